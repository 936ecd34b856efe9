// Package sm is the subnet manager service of the emulated InfiniBand
// subnet: one process plays SM (port registry, LIDs, epochs), SA (package
// ib/sa behind QP1 at LID 1 and behind a raw UDP port) and switch
// (unicast by DLID, multicast by MLID). The protocol is package ib/fabric.
//
// Switch: for each IB packet from a registered port (identified by its UDP
// source address) the VCRC and the LRH are checked (bad → dropped and
// counted). DLID = SMLID goes to the SA agent; a multicast DLID
// (0xC000..0xFFFE) is forwarded unchanged to every other attached port
// holding FullMember or NonMember in a group with that MLID — never to a
// port holding only send-only bits, never back to the sender; a unicast
// DLID goes to the port with that LID; anything else is dropped. The
// links to the ports are lossless (flow controlled, see switch.go): a
// packet is sent to a port only with that port's credit, and waits for it
// at most Config.HOQLife.
//
// Identity: a port is its GUID, bound to the UDP address it attached from
// while it is registered. An attach for a registered GUID from another
// address is refused (counted, and answered with a "refused" control
// message) until the port detaches or expires; a
// detach counts only from the port's own address. A port registering again
// after it was forgotten (expired or detached) gets ClientReregister in its
// port_info, so it learns that its memberships are gone.
//
// LIDs: see lidAlloc; when none is free the attach is refused (counted,
// answered with "refused").
//
// Floods (the SM keeps answering; issue 24): the reader only sorts
// datagrams; control messages (attach, detach) wait for a control
// goroutine, so that a flood of them never holds up IB packets (SA
// requests). Each attached port's address has its own short queue
// (portPending) and budget (ControlBurst at once, ControlRate a second
// beyond, then dropped: ThrottledControls), and the control goroutine
// serves the attached ports round robin, so that a port's keepalive waits
// behind at most one message of each other port. Messages from every
// other address share one queue of newQueue, in turns with the attached
// ports; when it is full they are dropped (ControlDrops). A source IP
// address (the "host": every local process shares 127.0.0.1 unless it
// binds another loopback address) may have Config.MaxPortsPerSource ports
// attached; a further attach from it is refused (SourceLimitAttaches,
// answered with "refused" source_limit), and beyond RefusalRate a second
// such messages are dropped unread (counted the same). A control message
// longer than MaxControlLen is dropped (ControlDrops), and a NodeDesc is
// cut to MaxNodeDesc bytes. Where the kernel lets it (CAP_NET_ADMIN), the
// fabric socket gets a receive buffer of floodHeadroom beyond the one the
// windows share, so that a burst of tens of thousands of attaches is not
// dropped by the kernel before the reader sees it. No port event,
// datagram or tick costs work proportional to the number of ports under
// the SM's lock: the window is one shared value, the forwarder visits
// only ports with queued packets or flow control to send, expiry walks
// the ports in order of their last keepalive (at most expireBatch under
// one hold of the lock), a port's removal costs its memberships at the
// SA, attachments do not rebuild the multicast forwarding table, and the
// state file is written at most once a second (and on Close). Throttles,
// drops and refusals are logged at most once a second with their counts.
//
// Forged source addresses (issue 24, item 8): an attach is answered only
// as ib/fabric's address validation says. From an address not proven for
// the attach's GUID (the GUID's port is not registered there, and the
// attach carries no valid cookie) the only answer is a retry with a
// cookie (Retries), and only when it is no longer than the attach (an
// unpadded attach is dropped: UnpaddedAttaches); nothing is allocated for
// it. An attach with a wrong or expired cookie is counted (BadCookies)
// and answered with a new retry. An attach of protocol version 1 gets a
// refused with fabric.ReasonVersion in version 1's format, when it is no
// longer than the attach (VersionRefusals). So a forged attach can make
// the SM send only a datagram no larger than itself, to the forged
// address, and cannot take a LID, a port record or a source address's
// share of MaxPortsPerSource; nor can it replace the port registered at
// the forged address. Retries, bad cookies and the rest are logged at
// most once a second with their counts.
//
// The SM's address and identity: ports send everything to the fabric
// address, so New binds it without SO_REUSEADDR or SO_REUSEPORT (no
// other socket may share it) and, when someone else holds it, fails
// saying who (EADDRINUSE; owner uid, and the process where /proc shows
// it). Every port_info carries Session, a token of this SM instance for
// that port (an HMAC of the port's address and GUID under the SM's random
// secret) and SMGUID; with Config.Key, every port_info and refused also
// carries a MAC under the key over the nonce of the attach it answers.
// Ports authenticate the SM by them (see provider/ib and ib/fabric's
// auth.go).
//
// SA quotas: a port may have created Config.MaxGroupsPerPort groups that
// still exist and be a member of Config.MaxMembershipsPerPort groups, and
// the ports of one source IP address (the raw SA port's peers: each
// peer's address) may have created Config.MaxGroupsPerSource groups
// together, a quarter of the MLIDs by default, so that the ports one
// address may attach cannot take every MLID; a join beyond is answered
// 0x0100 (insufficient resources), counted (GroupQuotaRefusals,
// MembershipQuotaRefusals) and logged (see sa.Config).
//
// SA requests and tables: no SA request costs work that grows with the
// subnet in the reader or under the SM's lock beyond a copy. The reader
// answers joins, leaves, ClassPortInfo and the queries of one group,
// member or path itself (O(1) each); a broad query (sa.SA.Broad: a Get or
// GetTable of MCMemberRecord or PathRecord whose work grows with the
// subnet) goes to the table goroutine (at most tableQueue wait; beyond, 0x0100 at once,
// TableBusy), which copies what the query needs under the lock
// (sa.Prepare: at most every port or group) and builds the answer without
// it (sa.Query.Build). An answer carries at most Config.MaxTableRecords
// records: a query that would answer more, or examine more than
// sa.WorkFactor × as many candidates, is answered 0x0100 and no record
// (TableTooLarge). A port may send SARequestBurst SA requests at once and
// SARequestRate a second beyond, of them TableBurst broad queries at once
// and TableRate a second; a source address (all its ports; the raw SA port's
// peers count as one source) SASourceBurst/SASourceRate and
// TableSourceBurst/TableSourceRate. Beyond, requests are dropped
// (SAThrottled). A requester may have MaxRMPPPerRequester RMPP transfers in
// progress, a source address RMPPSourceBytes of segments in them, all
// sources RMPPBytes; a GetTable beyond is answered 0x0100 (TableBusy).
// RMPP ACKs, STOPs and ABORTs are not counted against the rates. Each kind
// is logged at most once a second with its count.
//
// Raw SA port (off unless Config.SAListen is set; loopback only unless
// Config.SAAllowRemote): a diagnostic. One datagram of exactly 256 bytes
// is one SA MAD; every response MAD (one, or the RMPP segments of a
// GetTableResp) goes back to the sender as one datagram. Such a request
// acts for the port whose GUID is the record's PortGID: whoever can reach
// the raw port can join and leave for any port.
//
// RMPP: a GetTableResp (always RMPP-active) is sent as the kernel's MAD
// layer sends it for OpenSM (mad_rmpp.c): segment 1 first, then no segment
// above the receiver's NewWindowLast; the receiver's ACKs (type ACK, method
// GetTable, same TID, to QP1 or from the raw port's peer) move the window.
// When no ACK moved it for Config.RMPPTimeout the unacknowledged segments
// of the window go again, at most Config.RMPPRetries times in a row; then
// the transfer is dropped. A bad ACK aborts the transfer with an RMPP
// ABORT to the receiver; a STOP or ABORT from the receiver ends it. A new
// GetTable with the same TID from the same requester replaces a transfer
// in progress.
package sm

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sa"
	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/internal/sys/rawudp"
	"github.com/softrdma/softrdma/internal/sys/udpowner"
	"github.com/softrdma/softrdma/wire"
)

// DefaultSMGUID is the SM port's GUID; its GID is fe80::1.
const DefaultSMGUID = 1

// Flood limits (see the package comment).
const (
	// DefaultMaxPortsPerSource is Config.MaxPortsPerSource's default: far
	// above the ports any test or benchmark attaches from one address
	// (tens), a twelfth of the unicast LIDs.
	DefaultMaxPortsPerSource = 4096
	// DefaultMaxGroupsPerPort is Config.MaxGroupsPerPort's default: a
	// quarter of the MLIDs, twice the groups the IB benchmark joins from
	// one port (2,000).
	DefaultMaxGroupsPerPort = 4096
	// DefaultMaxMembershipsPerPort is Config.MaxMembershipsPerPort's
	// default: half the MLIDs, four times the IB benchmark's joins.
	DefaultMaxMembershipsPerPort = 8192
	// ControlBurst and ControlRate bound the control messages (attach,
	// detach) of an attached port's address: ControlBurst at once, then
	// ControlRate a second (a port sends one keepalive a second).
	ControlBurst = 16
	ControlRate  = 2
	// MaxControlLen is the longest control message taken (an attach with
	// the longest NodeDesc, JSON-escaped, is well below).
	MaxControlLen = 1024
	// MaxNodeDesc is the longest NodeDesc kept: IB's NodeDescription is
	// 64 bytes.
	MaxNodeDesc = 64
	// RefusalRate is how many control messages a second from unattached
	// addresses of sources at their MaxPortsPerSource the SM looks at
	// (and answers "refused" source_limit, in bursts of as many); the
	// others it drops unread, counted as SourceLimitAttaches too.
	RefusalRate = 64
	// portPending is the most control messages of an attached port's
	// address that wait for the control goroutine; newQueue the most of
	// all other addresses together.
	portPending = 4
	newQueue    = 1024
	// tableQueue is the most broad SA queries (sa.SA.Broad) that wait for
	// the table goroutine.
	tableQueue = 64
	// expireBatch is the most ports expire forgets under one hold of the
	// lock.
	expireBatch = 256
	// stateEvery is how often a changed state file is written.
	stateEvery = time.Second
)

// SA bounds (see the package comment, "SA requests and tables").
const (
	// DefaultMaxTableRecords is Config.MaxTableRecords's default: every
	// group the MLIDs allow (16,383) in one GetTable(MCMemberRecord).
	DefaultMaxTableRecords = 16384
	// SARequestBurst and SARequestRate bound the SA requests of one port:
	// SARequestBurst at once (a port rejoining all of its
	// DefaultMaxMembershipsPerPort groups after a client reregister),
	// SARequestRate a second beyond (twice the joins a second one port
	// makes in the IB benchmark); SASourceBurst and SASourceRate those of
	// all the ports of one source IP address (the raw SA port's peers
	// count as one source). Beyond, requests are dropped (SAThrottled):
	// the requester's SA client sends again after its timeout.
	SARequestBurst = 8192
	SARequestRate  = 32768
	SASourceBurst  = 32768
	SASourceRate   = 65536
	// TableBurst and TableRate bound the broad queries (sa.SA.Broad: a
	// Get or GetTable of MCMemberRecord or PathRecord whose cost grows
	// with the subnet) of one port, TableSourceBurst and TableSourceRate those of one source
	// address; beyond, they are dropped (SAThrottled).
	TableBurst       = 4
	TableRate        = 2
	TableSourceBurst = 32
	TableSourceRate  = 16
	// MaxRMPPPerRequester is how many RMPP transfers (GetTable answers)
	// one requester (a port, a raw SA peer) may have in progress;
	// RMPPSourceBytes and RMPPBytes bound the segments held for the
	// transfers of one source address and of all. A GetTable beyond is
	// answered 0x0100 (TableBusy).
	MaxRMPPPerRequester = 2
	RMPPSourceBytes     = 16 << 20
	RMPPBytes           = 64 << 20
)

// RMPP defaults.
const (
	// DefaultRMPPTimeout is the wait for an RMPP ACK: the kernel's 2 s.
	DefaultRMPPTimeout = 2 * time.Second
	// DefaultRMPPRetries is how often an RMPP transfer is resent without
	// progress before it is dropped.
	DefaultRMPPRetries = 3
)

// Config configures a subnet manager.
type Config struct {
	// Listen is the fabric UDP address (fabric.DefaultListen if empty;
	// port 0 picks a free port).
	Listen string
	// SAListen is the raw SA UDP address; empty (the default) disables the
	// raw port. It must be a loopback address unless SAAllowRemote.
	SAListen string
	// SAAllowRemote lets the raw SA port bind a non-loopback address and
	// take requests from non-loopback sources.
	SAAllowRemote bool
	// SendOnlySupport advertises ClassPortInfo CapabilityMask2 bit 12 and
	// accepts SendOnlyFullMember joins.
	SendOnlySupport bool
	// Ports are pre-registered port GUIDs: known to the SA from the start,
	// LIDs assigned in this order (unless the state file has them).
	Ports []uint64
	// StateFile, if set, keeps GUID → LID across restarts (JSON).
	StateFile string
	// SADelay delays every SA answer (the request is processed when the
	// delay has passed); ClassPortInfo advertises a matching RespTimeValue.
	SADelay time.Duration
	// SADrop makes the SA never answer (nor process) any SA MAD.
	SADrop bool
	// RMPPTimeout is how long an RMPP transfer waits for an ACK that moves
	// its window before sending the unacknowledged segments again (0 → 2 s,
	// the kernel's wait for an RMPP ACK).
	RMPPTimeout time.Duration
	// RMPPRetries is how many times in a row an RMPP transfer is resent
	// without progress before it is dropped (0 → DefaultRMPPRetries;
	// negative → never resent).
	RMPPRetries int
	// SubnetPrefix is the subnet prefix (0 → fe80::).
	SubnetPrefix uint64
	// SMGUID is the SM port's GUID (0 → DefaultSMGUID).
	SMGUID uint64
	// PortTimeout is how long a silent port is kept (0 → 5 s).
	PortTimeout time.Duration
	// MaxMLID caps MLID allocation (0 → 0xFFFE).
	MaxMLID uint16
	// MaxLID caps unicast LID allocation (0 → 0xBFFF).
	MaxLID uint16
	// HOQLife is how long a packet may wait at the head of a port's input
	// queue for a destination port without credit before it is discarded
	// for that port (0 → DefaultHOQLife).
	HOQLife time.Duration
	// VLStallCount is how many packets in a row may be discarded so for a
	// port before every packet for it is discarded at once for 8 × HOQLife
	// (0 → DefaultVLStallCount).
	VLStallCount int
	// MaxPortsPerSource caps the ports attached from one source IP
	// address (0 → DefaultMaxPortsPerSource; negative → no cap).
	MaxPortsPerSource int
	// MaxGroupsPerPort caps the groups one port may have created that
	// still exist (0 → DefaultMaxGroupsPerPort; negative → no cap).
	MaxGroupsPerPort int
	// MaxGroupsPerSource caps the groups the ports of one source IP
	// address may have created together that still exist (0 →
	// DefaultMaxGroupsPerSource(MaxMLID): 4096 with the default MaxMLID;
	// negative → no cap).
	MaxGroupsPerSource int
	// MaxMembershipsPerPort caps the groups one port may be a member of
	// (0 → DefaultMaxMembershipsPerPort; negative → no cap).
	MaxMembershipsPerPort int
	// MaxTableRecords caps the records of one SA answer (0 →
	// DefaultMaxTableRecords; negative → no cap): a Get or GetTable that
	// would answer more, or examine more than sa.WorkFactor × as many
	// candidates, is answered 0x0100 (TableTooLarge).
	MaxTableRecords int
	// Logf, if set, receives one line per event (attach, detach, SA
	// request, drop reason).
	Logf func(format string, args ...any)
	// Key, if set, is the subnet's key (fabric.ReadKeyFile): every
	// port_info and refused carries a MAC under it over the nonce of the
	// attach it answers (fabric.ControlMAC), so that a port configured
	// with the key takes answers from this SM only.
	Key []byte
}

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
}

type portCounters struct {
	rx, tx, fwd, drops, sa    atomic.Uint64
	waits, discards, overruns atomic.Uint64
}

type port struct {
	guid     uint64
	lid      uint16
	desc     string
	addr     netip.AddrPort // valid while attached
	lastSeen time.Time
	pre      bool
	c        portCounters
	ls       linkState
	// The attached ports in order of lastSeen (SM.lruOld first).
	older, newer *port
	inLRU        bool
	// Control message budget of the port's address (ControlBurst,
	// ControlRate), and its messages waiting for the control goroutine
	// (the port is on SM.ctlPorts while there are any).
	budget  bucket
	pending []ctlMsg
	// SA request budgets of the port (SARequestRate, TableRate).
	saBudget, tableBudget bucket
}

// saSource is the SA budget of a source address: its requests and
// queries (SASourceRate, TableSourceRate) and the bytes of its RMPP
// transfers in progress (RMPPSourceBytes). Guarded by SM.mu.
type saSource struct {
	reqs, tables bucket
	rmppBytes    int
}

// tableJob is an SA query waiting for the table goroutine.
type tableJob struct {
	req  mad.MAD
	from sa.From
	key  rmppKey
	send func(mad.MAD) // called under mu
	src  *saSource
	who  string // the requester, for the log
}

// bucket is a token bucket; the zero bucket is full.
type bucket struct {
	tokens float64
	at     time.Time
}

// allow takes a token from a bucket of burst tokens refilled at rate a
// second (a nil bucket always allows).
func (b *bucket) allow(now time.Time, burst, rate float64) bool {
	if b == nil {
		return true
	}
	if b.at.IsZero() {
		b.tokens = burst
	} else {
		b.tokens = min(b.tokens+now.Sub(b.at).Seconds()*rate, burst)
	}
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// ctlMsg is a control message waiting for the control goroutine.
type ctlMsg struct {
	b    []byte
	from netip.AddrPort
}

// fifo is a first-in first-out queue.
type fifo[T any] struct {
	q    []T
	head int
}

func (f *fifo[T]) len() int { return len(f.q) - f.head }

func (f *fifo[T]) push(v T) { f.q = append(f.q, v) }

func (f *fifo[T]) pop() T {
	var zero T
	v := f.q[f.head]
	f.q[f.head] = zero
	f.head++
	if f.head == len(f.q) {
		f.q, f.head = f.q[:0], 0
	} else if f.head >= 1024 && f.head*2 >= len(f.q) {
		f.q = append(f.q[:0], f.q[f.head:]...)
		f.head = 0
	}
	return v
}

// limitedLog logs one kind of event at most once a second, with the
// count since the last line.
type limitedLog struct {
	mu sync.Mutex
	at time.Time
	n  uint64
}

func (p *port) attached() bool { return p.addr.IsValid() }

// SM is a running subnet manager.
type SM struct {
	cfg     Config
	epoch   uint64
	prefix  uint64
	fabric  *rawudp.Conn // out of the netpoller for writing: see internal/sys/rawudp
	rawSA   *net.UDPConn
	timeout time.Duration

	mu     sync.Mutex
	sa     *sa.SA
	lids   *lidAlloc
	byGUID map[uint64]*port
	byAddr map[netip.AddrPort]*port
	byLID  map[uint16]*port
	mft    map[uint16][]*port
	mftVer uint64
	psn    uint32
	timers map[*time.Timer]struct{}
	rmpp   map[rmppKey]*rmppXfer
	closed bool
	// rmppPer counts the RMPP transfers in progress of each requester (its
	// rmppKey without TID), rmppBytes the bytes of all their segments.
	rmppPer   map[rmppKey]int
	rmppBytes int
	// SA budgets: of each source address with attached ports, and of the
	// raw SA port's peers together.
	saSources map[netip.Addr]*saSource
	rawSource saSource
	// SA queries waiting for the table goroutine (at most tableQueue).
	tables    fifo[tableJob]
	tableWake chan struct{}
	// win is every attached port's receive window at the switch: the
	// socket buffer shared among them (fabric.Window).
	win int
	// perSource counts the attached ports of each source IP address.
	perSource map[netip.Addr]int
	// lruOld and lruNew end the list of attached ports by lastSeen.
	lruOld, lruNew *port
	// unlogged lists the ports with discards not logged yet
	// (flushDiscards).
	unlogged []*port
	// visit lists the ports the forwarder has to visit (queued packets,
	// flow control to send); spare is its other buffer.
	visit, spare []*port
	// stateDirty: the LIDs changed since the state file was written.
	stateDirty bool
	stateAt    time.Time
	// refusals is the budget of control messages from sources at their
	// MaxPortsPerSource looked at (RefusalRate).
	refusals bucket
	// Rate-limited logs of throttles, drops and refusals.
	logThrottle, logDrop, logSource, logNoLID limitedLog
	logBad, logRefused, logForeign            limitedLog
	logRetry, logCookie, logUnpadded          limitedLog
	logVersion                                limitedLog
	logSAThrottle, logTooLarge, logTableBusy  limitedLog
	// secret keys the cookies of retries (random per SM start).
	secret [32]byte
	// Markers (switch.go): the token that proves one ours, where they go,
	// the last one's number, the send times of the last markerRing, and
	// caught: every datagram that reached the fabric socket before it has
	// been handled (the send time of the last marker handled); markDone
	// is the last marker handled, expiryAt the earliest end of a waiting
	// head's lifetime (zero: none, or a marker went out since).
	markToken [markerTokenLen]byte
	markAddr  netip.AddrPort
	markSeq   uint64
	markDone  uint64
	markSent  [markerRing]time.Time
	caught    time.Time
	expiryAt  time.Time
	// Control messages waiting for the control goroutine: the attached
	// ports' (each port's own, served round robin) and the rest's.
	ctlPorts fifo[*port]
	ctlNew   fifo[ctlMsg]
	ctlTurn  bool // the rest's turn
	ctlWake  chan struct{}

	unknownSrc, rawReqs, rawDrops             atomic.Uint64
	refusedAttach, foreignDetach, noLIDAttach atomic.Uint64
	sourceLimit, throttled, ctlDrops          atomic.Uint64
	retries, badCookies, unpadded, oldVersion atomic.Uint64
	rmppXfers, rmppRetrans, rmppTimeouts      atomic.Uint64
	rmppAborts                                atomic.Uint64
	saThrottled, tableTooLarge, tableBusy     atomic.Uint64
	saDrop                                    atomic.Bool // Config.SADrop, changeable with SetSADrop
	sendErrors                                atomic.Uint64
	sockDropsSeen                             atomic.Uint32 // the fabric socket's kernel drops at the last look (logSocketDrops)
	rcvbuf                                    int           // the fabric socket's receive buffer
	gso                                       bool          // the kernel takes UDP_SEGMENT sends
	work                                      chan struct{} // wakes the forwarder
	fmu                                       sync.Mutex    // serializes forwarding (pump); before mu
	saveMu                                    sync.Mutex    // serializes state file writes; after mu
	quit                                      chan struct{} // closed by Close

	closeOnce sync.Once
	wg        sync.WaitGroup
}

// New binds the sockets, loads the state file and registers the
// pre-registered ports. Call Run to serve, or Close.
func New(cfg Config) (*SM, error) {
	s, err := newState(cfg)
	if err != nil {
		return nil, err
	}
	// No SO_REUSEADDR nor SO_REUSEPORT: no other socket, of this user or
	// another, may share the address (with SO_REUSEADDR on both, UDP
	// shares a port across users).
	if s.fabric, err = rawudp.ListenUDP("udp", s.cfg.Listen, nil); err != nil {
		return nil, heldError(s.cfg.Listen, err)
	}
	s.rcvbuf = socketBuffer(s.fabric)
	s.markAddr = markerAddr(s.FabricAddr())
	if raw, err := s.fabric.SyscallConn(); err == nil {
		s.gso = mmsg.GSOSupported(raw)
	}
	if s.cfg.SAListen != "" {
		if s.rawSA, err = listenUDP(s.cfg.SAListen); err != nil {
			s.fabric.Close()
			return nil, heldError(s.cfg.SAListen, err)
		}
	}
	return s, nil
}

// newState is New without the sockets: the configuration checked and
// defaulted, the state file loaded, the pre-registered ports registered.
func newState(cfg Config) (*SM, error) {
	if cfg.Listen == "" {
		cfg.Listen = fabric.DefaultListen
	}
	if cfg.SubnetPrefix == 0 {
		cfg.SubnetPrefix = fabric.DefaultSubnetPrefix
	}
	if cfg.SMGUID == 0 {
		cfg.SMGUID = DefaultSMGUID
	}
	if cfg.PortTimeout < 0 {
		return nil, fmt.Errorf("sm: port timeout %v: must not be negative", cfg.PortTimeout)
	}
	if cfg.SAListen != "" && !cfg.SAAllowRemote {
		ap, err := netip.ParseAddrPort(cfg.SAListen)
		if err != nil || !ap.Addr().IsLoopback() {
			return nil, fmt.Errorf("sm: raw SA address %q: not a loopback address (the raw SA port acts for any port; widen it explicitly)", cfg.SAListen)
		}
	}
	s := &SM{
		cfg:     cfg,
		prefix:  cfg.SubnetPrefix,
		timeout: cfg.PortTimeout,
		lids:    newLIDAlloc(cfg.MaxLID),
		byGUID:  make(map[uint64]*port),
		byAddr:  make(map[netip.AddrPort]*port),
		byLID:   make(map[uint16]*port),
		timers:  make(map[*time.Timer]struct{}),
		rmpp:    make(map[rmppKey]*rmppXfer),
		rmppPer: make(map[rmppKey]int),
		work:    make(chan struct{}, 1),
		quit:    make(chan struct{}),

		perSource: make(map[netip.Addr]int),
		ctlWake:   make(chan struct{}, 1),
		saSources: make(map[netip.Addr]*saSource),
		tableWake: make(chan struct{}, 1),
	}
	if s.cfg.HOQLife <= 0 {
		s.cfg.HOQLife = DefaultHOQLife
	}
	if s.cfg.VLStallCount <= 0 {
		s.cfg.VLStallCount = DefaultVLStallCount
	}
	if s.cfg.RMPPTimeout <= 0 {
		s.cfg.RMPPTimeout = DefaultRMPPTimeout
	}
	switch {
	case s.cfg.RMPPRetries == 0:
		s.cfg.RMPPRetries = DefaultRMPPRetries
	case s.cfg.RMPPRetries < 0:
		s.cfg.RMPPRetries = 0
	}
	if s.timeout == 0 {
		s.timeout = fabric.PortTimeout
	}
	s.saDrop.Store(cfg.SADrop)
	if _, err := rand.Read(s.secret[:]); err != nil {
		return nil, err
	}
	if _, err := rand.Read(s.markToken[:]); err != nil {
		return nil, err
	}
	var eb [8]byte
	for s.epoch == 0 {
		if _, err := rand.Read(eb[:]); err != nil {
			return nil, err
		}
		s.epoch = binary.LittleEndian.Uint64(eb[:])
	}
	s.cfg.MaxPortsPerSource = orDefault(cfg.MaxPortsPerSource, DefaultMaxPortsPerSource)
	s.cfg.MaxGroupsPerPort = orDefault(cfg.MaxGroupsPerPort, DefaultMaxGroupsPerPort)
	s.cfg.MaxGroupsPerSource = orDefault(cfg.MaxGroupsPerSource, DefaultMaxGroupsPerSource(cfg.MaxMLID))
	s.cfg.MaxMembershipsPerPort = orDefault(cfg.MaxMembershipsPerPort, DefaultMaxMembershipsPerPort)
	s.cfg.MaxTableRecords = orDefault(cfg.MaxTableRecords, DefaultMaxTableRecords)
	s.sa = sa.New(sa.Config{
		SubnetPrefix:          cfg.SubnetPrefix,
		SendOnlySupport:       cfg.SendOnlySupport,
		MaxMLID:               cfg.MaxMLID,
		RespTimeValue:         sa.RespTimeValueFor(cfg.SADelay),
		MaxGroupsPerPort:      s.cfg.MaxGroupsPerPort,
		MaxGroupsPerSource:    s.cfg.MaxGroupsPerSource,
		MaxMembershipsPerPort: s.cfg.MaxMembershipsPerPort,
		MaxRecords:            s.cfg.MaxTableRecords,
		Logf:                  s.logf,
	})
	if cfg.StateFile != "" {
		if err := s.loadState(); err != nil {
			return nil, err
		}
	}
	for _, guid := range cfg.Ports {
		if s.byGUID[guid] != nil {
			continue
		}
		lid, err := s.lids.lidFor(guid)
		if err != nil {
			return nil, fmt.Errorf("sm: pre-registered port %#x: %w", guid, err)
		}
		p := &port{guid: guid, lid: lid, pre: true}
		s.byGUID[guid] = p
		s.byLID[p.lid] = p
		s.sa.AddPort(sa.Port{GUID: guid, LID: lid, MTU: fabric.PortMTU, Rate: fabric.PortRate})
	}
	s.lids.idleAll(func(g uint64) bool { return s.byGUID[g] != nil })
	if err := s.saveState(); err != nil {
		return nil, err
	}
	s.rebuildMFT()
	return s, nil
}

// DefaultMaxGroupsPerSource is Config.MaxGroupsPerSource's default for
// the MLIDs up to maxMLID (0 → 0xFFFE): a quarter of them, rounded up
// (4096 for 0xC000–0xFFFE, as DefaultMaxGroupsPerPort), so that the
// ports of one address leave three quarters to the others.
func DefaultMaxGroupsPerSource(maxMLID uint16) int {
	if maxMLID == 0 || maxMLID > wire.MulticastLIDMax {
		maxMLID = wire.MulticastLIDMax
	}
	if maxMLID < wire.MulticastLIDBase {
		return 1
	}
	return (int(maxMLID) - wire.MulticastLIDBase + 1 + 3) / 4
}

// orDefault is v, def when v is 0, and 0 (no cap) when v is negative.
func orDefault(v, def int) int {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

func listenUDP(addr string) (*net.UDPConn, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	return net.ListenUDP("udp", ua)
}

// SetSADrop makes the SA stop (true) or resume (false) answering SA MADs,
// as Config.SADrop does from the start: a silent SA for tests.
func (s *SM) SetSADrop(drop bool) { s.saDrop.Store(drop) }

// FabricAddr returns the bound fabric address.
func (s *SM) FabricAddr() netip.AddrPort { return s.fabric.LocalAddr().(*net.UDPAddr).AddrPort() }

// SAAddr returns the bound raw SA address (invalid when disabled).
func (s *SM) SAAddr() netip.AddrPort {
	if s.rawSA == nil {
		return netip.AddrPort{}
	}
	return s.rawSA.LocalAddr().(*net.UDPAddr).AddrPort()
}

// Epoch returns the random epoch of this SM instance.
func (s *SM) Epoch() uint64 { return s.epoch }

// SMGID returns the GID of the SM port.
func (s *SM) SMGID() wire.GID { return fabric.PortGID(s.prefix, s.cfg.SMGUID) }

func (s *SM) logf(format string, args ...any) {
	if s.cfg.Logf != nil {
		s.cfg.Logf(format, args...)
	}
}

// limitedf logs through l: the first event, then at most one line a
// second saying how many happened since the last line.
func (s *SM) limitedf(l *limitedLog, now time.Time, format string, args ...any) {
	if s.cfg.Logf == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	if !l.at.IsZero() && now.Sub(l.at) < time.Second {
		return
	}
	s.logf("%s (%d such since the last line)", fmt.Sprintf(format, args...), l.n)
	l.at, l.n = now, 0
}

// Run serves until ctx is done, then closes the SM and returns nil (or the
// first socket error that is not due to closing).
func (s *SM) Run(ctx context.Context) error {
	errc := make(chan error, 2)
	s.wg.Add(5)
	go func() { defer s.wg.Done(); errc <- s.fabricLoop() }()
	go func() { defer s.wg.Done(); s.forwardLoop() }()
	go func() { defer s.wg.Done(); s.controlLoop() }()
	go func() { defer s.wg.Done(); s.tableLoop() }()
	go func() { defer s.wg.Done(); s.expiryLoop(ctx) }()
	if s.rawSA != nil {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); errc <- s.rawSALoop() }()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	s.Close()
	return err
}

// Close closes the sockets, cancels delayed SA answers and waits for the
// serving goroutines. It is safe to call more than once.
func (s *SM) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		for t := range s.timers {
			if t.Stop() {
				s.wg.Done()
			}
		}
		clear(s.timers)
		s.mu.Unlock()
		close(s.quit)
		s.fabric.Close()
		if s.rawSA != nil {
			s.rawSA.Close()
		}
	})
	s.wg.Wait()
	s.saveIfDirty(time.Time{})
	return nil
}

// saveIfDirty writes the state file when the LIDs changed and the last
// write is stateEvery old (now zero: at once). The map is copied under mu
// (O(ports), at most once per stateEvery) and written without it.
func (s *SM) saveIfDirty(now time.Time) {
	s.mu.Lock()
	if !s.stateDirty || (!now.IsZero() && now.Sub(s.stateAt) < stateEvery) {
		s.mu.Unlock()
		return
	}
	s.stateDirty, s.stateAt = false, now
	lids := maps.Clone(s.lids.byGUID)
	s.mu.Unlock()
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	if err := writeState(s.cfg.StateFile, lids); err != nil {
		s.logf("state file: %v", err)
	}
}

func (s *SM) expiryLoop(ctx context.Context) {
	t := time.NewTicker(max(min(s.timeout/5, 500*time.Millisecond), time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if !s.expire(now) {
				return
			}
			s.saveIfDirty(now)
			s.logSocketDrops()
			s.flushDiscards(now)
		}
	}
}

// expire forgets the ports silent since before now - PortTimeout, the
// longest silent first (O(forgotten), at most expireBatch under one hold
// of mu); false once the SM is closed.
func (s *SM) expire(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n := 0; ; n++ {
		if s.closed {
			return false
		}
		p := s.lruOld
		if p == nil || now.Sub(p.lastSeen) <= s.timeout {
			return true
		}
		s.logf("port %#x (LID %d) silent for %v: forgotten", p.guid, p.lid, s.timeout)
		s.detachLocked(p)
		if n == expireBatch {
			n = 0
			s.mu.Unlock()
			runtime.Gosched() // let the reader and the control goroutine in
			s.mu.Lock()
		}
	}
}

// lruTouch makes p the most recently seen attached port. Caller holds mu.
func (s *SM) lruTouch(p *port) {
	s.lruRemove(p)
	p.older, p.newer, p.inLRU = s.lruNew, nil, true
	if s.lruNew != nil {
		s.lruNew.newer = p
	} else {
		s.lruOld = p
	}
	s.lruNew = p
}

// lruRemove takes p out of the list of attached ports. Caller holds mu.
func (s *SM) lruRemove(p *port) {
	if !p.inLRU {
		return
	}
	if p.older != nil {
		p.older.newer = p.newer
	} else {
		s.lruOld = p.newer
	}
	if p.newer != nil {
		p.newer.older = p.older
	} else {
		s.lruNew = p.older
	}
	p.older, p.newer, p.inLRU = nil, nil, false
}

// controlIn queues a control message for the control goroutine (the
// reader's part: O(1)). A message from an attached port's address is
// taken within the port's budget (ControlBurst, ControlRate) and waits
// with the port's others (at most portPending): the control goroutine
// serves the attached ports round robin, so that no flood of them delays
// a port's keepalive by more than one message of each. Any other message
// waits in one queue of at most newQueue. Beyond, it is dropped. Caller
// holds mu.
func (s *SM) controlIn(b []byte, from netip.AddrPort, now time.Time) {
	if len(b) > MaxControlLen {
		s.ctlDrops.Add(1)
		s.limitedf(&s.logDrop, now, "control message of %d bytes from %v: dropped (longer than %d)", len(b), from, MaxControlLen)
		return
	}
	m := ctlMsg{from: from}
	if p := s.byAddr[from]; p != nil {
		if !p.budget.allow(now, ControlBurst, ControlRate) || len(p.pending) == portPending {
			s.throttled.Add(1)
			s.limitedf(&s.logThrottle, now, "control message from %v (port %#x): dropped, beyond %d a second", from, p.guid, ControlRate)
			return
		}
		m.b = append([]byte(nil), b...)
		if len(p.pending) == 0 {
			s.ctlPorts.push(p)
		}
		p.pending = append(p.pending, m)
	} else {
		if max := s.cfg.MaxPortsPerSource; max > 0 && s.perSource[from.Addr().Unmap()] >= max &&
			!s.refusals.allow(now, RefusalRate, RefusalRate) {
			s.sourceLimit.Add(1)
			s.limitedf(&s.logSource, now, "control message from %v: dropped unread, %d ports attached from %v, the most one source address may attach",
				from, max, from.Addr().Unmap())
			return
		}
		if s.ctlNew.len() == newQueue {
			s.ctlDrops.Add(1)
			s.limitedf(&s.logDrop, now, "control message from %v: dropped, %d from unattached addresses wait already", from, newQueue)
			return
		}
		m.b = append([]byte(nil), b...)
		s.ctlNew.push(m)
	}
	select {
	case s.ctlWake <- struct{}{}:
	default:
	}
}

// nextControl takes the next control message to handle: attached ports
// round robin, and the rest's queue, in turns. Caller holds mu.
func (s *SM) nextControl() (ctlMsg, bool) {
	known, other := s.ctlPorts.len() > 0, s.ctlNew.len() > 0
	if other && (!known || s.ctlTurn) {
		s.ctlTurn = false
		return s.ctlNew.pop(), true
	}
	if !known {
		return ctlMsg{}, false
	}
	s.ctlTurn = true
	p := s.ctlPorts.pop()
	m := p.pending[0]
	p.pending[0] = ctlMsg{}
	p.pending = p.pending[1:]
	if len(p.pending) > 0 {
		s.ctlPorts.push(p)
	} else {
		p.pending = nil
	}
	return m, true
}

// controlLoop handles the queued control messages until Close.
func (s *SM) controlLoop() {
	for {
		select {
		case <-s.ctlWake:
		case <-s.quit:
			return
		}
		for {
			s.mu.Lock()
			m, ok := s.nextControl()
			closed := s.closed
			s.mu.Unlock()
			if !ok || closed {
				break
			}
			s.handleControl(m.b, m.from)
		}
	}
}

func (s *SM) handleControl(b []byte, from netip.AddrPort) {
	c, err := fabric.DecodeControl(b)
	if errors.Is(err, fabric.ErrVersion) {
		s.otherVersion(b, from)
		return
	}
	if err != nil {
		s.limitedf(&s.logBad, time.Now(), "bad control message from %v: %v", from, err)
		return
	}
	switch c.Type {
	case fabric.TypeAttach:
		if c.GUID == 0 {
			s.limitedf(&s.logBad, time.Now(), "attach without GUID from %v", from)
			return
		}
		if !s.proven(c, from, len(b)) {
			return
		}
		lid, rereg, win, err := s.attach(c.GUID, c.NodeDesc, from, c.Credits)
		if err != nil {
			s.refuse(c.GUID, c.Nonce, from, err)
			return
		}
		reply := fabric.EncodeControl(s.sign(&fabric.Control{
			Type: fabric.TypePortInfo, GUID: c.GUID, LID: lid, SMLID: fabric.SMLID,
			SubnetPrefix: s.prefix, PKeys: []uint16{fabric.DefaultPKey}, Epoch: s.epoch,
			MTU: fabric.PortMTU, Rate: fabric.PortRate, State: fabric.StateActive,
			ClientReregister: rereg, Credits: win,
			Session: s.session(from, c.GUID), SMGUID: s.cfg.SMGUID,
		}, c.Nonce))
		if _, err := s.fabric.WriteToUDPAddrPort(reply, from); err != nil {
			s.logf("port_info to %v: %v", from, err)
		}
	case fabric.TypeDetach:
		s.mu.Lock()
		if p := s.byAddr[from]; p != nil && (c.GUID == 0 || c.GUID == p.guid) {
			s.logf("port %#x (LID %d) detached", p.guid, p.lid)
			s.detachLocked(p)
		} else {
			s.foreignDetach.Add(1)
			s.limitedf(&s.logForeign, time.Now(), "detach of %#x from %v ignored: not the port's address", c.GUID, from)
		}
		s.mu.Unlock()
	default:
		s.limitedf(&s.logBad, time.Now(), "unknown control message %q from %v", c.Type, from)
	}
}

// proven reports whether the attach c (len bytes) comes from an address
// proven for its GUID: the GUID's port is registered at from, or c carries
// a valid cookie for from and the GUID. Otherwise it answers with a retry
// (when that is no longer than the attach) and nothing else happens.
func (s *SM) proven(c *fabric.Control, from netip.AddrPort, n int) bool {
	s.mu.Lock()
	p := s.byGUID[c.GUID]
	registered := p != nil && p.attached() && p.addr == from
	s.mu.Unlock()
	if registered {
		return true
	}
	now := time.Now()
	w := cookieWindow(now)
	if len(c.Cookie) > 0 {
		if hmac.Equal(c.Cookie, s.cookie(from, c.GUID, w)) || hmac.Equal(c.Cookie, s.cookie(from, c.GUID, w-1)) {
			return true
		}
		s.badCookies.Add(1)
		s.limitedf(&s.logCookie, now, "attach of %#x from %v: wrong or expired cookie, answered with a retry", c.GUID, from)
	}
	retry := fabric.EncodeControl(&fabric.Control{Type: fabric.TypeRetry, GUID: c.GUID, Cookie: s.cookie(from, c.GUID, w)})
	if len(retry) > n {
		s.unpadded.Add(1)
		s.limitedf(&s.logUnpadded, now, "attach of %#x from %v: %d bytes from an unproven address, shorter than a retry (%d): dropped", c.GUID, from, n, len(retry))
		return false
	}
	// Counted before it leaves, so that whoever reads the answer finds
	// it counted.
	s.retries.Add(1)
	if _, err := s.fabric.WriteToUDPAddrPort(retry, from); err != nil {
		s.sendErrors.Add(1)
		s.limitedf(&s.logRetry, now, "retry to %v: %v", from, err)
		return false
	}
	s.limitedf(&s.logRetry, now, "attach of %#x from %v: address not proven yet, answered with a retry", c.GUID, from)
	return false
}

// cookieWindow is the cookie time unit of t (fabric.CookieWindow).
func cookieWindow(t time.Time) int64 { return t.UnixNano() / int64(fabric.CookieWindow) }

// cookie is the cookie of a retry to from for guid in time unit w: an
// HMAC-SHA256 of them under the SM's secret, cut to fabric.CookieLen.
func (s *SM) cookie(from netip.AddrPort, guid uint64, w int64) []byte {
	var b [16 + 2 + 8 + 8]byte
	a := from.Addr().Unmap().As16()
	copy(b[:16], a[:])
	binary.BigEndian.PutUint16(b[16:], from.Port())
	binary.BigEndian.PutUint64(b[18:], guid)
	binary.BigEndian.PutUint64(b[26:], uint64(w))
	m := hmac.New(sha256.New, s.secret[:])
	m.Write(b[:])
	return m.Sum(nil)[:fabric.CookieLen]
}

// sign sets c's MAC for the attach of nonce when the SM has a key (an
// attach without a nonce gets no MAC: its port cannot check one).
func (s *SM) sign(c *fabric.Control, nonce []byte) *fabric.Control {
	if len(s.cfg.Key) > 0 && len(nonce) > 0 && len(nonce) <= 2*fabric.NonceLen {
		c.MAC = fabric.ControlMAC(s.cfg.Key, nonce, c)
	}
	return c
}

// session is the Session token of the port of guid at from: an HMAC of
// them under the SM's secret (random per SM start), so that it is the
// same in every port_info of this SM to that port and nobody but the SM
// and the port knows it.
func (s *SM) session(from netip.AddrPort, guid uint64) []byte {
	var b [7 + 16 + 2 + 8]byte
	copy(b[:7], "session")
	a := from.Addr().Unmap().As16()
	copy(b[7:23], a[:])
	binary.BigEndian.PutUint16(b[23:], from.Port())
	binary.BigEndian.PutUint64(b[25:], guid)
	m := hmac.New(sha256.New, s.secret[:])
	m.Write(b[:])
	return m.Sum(nil)[:fabric.SessionLen]
}

// heldError explains a failed bind of the fabric address: when another
// socket holds it (EADDRINUSE), who holds it (owner uid, and the process
// where /proc shows it), so that the SM refuses to start saying who took
// its address.
func heldError(listen string, err error) error {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return err
	}
	ap, perr := netip.ParseAddrPort(listen)
	if perr != nil {
		return err
	}
	who := udpowner.Describe(ap)
	if who == "" {
		who = "a socket /proc does not show"
	}
	return fmt.Errorf("%v is held by %s; refusing to start: %w", ap, who, syscall.EADDRINUSE)
}

// otherVersion answers an attach of another protocol version with a
// refused (fabric.ReasonVersion) in that version, when the refusal is no
// longer than the attach; anything else of another version is dropped.
func (s *SM) otherVersion(b []byte, from netip.AddrPort) {
	now := time.Now()
	c, v, err := fabric.DecodeControlAnyVersion(b)
	if err != nil || c.Type != fabric.TypeAttach || c.GUID == 0 {
		s.limitedf(&s.logBad, now, "control message of protocol version %d from %v: dropped", fabric.ControlVersion(b), from)
		return
	}
	s.oldVersion.Add(1)
	r := fabric.EncodeControlVersion(&fabric.Control{Type: fabric.TypeRefused, GUID: c.GUID, Reason: fabric.ReasonVersion}, v)
	if len(r) > len(b) {
		s.limitedf(&s.logVersion, now, "attach of %#x from %v: protocol version %d, this SM speaks %d: dropped (a refusal would be longer)", c.GUID, from, v, fabric.Version)
		return
	}
	if _, err := s.fabric.WriteToUDPAddrPort(r, from); err != nil {
		s.sendErrors.Add(1)
		s.limitedf(&s.logVersion, now, "refused to %v: %v", from, err)
		return
	}
	s.limitedf(&s.logVersion, now, "attach of %#x from %v: protocol version %d, this SM speaks %d: refused", c.GUID, from, v, fabric.Version)
}

// errLive refuses an attach for a GUID registered at another address.
var errLive = errors.New("the GUID is registered at another address")

// ErrSourceLimit reports that the attach's source IP address has
// Config.MaxPortsPerSource ports attached: the attach is refused.
var ErrSourceLimit = errors.New("sm: the source address has the most ports it may attach")

// refuse answers a refused attach with a "refused" control message, so
// that the port fails at once instead of waiting for a port_info.
func (s *SM) refuse(guid uint64, nonce []byte, to netip.AddrPort, err error) {
	reason := fabric.ReasonGUIDInUse
	switch {
	case errors.Is(err, ErrNoLID):
		reason = fabric.ReasonNoLID
	case errors.Is(err, ErrSourceLimit):
		reason = fabric.ReasonSourceLimit
	}
	b := fabric.EncodeControl(s.sign(&fabric.Control{Type: fabric.TypeRefused, GUID: guid, Reason: reason}, nonce))
	if _, err := s.fabric.WriteToUDPAddrPort(b, to); err != nil {
		s.logf("refused to %v: %v", to, err)
	}
}

// attach registers or refreshes a port and returns its LID, whether the
// port registers anew (its memberships, if it had any, are gone) and the
// switch's receive window for it (0 when the port offers no credits: its
// links are not flow controlled).
func (s *SM) attach(guid uint64, desc string, from netip.AddrPort, credits int) (lid uint16, rereg bool, win int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	p := s.byGUID[guid]
	if p != nil && p.attached() && p.addr != from {
		if now.Sub(p.lastSeen) <= s.timeout {
			s.refusedAttach.Add(1)
			s.limitedf(&s.logRefused, now, "attach of %#x from %v refused: %v (%v)", guid, from, errLive, p.addr)
			return 0, false, 0, fmt.Errorf("%w (%v)", errLive, p.addr)
		}
		s.logf("port %#x (LID %d) silent for %v: forgotten", p.guid, p.lid, s.timeout)
		s.detachLocked(p)
		p = s.byGUID[guid]
	}
	other := s.byAddr[from]
	if (p == nil || !p.attached()) && other == nil && s.cfg.MaxPortsPerSource > 0 &&
		s.perSource[from.Addr().Unmap()] >= s.cfg.MaxPortsPerSource {
		s.sourceLimit.Add(1)
		s.limitedf(&s.logSource, now, "attach of %#x from %v refused: %d ports attached from %v, the most one source address may attach",
			guid, from, s.cfg.MaxPortsPerSource, from.Addr().Unmap())
		return 0, false, 0, ErrSourceLimit
	}
	if other != nil && other != p {
		// The socket's own owner attaches another GUID: its old port goes.
		s.logf("port %#x replaced by %#x at %v", other.guid, guid, from)
		s.detachLocked(other)
	}
	if p == nil {
		lid, err := s.lids.lidFor(guid)
		if err != nil {
			s.noLIDAttach.Add(1)
			s.limitedf(&s.logNoLID, now, "attach of %#x from %v refused: %v", guid, from, err)
			return 0, false, 0, err
		}
		p = &port{guid: guid, lid: lid}
		s.byGUID[guid] = p
		s.byLID[p.lid] = p
		s.stateDirty = s.cfg.StateFile != ""
	}
	rereg = !p.attached()
	if len(desc) > MaxNodeDesc {
		desc = cutUTF8(desc, MaxNodeDesc)
	}
	if rereg {
		s.logf("port %#x attached at %v: LID %d %q", guid, from, p.lid, desc)
		p.addr = from
		s.byAddr[from] = p
		s.perSource[from.Addr().Unmap()]++
		s.resizeWindows()
		credits = min(max(credits, 0), fabric.MaxWindow)
		p.ls.link.Reset(credits, s.win)
		p.ls.stallCount, p.ls.dropUntil = 0, time.Time{}
	}
	if !s.sa.HasPort(guid) {
		s.sa.AddPort(sa.Port{GUID: guid, LID: p.lid, MTU: fabric.PortMTU, Rate: fabric.PortRate})
	}
	if p.desc != desc {
		p.desc = desc
	}
	p.lastSeen = now
	s.lruTouch(p)
	if p.ls.link.On {
		win = s.win
	}
	return p.lid, rereg, win, nil
}

// cutUTF8 cuts s to at most n bytes, not inside a UTF-8 sequence.
func cutUTF8(s string, n int) string {
	for n > 0 && n < len(s) && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// resizeWindows shares the fabric socket's buffer among the attached
// ports: a port's window (the most packets it may have in flight to the
// switch) shrinks as ports attach; credit already granted stays, and a
// window that grew is advertised when the port next asks for credit or
// its queue drains. O(1). Caller holds mu.
func (s *SM) resizeWindows() {
	s.win = fabric.Window(s.rcvbuf, len(s.byAddr))
}

// detachLocked removes a port's attachment and memberships; ports that
// were not pre-registered are forgotten (their LID stays reserved).
func (s *SM) detachLocked(p *port) {
	if p.attached() {
		delete(s.byAddr, p.addr)
		src := p.addr.Addr().Unmap()
		if s.perSource[src]--; s.perSource[src] <= 0 {
			delete(s.perSource, src)
			delete(s.saSources, src) // transfers and queries keep their pointer
		}
		p.addr = netip.AddrPort{}
		p.c.drops.Add(uint64(p.ls.dropQueue())) // a port that went down loses what it sent
		p.ls.link = fabric.Link{}
		p.ls.wantFlow = false
		p.budget, p.saBudget, p.tableBudget = bucket{}, bucket{}, bucket{}
		s.lruRemove(p)
		s.resizeWindows()
	}
	// The SA marks the MLIDs of the port's memberships changed: the
	// forwarding table follows entry by entry (rebuildMFT).
	if p.pre {
		s.sa.LeaveAll(p.guid)
	} else {
		s.sa.RemovePort(p.guid)
		delete(s.byGUID, p.guid)
		delete(s.byLID, p.lid)
		s.lids.forget(p.guid)
	}
}

// rebuildMFT brings the multicast forwarding table up to date: the
// entries of the MLIDs the SA changed (all of it the first time). A port
// that attaches has no memberships yet, and a port that goes loses its
// memberships at the SA, so attachments need no full rebuild. Caller
// holds mu (or is New).
func (s *SM) rebuildMFT() {
	if s.mft != nil && s.mftVer == s.sa.Version() {
		return
	}
	if s.mft != nil {
		for _, mlid := range s.sa.TakeChanged() {
			if guids, ok := s.sa.MulticastEntry(mlid); ok {
				s.mft[mlid] = s.portsOf(guids)
			} else {
				delete(s.mft, mlid)
			}
		}
		s.mftVer = s.sa.Version()
		return
	}
	s.sa.TakeChanged()
	mft := make(map[uint16][]*port)
	for mlid, guids := range s.sa.MulticastTable() {
		mft[mlid] = s.portsOf(guids)
	}
	s.mft, s.mftVer = mft, s.sa.Version()
}

// portsOf returns the known ports among guids. Caller holds mu.
func (s *SM) portsOf(guids []uint64) []*port {
	var ps []*port
	for _, g := range guids {
		if p := s.byGUID[g]; p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

// saFromFabric is the SA agent at QP1: checks the UD packet, answers
// from SLID 1 / QP1 to the requester's SLID and source QP, with the GIDs
// swapped when the request had a GRH. Caller holds mu.
func (s *SM) saFromFabric(b []byte, p *port) {
	var pkt fabric.Packet
	if err := fabric.Parse(b, &pkt); err != nil {
		p.c.drops.Add(1)
		s.logf("SA packet from %#x: %v", p.guid, err)
		return
	}
	if pkt.UD.BTH.DestQP() != fabric.SAQPN || pkt.UD.DETH.QKey() != fabric.SAQKey || len(pkt.UD.Payload) < mad.Len {
		p.c.drops.Add(1)
		s.logf("SA packet from %#x: DestQP %d Q_Key %#x payload %d", p.guid,
			pkt.UD.BTH.DestQP(), pkt.UD.DETH.QKey(), len(pkt.UD.Payload))
		return
	}
	p.c.sa.Add(1)
	if s.saDrop.Load() {
		return
	}
	req := append(mad.MAD(nil), pkt.UD.Payload[:mad.Len]...)
	guid := p.guid
	hdr := fabric.UDPacket{
		SL: pkt.LRH.SL(), DLID: pkt.LRH.SLID(), SLID: fabric.SMLID,
		UD: wire.UDHeader{PKey: pkt.UD.BTH.PKey(), DestQP: pkt.UD.DETH.SrcQP(), QKey: fabric.SAQKey, SrcQP: fabric.SAQPN},
	}
	if pkt.Global() {
		hdr.Global = true
		hdr.GRH = wire.IBGRHFields{TClass: pkt.GRH.TClass(), FlowLabel: pkt.GRH.FlowLabel(),
			HopLmt: pkt.GRH.HopLmt(), SGID: pkt.GRH.DGID(), DGID: pkt.GRH.SGID()}
	}
	send := func(r mad.MAD) {
		d := s.byGUID[guid]
		if d == nil || !d.attached() {
			return
		}
		h := hdr
		h.UD.PSN = s.psn & 0xFFFFFF
		s.psn++
		out := make([]byte, fabric.PacketLen(len(r), false, h.Global))
		fabric.EncodeUD(out, &h, r)
		// A management packet: counted on the link, sent without credit.
		d.ls.link.Sent(1)
		if _, err := s.fabric.WriteToUDPAddrPort(out, d.addr); err != nil {
			s.logf("SA answer to %#x: %v", guid, err)
			return
		}
		d.c.tx.Add(1)
	}
	key := rmppKey{guid: guid, tid: req.TID()}
	if isRMPPControl(req) {
		s.rmppReceive(key, req, send)
		return
	}
	srcAddr := p.addr.Addr().Unmap()
	src := s.saSources[srcAddr]
	if src == nil {
		src = &saSource{}
		s.saSources[srcAddr] = src
	}
	query := s.sa.Broad(req)
	if !s.saAllow(&p.saBudget, &p.tableBudget, src, query, func() string { return fmt.Sprintf("port %#x (%v)", guid, p.addr) }) {
		return
	}
	if query {
		s.saLater(func() {
			s.queueTable(tableJob{req: req, from: sa.From{GUID: guid, Source: srcAddr}, key: key, send: send, src: src, who: fmt.Sprintf("%#x", guid)})
		})
		return
	}
	s.saLater(func() {
		resps := s.sa.Handle(req, sa.From{GUID: guid, Source: srcAddr})
		if s.cfg.Logf != nil {
			s.logf("SA %s from %#x → %s", describe(req), guid, describeResp(resps))
		}
		s.answer(key, req, resps, send, src)
	})
}

// saAllow takes an SA request's tokens: the port's and the source's
// (nil port buckets: a raw SA peer), and for a query their table tokens
// too. Beyond, the request is dropped, counted and logged. Caller holds
// mu.
func (s *SM) saAllow(reqs, tables *bucket, src *saSource, query bool, who func() string) bool {
	now := time.Now()
	why := ""
	switch {
	case !reqs.allow(now, SARequestBurst, SARequestRate):
		why = fmt.Sprintf("beyond %d SA requests a second from the port", SARequestRate)
	case !src.reqs.allow(now, SASourceBurst, SASourceRate):
		why = fmt.Sprintf("beyond %d SA requests a second from its source address", SASourceRate)
	case query && !tables.allow(now, TableBurst, TableRate):
		why = fmt.Sprintf("beyond %d broad queries (Get, GetTable) a second from the port", TableRate)
	case query && !src.tables.allow(now, TableSourceBurst, TableSourceRate):
		why = fmt.Sprintf("beyond %d broad queries (Get, GetTable) a second from its source address", TableSourceRate)
	default:
		return true
	}
	s.saThrottled.Add(1)
	if s.cfg.Logf != nil {
		s.limitedf(&s.logSAThrottle, now, "SA request from %s: dropped, %s", who(), why)
	}
	return false
}

// queueTable queues a query for the table goroutine; when tableQueue
// wait already it is answered 0x0100 at once. Caller holds mu.
func (s *SM) queueTable(j tableJob) {
	if s.tables.len() >= tableQueue {
		s.tableBusy.Add(1)
		s.limitedf(&s.logTableBusy, time.Now(), "SA %s from %s: answered 0x0100, %d queries wait already", describe(j.req), j.who, tableQueue)
		j.send(sa.ErrorReply(j.req, mad.StatusNoResources)[0])
		return
	}
	s.tables.push(j)
	select {
	case s.tableWake <- struct{}{}:
	default:
	}
}

// tableLoop answers the queued queries until Close, one at a time: under
// mu the SA copies what a query needs (sa.Prepare: at most every port or
// group), without mu the answer is built (sa.Query.Build: bounded by
// Config.MaxTableRecords), under mu again it is sent. So a query holds up
// neither the reader nor the joins of other ports for longer than the
// copy.
func (s *SM) tableLoop() {
	for {
		select {
		case <-s.tableWake:
		case <-s.quit:
			return
		}
		for {
			s.mu.Lock()
			if s.closed || s.tables.len() == 0 {
				s.mu.Unlock()
				break
			}
			j := s.tables.pop()
			resps, q := s.sa.Prepare(j.req, j.from)
			s.mu.Unlock()
			tooLarge := false
			if q != nil {
				resps, tooLarge = q.Build()
			}
			s.mu.Lock()
			if s.closed {
				s.mu.Unlock()
				return
			}
			now := time.Now()
			if tooLarge {
				s.tableTooLarge.Add(1)
				s.limitedf(&s.logTooLarge, now, "SA %s from %s: answered 0x0100, more than %d records (or %d candidates)",
					describe(j.req), j.who, s.cfg.MaxTableRecords, sa.WorkFactor*s.cfg.MaxTableRecords)
			}
			if s.cfg.Logf != nil {
				s.logf("SA %s from %s → %s", describe(j.req), j.who, describeResp(resps))
			}
			s.answer(j.key, j.req, resps, j.send, j.src)
			s.mu.Unlock()
		}
	}
}

// rmppKey names an RMPP transfer: its TID and the requester (a port over
// the fabric, or a raw SA peer).
type rmppKey struct {
	guid uint64
	raw  netip.AddrPort
	tid  uint64
}

// rmppXfer is an RMPP transfer in progress.
type rmppXfer struct {
	snd   *mad.RMPPSender
	send  func(mad.MAD)
	timer *time.Timer
	bytes int       // its segments' (RMPPBytes, RMPPSourceBytes)
	src   *saSource // charged for bytes
}

// requester is the requester of a transfer: its key without the TID.
func (k rmppKey) requester() rmppKey {
	k.tid = 0
	return k
}

// isRMPPControl reports an RMPP ACK, STOP or ABORT (for the RMPP sender,
// not the SA).
func isRMPPControl(m mad.MAD) bool {
	return m.RMPPFlags()&mad.RMPPFlagActive != 0 && m.RMPPType() != mad.RMPPTypeData
}

// answer sends the SA's response MADs to req: a plain MAD at once, the
// segments of an RMPP-active answer through a windowed RMPP sender — unless
// the requester has MaxRMPPPerRequester transfers in progress or the
// segments would exceed src's RMPPSourceBytes or RMPPBytes: then the
// answer is 0x0100 (TableBusy). A transfer with the same key (requester
// and TID) is replaced. Caller holds mu.
func (s *SM) answer(key rmppKey, req mad.MAD, resps []mad.MAD, send func(mad.MAD), src *saSource) {
	if len(resps) == 0 {
		return
	}
	if resps[0].RMPPFlags()&mad.RMPPFlagActive == 0 {
		for _, r := range resps {
			send(r)
		}
		return
	}
	if old := s.rmpp[key]; old != nil {
		s.rmppEnd(key, old)
	}
	n := len(resps) * mad.Len
	if s.rmppPer[key.requester()] >= MaxRMPPPerRequester || s.rmppBytes+n > RMPPBytes || src.rmppBytes+n > RMPPSourceBytes {
		s.tableBusy.Add(1)
		s.limitedf(&s.logTableBusy, time.Now(), "SA %s: answered 0x0100, the requester has %d RMPP transfers in progress (at most %d), its source address %d bytes of them (%d), all %d (%d); this one %d",
			describe(req), s.rmppPer[key.requester()], MaxRMPPPerRequester, src.rmppBytes, RMPPSourceBytes, s.rmppBytes, RMPPBytes, n)
		send(sa.ErrorReply(req, mad.StatusNoResources)[0])
		return
	}
	x := &rmppXfer{snd: mad.NewRMPPSender(resps, s.cfg.RMPPRetries), send: send, bytes: n, src: src}
	s.rmpp[key] = x
	s.rmppPer[key.requester()]++
	s.rmppBytes += n
	src.rmppBytes += n
	s.rmppXfers.Add(1)
	s.rmppSend(key, x, x.snd.Start())
}

// rmppEnd forgets a transfer: its timer, its count and bytes. Caller
// holds mu.
func (s *SM) rmppEnd(key rmppKey, x *rmppXfer) {
	s.stopTimer(x.timer)
	delete(s.rmpp, key)
	who := key.requester()
	if s.rmppPer[who]--; s.rmppPer[who] <= 0 {
		delete(s.rmppPer, who)
	}
	s.rmppBytes -= x.bytes
	x.src.rmppBytes -= x.bytes
}

// rmppSend sends segments of a transfer and (re)arms its ACK timer.
// Caller holds mu.
func (s *SM) rmppSend(key rmppKey, x *rmppXfer, segs []mad.MAD) {
	for _, m := range segs {
		x.send(m)
	}
	s.stopTimer(x.timer)
	x.timer = s.after(s.cfg.RMPPTimeout, func() { s.rmppTimeout(key, x) })
}

// rmppTimeout resends the window's unacknowledged segments or drops the
// transfer once its retries are used. Caller holds mu.
func (s *SM) rmppTimeout(key rmppKey, x *rmppXfer) {
	if s.rmpp[key] != x {
		return
	}
	x.timer = nil
	segs := x.snd.Timeout()
	if done, _ := x.snd.Done(); done {
		s.rmppTimeouts.Add(1)
		s.rmppEnd(key, x)
		s.logf("RMPP transfer tid %#x: no ACK after %d retries (%d segments acknowledged): dropped", key.tid, s.cfg.RMPPRetries, x.snd.Acked())
		return
	}
	s.rmppRetrans.Add(uint64(len(segs)))
	s.rmppSend(key, x, segs)
}

// rmppReceive hands an RMPP ACK, STOP or ABORT to its transfer; one for
// no transfer in progress is ignored. Caller holds mu.
func (s *SM) rmppReceive(key rmppKey, m mad.MAD, reply func(mad.MAD)) {
	x := s.rmpp[key]
	if x == nil {
		return
	}
	segs, progress, abort := x.snd.Receive(m)
	if abort != nil {
		reply(abort)
	}
	if done, err := x.snd.Done(); done {
		s.rmppEnd(key, x)
		if err != nil {
			s.rmppAborts.Add(1)
			s.logf("RMPP transfer tid %#x: %v (RMPP type %d status %d)", key.tid, err, m.RMPPType(), m.RMPPStatus())
		}
		return
	}
	if progress || len(segs) > 0 {
		s.rmppSend(key, x, segs)
	}
}

// saLater runs f (under mu) now, or after SADelay on a timer. Caller holds mu.
func (s *SM) saLater(f func()) {
	if s.cfg.SADelay <= 0 {
		f()
		s.rebuildMFT()
		return
	}
	s.after(s.cfg.SADelay, func() {
		f()
		s.rebuildMFT()
	})
}

// after runs f under mu after d unless the timer is stopped (stopTimer)
// or the SM closes first. Caller holds mu.
func (s *SM) after(d time.Duration, f func()) *time.Timer {
	s.wg.Add(1)
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		defer s.wg.Done()
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.timers[t]; !ok || s.closed {
			return // stopped, or the SM closed
		}
		delete(s.timers, t)
		f()
	})
	s.timers[t] = struct{}{}
	return t
}

// stopTimer cancels a timer of after (nil: none). Caller holds mu.
func (s *SM) stopTimer(t *time.Timer) {
	if t == nil {
		return
	}
	if _, ok := s.timers[t]; !ok {
		return
	}
	delete(s.timers, t)
	if t.Stop() {
		s.wg.Done()
	}
}

func (s *SM) rawSALoop() error {
	buf := make([]byte, 65536)
	for {
		n, from, err := s.rawSA.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		s.rawReqs.Add(1)
		if n != mad.Len || s.saDrop.Load() || (!s.cfg.SAAllowRemote && !from.Addr().Unmap().IsLoopback()) {
			s.rawDrops.Add(1)
			continue
		}
		req := append(mad.MAD(nil), buf[:n]...)
		send := func(r mad.MAD) {
			if _, err := s.rawSA.WriteToUDPAddrPort(r, from); err != nil {
				s.logf("raw SA answer to %v: %v", from, err)
			}
		}
		key := rmppKey{raw: from, tid: req.TID()}
		s.mu.Lock()
		if isRMPPControl(req) {
			s.rmppReceive(key, req, send)
			s.mu.Unlock()
			continue
		}
		src := &s.rawSource
		query := s.sa.Broad(req)
		if !s.saAllow(nil, nil, src, query, func() string { return fmt.Sprintf("raw %v", from) }) {
			s.mu.Unlock()
			continue
		}
		if query {
			s.saLater(func() {
				s.queueTable(tableJob{req: req, from: sa.From{Raw: true, Source: from.Addr().Unmap()}, key: key, send: send, src: src, who: fmt.Sprintf("raw %v", from)})
			})
			s.mu.Unlock()
			continue
		}
		s.saLater(func() {
			resps := s.sa.Handle(req, sa.From{Raw: true, Source: from.Addr().Unmap()})
			if s.cfg.Logf != nil {
				s.logf("SA %s from raw %v → %s", describe(req), from, describeResp(resps))
			}
			s.answer(key, req, resps, send, src)
		})
		s.mu.Unlock()
	}
}

func describe(m mad.MAD) string {
	s := fmt.Sprintf("method %#02x attr %#04x tid %#x", m.Method(), m.AttrID(), m.TID())
	if m.AttrID() == mad.AttrMCMemberRecord {
		r := m.MCMemberRecord()
		s += fmt.Sprintf(" mgid %v port %v js %#x mask %#x", r.MGID(), r.PortGID(), r.JoinState(), m.CompMask())
	}
	return s
}

func describeResp(rs []mad.MAD) string {
	switch len(rs) {
	case 0:
		return "no answer"
	case 1:
		return fmt.Sprintf("status %#04x", rs[0].Status())
	}
	return fmt.Sprintf("%d RMPP segments", len(rs))
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
		SocketBuffer: s.rcvbuf, SendErrors: s.sendErrors.Load(), SocketDrops: uint64(s.socketDrops())}
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

// stateFile is the JSON of Config.StateFile.
type stateFile struct {
	Version int               `json:"version"`
	LIDs    map[string]uint16 `json:"lids"` // "0x100001" → 2
}

func (s *SM) loadState() error {
	b, err := os.ReadFile(s.cfg.StateFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("state file %s: %w", s.cfg.StateFile, err)
	}
	for k, lid := range st.LIDs {
		var guid uint64
		if _, err := fmt.Sscanf(k, "0x%x", &guid); err != nil || !validUnicast(lid) || lid > s.lids.max {
			return fmt.Errorf("state file %s: bad entry %q: %d", s.cfg.StateFile, k, lid)
		}
		s.lids.bind(guid, lid)
	}
	return nil
}

// saveState writes the GUID → LID map now (New). Caller holds mu.
func (s *SM) saveState() error {
	if s.cfg.StateFile == "" {
		return nil
	}
	s.stateDirty = false
	return writeState(s.cfg.StateFile, s.lids.byGUID)
}

// writeState writes a GUID → LID map to file (temporary file, then
// rename); no file: nothing.
func writeState(file string, lids map[uint64]uint16) error {
	if file == "" {
		return nil
	}
	st := stateFile{Version: 1, LIDs: make(map[string]uint16, len(lids))}
	for guid, lid := range lids {
		st.LIDs[fmt.Sprintf("%#x", guid)] = lid
	}
	b, err := json.MarshalIndent(&st, "", "  ")
	if err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}
