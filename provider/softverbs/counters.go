package softverbs

import (
	"sync/atomic"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// Counter names one counter of a software device. Every counter is one
// declaration below: its name, help, scope and drop reason; verbs'
// CounterSource hands the schema to the tools.
//
// Every datagram a device reads is counted in RcvdPkts, then exactly once
// more: in one transport drop (MalformedDrops … ICRCErrors), as an SA MAD,
// in NoGroupDrops / NoQPDrops, as Forwarded, in ForwardDrops or in
// NoOwnerDrops (RoCEv2: a unicast datagram for another device of the
// host), or once per receiving QP as Delivered or in one per-QP drop
// (NotReadyDrops … CQFullDrops). RcvdForwarded refines RcvdPkts (the owner
// reads a forwarded datagram again and counts it as any other). On
// InfiniBand, datagrams from a sender other than the SM count only in
// UntrustedDrops (with direct forwarding, the peers the SM gave the port
// count as the switch), and the SM's control messages are not packets: a
// rejected one counts only in ControlDrops.
type Counter int

// schema is the counter table, in declaration order.
var schema []verbs.CounterDesc

// def declares a counter.
func def(name string, scope verbs.CounterScope, metric, reason, help string) Counter {
	return defDesc(verbs.CounterDesc{Name: name, Help: help, Scope: scope, Metric: metric, Reason: reason})
}

// defShared declares a counter every backend has (driver.CounterSentPkts
// …), with what it means on a software device.
func defShared(d verbs.CounterDesc, help string) Counter {
	d.Help = help
	return defDesc(d)
}

func defDesc(d verbs.CounterDesc) Counter {
	schema = append(schema, d)
	return Counter(len(schema) - 1)
}

const (
	dev = verbs.ScopeDevice
	qp  = verbs.ScopeQP
	drp = "dropped_packets_total"
)

// The counters of a software device.
var (
	RcvdPkts           = defShared(driver.CounterRcvdPkts, "Datagrams read from the device's sockets, before any check.")
	RcvdBytes          = def("rcvd_bytes", dev, "received_bytes_total", "", "Bytes of the datagrams read (UDP payload on RoCEv2, the whole packet on IB).")
	SocketDrops        = def("socket_drops", dev, drp, "socket_buffer", "Datagrams the kernel dropped because a receive socket's buffer was full, before the device read them (the kernel's count of the socket, asked when the counters are read; RoCEv2).")
	SocketErrors       = def("socket_errors", dev, "socket_errors_total", "", "Errors the kernel reported on a receive socket for an ICMP or ICMPv6 message that quotes its addresses and ports (port unreachable and the like; anyone can send one): counted, and the socket reads on (RoCEv2).")
	RecvLoopEnds       = def("recv_loop_ends", dev, "receive_loop_ends_total", "", "Receive goroutines that ended on an error while their socket was open, each logged; a unicast socket is closed with its goroutine (RoCEv2).")
	Delivered          = def("delivered", qp, "delivered_packets_total", "", "Datagrams handed to a QP's receive queue (one per receiving QP).")
	SentPkts           = defShared(driver.CounterSentPkts, "Datagrams sent.")
	SentBytes          = def("sent_bytes", qp, "sent_bytes_total", "", "Bytes sent (UDP payload on RoCEv2, the whole packet on IB).")
	SendErrors         = defShared(driver.CounterSendErrors, "Sends the transport refused (the completion has LOC_QP_OP_ERR).")
	OversizedSendDrops = def("oversized_send_drops", qp, drp, "oversized_send", "Sends larger than the active MTU, completed without being sent (as rxe does).")
	SAMADs             = def("sa_mads", dev, "sa_mads_total", "", "MADs for the port's GSI QP handed to the SA client (InfiniBand).")
	UntrustedDrops     = def("untrusted_drops", dev, drp, "untrusted", "Datagrams from a sender the port does not trust (InfiniBand: not its SM).")
	ControlDrops       = def("control_drops", dev, drp, "bad_control", "Control messages from the SM that are malformed, not a port_info, or carry invalid port_info fields (InfiniBand).")
	SAStrayDrops       = def("sa_stray_drops", dev, drp, "sa_stray", "SA MADs that answer no pending request: TID, response method, attribute or source differ (InfiniBand).")
	MalformedDrops     = def("malformed_drops", dev, drp, "malformed", "Packets that do not parse (InfiniBand: bad LRH, GRH or BTH).")
	TruncatedDrops     = def("truncated_drops", dev, drp, "truncated", "Datagrams shorter than their headers and ICRC.")
	TVerDrops          = def("tver_drops", dev, drp, "tver", "Datagrams with a BTH transport version other than 0.")
	OpcodeDrops        = def("opcode_drops", dev, drp, "opcode", "Datagrams whose opcode is not UD SEND_ONLY[_WITH_IMMEDIATE].")
	DestQP0Drops       = def("destqp0_drops", dev, drp, "destqp0", "Datagrams addressed to QP 0.")
	OversizedRecvDrops = def("oversized_recv_drops", dev, drp, "oversized_recv", "Datagrams larger than any packet of a 4096-byte MTU.")
	ICRCErrors         = def("icrc_errors", dev, drp, "icrc", "Datagrams whose ICRC does not match.")
	VCRCErrors         = def("vcrc_errors", dev, drp, "vcrc", "Packets whose VCRC does not match (InfiniBand).")
	NoGroupDrops       = def("no_group_drops", dev, drp, "no_group", "Multicast datagrams for a group with no attached QP.")
	NoQPDrops          = def("no_qp_drops", dev, drp, "no_qp", "Unicast datagrams for a QPN the device does not have.")
	Forwarded          = def("forwarded", dev, "forwarded_packets_total", "", "Unicast datagrams for a QPN of another device of this user on the host, handed over to it (RoCEv2).")
	ForwardDrops       = def("forward_drops", dev, drp, "forward", "Unicast datagrams for another device of the host that could not be handed over to it: its connection was full, another user holds its hand-over socket's name, or, during a flood of datagrams for ports without an owner, the device's connection attempts of the moment were used up (RoCEv2).")
	NoOwnerDrops       = def("no_owner_drops", dev, drp, "no_owner", "Unicast datagrams for a QPN of another device that no device of this user on the host has (RoCEv2); a port found without an owner is not tried again for 100 to 200 ms.")
	HandoverErrors     = def("handover_errors", dev, "handover_errors_total", "", "Hand-over sockets that could not be set up or were refused (the name held by a socket of another user, a send block without one), each logged once per device: unicast datagrams between this user's processes are then lost, nothing else fails (RoCEv2).")
	RcvdForwarded      = def("rcvd_forwarded", dev, "received_forwarded_packets_total", "", "Datagrams another device of the host forwarded to this one (RoCEv2; counted in rcvd_pkts too).")
	NotReadyDrops      = def("not_ready_drops", qp, drp, "not_ready", "Datagrams for a QP that does not receive (below RTR, ERR, destroyed).")
	PKeyViolations     = def("pkey_violations", qp, drp, "pkey", "Datagrams whose P_Key is not the default partition's.")
	QKeyViolations     = def("qkey_violations", qp, drp, "qkey", "Datagrams whose Q_Key differs from the receiving QP's.")
	SelfLoopbackDrops  = def("self_loopback_drops", qp, drp, "self_loopback", "A QP's own multicast not delivered to it (CreateBlockSelfMcastLB).")
	NoRecvWRDrops      = def("no_recv_wr_drops", qp, drp, "no_recv_wr", "Datagrams dropped because no receive WR was posted.")
	TooLongDrops       = def("too_long_drops", qp, drp, "too_long", "Datagrams larger than the next receive WR (40 + payload); the WR is not consumed.")
	CQFullDrops        = def("cq_full_drops", qp, drp, "cq_full", "Datagrams dropped because the receive CQ was full.")
	LinkWaits          = def("link_waits", dev, "link_waits_total", "", "Sends that waited for credit from the switch: the link held the sender back (InfiniBand flow control).")
	LinkStallDrops     = def("link_stall_drops", dev, drp, "link_stall", "Packets not sent because the link to the switch stayed without credit for the stall timeout (InfiniBand).")
	DirectSends        = def("direct_sends", dev, "direct_sent_packets_total", "", "Packets sent straight to a destination port, one per destination, not through the switch (InfiniBand direct forwarding).")
	DirectDiscards     = def("direct_discards", dev, drp, "direct_discard", "Packets not sent to a destination port directly: it gave no credit for the switch's head-of-queue lifetime, or it was stalled, or the send failed (InfiniBand direct forwarding).")
)

// Schema returns the counter schema of software devices, indexed by
// Counter. The slice is shared and must not be modified.
func Schema() []verbs.CounterDesc { return schema }

// String returns the counter's name.
func (c Counter) String() string { return schema[c].Name }

// counters is one set of atomic counters, indexed by Counter; the hot path
// only adds.
type counters []atomic.Uint64

func newCounters() counters { return make(counters, len(schema)) }

func (c counters) values() []uint64 {
	out := make([]uint64, len(c))
	for i := range c {
		out[i] = c[i].Load()
	}
	return out
}

// Snapshot is the values of a device's or a QP's counters.
type Snapshot []uint64

// Get returns one counter's value.
func (s Snapshot) Get(c Counter) uint64 {
	if int(c) >= len(s) {
		return 0
	}
	return s[c]
}
