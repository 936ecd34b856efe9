// Package ib is softrdma's InfiniBand provider: a host channel adapter
// port attached to an emulated subnet (ib/sm: subnet manager, SA and
// switch in one process) over UDP. It implements softverbs.Driver with the
// InfiniBand rules (LIDs, multicast LIDs from 0xC000, P_Keys) and sends
// real IB packets (LRH/GRH/BTH/DETH/ICRC/VCRC) to the switch. It is only
// the port: the SA client, its multicast join engine and the IPoIB
// broadcast membership belong to the host (rdmacm/saclient, which finds
// the port by driver.MADPort), as in the kernel's ib_core.
//
// A port is opened with Open (or by the RDMA CM when SOFTRDMA_SM names a
// subnet manager); the local address of its fabric socket plays the role
// of the port's IPoIB address: binding an RDMA CM id to it selects the
// port.
package ib

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/internal/sys/rawudp"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// Config describes a port to attach to a subnet.
type Config struct {
	// SM is the subnet manager's fabric address, e.g. "127.0.0.1:4792".
	SM string
	// Local is the port's IPoIB address: the fabric socket binds to it and
	// RDMA CM ids bound to it use this port. Required.
	Local netip.Addr
	// GUID is the port GUID; 0 derives one from the process and address.
	GUID uint64
	// Name is the device name; "" gives softib<N>.
	Name string
	// SATimeout is how long an SA request waits for an answer (default 3 s,
	// as the kernel's join/leave MADs); SARetries how often it is resent.
	SATimeout time.Duration
	SARetries int
	// ActivateTimeout bounds how long Open waits for the SM (default 5 s).
	ActivateTimeout time.Duration
	// Host is the host whose device list the port joins (nil:
	// verbs.DefaultHost).
	Host *verbs.Host
	// LinkStallTimeout bounds how long a send waits for credit from the
	// switch (default fabric.DefaultLinkStall); then the packet is dropped,
	// and so is every packet until credit comes (LinkStallDrops).
	LinkStallTimeout time.Duration
	// SMKey, if set, is the subnet's key (fabric.ReadKeyFile): the port
	// takes the SM's answers only with its MAC over the port's nonce (see
	// smauth.go). SMKeyFile, when SMKey is not set, names the file Open
	// reads it from (OpenFromEnv: SOFTRDMA_SM_KEY_FILE).
	SMKey     []byte
	SMKeyFile string
	// TrustSMUIDs are uids the port trusts, besides root and its own
	// effective uid, as the owner of the socket at the SM's address when
	// it has no key (OpenFromEnv: SOFTRDMA_SM_UID).
	TrustSMUIDs []int
}

// PortEventKind is an asynchronous port event (enum ib_event_type subset).
type PortEventKind int

// Port events.
const (
	// ClientReregister: the SM asks clients to re-register (an SM restart).
	ClientReregister PortEventKind = iota + 1
	// LIDChange: the port's LID changed.
	LIDChange
	// PortError: the port lost the subnet manager.
	PortError
	// PortActive: the port is active again.
	PortActive
)

// PortEvent is delivered to subscribers of a device.
type PortEvent struct{ Kind PortEventKind }

// Registry is a host's InfiniBand ports.
type Registry struct {
	host *verbs.Host
	mu   sync.Mutex
	devs []*Device
	env  sync.Mutex // serializes OpenFromEnv
	// tried: the ports of EnvPorts were opened (discover.go); under env.
	tried bool
	// names numbers the host's ports softib0, softib1…, as a machine
	// numbers its own HCAs.
	names atomic.Int64
}

type registryKey struct{}

// On returns the InfiniBand ports of a host (the package-level functions
// use verbs.DefaultHost). Closing the host closes them.
func On(h *verbs.Host) *Registry {
	return h.Value(registryKey{}, func() any {
		r := &Registry{host: h}
		h.OnClose(r.CloseAll)
		return r
	}).(*Registry)
}

func defaultRegistry() *Registry { return On(verbs.DefaultHost()) }

// Device is an InfiniBand port of this process on an emulated subnet.
type Device struct {
	cfg    Config
	name   string
	guid   uint64
	vdev   *verbs.Device
	reg    *Registry
	core   *softverbs.Device
	conn   *rawudp.Conn   // out of the netpoller for writing: see internal/sys/rawudp
	smAddr netip.AddrPort // sm, unmapped: the only source the port trusts
	smDst  netip.AddrPort // sm as the socket sends to it (sendmmsg)
	gso    bool           // the kernel takes UDP_SEGMENT sends

	mu       sync.Mutex
	lid      uint16
	smLID    uint16
	prefix   uint64
	epoch    uint64
	mtu      uint8
	rate     uint8
	active   bool
	lastSeen time.Time
	activeCh chan struct{}
	// refusal is why the SM refused the port's attach (set once, before
	// the first port_info, then refusedCh is closed).
	refusal   error
	refusedCh chan struct{}
	// cookie is the SM's last retry's, sent in every attach until a
	// port_info comes (ib/fabric's address validation); retryOK is set
	// by each keepalive and taken by the retry answered at once.
	cookie  []byte
	retryOK bool
	subs    []portSub // in subscription order: the host's SA client first
	nextSub int
	qpns    map[uint32]bool // QPNs in use
	nextQPN uint32
	closed  bool

	// The link to the switch (link.go).
	lmu     sync.Mutex
	link    fabric.Link
	linkOn  atomic.Bool   // link.On, for the receive goroutine
	linkCh  chan struct{} // closed when credit comes
	stalled bool
	lastReq time.Time
	rxWin   int // the port's receive window at the switch, in packets

	// Direct forwarding (direct.go): its state (dmu), the peers by
	// address for the receive goroutine, and the port's markers (their
	// token, the last sent under lmu, the last read, markCh closed and
	// renewed under lmu when one is read), sent to itself (self; selfDst
	// as the socket sends to it).
	dmu       sync.Mutex
	dir       directState
	directOn  atomic.Bool // dir.on, for the receive loop
	peers     atomic.Pointer[map[netip.AddrPort]*peerLink]
	markToken [16]byte
	markSeq   uint64
	markSeen  atomic.Uint64
	markCh    chan struct{}
	self      netip.AddrPort
	selfDst   netip.AddrPort

	// auth is what the port knows of its SM's identity (smauth.go; under
	// mu); smTrusted is set while the SM at smAddr is authenticated: IB
	// and flow control packets are taken only then.
	auth      smAuth
	smTrusted atomic.Bool

	agents atomic.Pointer[[]madAgent] // QP1's MAD agents (RegisterMADAgent)
	events chan PortEvent
	done   chan struct{}
	wg     sync.WaitGroup
}

// Open attaches a new port to the subnet manager at cfg.SM and waits until
// it is active (the SM gave it a LID). It fails at once when the SM
// refuses the attach: with EADDRINUSE when the GUID is in use at another
// address, ENOSPC when the subnet has no free LID; and with ETIMEDOUT when
// the SM does not answer within cfg.ActivateTimeout.
func Open(cfg Config) (*Device, error) {
	if cfg.SM == "" || !cfg.Local.IsValid() {
		return nil, fmt.Errorf("ib: open: need an SM address and a local address: %w", syscall.EINVAL)
	}
	sm, err := net.ResolveUDPAddr("udp", cfg.SM)
	if err != nil {
		return nil, fmt.Errorf("ib: open: SM address %q: %v: %w", cfg.SM, err, syscall.EINVAL)
	}
	if cfg.SATimeout <= 0 {
		cfg.SATimeout = 3 * time.Second
	}
	if cfg.SARetries <= 0 {
		cfg.SARetries = 1
	}
	if cfg.Host == nil {
		cfg.Host = verbs.DefaultHost()
	}
	if cfg.ActivateTimeout <= 0 {
		cfg.ActivateTimeout = 5 * time.Second
	}
	if cfg.LinkStallTimeout <= 0 {
		cfg.LinkStallTimeout = fabric.DefaultLinkStall
	}
	conn, err := rawudp.ListenUDP("udp", netip.AddrPortFrom(cfg.Local, 0).String(), nil)
	if err != nil {
		return nil, fmt.Errorf("ib: open: %w", err)
	}
	d := &Device{
		cfg: cfg, conn: conn, guid: cfg.GUID,
		smAddr:   netip.AddrPortFrom(sm.AddrPort().Addr().Unmap(), sm.AddrPort().Port()),
		activeCh: make(chan struct{}), refusedCh: make(chan struct{}),
		qpns: map[uint32]bool{}, nextQPN: 2,
		done: make(chan struct{}), events: make(chan PortEvent, 16),
		linkCh: make(chan struct{}),
	}
	rcvbuf := socketBuffer(conn)
	d.rxWin = switchWindow(rcvbuf)
	d.initDirect(rcvbuf)
	la := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	d.self = netip.AddrPortFrom(la.Addr().Unmap(), la.Port())
	d.selfDst = d.sendAddr(d.self)
	smIP := d.smAddr.Addr()
	if !cfg.Local.Is4() && smIP.Is4() {
		smIP = netip.AddrFrom16(smIP.As16()) // an IPv6 socket sends to IPv4 as mapped
	}
	d.smDst = netip.AddrPortFrom(smIP, d.smAddr.Port())
	if err = d.setupAuth(); err == nil {
		err = d.preCheck()
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("ib: open: %w", err)
	}
	if raw, err := conn.SyscallConn(); err == nil {
		d.gso = mmsg.GSOSupported(raw)
	}
	if d.guid == 0 {
		h := fnv.New64a()
		fmt.Fprintf(h, "%d/%s/%d", os.Getpid(), cfg.Local, conn.LocalAddr().(*net.UDPAddr).Port)
		d.guid = h.Sum64()&0x0000ffffffffffff | 0x0002c90000000000
	}
	d.core = softverbs.New(d)
	r := On(cfg.Host)
	d.name = cfg.Name
	if d.name == "" {
		d.name = fmt.Sprintf("softib%d", r.names.Add(1)-1)
	}

	d.wg.Add(3)
	go d.receiveLoop()
	go d.keepalive()
	go d.eventLoop()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.ActivateTimeout)
	defer cancel()
	select {
	case <-d.activeCh:
	case <-d.refusedCh:
		d.shutdown()
		return nil, fmt.Errorf("ib: open %s: %w", d.name, d.refusal)
	case <-ctx.Done():
		d.shutdown()
		return nil, fmt.Errorf("ib: open %s: no answer from the subnet manager at %s: %w", d.name, cfg.SM, syscall.ETIMEDOUT)
	}
	d.reg = r
	d.vdev = r.host.RegisterDevice(d.core)
	r.mu.Lock()
	r.devs = append(r.devs, d)
	r.mu.Unlock()
	return d, nil
}

// ForAddr returns the open port of verbs.DefaultHost whose local address
// is a, or nil.
func ForAddr(a netip.Addr) *Device { return defaultRegistry().ForAddr(a) }

// OpenFromEnv is Registry.OpenFromEnv on verbs.DefaultHost.
func OpenFromEnv(a netip.Addr) (*Device, error) { return defaultRegistry().OpenFromEnv(a) }

// CloseAll closes every port of verbs.DefaultHost (tests).
func CloseAll() { defaultRegistry().CloseAll() }

// ForAddr returns the host's open port whose local address is a, or nil.
func (r *Registry) ForAddr(a netip.Addr) *Device {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.devs {
		if d.cfg.Local == a.Unmap().WithZone("") {
			return d
		}
	}
	return nil
}

// OpenFromEnv returns the host's port for local address a on the subnet
// named by the SOFTRDMA_SM environment variable (opening it on first use),
// or nil when the variable is unset. SOFTRDMA_SM_KEY_FILE names the
// subnet's key file and SOFTRDMA_SM_UID the uids trusted to run the SM
// besides root and this user (Config.SMKeyFile, Config.TrustSMUIDs).
func (r *Registry) OpenFromEnv(a netip.Addr) (*Device, error) {
	sm := os.Getenv("SOFTRDMA_SM")
	if sm == "" {
		return nil, nil
	}
	r.env.Lock()
	defer r.env.Unlock()
	if d := r.ForAddr(a); d != nil {
		return d, nil
	}
	uids, err := ParseUIDs(os.Getenv(fabric.EnvTrustUID))
	if err != nil {
		return nil, fmt.Errorf("ib: open: %w", err)
	}
	return Open(Config{SM: sm, Local: a.Unmap().WithZone(""), Host: r.host,
		SMKeyFile: os.Getenv(fabric.EnvKeyFile), TrustSMUIDs: uids})
}

// addrOwner finds the port of an IPoIB address for the RDMA CM
// (driver.AddrOwner).
type addrOwner struct{}

// DeviceForAddr returns the host's open port whose IPoIB address a is, or
// the port OpenFromEnv opens for it; (nil, nil) when there is none.
func (addrOwner) DeviceForAddr(h driver.Host, a netip.Addr) (driver.DeviceOps, error) {
	r := On(h.(*verbs.Host))
	d := r.ForAddr(a)
	if d == nil {
		var err error
		if d, err = r.OpenFromEnv(a); err != nil || d == nil {
			return nil, err
		}
	}
	return d.core, nil
}

// AddrOrder puts IB ports before kinds that claim every address of an
// interface: an IPoIB address may also be an interface's (127.0.0.x).
func (addrOwner) AddrOrder() int { return 10 }

// A port carries the host's SA client's MADs.
var _ driver.MADPort = (*Device)(nil)

func init() { driver.RegisterAddrOwner("ib", addrOwner{}) }

// CloseAll closes every port of the host.
func (r *Registry) CloseAll() {
	r.mu.Lock()
	devs := r.devs
	r.devs = nil
	r.mu.Unlock()
	for _, d := range devs {
		d.Close()
	}
}

// Name returns the device name.
func (d *Device) Name() string { return d.name }

// SMLID returns the subnet manager's LID (driver.MADPort).
func (d *Device) SMLID() uint16 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.smLID
}

// GUID returns the port GUID.
func (d *Device) GUID() uint64 { return d.guid }

// Verbs returns the verbs device.
func (d *Device) Verbs() *verbs.Device { return d.vdev }

// LocalAddr returns the port's IPoIB address.
func (d *Device) LocalAddr() netip.Addr { return d.cfg.Local }

// LID returns the port's LID (0 while not active).
func (d *Device) LID() uint16 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lid
}

// PortGID returns GID 0: the subnet prefix and the port GUID.
func (d *Device) PortGID() verbs.GID {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.portGIDLocked()
}

func (d *Device) portGIDLocked() verbs.GID {
	var g verbs.GID
	binary.BigEndian.PutUint64(g[0:8], d.prefix)
	binary.BigEndian.PutUint64(g[8:16], d.guid)
	return g
}

// Attr implements softverbs.Driver.
func (d *Device) Attr() verbs.DeviceAttr {
	return verbs.DeviceAttr{
		NodeGUID: d.guid, SysImageGUID: d.guid, VendorID: 0x02c9, VendorPartID: 0x1003, FWVer: "softrdma",
		PhysPortCnt: 1, MaxQP: 65536, MaxQPWR: 16384, MaxSGE: 32, MaxCQ: 65536, MaxCQE: 65536,
		MaxMR: 1 << 20, MaxPD: 1 << 16, MaxAH: 1 << 20, MaxMcastGrp: 16384, MaxMcastQPAttach: 56,
		MaxTotalMcastQP: 0x70000, MaxInlineData: 256,
	}
}

// QueryPort implements softverbs.Driver.
func (d *Device) QueryPort(port uint8) (verbs.PortAttr, error) {
	if port != 1 {
		return verbs.PortAttr{}, fmt.Errorf("ib: port %d: %w", port, syscall.EINVAL)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st := verbs.PortDown
	if d.active {
		st = verbs.PortActive
	}
	return verbs.PortAttr{
		State: st, MaxMTU: verbs.MTU4096, ActiveMTU: verbs.MTU(d.mtu), GIDTblLen: 1, PKeyTblLen: 1,
		LID: d.lid, SMLID: d.smLID, LinkLayer: verbs.LinkLayerInfiniBand,
	}, nil
}

// GIDTable implements softverbs.Driver: one GID, the subnet prefix + GUID.
func (d *Device) GIDTable(port uint8) ([]verbs.GIDEntry, error) {
	if port != 1 {
		return nil, fmt.Errorf("ib: port %d: %w", port, syscall.EINVAL)
	}
	return []verbs.GIDEntry{{GID: d.PortGID(), Index: 0, PortNum: 1, Type: verbs.GIDTypeIB}}, nil
}

// portSub is one subscriber of the port's events.
type portSub struct {
	id int
	fn func(PortEvent)
}

// Watch calls fn for every port event until cancel is called.
// Subscribers are called one after another in the order they subscribed,
// so the host's SA client (subscribed when the device was registered)
// has reset its memberships before a program hears of the event.
func (d *Device) Watch(fn func(PortEvent)) (cancel func()) {
	d.mu.Lock()
	id := d.nextSub
	d.nextSub++
	d.subs = append(d.subs, portSub{id, fn})
	d.mu.Unlock()
	return func() {
		d.mu.Lock()
		d.subs = slices.DeleteFunc(d.subs, func(s portSub) bool { return s.id == id })
		d.mu.Unlock()
	}
}

func (d *Device) emit(ev PortEvent) {
	d.mu.Lock()
	subs := slices.Clone(d.subs)
	d.mu.Unlock()
	for _, s := range subs {
		s.fn(ev)
	}
}

// keepalive sends attach every second and notices a silent SM.
func (d *Device) keepalive() {
	defer d.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		d.sendAttach(true)
		select {
		case <-d.done:
			return
		case <-t.C:
		}
		d.silentCheck()
		d.mu.Lock()
		lost := d.active && time.Since(d.lastSeen) > 5*time.Second
		if lost {
			d.active = false
		}
		d.mu.Unlock()
		if lost {
			select {
			case d.events <- PortEvent{Kind: PortError}:
			case <-d.done:
				return
			}
		}
	}
}

// sendAttach sends an attach (a keepalive when keepalive is set), with
// the cookie of the SM's last retry until a port_info comes, and a new
// nonce (smauth.go).
func (d *Device) sendAttach(keepalive bool) {
	d.mu.Lock()
	cookie := d.cookie
	if keepalive {
		d.retryOK = true
	}
	nonce := d.newNonceLocked()
	d.mu.Unlock()
	d.sendControl(&fabric.Control{Type: fabric.TypeAttach, GUID: d.guid, NodeDesc: "softrdma " + d.cfg.Local.String(),
		Credits: d.rxWin, Cookie: cookie, Nonce: nonce})
}

func (d *Device) sendControl(c *fabric.Control) {
	d.conn.WriteToUDPAddrPort(fabric.EncodeControl(c), d.smDst)
}

// portInfo applies the SM's answer; an epoch or LID change is a client
// reregister / LID change for the multicast engine.
func (d *Device) portInfo(c *fabric.Control) {
	d.mu.Lock()
	first := d.lid == 0 && !d.active && d.epoch == 0
	wasActive := d.active
	epochChanged := d.epoch != 0 && (c.Epoch != d.epoch || c.ClientReregister)
	lidChanged := d.lid != 0 && c.LID != d.lid
	d.lid, d.smLID, d.prefix, d.epoch = c.LID, c.SMLID, c.SubnetPrefix, c.Epoch
	d.mtu, d.rate = c.MTU, c.Rate
	d.cookie = nil
	d.active = true
	d.lastSeen = time.Now()
	d.mu.Unlock()
	if first || epochChanged {
		// The SM registered the port anew: both ends count from 0.
		d.resetLink(min(max(c.Credits, 0), fabric.MaxWindow))
	}
	d.directConfig(c.Direct, c.Session, c.SMLID, first || epochChanged)
	var kind PortEventKind
	switch {
	case first:
		close(d.activeCh)
		return
	case epochChanged:
		kind = ClientReregister
	case lidChanged:
		kind = LIDChange
	case !wasActive:
		kind = PortActive
	default:
		return
	}
	// Off the receive goroutine: subscribers may take their time. Close
	// ends the wait (the event loop is gone then).
	select {
	case d.events <- PortEvent{Kind: kind}:
	case <-d.done:
	}
}

// eventLoop hands port events to the subscribers, in order.
func (d *Device) eventLoop() {
	defer d.wg.Done()
	for {
		select {
		case ev := <-d.events:
			d.emit(ev)
		case <-d.done:
			return
		}
	}
}

// Close detaches the port from the subnet and unregisters the device.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return fmt.Errorf("ib: close %s: %w", d.name, syscall.EINVAL)
	}
	d.closed = true
	d.mu.Unlock()
	if r := d.reg; r != nil {
		r.mu.Lock()
		r.devs = slices.DeleteFunc(r.devs, func(x *Device) bool { return x == d })
		r.mu.Unlock()
		r.host.UnregisterDevice(d.vdev)
	}
	d.core.Close()
	d.sendControl(&fabric.Control{Type: fabric.TypeDetach, GUID: d.guid})
	d.shutdown()
	return nil
}

func (d *Device) shutdown() {
	close(d.done)
	d.conn.Close()
	d.wg.Wait()
}
