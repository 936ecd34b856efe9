package sm

import (
	"net/netip"
	"slices"
	"sync/atomic"

	"github.com/softrdma/softrdma/ib/sa"
)

// PortStats are the counters and state of one port.
type PortStats struct {
	GUID     uint64
	LID      uint16
	NodeDesc string
	// Attached is true while a client port is attached; Addr is its socket.
	Attached bool
	Addr     netip.AddrPort
	// PreRegistered ports were given on the command line.
	PreRegistered bool
	// RxPackets counts IB packets received from the port.
	RxPackets uint64
	// TxPackets counts IB packets delivered to the port (forwarded
	// multicast and unicast, SA answers).
	TxPackets uint64
	// Forwarded counts copies of the port's packets sent to other ports.
	Forwarded uint64
	// Drops counts the port's packets that went nowhere: bad VCRC/LRH,
	// bad SA packets, unknown or absent DLID, multicast with no receiver.
	Drops uint64
	// SARequests counts SA MADs the port sent.
	SARequests uint64
	// FlowControl is set when the port's links are flow controlled (the
	// port offered credits); Window is the switch's receive window for
	// the port and Credits what the port lets the switch send now.
	FlowControl     bool
	Window, Credits int
	// XmitWaits counts packets for the port that had to wait for its
	// credit; XmitDiscards packets for the port discarded because its
	// credit did not come within HOQLife, or while it was stalled (IB's
	// PortXmitWait and PortXmitDiscards).
	XmitWaits, XmitDiscards uint64
	// RcvOverruns counts packets from the port beyond the credit it was
	// given, dropped.
	RcvOverruns uint64
}

// Stats is a snapshot of the SM's counters.
type Stats struct {
	// Ports, sorted by LID.
	Ports []PortStats
	// UnknownSource counts IB packets from addresses with no attached port.
	UnknownSource uint64
	// RawSARequests counts MADs on the raw SA port; RawSADrops those
	// dropped (not 256 bytes, SA silenced, or a non-loopback source).
	RawSARequests, RawSADrops uint64
	// RefusedAttaches counts attaches for a GUID registered at another
	// address; ForeignDetaches detaches from an address that is not the
	// named port's; NoLIDAttaches attaches refused because no LID was free.
	RefusedAttaches, ForeignDetaches, NoLIDAttaches uint64
	// SourceLimitAttaches counts attaches refused because their source IP
	// address had Config.MaxPortsPerSource ports attached.
	SourceLimitAttaches uint64
	// Retries counts retries answered (counted as they are sent; one the
	// socket refused also counts in SendErrors): answers to attaches from
	// addresses not proven for their GUID (see ib/fabric's address validation);
	// BadCookies attaches whose cookie was wrong or expired (answered
	// with a new retry); UnpaddedAttaches attaches from such addresses
	// too short for a retry (shorter than fabric.AttachLen's padding),
	// dropped; VersionRefusals attaches of another protocol version,
	// refused with fabric.ReasonVersion (or dropped when the refusal is
	// longer than the attach).
	Retries, BadCookies, UnpaddedAttaches, VersionRefusals uint64
	// ThrottledControls counts control messages from an attached port's
	// address beyond ControlBurst/ControlRate or beyond the portPending
	// that may wait, dropped; ControlDrops
	// control messages dropped because the control queue was full or
	// they were longer than MaxControlLen.
	ThrottledControls, ControlDrops uint64
	// GroupQuotaRefusals counts SA joins refused (0x0100) because the
	// requester had created Config.MaxGroupsPerPort groups, or the ports
	// of its source address Config.MaxGroupsPerSource;
	// MembershipQuotaRefusals joins refused because the port was a member
	// of Config.MaxMembershipsPerPort groups.
	GroupQuotaRefusals, MembershipQuotaRefusals uint64
	// RMPPTransfers counts RMPP transfers (GetTable answers) started;
	// RMPPRetransmits segments sent again after an ACK timeout;
	// RMPPTimeouts transfers dropped after their retries; RMPPAborts
	// transfers ended by a STOP or ABORT from the receiver or by a bad ACK.
	RMPPTransfers, RMPPRetransmits, RMPPTimeouts, RMPPAborts uint64
	// SAThrottled counts SA requests dropped beyond a port's or a source
	// address's SA rate (SARequestRate, SASourceRate, TableRate,
	// TableSourceRate); TableTooLarge queries answered 0x0100 because the
	// answer would exceed Config.MaxTableRecords records (or its
	// candidates sa.WorkFactor × as many); TableBusy queries answered
	// 0x0100 because tableQueue of them waited already, or the requester
	// had MaxRMPPPerRequester transfers in progress, or the transfer
	// would exceed RMPPSourceBytes or RMPPBytes.
	SAThrottled, TableTooLarge, TableBusy uint64
	// SocketBuffer is the fabric socket's receive buffer the ports'
	// windows share (bytes, as the kernel reported it before the SM asked
	// for floodHeadroom beyond); SendErrors counts datagrams the kernel
	// refused to send.
	SocketBuffer int
	SendErrors   uint64
	// SocketDrops counts datagrams the kernel dropped because the fabric
	// socket's buffer was full, before the switch read them (SO_MEMINFO's
	// drop count, asked when Stats is called): packets, credits and
	// control messages lost on the way into the switch.
	SocketDrops uint64
	// OpenSMRelayDrops counts SA MADs of ports dropped on their way to
	// OpenSM because OpenSMRelayQueue of them waited to be handed to it
	// already, or because its socket took none for a second (OpenSM in
	// charge only: an OpenSM that reads nothing, stopped or busy, holds
	// the queue up; logged with -v). The port's SA client
	// sends again after its timeout. Always 0 with softsm's own SM.
	OpenSMRelayDrops uint64
	// Direct forwarding (direct.go): DirectRoutes counts route messages
	// sent to ports (answers and updates); DirectPairs pairings both
	// ports took; DirectRefusedPairs pairings a port had no room for
	// (their routes stay with the switch); DirectDrops direct forwarding
	// messages of ports dropped: malformed, of a type a port does not
	// send, or beyond the port's budget (directBurst, directRate).
	DirectRoutes, DirectPairs, DirectRefusedPairs, DirectDrops uint64
}

type portCounters struct {
	rx, tx, fwd, drops, sa    atomic.Uint64
	waits, discards, overruns atomic.Uint64
}

func (s *SM) sortedPorts() []*port {
	ps := make([]*port, 0, len(s.byGUID))
	for _, p := range s.byGUID {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b *port) int { return int(a.lid) - int(b.lid) })
	return ps
}

// Stats returns a snapshot of the counters.
func (s *SM) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.sa.QuotaRefusals()
	st := Stats{UnknownSource: s.unknownSrc.Load(), RawSARequests: s.rawReqs.Load(), RawSADrops: s.rawDrops.Load(),
		RefusedAttaches: s.refusedAttach.Load(), ForeignDetaches: s.foreignDetach.Load(), NoLIDAttaches: s.noLIDAttach.Load(),
		SourceLimitAttaches: s.sourceLimit.Load(),
		Retries:             s.retries.Load(), BadCookies: s.badCookies.Load(), UnpaddedAttaches: s.unpadded.Load(), VersionRefusals: s.oldVersion.Load(),
		ThrottledControls: s.throttled.Load(), ControlDrops: s.ctlDrops.Load(),
		GroupQuotaRefusals: q.Groups, MembershipQuotaRefusals: q.Memberships,
		RMPPTransfers: s.rmppXfers.Load(), RMPPRetransmits: s.rmppRetrans.Load(), RMPPTimeouts: s.rmppTimeouts.Load(), RMPPAborts: s.rmppAborts.Load(),
		SAThrottled: s.saThrottled.Load(), TableTooLarge: s.tableTooLarge.Load(), TableBusy: s.tableBusy.Load(),
		SocketBuffer: s.rcvbuf, SendErrors: s.sendErrors.Load(), SocketDrops: uint64(s.socketDrops()),
		DirectRoutes: s.dRoutes.Load(), DirectPairs: s.dPairs.Load(), DirectRefusedPairs: s.dRefused.Load(), DirectDrops: s.dDrops.Load()}
	if s.ext != nil {
		st.OpenSMRelayDrops = s.ext.relayDrops.Load()
	}
	for _, p := range s.sortedPorts() {
		st.Ports = append(st.Ports, PortStats{
			GUID: p.guid, LID: p.lid, NodeDesc: p.desc, Attached: p.attached(), Addr: p.addr, PreRegistered: p.pre,
			RxPackets: p.c.rx.Load(), TxPackets: p.c.tx.Load(), Forwarded: p.c.fwd.Load(),
			Drops: p.c.drops.Load(), SARequests: p.c.sa.Load(),
			FlowControl: p.ls.link.On, Window: s.portWindow(p), Credits: p.ls.link.Credits(),
			XmitWaits: p.c.waits.Load(), XmitDiscards: p.c.discards.Load(), RcvOverruns: p.c.overruns.Load(),
		})
	}
	return st
}

// Groups returns a snapshot of the SA's multicast groups.
func (s *SM) Groups() []sa.Group {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sa.Groups()
}
