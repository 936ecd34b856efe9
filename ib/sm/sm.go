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
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sa"
	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/internal/sys/rawudp"
	"github.com/softrdma/softrdma/wire"
)

// DefaultSMGUID is the SM port's GUID; its GID is fe80::1.
const DefaultSMGUID = 1

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
	// Logf, if set, receives one line per event (attach, detach, SA
	// request, drop reason).
	Logf func(format string, args ...any)
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
	// RMPPTransfers counts RMPP transfers (GetTable answers) started;
	// RMPPRetransmits segments sent again after an ACK timeout;
	// RMPPTimeouts transfers dropped after their retries; RMPPAborts
	// transfers ended by a STOP or ABORT from the receiver or by a bad ACK.
	RMPPTransfers, RMPPRetransmits, RMPPTimeouts, RMPPAborts uint64
	// SocketBuffer is the fabric socket's receive buffer (bytes, as the
	// kernel reports it); SendErrors counts datagrams the kernel refused
	// to send.
	SocketBuffer int
	SendErrors   uint64
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

	mu      sync.Mutex
	sa      *sa.SA
	lids    *lidAlloc
	byGUID  map[uint64]*port
	byAddr  map[netip.AddrPort]*port
	byLID   map[uint16]*port
	mft     map[uint16][]*port
	mftVer  uint64
	mftAddr bool // attachments changed since the MFT was built
	psn     uint32
	timers  map[*time.Timer]struct{}
	rmpp    map[rmppKey]*rmppXfer
	closed  bool

	unknownSrc, rawReqs, rawDrops             atomic.Uint64
	refusedAttach, foreignDetach, noLIDAttach atomic.Uint64
	rmppXfers, rmppRetrans, rmppTimeouts      atomic.Uint64
	rmppAborts                                atomic.Uint64
	saDrop                                    atomic.Bool // Config.SADrop, changeable with SetSADrop
	sendErrors                                atomic.Uint64
	rcvbuf                                    int           // the fabric socket's receive buffer
	gso                                       bool          // the kernel takes UDP_SEGMENT sends
	work                                      chan struct{} // wakes the forwarder
	fmu                                       sync.Mutex    // serializes forwarding (pump); before mu
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
	if s.fabric, err = rawudp.ListenUDP("udp", s.cfg.Listen, nil); err != nil {
		return nil, err
	}
	s.rcvbuf = socketBuffer(s.fabric)
	if raw, err := s.fabric.SyscallConn(); err == nil {
		s.gso = mmsg.GSOSupported(raw)
	}
	if s.cfg.SAListen != "" {
		if s.rawSA, err = listenUDP(s.cfg.SAListen); err != nil {
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
		work:    make(chan struct{}, 1),
		quit:    make(chan struct{}),
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
	var eb [8]byte
	for s.epoch == 0 {
		if _, err := rand.Read(eb[:]); err != nil {
			return nil, err
		}
		s.epoch = binary.LittleEndian.Uint64(eb[:])
	}
	s.sa = sa.New(sa.Config{
		SubnetPrefix:    cfg.SubnetPrefix,
		SendOnlySupport: cfg.SendOnlySupport,
		MaxMLID:         cfg.MaxMLID,
		RespTimeValue:   sa.RespTimeValueFor(cfg.SADelay),
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
		s.sa.AddPort(sa.Port{GUID: guid, MTU: fabric.PortMTU, Rate: fabric.PortRate})
	}
	s.lids.idleAll(func(g uint64) bool { return s.byGUID[g] != nil })
	if err := s.saveState(); err != nil {
		return nil, err
	}
	s.rebuildMFT()
	return s, nil
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

// Run serves until ctx is done, then closes the SM and returns nil (or the
// first socket error that is not due to closing).
func (s *SM) Run(ctx context.Context) error {
	errc := make(chan error, 2)
	s.wg.Add(3)
	go func() { defer s.wg.Done(); errc <- s.fabricLoop() }()
	go func() { defer s.wg.Done(); s.forwardLoop() }()
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
	return nil
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
		}
	}
}

// expire forgets the ports silent since before now - PortTimeout; false
// once the SM is closed.
func (s *SM) expire(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	for _, p := range s.sortedPorts() {
		if p.attached() && now.Sub(p.lastSeen) > s.timeout {
			s.logf("port %#x (LID %d) silent for %v: forgotten", p.guid, p.lid, s.timeout)
			s.detachLocked(p)
		}
	}
	return true
}

func (s *SM) handleControl(b []byte, from netip.AddrPort) {
	c, err := fabric.DecodeControl(b)
	if err != nil {
		s.logf("bad control message from %v: %v", from, err)
		return
	}
	switch c.Type {
	case fabric.TypeAttach:
		if c.GUID == 0 {
			s.logf("attach without GUID from %v", from)
			return
		}
		lid, rereg, win, err := s.attach(c.GUID, c.NodeDesc, from, c.Credits)
		if err != nil {
			s.logf("attach of %#x from %v refused: %v", c.GUID, from, err)
			s.refuse(c.GUID, from, err)
			return
		}
		reply := fabric.EncodeControl(&fabric.Control{
			Type: fabric.TypePortInfo, GUID: c.GUID, LID: lid, SMLID: fabric.SMLID,
			SubnetPrefix: s.prefix, PKeys: []uint16{fabric.DefaultPKey}, Epoch: s.epoch,
			MTU: fabric.PortMTU, Rate: fabric.PortRate, State: fabric.StateActive,
			ClientReregister: rereg, Credits: win,
		})
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
			s.logf("detach of %#x from %v ignored: not the port's address", c.GUID, from)
		}
		s.mu.Unlock()
	default:
		s.logf("unknown control message %q from %v", c.Type, from)
	}
}

// errLive refuses an attach for a GUID registered at another address.
var errLive = errors.New("the GUID is registered at another address")

// refuse answers a refused attach with a "refused" control message, so
// that the port fails at once instead of waiting for a port_info.
func (s *SM) refuse(guid uint64, to netip.AddrPort, err error) {
	reason := fabric.ReasonGUIDInUse
	if errors.Is(err, ErrNoLID) {
		reason = fabric.ReasonNoLID
	}
	b := fabric.EncodeControl(&fabric.Control{Type: fabric.TypeRefused, GUID: guid, Reason: reason})
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
			return 0, false, 0, fmt.Errorf("%w (%v)", errLive, p.addr)
		}
		s.logf("port %#x (LID %d) silent for %v: forgotten", p.guid, p.lid, s.timeout)
		s.detachLocked(p)
		p = s.byGUID[guid]
	}
	if other := s.byAddr[from]; other != nil && other != p {
		// The socket's own owner attaches another GUID: its old port goes.
		s.logf("port %#x replaced by %#x at %v", other.guid, guid, from)
		s.detachLocked(other)
	}
	if p == nil {
		lid, err := s.lids.lidFor(guid)
		if err != nil {
			s.noLIDAttach.Add(1)
			return 0, false, 0, err
		}
		p = &port{guid: guid, lid: lid}
		s.byGUID[guid] = p
		s.byLID[p.lid] = p
		if err := s.saveState(); err != nil {
			s.logf("state file: %v", err)
		}
	}
	rereg = !p.attached()
	if rereg {
		s.logf("port %#x attached at %v: LID %d %q", guid, from, p.lid, desc)
		p.addr = from
		s.byAddr[from] = p
		s.mftAddr = true
		s.resizeWindows()
		credits = min(max(credits, 0), fabric.MaxWindow)
		p.ls.link.Reset(credits, p.ls.win)
		p.ls.stallCount, p.ls.dropUntil = 0, time.Time{}
	}
	if !s.sa.HasPort(guid) {
		s.sa.AddPort(sa.Port{GUID: guid, MTU: fabric.PortMTU, Rate: fabric.PortRate})
	}
	p.desc = desc
	p.lastSeen = now
	if p.ls.link.On {
		win = p.ls.win
	}
	return p.lid, rereg, win, nil
}

// resizeWindows shares the fabric socket's buffer among the attached
// ports: a port's window (the most packets it may have in flight to the
// switch) shrinks as ports attach; credit already granted stays. Caller
// holds mu.
func (s *SM) resizeWindows() {
	w := fabric.Window(s.rcvbuf, len(s.byAddr))
	for _, p := range s.byAddr {
		p.ls.win = w
	}
}

// detachLocked removes a port's attachment and memberships; ports that
// were not pre-registered are forgotten (their LID stays reserved).
func (s *SM) detachLocked(p *port) {
	if p.attached() {
		delete(s.byAddr, p.addr)
		p.addr = netip.AddrPort{}
		p.ls.dropQueue()
		p.ls.link = fabric.Link{}
		s.resizeWindows()
	}
	if p.pre {
		s.sa.LeaveAll(p.guid)
	} else {
		s.sa.RemovePort(p.guid)
		delete(s.byGUID, p.guid)
		delete(s.byLID, p.lid)
		s.lids.forget(p.guid)
	}
	s.mftAddr = true
}

// rebuildMFT brings the multicast forwarding table up to date: the
// entries of the MLIDs the SA changed, or all of it when the attachments
// changed. Caller holds mu (or is New).
func (s *SM) rebuildMFT() {
	if s.mft != nil && s.mftVer == s.sa.Version() && !s.mftAddr {
		return
	}
	if s.mft != nil && !s.mftAddr {
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
	s.mft, s.mftVer, s.mftAddr = mft, s.sa.Version(), false
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
	s.saLater(func() {
		resps := s.sa.Handle(req, sa.From{GUID: guid})
		if s.cfg.Logf != nil {
			s.logf("SA %s from %#x → %s", describe(req), guid, describeResp(resps))
		}
		s.answer(key, resps, send)
	})
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
}

// isRMPPControl reports an RMPP ACK, STOP or ABORT (for the RMPP sender,
// not the SA).
func isRMPPControl(m mad.MAD) bool {
	return m.RMPPFlags()&mad.RMPPFlagActive != 0 && m.RMPPType() != mad.RMPPTypeData
}

// answer sends the SA's response MADs: a plain MAD at once, the segments
// of an RMPP-active answer through a windowed RMPP sender. Caller holds mu.
func (s *SM) answer(key rmppKey, resps []mad.MAD, send func(mad.MAD)) {
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
		s.stopTimer(old.timer)
	}
	x := &rmppXfer{snd: mad.NewRMPPSender(resps, s.cfg.RMPPRetries), send: send}
	s.rmpp[key] = x
	s.rmppXfers.Add(1)
	s.rmppSend(key, x, x.snd.Start())
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
		delete(s.rmpp, key)
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
		s.stopTimer(x.timer)
		delete(s.rmpp, key)
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
		s.saLater(func() {
			resps := s.sa.Handle(req, sa.From{Raw: true})
			if s.cfg.Logf != nil {
				s.logf("SA %s from raw %v → %s", describe(req), from, describeResp(resps))
			}
			s.answer(key, resps, send)
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
	st := Stats{UnknownSource: s.unknownSrc.Load(), RawSARequests: s.rawReqs.Load(), RawSADrops: s.rawDrops.Load(),
		RefusedAttaches: s.refusedAttach.Load(), ForeignDetaches: s.foreignDetach.Load(), NoLIDAttaches: s.noLIDAttach.Load(),
		RMPPTransfers: s.rmppXfers.Load(), RMPPRetransmits: s.rmppRetrans.Load(), RMPPTimeouts: s.rmppTimeouts.Load(), RMPPAborts: s.rmppAborts.Load(),
		SocketBuffer: s.rcvbuf, SendErrors: s.sendErrors.Load()}
	for _, p := range s.sortedPorts() {
		st.Ports = append(st.Ports, PortStats{
			GUID: p.guid, LID: p.lid, NodeDesc: p.desc, Attached: p.attached(), Addr: p.addr, PreRegistered: p.pre,
			RxPackets: p.c.rx.Load(), TxPackets: p.c.tx.Load(), Forwarded: p.c.fwd.Load(),
			Drops: p.c.drops.Load(), SARequests: p.c.sa.Load(),
			FlowControl: p.ls.link.On, Window: p.ls.win, Credits: p.ls.link.Credits(),
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

// saveState writes the GUID → LID map (temporary file, then rename).
func (s *SM) saveState() error {
	if s.cfg.StateFile == "" {
		return nil
	}
	st := stateFile{Version: 1, LIDs: make(map[string]uint16, len(s.lids.byGUID))}
	for guid, lid := range s.lids.byGUID {
		st.LIDs[fmt.Sprintf("%#x", guid)] = lid
	}
	b, err := json.MarshalIndent(&st, "", "  ")
	if err != nil {
		return err
	}
	tmp := s.cfg.StateFile + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, s.cfg.StateFile)
}
