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
// Floods (the SM keeps answering): the reader only sorts
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
// Forged source addresses: an attach is answered only
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
// Manager: all of the above is softsm's own SM (Config.Manager
// ManagerSoftsm, the default). With ManagerOpenSM, Debian's OpenSM runs
// the subnet (opensm.go): the SM starts it under libumad2sim.so against
// package ib/sma's model, a port's attach is answered once OpenSM made
// the port Active (with OpenSM's LID for it and OpenSM's own LID as
// SMLID), the ports' SA MADs are relayed to OpenSM's SA and its answers
// back, and the switch forwards unicast and multicast by the forwarding
// tables OpenSM programs (same credits, same head-of-queue rules; a
// multicast packet never goes back to its sender). The attach rules,
// address validation and control and SA request budgets stay as above.
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
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
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
	// Manager is who manages the subnet: ManagerSoftsm ("" too: this
	// SM assigns the LIDs, its SA answers, the switch forwards by its
	// tables) or ManagerOpenSM (OpenSM does all three: see opensm.go;
	// SAListen must be empty; SADelay hands the ports' SA MADs to OpenSM
	// when it has passed (OpenSM's ClassPortInfo does not advertise it);
	// SADrop keeps them from OpenSM, so that its SA falls silent).
	Manager string
	// OpenSM configures ManagerOpenSM.
	OpenSM OpenSMConfig
	// ViaSwitch sends every data packet through the switch. By default
	// softsm's own SM forwards directly: the ports send to each other by
	// the routes it gives them, without the switch's hop (see direct.go
	// and ib/fabric's direct.go). With ManagerOpenSM every packet goes
	// through the switch, by OpenSM's tables.
	ViaSwitch bool
	// Key, if set, is the subnet's key (fabric.ReadKeyFile): every
	// port_info and refused carries a MAC under it over the nonce of the
	// attach it answers (fabric.ControlMAC), so that a port configured
	// with the key takes answers from this SM only.
	Key []byte
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
	// What the port was told in OpenSM mode.
	ext extPort
	// Its direct forwarding state (direct.go).
	dir directPort
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
	ext     *extSM // OpenSM in charge (nil: softsm's own SM)

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
	// Direct forwarding (direct.go): the pairings, the ports holding
	// each DLID's route, the ports whose routes are ready to go out once
	// the batch they waited for went out (dready) and those to put on
	// the visit list after forwardLocked (dlate), the DLIDs whose
	// destinations changed, and forwarding: forwardLocked runs.
	dpairs     map[pairKey]*pairing
	dsubs      map[uint16]map[*port]struct{}
	dready     []*port
	dlate      []*port
	dchanged   []uint16
	forwarding bool
	// Control messages waiting for the control goroutine: the attached
	// ports' (each port's own, served round robin) and the rest's.
	ctlPorts fifo[*port]
	ctlNew   fifo[ctlMsg]
	ctlTurn  bool // the rest's turn
	ctlWake  chan struct{}

	unknownSrc, rawReqs, rawDrops             atomic.Uint64
	dRoutes, dPairs, dRefused, dDrops         atomic.Uint64
	refusedAttach, foreignDetach, noLIDAttach atomic.Uint64
	sourceLimit, throttled, ctlDrops          atomic.Uint64
	retries, badCookies, unpadded, oldVersion atomic.Uint64
	rmppXfers, rmppRetrans, rmppTimeouts      atomic.Uint64
	rmppAborts                                atomic.Uint64
	saThrottled, tableTooLarge, tableBusy     atomic.Uint64
	saDrop                                    atomic.Bool // Config.SADrop
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
	if s.cfg.Manager == ManagerOpenSM {
		if s.ext, err = s.newExt(s.cfg.OpenSM); err != nil {
			s.fabric.Close()
			return nil, err
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
	switch cfg.Manager {
	case "", ManagerSoftsm:
		cfg.Manager = ManagerSoftsm
	case ManagerOpenSM:
		if cfg.SAListen != "" {
			return nil, fmt.Errorf("sm: the raw SA port is softsm's SA: not with OpenSM in charge")
		}
	default:
		return nil, fmt.Errorf("sm: manager %q: want %q or %q", cfg.Manager, ManagerSoftsm, ManagerOpenSM)
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
		dpairs:  make(map[pairKey]*pairing),
		dsubs:   make(map[uint16]map[*port]struct{}),
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

// SetSADrop makes the SA stop (true) or resume (false) answering SA MADs
// while the SM runs: Config.SADrop (softsm -sa-drop) at run time, for
// trying how a program copes when its SA falls silent mid-run. With
// OpenSM in charge the ports' SA MADs are not relayed to OpenSM meanwhile.
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
	if s.ext != nil {
		if err := s.startExt(); err != nil {
			s.Close()
			return err
		}
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
		if s.ext != nil {
			s.stopExt()
		}
	})
	s.wg.Wait()
	s.removeExtDir()
	s.saveIfDirty(time.Time{})
	return nil
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
