package driver

import (
	"net/netip"
	"time"
)

// This file is what a backend offers beyond the verbs, each an optional
// interface of its DeviceOps (or ContextOps) that verbs asks for, and the
// plain data those interfaces carry: reports and events for the operator
// tools, counters, frame taps, asynchronous events. Tools reach devices
// only through these, never through a backend's concrete types, so any
// backend can offer them.

// Inspector is an optional interface of a DeviceOps: a read-only view of
// the device, as ibv_devinfo and `rdma` show a kernel device.
type Inspector interface {
	// Inspect returns the device's state at one instant.
	Inspect() DeviceReport
}

// DeviceReport is a read-only view of a device.
type DeviceReport struct {
	// Kind names the backend: "rxe" (softrdma's RoCEv2 device), "ib" (a
	// port of an emulated InfiniBand subnet)…
	Kind string
	// Netdev is the network interface below a RoCE device (zero on IB).
	Netdev NetdevReport
	// Port and GIDs are port 1's attributes and GID table.
	Port PortAttr
	GIDs []GIDEntry
	// Usage counts what the device uses, in display order (e.g. "qps",
	// "mcast_groups", "mcast_attachments", "recv_sockets").
	Usage []UsageCount
	// QPs are the device's QPs, by QPN.
	QPs []QPReport
	// Groups are the multicast groups the device has state for, by MGID:
	// groups with attached QPs, IP memberships, SA memberships.
	Groups []GroupReport
}

// NetdevReport names the network interface of a RoCE device.
type NetdevReport struct {
	Name  string
	Index int
	MAC   string
}

// UsageCount is one usage figure of a device.
type UsageCount struct {
	Name  string
	Value int
}

// QPReport is the view of one QP.
type QPReport struct {
	QPN              uint32
	State            QPState
	QKey             uint32
	Port             uint8
	BlockSelfMcastLB bool
	// SrcPort is the UDP source port of the QP's datagrams (RoCEv2).
	SrcPort uint16
	// Groups are the QP's attachments, in attach order.
	Groups []McastAttachment
	// Counters are the QP's counters in the device's schema order (see
	// CounterSource); nil when the device keeps none per QP.
	Counters []uint64
}

// McastAttachment is one multicast attachment of a QP: an MGID and the
// MLID it was attached with (0 on RoCE).
type McastAttachment struct {
	MGID GID
	MLID uint16
}

// GroupReport is one multicast group of a device.
type GroupReport struct {
	MGID GID
	// QPNs are the attached QPs, in attach (delivery) order.
	QPNs []uint32
	// IPGroup is the IP group a RoCE device joins for the MGID (invalid
	// on IB); IPJoined says the interface holds its membership, CMRefs
	// how many RDMA CM joins reference it.
	IPGroup  netip.Addr
	IPJoined bool
	CMRefs   int
	// MLID and SAJoinState are the port's SA membership on IB (0: none).
	MLID        uint16
	SAJoinState uint8
}

// DeviceEvent is a change of a device's network side that tools log.
type DeviceEvent struct {
	// Kind names the change, e.g. "NetdevRemoved", "AddrRemoved",
	// "AddrAdded", "ClientReregister".
	Kind string
	Addr netip.Addr // the address, for address changes
}

// EventSource is an optional interface of a DeviceOps: notifications of
// the device's changes.
type EventSource interface {
	// Subscribe calls fn for every change until cancel is called.
	Subscribe(fn func(DeviceEvent)) (cancel func())
}

// CounterScope says where a counter is kept.
type CounterScope uint8

// Counter scopes.
const (
	// ScopeDevice counters are kept per device only.
	ScopeDevice CounterScope = iota
	// ScopeQP counters are kept per device and per QP.
	ScopeQP
)

// CounterDesc is one counter of a device's schema.
type CounterDesc struct {
	// Name is the counter's name in stat and --json, e.g. "qkey_violations".
	Name string
	// Help says what the counter counts.
	Help string
	// Scope says whether QPs have the counter too.
	Scope CounterScope
	// Metric is the Prometheus metric the counter feeds, without the
	// softrdma_ (or softrdma_qp_) prefix, e.g. "dropped_packets_total".
	Metric string
	// Reason is the drop reason, the metric's "reason" label; "" when the
	// counter is not a drop.
	Reason string
}

// The counters every backend has with the same meaning: a software
// device counts them itself, the kernel backend maps its device's own
// counters onto them, so the tools and metrics show one name for each.
var (
	CounterRcvdPkts   = CounterDesc{Name: "rcvd_pkts", Help: "Packets the device received, before any check.", Scope: ScopeDevice, Metric: "received_packets_total"}
	CounterSentPkts   = CounterDesc{Name: "sent_pkts", Help: "Packets sent.", Scope: ScopeQP, Metric: "sent_packets_total"}
	CounterSendErrors = CounterDesc{Name: "send_errors", Help: "Sends that failed (the completion has an error status).", Scope: ScopeQP, Metric: "send_errors_total"}
)

// CounterSource is an optional interface of a DeviceOps: the device's
// counter schema and values. Values come in schema order.
type CounterSource interface {
	// CounterSchema returns the device's counters; the slice is shared and
	// must not be modified.
	CounterSchema() []CounterDesc
	// DeviceCounters returns every counter of the device.
	DeviceCounters() []uint64
	// QPCounters returns the counters of QP qpn (zero for device-scope
	// ones); false when the device has no such QP.
	QPCounters(qpn uint32) ([]uint64, bool)
}

// Link types of frames, as pcap names them (LINKTYPE_*).
const (
	// LinkTypeEthernet is Ethernet frames (RoCE).
	LinkTypeEthernet uint32 = 1
	// LinkTypeInfiniBand is InfiniBand packets from the LRH on (Wireshark
	// decodes them).
	LinkTypeInfiniBand uint32 = 247
)

// Frame is one packet a device sent or received, as its link carries it.
type Frame struct {
	Time time.Time
	// Data is the whole frame; a tap must not keep it past its call.
	Data []byte
	// Sent is true for a frame the device sent, false for one it read.
	Sent bool
}

// Tapper is an optional interface of a DeviceOps: a copy of every frame
// the device sends and receives, for packet captures.
type Tapper interface {
	// LinkType is the pcap link type of the device's frames.
	LinkType() uint32
	// Tap calls fn with every frame until cancel is called. fn runs on
	// the datapath: it must not block.
	Tap(fn func(Frame)) (cancel func())
}

// AsyncEventType is the kind of an asynchronous event (enum
// ibv_event_type, with libibverbs' values).
type AsyncEventType int

// Asynchronous event types.
const (
	EventCQErr            AsyncEventType = 0
	EventQPFatal          AsyncEventType = 1
	EventQPReqErr         AsyncEventType = 2
	EventQPAccessErr      AsyncEventType = 3
	EventCommEst          AsyncEventType = 4
	EventSQDrained        AsyncEventType = 5
	EventPathMig          AsyncEventType = 6
	EventPathMigErr       AsyncEventType = 7
	EventDeviceFatal      AsyncEventType = 8
	EventPortActive       AsyncEventType = 9
	EventPortErr          AsyncEventType = 10
	EventLIDChange        AsyncEventType = 11
	EventPKeyChange       AsyncEventType = 12
	EventSMChange         AsyncEventType = 13
	EventSRQErr           AsyncEventType = 14
	EventSRQLimitReached  AsyncEventType = 15
	EventQPLastWQEReached AsyncEventType = 16
	EventClientReregister AsyncEventType = 17
	EventGIDChange        AsyncEventType = 18
	EventWQFatal          AsyncEventType = 19
)

var asyncEventNames = [...]string{
	"CQ error", "local work queue catastrophic error", "invalid request local work queue error",
	"local access violation work queue error", "communication established", "send queue drained",
	"path migrated", "path migration request error", "local catastrophic error", "port active",
	"port error", "LID change", "P_Key change", "SM change", "SRQ catastrophic error",
	"SRQ limit reached", "last WQE reached", "client reregistration", "GID table change",
	"WQ fatal",
}

// String returns ibv_event_type_str's text.
func (t AsyncEventType) String() string {
	if t >= 0 && int(t) < len(asyncEventNames) {
		return asyncEventNames[t]
	}
	return "unknown"
}

// AsyncEvent is an asynchronous event of a device (struct
// ibv_async_event). softrdma's devices raise port events: PortNum names
// the port.
type AsyncEvent struct {
	Type    AsyncEventType
	PortNum uint8
}

// AsyncEventSource is an optional interface of a ContextOps or, failing
// that, of a DeviceOps: a backend that raises asynchronous events (of the
// context, or of the device for each context) delivers them to fn until
// cancel is called (a call already under way may end after cancel
// returns: a context ignores events once closed). Without it a device has
// no asynchronous events.
type AsyncEventSource interface {
	// SubscribeAsync delivers the events to fn until cancel is called.
	SubscribeAsync(fn func(AsyncEvent)) (cancel func())
}
