package rdmacm

import (
	"fmt"
	"net/netip"
	"slices"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/rdmacm/internal/addr"
	"github.com/softrdma/softrdma/verbs"
)

// softEngine does an id's CM work on softrdma's devices: the kernel's
// cma.c over the ports portOf picks (port.go). Its state is the id's own.
type softEngine struct{}

// bindLocked is cma_bind_addr on a softrdma device (id.bindLocked).
func (softEngine) bindLocked(id *ID, sa sockaddr) error {
	if !sa.isIP() {
		return fmt.Errorf("AF_IB needs an InfiniBand device: %w", syscall.EINVAL)
	}
	return id.bindLocked(sa)
}

// resolveAddr is rdma_resolve_addr: the route lookup, the bind to the
// source it picks, and ADDR_RESOLVED at once (a group, loopback) or when
// the neighbour is known (a unicast destination).
func (softEngine) resolveAddr(id *ID, src *sockaddr, d sockaddr, timeout time.Duration) (err error) {
	var s sockaddr
	if src != nil {
		s = *src
	}
	if !d.isIP() && src == nil {
		return resolveIBAddr(id, d)
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
			if err := id.bindLocked(s); err != nil {
				// A route without an RDMA device: addr_handler's failed
				// cma_acquire_dev, an ADDR_ERROR event.
				id.mu.Unlock()
				return id.complete(id.queue(&Event{ID: id, Event: EventAddrError, Status: -int(verbs.ErrnoOf(err))}))
			}
		} else if err := id.bindLocked(s); err != nil {
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
	id.dst = d
	if id.dev != nil && !d.ip.IsMulticast() && !d.ip.IsLoopback() && !d.ip.IsUnspecified() {
		// A unicast destination: ADDR_RESOLVED once its neighbour is known.
		id.startNeighbourLocked(d.ip.WithZone(""), timeout)
		id.mu.Unlock()
		return id.complete(nil)
	}
	var ev *Event
	if id.dev == nil {
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
func resolveIBAddr(id *ID, d sockaddr) error {
	id.mu.Lock()
	if id.state != stateAddrBound || id.dev == nil || !id.dev.ib {
		id.mu.Unlock()
		return fmt.Errorf("an AF_IB destination needs an id bound to an InfiniBand device's address: %w", syscall.EINVAL)
	}
	id.dst, id.state = d, stateAddrResolved
	id.mu.Unlock()
	return id.complete(id.queue(&Event{ID: id, Event: EventAddrResolved}))
}

// resolveRoute asks the port for the route (route.go): a RoCE route is
// built at once (cma_resolve_iboe_route); an InfiniBand one is an SA
// PathRecord query (cma_resolve_ib_route), ROUTE_QUERY until it ends with
// ROUTE_RESOLVED or ROUTE_ERROR (the id back in ADDR_RESOLVED, as
// cma_query_handler).
func (softEngine) resolveRoute(id *ID, _ time.Duration) error {
	id.mu.Lock()
	if id.state != stateAddrResolved || id.dev == nil {
		id.mu.Unlock()
		return syscall.EINVAL
	}
	paths, query := id.dev.port.route(id)
	if query == nil {
		id.state, id.route = stateRouteResolved, paths
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
			id.state, id.route = stateRouteResolved, paths
		}
		id.mu.Unlock()
		id.queue(ev)
	}()
	return id.complete(nil)
}

// retrieved: the engine's state is already the event's.
func (softEngine) retrieved(*ID, *Event) {}

// setOptionLocked checks and applies the option; one set while the id is
// idle is kept for the librdmacm id it may become.
func (softEngine) setOptionLocked(id *ID, level, name int, val []byte) error {
	if err := id.setOptionLocked(level, name, val); err != nil {
		return err
	}
	if level == OptionID && id.state == stateIdle {
		id.opts = append(id.opts, idOption{level, name, val})
	}
	return nil
}

func (softEngine) srcPort(id *ID) uint16 { return id.src.portOf() }
func (softEngine) dstPort(id *ID) uint16 { return id.dst.portOf() }
func (softEngine) portNum(*ID) uint8     { return 1 }

// initQPAttrLocked: INIT takes the id's P_Key index (0), port (1) and
// Q_Key.
func (softEngine) initQPAttrLocked(id *ID) (verbs.QPAttr, verbs.QPAttrMask, error) {
	qkey, err := id.defaultQKey()
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
// and address checks of the join itself (id.join).
func (softEngine) join(id *ID, ex bool, attr JoinMCAttrEx, ctx any) error {
	if !ex {
		if _, err := toSockaddr(attr.Addr); err != nil {
			return err
		}
		return id.join(attr.Addr, MCJoinFlagFullMember, ctx)
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
	if _, err := toSockaddr(attr.Addr); err != nil {
		return err
	}
	return id.join(attr.Addr, attr.JoinFlags, ctx)
}

// leave is rdma_leave_multicast (see ID.LeaveMulticast).
func (softEngine) leave(id *ID, sa sockaddr) error {
	id.mu.Lock()
	var mc *mcJoin
	// Newest first, as librdmacm's list (joins are appended).
	for i := len(id.mcs) - 1; i >= 0; i-- {
		if id.mcs[i].addr == sa {
			mc = id.mcs[i]
			id.mcs = slices.Delete(id.mcs, i, i+1)
			break
		}
	}
	if mc == nil {
		id.mu.Unlock()
		return fmt.Errorf("not joined: %w", syscall.EADDRNOTAVAIL)
	}
	wait := id.leaveLocked(mc)
	id.mu.Unlock()
	var err error
	if wait != nil {
		err = wait()
	}

	ch := id.lockCh()
	defer ch.mu.Unlock()
	// A synchronous id's parked JOIN event would otherwise never be acked.
	if p := id.parked; p != nil && p.mc == mc {
		id.ackLocked(p)
		id.parked = nil
	}
	for mc.eventsCompleted < mc.eventsReported {
		ch.cond.Wait()
	}
	return err
}

// releaseLocked frees the id's port of its port space.
func (softEngine) releaseLocked(id *ID) func() error {
	if id.src.isIP() {
		id.ch().cm.releasePort(id, id.src.port)
	}
	return nil
}
