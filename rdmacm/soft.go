package rdmacm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/rdmacm/internal/addr"
	"github.com/softrdma/softrdma/verbs"
)

// softEngine does an id's CM work on softrdma's devices: the kernel's
// cma.c over the ports portOf picks (port.go). It holds the id's state on
// that side: device, addresses and route (idAddr), the GID index of its
// source, its port of the port space (reservePort), its options, a
// unicast resolution in progress and its UD connection (sidr.go); it
// turns its device's netdev events into DEVICE_REMOVAL and ADDR_CHANGE
// (deviceRemoved, addrRemoved). Its fields are guarded by id.mu but the
// atomics, which other ids' binds read.
type softEngine struct {
	idAddr
	id      *ID
	sgidIdx uint8

	// A unicast resolution in progress (internal/addr): its cancel and end.
	resolveStop context.CancelFunc
	resolveDone chan struct{}

	// Options (SetOption): reuse and afonly are read by other ids' binds.
	reuse      atomic.Bool
	afonlySet  atomic.Bool
	afonly     atomic.Bool
	ackTimeout uint8
	opts       []idOption // set while idle, for the librdmacm id it may become

	// UD connections (sidr.go): the devices a listen claimed its service
	// on, the outstanding SIDR_REQ of an active id, the request a
	// CONNECT_REQUEST's id answers.
	listenDevs []*cmDevice
	sidrOut    *sidrOut
	sidrIn     *sidrIn
}

// soft returns the id's soft engine, nil for a kernel id (id.mu is held,
// or the id is softrdma's for good: sidr.go's and the ports' callers).
func (id *ID) soft() *softEngine {
	e, _ := id.eng.(*softEngine)
	return e
}

// bindLocked is cma_bind_addr on a softrdma device (bindLockedIP).
func (e *softEngine) bindLocked(id *ID, sa sockaddr) error {
	if !sa.isIP() {
		return fmt.Errorf("AF_IB needs an InfiniBand device: %w", syscall.EINVAL)
	}
	return e.bindLockedIP(sa)
}

// resolveAddr is rdma_resolve_addr: the route lookup, the bind to the
// source it picks, and ADDR_RESOLVED at once (a group, loopback) or when
// the neighbour is known (a unicast destination).
func (e *softEngine) resolveAddr(id *ID, src *sockaddr, d sockaddr, timeout time.Duration) (err error) {
	var s sockaddr
	if src != nil {
		s = *src
	}
	if !d.isIP() && src == nil {
		return e.resolveIBAddr(d)
	}
	if !d.isIP() || (src != nil && !s.isIP()) {
		return fmt.Errorf("AF_IB needs an InfiniBand device: %w", syscall.EINVAL)
	}
	if src != nil && s.family != d.family {
		return fmt.Errorf("address families differ: %w", syscall.EINVAL)
	}
	// The route lookup: the kernel's rdma_resolve_ip fails the call when
	// there is no route (a multicast group from a given source needs none).
	var routeSrc netip.Addr
	wildSrc := src == nil || s.ip.IsUnspecified()
	if !d.ip.IsLoopback() && (wildSrc || !d.ip.IsMulticast()) {
		// From a bound source, a unicast destination no route has is taken
		// to be on the source's link (addr.ResolveNeighbour).
		if routeSrc, err = addr.RouteSource(d.ip.WithZone("")); err != nil && wildSrc {
			return fmt.Errorf("route to %v: %w", d.ip, err)
		}
	}
	id.mu.Lock()
	if id.state == stateIdle {
		if src == nil || s.ip.IsUnspecified() {
			// Bind to the source the route lookup picked.
			a := routeSrc
			if d.ip.IsLoopback() {
				a = d.ip
			}
			if src != nil {
				s.ip = a
			} else {
				s = sockaddr{family: d.family, ip: a}
			}
			if err := e.bindLockedIP(s); err != nil {
				// A route without an RDMA device: addr_handler's failed
				// cma_acquire_dev, an ADDR_ERROR event.
				id.mu.Unlock()
				return id.complete(id.queue(&Event{ID: id, Event: EventAddrError, Status: -int(verbs.ErrnoOf(err))}))
			}
		} else if err := e.bindLockedIP(s); err != nil {
			id.mu.Unlock()
			return fmt.Errorf("bind %v: %w", s.netAddr(), err)
		}
	}
	switch id.state {
	case stateAddrBound, stateAddrResolved:
	default:
		st := id.state
		id.mu.Unlock()
		return fmt.Errorf("id is %s, an address resolution wants IDLE, ADDR_BOUND or ADDR_RESOLVED: %w", stateName(st), syscall.EINVAL)
	}
	e.dst = d
	if e.dev != nil && !d.ip.IsMulticast() && !d.ip.IsLoopback() && !d.ip.IsUnspecified() {
		// A unicast destination: ADDR_RESOLVED once its neighbour is known.
		e.startNeighbourLocked(d.ip.WithZone(""), timeout)
		id.mu.Unlock()
		return id.complete(nil)
	}
	var ev *Event
	if e.dev == nil {
		ev = &Event{ID: id, Event: EventAddrError, Status: -int(syscall.ENODEV)}
	} else {
		id.state = stateAddrResolved
		ev = &Event{ID: id, Event: EventAddrResolved}
	}
	id.mu.Unlock()
	return id.complete(id.queue(ev))
}

// resolveIBAddr is cma_resolve_ib_addr for an id bound to an InfiniBand
// device's address: the AF_IB destination's GID is its address, resolved
// at once.
func (e *softEngine) resolveIBAddr(d sockaddr) error {
	id := e.id
	id.mu.Lock()
	if id.state != stateAddrBound || e.dev == nil || !e.dev.ib {
		id.mu.Unlock()
		return fmt.Errorf("an AF_IB destination needs an id bound to an InfiniBand device's address: %w", syscall.EINVAL)
	}
	e.dst, id.state = d, stateAddrResolved
	id.mu.Unlock()
	return id.complete(id.queue(&Event{ID: id, Event: EventAddrResolved}))
}

// resolveRoute asks the port for the route (route.go): a RoCE route is
// built at once (cma_resolve_iboe_route); an InfiniBand one is an SA
// PathRecord query (cma_resolve_ib_route), ROUTE_QUERY until it ends with
// ROUTE_RESOLVED or ROUTE_ERROR (the id back in ADDR_RESOLVED, as
// cma_query_handler).
func (e *softEngine) resolveRoute(id *ID, _ time.Duration) error {
	id.mu.Lock()
	if id.state != stateAddrResolved || e.dev == nil {
		id.mu.Unlock()
		return syscall.EINVAL
	}
	paths, query := e.dev.port.route(e)
	if query == nil {
		id.state, e.route = stateRouteResolved, paths
		id.mu.Unlock()
		return id.complete(id.queue(&Event{ID: id, Event: EventRouteResolved}))
	}
	id.state = stateRouteQuery
	id.mu.Unlock()
	go func() {
		paths, status := query()
		id.mu.Lock()
		if id.state != stateRouteQuery {
			id.mu.Unlock() // destroyed meanwhile
			return
		}
		ev := &Event{ID: id, Event: EventRouteResolved}
		if status != 0 {
			id.state = stateAddrResolved
			ev.Event, ev.Status = EventRouteError, status
		} else {
			id.state, e.route = stateRouteResolved, paths
		}
		id.mu.Unlock()
		id.queue(ev)
	}()
	return id.complete(nil)
}

// retrieved: the engine's state is already the event's.
func (e *softEngine) retrieved(*ID, *Event) {}

// setOptionLocked checks and applies the option; one set while the id is
// idle is kept for the librdmacm id it may become.
func (e *softEngine) setOptionLocked(id *ID, level, name int, val []byte) error {
	if err := e.setSoftOptionLocked(level, name, val); err != nil {
		return err
	}
	if level == OptionID && id.state == stateIdle {
		e.opts = append(e.opts, idOption{level, name, val})
	}
	return nil
}

func (e *softEngine) srcPort(id *ID) uint16 { return e.src.portOf() }
func (e *softEngine) dstPort(id *ID) uint16 { return e.dst.portOf() }
func (e *softEngine) portNum(*ID) uint8     { return 1 }

// initQPAttrLocked: INIT takes the id's P_Key index (0), port (1) and
// Q_Key.
func (e *softEngine) initQPAttrLocked(id *ID) (verbs.QPAttr, verbs.QPAttrMask, error) {
	qkey, err := e.defaultQKey()
	if err != nil {
		return verbs.QPAttr{}, 0, err
	}
	return verbs.QPAttr{State: verbs.QPSInit, PortNum: 1, QKey: qkey},
		verbs.QPAttrState | verbs.QPAttrPKeyIdx | verbs.QPAttrPort | verbs.QPAttrQKey, nil
}

// join is rdma_join_multicast (ex false: a full member of attr.Addr) or
// rdma_join_multicast_ex with librdmacm's checks, first failure wins: a
// reserved comp_mask bit → EOPNOTSUPP; no ADDRESS bit, no JOIN_FLAGS bit or
// a flag ≥ 2 → EINVAL; nil or unsupported address → EINVAL; then the id
// and address checks of the join itself (joinAddr). The address is the
// one the front parsed (sa; saErr its failure).
func (e *softEngine) join(id *ID, ex bool, attr JoinMCAttrEx, sa sockaddr, saErr error, ctx any) error {
	if !ex {
		if saErr != nil {
			return saErr
		}
		return e.joinAddr(sa, MCJoinFlagFullMember, ctx)
	}
	if attr.CompMask >= JoinMCAttrReserved {
		return fmt.Errorf("comp_mask %#x: %w", attr.CompMask, syscall.EOPNOTSUPP)
	}
	if attr.CompMask&JoinMCAttrAddress == 0 {
		if attr.Addr != nil {
			return fmt.Errorf("comp_mask %#x lacks JoinMCAttrAddress, so Addr %v is not read: %w", attr.CompMask, attr.Addr, syscall.EINVAL)
		}
		return fmt.Errorf("no address (comp_mask %#x lacks JoinMCAttrAddress): %w", attr.CompMask, syscall.EINVAL)
	}
	if attr.CompMask&JoinMCAttrJoinFlags == 0 {
		return fmt.Errorf("comp_mask %#x lacks JoinMCAttrJoinFlags, so JoinFlags is not read: %w", attr.CompMask, syscall.EINVAL)
	}
	if attr.JoinFlags >= MCJoinFlagReserved {
		return fmt.Errorf("join flags %d: want MCJoinFlagFullMember or MCJoinFlagSendOnlyFullMember: %w", attr.JoinFlags, syscall.EINVAL)
	}
	if saErr != nil {
		return saErr
	}
	return e.joinAddr(sa, attr.JoinFlags, ctx)
}

// joinAddr is the join of the id itself: its checks, then the port's.
func (e *softEngine) joinAddr(sa sockaddr, flags uint32, ctx any) error {
	id := e.id
	id.mu.Lock()
	err := e.joinLocked(sa, flags, ctx)
	id.mu.Unlock()
	observeJoin(id, sa, flags, err)
	if err != nil {
		return err
	}
	return id.complete(nil)
}

// joinLocked is the kernel's rdma_join_multicast: the id checks, then the
// port's join (RoCE queues the JOIN event at once, IB when the SA answers).
func (e *softEngine) joinLocked(sa sockaddr, flags uint32, ctx any) error {
	id := e.id
	switch {
	case e.dev == nil:
		return fmt.Errorf("id is not bound to a device (bind or resolve a local address of one first): %w", syscall.EINVAL)
	case id.state != stateAddrBound && id.state != stateAddrResolved:
		return fmt.Errorf("id is %s, a join wants ADDR_BOUND or ADDR_RESOLVED: %w", stateName(id.state), syscall.EINVAL)
	case id.qpType != verbs.QPTypeUD:
		return fmt.Errorf("port space %v has %v QPs, a join wants %v: %w", id.ps, id.qpType, verbs.QPTypeUD, syscall.EINVAL)
	}
	mc := &mcJoin{id: id, context: ctx, addr: sa, sendOnly: flags == MCJoinFlagSendOnlyFullMember}
	if err := e.dev.port.join(e, mc); err != nil {
		return err
	}
	id.mcs = append(id.mcs, mc)
	return nil
}

// releaseJoinLocked is the port's leave of the join: what the port
// holds for it (an IP membership reference, an SA membership).
func (e *softEngine) releaseJoinLocked(mc *mcJoin) func() error {
	if mc.held == nil {
		return nil
	}
	// Waits for a running callback of the join; none runs afterwards.
	return e.dev.port.leave(mc)
}

// leave: no join of the address is EADDRNOTAVAIL; else the call waits
// until every retrieved event of the join is acked.
func (e *softEngine) leave(id *ID, mc *mcJoin, _ sockaddr) error {
	if mc == nil {
		return fmt.Errorf("not joined: %w", syscall.EADDRNOTAVAIL)
	}
	ch := id.lockCh()
	defer ch.mu.Unlock()
	for mc.eventsCompleted < mc.eventsReported {
		ch.cond.Wait()
	}
	return nil
}

// releaseLocked frees the id's port of its port space and ends its UD
// connection's part (sidr.go); the returned wait closes what that part
// still holds.
func (e *softEngine) releaseLocked(id *ID) func() error {
	sidrDone := e.releaseSIDRLocked()
	if e.src.isIP() {
		id.ch().cm.releasePort(e, e.src.port)
	}
	return func() error { sidrDone(); return nil }
}

// cancelLocked is rdma_addr_cancel: a unicast resolution in progress
// ends without an event.
func (e *softEngine) cancelLocked(*ID) func() {
	stop, done := e.resolveStop, e.resolveDone
	if stop == nil {
		return nil
	}
	return func() {
		stop()
		<-done
	}
}

// bindLockedIP is cma_bind_addr for an IP address: the device of the
// address (none for a wildcard), its GID index, the port of the port
// space (id.mu is held).
func (e *softEngine) bindLockedIP(sa sockaddr) error {
	id := e.id
	if id.state != stateIdle {
		return fmt.Errorf("id is %s, a bind wants IDLE (bound already?): %w", stateName(id.state), syscall.EINVAL)
	}
	var dev *cmDevice
	var gidx uint8
	if !sa.ip.IsUnspecified() {
		d, err := id.ch().cm.deviceForAddr(sa.ip.WithZone(""))
		if err != nil {
			return err
		}
		// cma_acquire_dev_by_src_ip: an IPoIB id takes only an IB device.
		if id.ps == PS_IPOIB && !d.ib {
			return fmt.Errorf("an RDMA_PS_IPOIB id needs an InfiniBand device, and %v is on %s, not InfiniBand: %w", sa.ip, d.name(), syscall.EINVAL)
		}
		if gidx, err = d.gidIndex(sa.ip); err != nil {
			return err
		}
		dev = d
	}
	e.defaultAFOnly(sa.family)
	port, err := id.ch().cm.reservePort(e, sa)
	if err != nil {
		return err
	}
	sa.port = port
	e.src, e.dev, e.sgidIdx = sa, dev, gidx
	id.state = stateAddrBound
	if dev != nil {
		dev.attach(id)
	}
	return nil
}

// defaultQKey is cma_set_default_qkey: RDMA_PS_UDP and RDMA_PS_IB use
// RDMA_UDP_QKEY. RDMA_PS_IPOIB takes the Q_Key of the port's IPoIB
// broadcast group, which a RoCE port does not have (ENODEV, as Linux).
func (e *softEngine) defaultQKey() (uint32, error) {
	id := e.id
	if e.qkey != 0 {
		return e.qkey, nil
	}
	switch id.ps {
	case PS_UDP, PS_IB:
		e.qkey = UDPQKey
	case PS_IPOIB:
		if e.dev == nil {
			return 0, fmt.Errorf("no IPoIB broadcast group without a device: %w", syscall.ENODEV)
		}
		qkey, err := e.dev.port.ipoibQKey()
		if err != nil {
			return 0, err
		}
		e.qkey = qkey
	}
	return e.qkey, nil
}

// startNeighbourLocked resolves the neighbour of a unicast destination in
// the background and queues ADDR_RESOLVED or ADDR_ERROR (id.mu is held).
func (e *softEngine) startNeighbourLocked(dst netip.Addr, timeout time.Duration) {
	id := e.id
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	id.state = stateAddrQuery
	e.resolveStop, e.resolveDone = cancel, done
	src := e.src.ip.WithZone("")
	// The handle's sockets belong to this thread's network namespace,
	// where the route lookup of ResolveAddr ran.
	h, herr := netlink.NewHandle()
	go func() {
		defer close(done)
		err := herr
		if h != nil {
			err = addr.ResolveNeighbour(ctx, h, src, dst, timeout)
			h.Close()
		}
		id.mu.Lock()
		e.resolveStop, e.resolveDone = nil, nil
		if ctx.Err() != nil || id.state != stateAddrQuery {
			id.mu.Unlock()
			return // cancelled by Destroy
		}
		ev := &Event{ID: id, Event: EventAddrResolved}
		if err != nil {
			id.state = stateAddrBound
			ev = &Event{ID: id, Event: EventAddrError, Status: -int(verbs.ErrnoOf(err)), Err: err}
		} else {
			id.state = stateAddrResolved
		}
		id.mu.Unlock()
		id.queue(ev)
	}()
}

// portKey is a port of a port space.
type portKey struct {
	ps   PortSpace
	port uint16
}

// portOwner is a soft id bound to a port, with the address it bound.
type portOwner struct {
	e    *softEngine
	addr sockaddr
}

// reservePort binds the id's port sa.port of its port space on the host
// (any free one for 0), as the kernel's cma_get_port: a port another id
// holds is refused unless both ids set RDMA_OPTION_ID_REUSEADDR, or both
// are AFONLY ids of different families; a wildcard address on either side
// is EADDRNOTAVAIL, the same address EADDRINUSE; different addresses share
// the port.
//
// A port below 1024 needs CAP_NET_BIND_SERVICE in the calling thread's
// effective set, else EACCES (cma_use_port's check, made before the
// others).
func (cm *cmState) reservePort(e *softEngine, sa sockaddr) (uint16, error) {
	if sa.port != 0 && sa.port < privilegedPorts && !canBindPrivileged() {
		return 0, fmt.Errorf("port %d is privileged (below %d): binding it needs CAP_NET_BIND_SERVICE: %w", sa.port, privilegedPorts, syscall.EACCES)
	}
	cm.portMu.Lock()
	defer cm.portMu.Unlock()
	if sa.port != 0 {
		key := portKey{e.id.ps, sa.port}
		for _, o := range cm.ports[key] {
			switch {
			case o.e == e:
			case e.reuse.Load() && o.e.reuse.Load():
			case e.afonly.Load() && o.e.afonly.Load() && o.addr.family != sa.family:
			case sa.ip.IsUnspecified() || o.addr.ip.IsUnspecified():
				return 0, fmt.Errorf("port %d is bound to %v: %w", sa.port, o.addr.netAddr(), syscall.EADDRNOTAVAIL)
			case o.addr.family == sa.family && o.addr.ip == sa.ip:
				return 0, fmt.Errorf("port %d: %w", sa.port, syscall.EADDRINUSE)
			}
		}
		cm.ports[key] = append(cm.ports[key], portOwner{e, sa})
		return sa.port, nil
	}
	for range 1 << 16 {
		p := uint16(32768 + rand.IntN(28232))
		if key := (portKey{e.id.ps, p}); len(cm.ports[key]) == 0 {
			sa.port = p
			cm.ports[key] = []portOwner{{e, sa}}
			return p, nil
		}
	}
	return 0, syscall.EADDRNOTAVAIL
}

// privilegedPorts is the kernel's PROT_SOCK: the RDMA CM's ports below it
// are privileged, whatever net.ipv4.ip_unprivileged_port_start says (that
// sysctl is the sockets').
const privilegedPorts = 1024

// capNetBindService is CAP_NET_BIND_SERVICE's bit (linux/capability.h).
const capNetBindService = 10

// canBindPrivileged reports whether the calling thread has
// CAP_NET_BIND_SERVICE in its effective set, as the kernel's capable()
// asks of the thread that writes the bind to /dev/infiniband/rdma_cm.
func canBindPrivileged() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[0].Effective&(1<<capNetBindService) != 0
}

// releasePort gives back the port the id holds.
func (cm *cmState) releasePort(e *softEngine, port uint16) {
	cm.portMu.Lock()
	defer cm.portMu.Unlock()
	key := portKey{e.id.ps, port}
	owners := slices.DeleteFunc(cm.ports[key], func(o portOwner) bool { return o.e == e })
	if len(owners) == 0 {
		delete(cm.ports, key)
	} else {
		cm.ports[key] = owners
	}
}

// deviceRemoved reports DEVICE_REMOVAL (the netdev went away).
func (e *softEngine) deviceRemoved() {
	id := e.id
	id.mu.Lock()
	if id.state == stateDestroying || id.state == stateDeviceRemoval {
		id.mu.Unlock()
		return
	}
	id.state = stateDeviceRemoval
	id.mu.Unlock()
	id.queue(&Event{ID: id, Event: EventDeviceRemoval})
}

// addrRemoved reports ADDR_CHANGE when the bound address disappears.
func (e *softEngine) addrRemoved(a netip.Addr) {
	id := e.id
	id.mu.Lock()
	hit := id.state != stateDestroying && id.state != stateDeviceRemoval && e.src.isIP() && e.src.ip.WithZone("") == a.Unmap()
	id.mu.Unlock()
	if hit {
		id.queue(&Event{ID: id, Event: EventAddrChange})
	}
}
