package rdmacm

import (
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"syscall"

	"github.com/softrdma/softrdma/verbs"
)

// mcJoin is one join of an id (librdmacm's struct cma_multicast plus the
// kernel's cma_multicast).
type mcJoin struct {
	id       *ID
	context  any
	addr     sockaddr
	sendOnly bool
	mgid     verbs.GID // set when the JOIN event is retrieved
	mlid     uint16
	left     atomic.Bool // LeaveMulticast or Destroy removed the join
	held     any         // what the port holds for the join (released by its leave)
	netRef   bool        // the port holds a reference on the IP group membership (IGMP/MLD)
	qkey     uint32      // the id's Q_Key when it joined

	// guarded by id.ch().mu
	eventsReported  int
	eventsCompleted int
}

// JoinMulticast joins a multicast group as a full member
// (rdma_join_multicast); ctx comes back in the event's PrivateData.
func (id *ID) JoinMulticast(addr net.Addr, ctx any) (err error) {
	defer wrapErr(&err, "rdma_join_multicast", addr)
	sa, saErr := toSockaddr(addr)
	return id.engine().join(id, false, JoinMCAttrEx{Addr: addr}, sa, saErr, ctx)
}

// JoinMulticastEx joins a multicast group (rdma_join_multicast_ex). Checks,
// first failure wins: a reserved comp_mask bit → EOPNOTSUPP; no ADDRESS bit,
// no JOIN_FLAGS bit or a flag ≥ 2 → EINVAL; nil or unsupported address →
// EINVAL; then the id's: not bound to a device, not ADDR_BOUND or
// ADDR_RESOLVED, or a port space without UD QPs (PS_TCP) → EINVAL; then the
// group's: 0.0.0.0 or :: → EINVAL, a loopback address → EINVAL (Linux
// takes it and yields MGID 0), a device without its netdev → ENODEV; on
// InfiniBand no IPoIB broadcast group → EADDRNOTAVAIL and a send-only join
// on an SM without support for it → EOPNOTSUPP. Each error names its
// cause. A full member takes a reference on the interface's IP membership
// of the group (IGMP/MLD report) on RoCE, an SA membership on InfiniBand.
// The result arrives as a MULTICAST_JOIN event, or MULTICAST_ERROR when
// the SA refuses (InfiniBand) or the id's QP cannot be attached as the
// event is retrieved (status -1; a send-only join attaches nothing). On a
// kernel id librdmacm makes the checks.
func (id *ID) JoinMulticastEx(attr *JoinMCAttrEx, ctx any) (err error) {
	defer wrapJoinErr(&err, "rdma_join_multicast_ex", attr)
	if attr == nil {
		return fmt.Errorf("nil attributes: %w", syscall.EINVAL)
	}
	sa, saErr := toSockaddr(attr.Addr)
	return id.engine().join(id, true, *attr, sa, saErr, ctx)
}

// processEvent runs librdmacm's event post-processing when an event is
// retrieved: a MULTICAST_JOIN records the MGID/MLID and attaches the id's
// QP unless the join is send-only; a failed attach turns the event into
// MULTICAST_ERROR with status -1, keeping its UD parameters (ah_attr,
// qp_num, qkey), as librdmacm does.
func (id *ID) processEvent(ev *Event) {
	id.engine().retrieved(id, ev)
	if ev.mc == nil || ev.Event != EventMulticastJoin {
		return
	}
	mc := ev.mc
	id.mu.Lock()
	defer id.mu.Unlock()
	mc.mgid = ev.Param.AHAttr.GRH.DGID
	mc.mlid = ev.Param.AHAttr.DLID
	if id.qp == nil || mc.sendOnly || mc.left.Load() {
		return
	}
	if err := id.qp.AttachMcast(mc.mgid, mc.mlid); err != nil {
		observeAttachError(id, mc, err)
		// librdmacm's ucma_process_join: the event becomes
		// MULTICAST_ERROR with status -1; its UD parameters stay.
		ev.Event = EventMulticastError
		ev.Status = -1
		ev.Err = err
	}
}

// LeaveMulticast leaves a group (rdma_leave_multicast). The newest join of
// this id whose address equals addr (family, address and port) is removed;
// none → EADDRNOTAVAIL. The QP is detached, undelivered events of the join
// are dropped, and the call waits until every retrieved event of the join
// is acked. On InfiniBand it also waits until the SA answered the Delete
// of the join states no other local join needs; an SA that refuses or
// does not answer gives its errno (EINVAL, ETIMEDOUT), the join being
// removed all the same.
func (id *ID) LeaveMulticast(addr net.Addr) (err error) {
	defer wrapErr(&err, "rdma_leave_multicast", addr)
	sa, err := toSockaddr(addr)
	if err != nil {
		return err
	}
	id.mu.Lock()
	mc := id.takeJoinLocked(sa)
	var wait func() error
	if mc != nil {
		wait = id.leaveLocked(mc)
	}
	eng := id.eng
	id.mu.Unlock()
	if wait != nil {
		err = wait()
	}
	if mc != nil {
		// A synchronous id's parked JOIN event would otherwise never be
		// acked.
		ch := id.lockCh()
		if p := id.ev.parked; p != nil && p.mc == mc {
			id.ackLocked(p)
			id.ev.parked = nil
		}
		ch.mu.Unlock()
	}
	if lerr := eng.leave(id, mc, sa); lerr != nil {
		return lerr
	}
	return err
}

// takeJoinLocked removes and returns the id's newest join whose address
// is sa (nil: none), as librdmacm's list is searched (id.mu is held): the
// leave's one lookup, for both engines.
func (id *ID) takeJoinLocked(sa sockaddr) *mcJoin {
	for i := len(id.mcs) - 1; i >= 0; i-- {
		if mc := id.mcs[i]; mc.addr == sa {
			id.mcs = slices.Delete(id.mcs, i, i+1)
			return mc
		}
	}
	return nil
}

// leaveLocked undoes a join: detach (errors ignored, as librdmacm), drop
// the membership reference, and purge the join's undelivered events. The
// port's remaining wait (an SA Delete) is returned, to be called once
// id.mu is released.
func (id *ID) leaveLocked(mc *mcJoin) (wait func() error) {
	observeLeave(id, mc)
	mc.left.Store(true)
	if id.qp != nil && !mc.sendOnly && !mc.mgid.IsZero() {
		id.qp.DetachMcast(mc.mgid, mc.mlid)
	}
	wait = id.eng.releaseJoinLocked(mc)
	// left is set before the purge takes the channel's lock: a kernel
	// join's event arriving later is acked on arrival (kernelReader).
	ch := id.lockCh()
	ch.purgeLocked(func(ev *Event) bool { return ev.mc == mc })
	ch.mu.Unlock()
	return wait
}
