// Package rxe is softrdma's software RoCEv2 device: a userspace Soft-RoCE
// that speaks real RoCEv2 (UDP port 4791, BTH/DETH/ImmDt, ICRC) on ordinary
// UDP sockets and interoperates with Linux rdma_rxe.
//
// There is one Device per network interface per process, created on first
// use (ForInterface, ForName, ForAddr) and named like rxe: rxe_<ifname>.
// Each device registers itself with package verbs and implements its
// provider seam (softverbs.Driver and softverbs.DriverQP) for UD QPs.
//
// Sockets. Receiving uses UDP sockets bound to 0.0.0.0:4791 / [::]:4791
// with SO_REUSEPORT (so several processes of one user share the port;
// another user cannot bind it beside them) and IP_MULTICAST_ALL=0 (a
// socket only gets the groups it joined).
// Group memberships are spread over several such sockets, at most
// net.ipv4.igmp_max_memberships per socket; a socket and its receive
// goroutine live only while they hold memberships (the unicast sockets
// below while the device has QPs). Sending uses one
// unconnected UDP socket per block of 255 QPs, bound to the wildcard
// address and an ephemeral port; IP_PMTUDISC_DO makes the kernel send
// DF=1 and IP ID 0, so the ICRC is computed before sendmsg. QPNs are
// (send socket port << 8) | index, unique on the host (in the network
// namespace) while the socket lives.
//
// Receiving through a UDP socket hides the IPv4 header: the ICRC check
// solves for the unknown IP identification and DF bit (wire.SolveIPv4ID),
// which leaves 15 bits of the ICRC to catch corruption (a random corrupt
// IPv4 frame passes with probability 2^-15; IPv6 has no unknown and keeps
// all 32 bits). IPv6 groups (MLD) are supported, as an extension: Linux rxe
// refuses them.
//
// Unicast. The kernel gives a unicast datagram to one of the host's
// sockets on UDP 4791, in whichever process of the user; a device that
// reads one for a QPN of another device hands it over to the owner's send
// block over a unix socket only that user can reach, and the owner checks
// and delivers it (see forward.go and handover.go). While a device has QPs
// it keeps unicast receive sockets on 4791 that hold no membership.
//
// Limits: a hop limit of 0 cannot be expressed per datagram (IP_TTL must
// be 1-255): multicast then uses the socket's multicast TTL, 0 (local loop
// only), and unicast the kernel's default TTL.
package rxe

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
)

// Default multicast limits (struct ibv_device_attr).
const (
	// DefaultMaxMcastGrp is the default max_mcast_grp.
	DefaultMaxMcastGrp = 16384
	// DefaultMaxMcastQPAttach is the default max_mcast_qp_attach (rxe: 56).
	DefaultMaxMcastQPAttach = 56
	// DefaultMaxTotalMcastQP is the default max_total_mcast_qp_attach (rxe: 0x70000).
	DefaultMaxTotalMcastQP = 0x70000
)

// Options are a device's multicast limits. A zero field means the default.
type Options struct {
	MaxMcastGrp      int // distinct multicast groups (max_mcast_grp)
	MaxMcastQPAttach int // QPs attached to one group (max_mcast_qp_attach)
	MaxTotalMcastQP  int // attachments over all groups (max_total_mcast_qp_attach)
}

func (o Options) withDefaults() Options {
	if o.MaxMcastGrp == 0 {
		o.MaxMcastGrp = DefaultMaxMcastGrp
	}
	if o.MaxMcastQPAttach == 0 {
		o.MaxMcastQPAttach = DefaultMaxMcastQPAttach
	}
	if o.MaxTotalMcastQP == 0 {
		o.MaxTotalMcastQP = DefaultMaxTotalMcastQP
	}
	return o
}

// Device is a software RoCEv2 device bound to one network interface. It
// implements softverbs.Driver. Its methods are safe for concurrent use.
type Device struct {
	name    string
	ifindex int
	guid    uint64
	vdev    *verbs.Device
	core    *softverbs.Device
	reg     *Registry

	info   atomic.Pointer[ifInfo]
	infoMu sync.Mutex // serializes refreshes

	// Hot-path tables, immutable once published.
	ownPorts4 atomic.Pointer[[]uint16] // the IPv4 send sockets' ports: the QPN prefixes
	ownPorts6 atomic.Pointer[[]uint16] // the IPv6 send sockets' ports

	// ho hands unicast datagrams over to their owner (handover.go).
	ho handover

	// gsi is QP1 while an agent has it open (gsi.go).
	gsi atomic.Pointer[gsiPort]
	// answering is set while an unclaimed SIDR_REQ is answered (gsi.go).
	answering atomic.Bool

	// uinputs are the unicast receive sockets and hand-over connections,
	// which consumers of the device's other inputs read too while they
	// are active (progress.go); changed under mu.
	uinputs atomic.Pointer[[]*uinput]

	// peers opens the peer sockets while the device has unicast sockets
	// (peers.go).
	peers atomic.Pointer[peerSocks]

	mu     sync.Mutex // control plane: everything below
	closed bool
	limits Options
	blocks []*sendBlock
	mships map[netip.Addr]*membership
	rsocks []*recvSock
	usocks []*recvSock // unicast receive sockets, while the device has QPs
	guard  *demuxGuard // while the device has an IPv4 socket on 4791

	wg sync.WaitGroup // receive goroutines

	ev events
}

func newDevice(r *Registry, ifindex int, o Options) (*Device, error) {
	info, err := loadIfInfo(ifindex)
	if err != nil {
		return nil, err
	}
	d := &Device{
		name:    "rxe_" + info.name,
		ifindex: ifindex,
		guid:    nodeGUID(info.mac, ifindex),
		limits:  o.withDefaults(),
		mships:  map[netip.Addr]*membership{},
	}
	d.info.Store(info)
	d.ownPorts4.Store(&[]uint16{})
	d.ownPorts6.Store(&[]uint16{})
	d.reg = r
	d.core = softverbs.New(d)
	d.vdev = r.host.RegisterDevice(d.core)
	return d, nil
}

// Name returns the device name, rxe_<ifname>.
func (d *Device) Name() string { return d.name }

// Ifindex returns the index of the device's network interface.
func (d *Device) Ifindex() int { return d.ifindex }

// Verbs returns the device as registered with package verbs.
func (d *Device) Verbs() *verbs.Device { return d.vdev }

// SetLimits changes the device's multicast limits (zero fields take the
// defaults). Existing groups and attachments are kept; the limits apply to
// later attaches. Negative values are refused with EINVAL.
func (d *Device) SetLimits(o Options) error {
	if o.MaxMcastGrp < 0 || o.MaxMcastQPAttach < 0 || o.MaxTotalMcastQP < 0 {
		return fmt.Errorf("rxe: limits %+v: %w", o, syscall.EINVAL)
	}
	d.mu.Lock()
	d.limits = o.withDefaults()
	d.mu.Unlock()
	return nil
}

// Attr returns the device capabilities (softverbs.Driver).
func (d *Device) Attr() verbs.DeviceAttr {
	d.mu.Lock()
	l := d.limits
	d.mu.Unlock()
	return verbs.DeviceAttr{
		NodeGUID:         d.guid,
		SysImageGUID:     d.guid,
		VendorID:         0xFFFFFF, // XRXE_VENDOR_ID
		VendorPartID:     0,
		HWVer:            0,
		FWVer:            "0.0.0",
		PhysPortCnt:      1,
		MaxQP:            maxQP,
		MaxQPWR:          16384,
		MaxSGE:           32,
		MaxCQ:            16384,
		MaxCQE:           65536,
		MaxMR:            0x40000,
		MaxPD:            0x10000,
		MaxAH:            0x8000,
		MaxMcastGrp:      l.MaxMcastGrp,
		MaxMcastQPAttach: l.MaxMcastQPAttach,
		MaxTotalMcastQP:  l.MaxTotalMcastQP,
		MaxInlineData:    256,
	}
}

// refreshInfo re-reads the interface and publishes the new snapshot. On
// failure (the interface is gone) the old snapshot stays, marked down.
func (d *Device) refreshInfo() (*ifInfo, error) {
	d.infoMu.Lock()
	defer d.infoMu.Unlock()
	info, err := loadIfInfo(d.ifindex)
	if err != nil {
		old := *d.info.Load()
		old.up = false
		d.info.Store(&old)
		return &old, err
	}
	d.info.Store(info)
	return info, nil
}

// currentInfo returns the interface's state: the cached copy while the
// netlink watcher keeps it up to date (it refreshes it on every link and
// address change), else a fresh read (two netlink dumps).
func (d *Device) currentInfo() *ifInfo {
	d.ev.mu.Lock()
	watched := d.ev.done != nil && d.ev.live
	d.ev.mu.Unlock()
	if watched {
		return d.info.Load()
	}
	info, _ := d.refreshInfo()
	return info
}

// QueryPort returns the attributes of port 1 (softverbs.Driver): Ethernet link
// layer, ACTIVE while the interface is up and running, active MTU from the
// netdev MTU like rxe.
func (d *Device) QueryPort(port uint8) (verbs.PortAttr, error) {
	if port != 1 {
		return verbs.PortAttr{}, fmt.Errorf("rxe: %s: port %d: %w", d.name, port, syscall.EINVAL)
	}
	info := d.currentInfo()
	st := verbs.PortDown
	if info.up {
		st = verbs.PortActive
	}
	return verbs.PortAttr{
		State:      st,
		MaxMTU:     verbs.MTU4096,
		ActiveMTU:  info.activeMTU(),
		GIDTblLen:  gidTableLen,
		PKeyTblLen: 1,
		LinkLayer:  verbs.LinkLayerEthernet,
		NetdevMTU:  info.mtu,
	}, nil
}

// GIDTable returns port 1's GID table (softverbs.Driver): index 0 is the
// IPv4-mapped first IPv4 address of the interface, then its other IPv4
// addresses, then its IPv6 addresses, all of type RoCEv2.
func (d *Device) GIDTable(port uint8) ([]verbs.GIDEntry, error) {
	if port != 1 {
		return nil, fmt.Errorf("rxe: %s: port %d: %w", d.name, port, syscall.EINVAL)
	}
	info := d.currentInfo()
	return append([]verbs.GIDEntry(nil), info.gids...), nil
}

// Close removes the device from the registry and from verbs, destroys its
// QPs, drops every membership, closes every socket and waits for its
// goroutines to exit. Closing a closed device does nothing.
func (d *Device) Close() error {
	r := d.reg
	r.mu.Lock()
	if r.devs[d.ifindex] == d {
		delete(r.devs, d.ifindex)
	}
	r.mu.Unlock()

	// The core detaches every QP first (its GroupDestroyed calls take d.mu).
	d.core.Close()
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	for _, b := range d.blocks {
		b.close()
	}
	d.blocks = nil
	d.publishPortsLocked()
	for _, m := range d.mships {
		m.cmRefs = 0
		d.releaseMembershipLocked(m)
	}
	for _, s := range d.rsocks {
		d.closeSock(s)
	}
	d.rsocks = nil
	d.closeUnicastLocked()
	d.mu.Unlock()

	d.stopEvents()
	d.ho.close()
	if g := d.gsi.Load(); g != nil {
		g.Close()
	}
	d.wg.Wait()
	r.host.UnregisterDevice(d.vdev)
	return nil
}

// errf wraps an errno with context, keeping errors.Is(err, errno) true.
func (d *Device) errf(errno syscall.Errno, format string, args ...any) error {
	return fmt.Errorf("rxe: %s: %s: %w", d.name, fmt.Sprintf(format, args...), errno)
}
