package rdmacm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"syscall"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
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
	netRef   bool        // holds a reference on the IP group membership
	left     atomic.Bool // LeaveMulticast or Destroy removed the join
	ibm      *ib.Member  // the SA join of an InfiniBand port
	qkey     uint32      // the id's Q_Key when it joined

	// guarded by id.ch.mu
	eventsReported  int
	eventsCompleted int
}

// JoinMulticast joins a multicast group as a full member
// (rdma_join_multicast); ctx comes back in the event's PrivateData.
func (id *ID) JoinMulticast(addr net.Addr, ctx any) error {
	if _, err := toSockaddr(addr); err != nil {
		return fmt.Errorf("rdmacm: join multicast: %w", err)
	}
	return id.join(addr, MCJoinFlagFullMember, ctx)
}

// JoinMulticastEx joins a multicast group (rdma_join_multicast_ex). Checks,
// first failure wins: a reserved comp_mask bit → EOPNOTSUPP; no ADDRESS bit,
// no JOIN_FLAGS bit or a flag ≥ 2 → EINVAL; nil or unsupported address →
// EINVAL; then the id and address checks of the join itself (see README).
// The result arrives as a MULTICAST_JOIN or MULTICAST_ERROR event.
func (id *ID) JoinMulticastEx(attr *JoinMCAttrEx, ctx any) error {
	if attr == nil {
		return fmt.Errorf("rdmacm: join multicast: nil attributes: %w", syscall.EINVAL)
	}
	if attr.CompMask >= JoinMCAttrReserved {
		return fmt.Errorf("rdmacm: join multicast: comp_mask %#x: %w", attr.CompMask, syscall.EOPNOTSUPP)
	}
	if attr.CompMask&JoinMCAttrAddress == 0 {
		return fmt.Errorf("rdmacm: join multicast: no address: %w", syscall.EINVAL)
	}
	if attr.CompMask&JoinMCAttrJoinFlags == 0 || attr.JoinFlags >= MCJoinFlagReserved {
		return fmt.Errorf("rdmacm: join multicast: join flags: %w", syscall.EINVAL)
	}
	if _, err := toSockaddr(attr.Addr); err != nil {
		return fmt.Errorf("rdmacm: join multicast: %w", err)
	}
	return id.join(attr.Addr, attr.JoinFlags, ctx)
}

func (id *ID) join(addr net.Addr, flags uint32, ctx any) error {
	sa, _ := toSockaddr(addr)
	id.mu.Lock()
	ev, err := id.joinLocked(sa, flags, ctx)
	id.mu.Unlock()
	observeJoin(id, sa, flags, err)
	if err != nil {
		return fmt.Errorf("rdmacm: join multicast %v: %w", addr, err)
	}
	return id.complete(ev)
}

// joinLocked is the kernel's rdma_join_multicast: the id checks, then the
// RoCE or the InfiniBand path. A RoCE join queues its JOIN event at once;
// an IB join queues it when the SA answers.
func (id *ID) joinLocked(sa sockaddr, flags uint32, ctx any) (*Event, error) {
	if id.dev == nil || (id.state != stateAddrBound && id.state != stateAddrResolved) || id.qpType != verbs.QPTypeUD {
		return nil, syscall.EINVAL
	}
	mc := &mcJoin{id: id, context: ctx, addr: sa, sendOnly: flags == MCJoinFlagSendOnlyFullMember}
	if id.dev.ib != nil {
		if err := id.joinIBLocked(mc); err != nil {
			return nil, err
		}
		id.mcs = append(id.mcs, mc)
		return nil, nil
	}
	return id.joinRoCELocked(mc)
}

// joinRoCELocked is cma_iboe_join_multicast for a RoCEv2 port.
func (id *ID) joinRoCELocked(mc *mcJoin) (*Event, error) {
	sa := mc.addr
	if !sa.isIP() {
		return nil, ENOTSUPP
	}
	group := sa.ip.WithZone("").Unmap()
	if group.IsUnspecified() {
		return nil, syscall.EINVAL
	}
	if group.IsLoopback() {
		// Linux accepts it and yields MGID 0; we refuse (see README).
		return nil, fmt.Errorf("loopback group address: %w", syscall.EINVAL)
	}
	if pa, err := id.dev.ctx.QueryPort(1); err != nil || pa.State != verbs.PortActive {
		return nil, syscall.ENODEV
	}
	if id.qkey == 0 && id.ps != PS_IPOIB {
		id.defaultQKey()
	}
	// Linux takes the IP membership for any address (ip_mc_inc_group does
	// not check the range); a socket can only join real multicast groups.
	if !mc.sendOnly && group.IsMulticast() {
		if err := id.dev.rxe.IncGroup(group); err != nil {
			return nil, err
		}
		mc.netRef = true
	}
	id.mcs = append(id.mcs, mc)
	mgid := wire.RoCEv2MGID(group)
	ev := &Event{ID: id, Event: EventMulticastJoin, mc: mc}
	ev.Param = UDParam{
		PrivateData: mc.context,
		QPNum:       MulticastQPN,
		QKey:        id.qkey,
		AHAttr: verbs.AHAttr{
			GRH:      verbs.GlobalRoute{DGID: mgid, SGIDIndex: id.sgidIdx, HopLimit: 64},
			IsGlobal: true,
			PortNum:  1,
		},
	}
	return id.queue(ev), nil
}

// joinIBLocked is cma_join_ib_multicast: the request starts from the
// port's IPoIB broadcast group record (none: EADDRNOTAVAIL), a send-only
// join needs the SA's send-only full member support (none: EOPNOTSUPP, as
// kernels 4.9-5.11 and the man page), and the SA join runs asynchronously.
func (id *ID) joinIBLocked(mc *mcJoin) error {
	p := id.dev.ib
	bc, ok := p.BroadcastGroup()
	if !ok {
		return fmt.Errorf("no IPoIB broadcast group on %s: %w", p.Name(), syscall.EADDRNOTAVAIL)
	}
	var mgid verbs.GID
	if mc.addr.family == afIB {
		mgid = mc.addr.ib.GID
	} else {
		group := mc.addr.ip.WithZone("").Unmap()
		if group.IsLoopback() {
			return fmt.Errorf("loopback group address: %w", syscall.EINVAL)
		}
		mgid = wire.IBMGID(group, binary.BigEndian.Uint16(bc.MGID[4:6]), bc.MGID[1]&0x0f, id.ps == PS_UDP)
	}
	if id.qkey == 0 {
		if id.ps == PS_IPOIB {
			id.qkey = bc.QKey
		} else if _, err := id.defaultQKey(); err != nil {
			return err
		}
	}
	if mc.sendOnly && !p.SendOnlyFullMemberSupported() {
		return fmt.Errorf("SM does not support send-only full member joins: %w", syscall.EOPNOTSUPP)
	}
	req := bc
	req.MGID, req.QKey, req.PortGID, req.MLID = mgid, id.qkey, p.PortGID(), 0
	req.JoinState = mad.JoinFullMember
	if mc.sendOnly {
		req.JoinState = mad.JoinSendOnlyFullMember
	}
	mask := mad.CompCreateRequired
	if id.ps == PS_IPOIB {
		mask = mad.CompIPoIBJoin
	}
	mc.qkey = id.qkey
	m, err := p.JoinMulticast(req, mask, func(status int, rec *ib.GroupRecord) { id.ibJoinDone(mc, status, rec) })
	if err != nil {
		return err
	}
	mc.ibm = m
	return nil
}

// ibJoinDone turns the SA's answer (or a later -ENETRESET) into the
// join's event (cma_ib_mc_handler).
func (id *ID) ibJoinDone(mc *mcJoin, status int, rec *ib.GroupRecord) {
	if mc.left.Load() {
		return
	}
	if status == 0 && (rec.QKey == 0 || rec.QKey != mc.qkey) {
		status = -int(syscall.EINVAL) // cma_set_qkey: the group's Q_Key is not the id's
	}
	ev := &Event{ID: id, mc: mc}
	if status != 0 {
		ev.Event, ev.Status = EventMulticastError, status
		ev.Param.PrivateData = mc.context
		id.queue(ev)
		return
	}
	ev.Event = EventMulticastJoin
	ev.Param = UDParam{
		PrivateData: mc.context,
		QPNum:       MulticastQPN,
		QKey:        rec.QKey,
		AHAttr: verbs.AHAttr{
			GRH: verbs.GlobalRoute{
				DGID: rec.MGID, SGIDIndex: 0, FlowLabel: rec.FlowLabel,
				HopLimit: rec.HopLimit, TrafficClass: rec.TClass,
			},
			DLID:       rec.MLID,
			SL:         rec.SL,
			StaticRate: rec.Rate,
			IsGlobal:   true,
			PortNum:    1,
		},
	}
	id.queue(ev)
}

// processEvent runs librdmacm's event post-processing when an event is
// retrieved: a MULTICAST_JOIN records the MGID/MLID and attaches the id's
// QP unless the join is send-only; a failed attach turns the event into
// MULTICAST_ERROR with status -1.
func (id *ID) processEvent(ev *Event) {
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
		ev.Event = EventMulticastError
		ev.Status = -1
		ev.Err = err
		ev.Param = UDParam{PrivateData: mc.context}
	}
}

// LeaveMulticast leaves a group (rdma_leave_multicast). The newest join of
// this id whose address equals addr (family, address and port) is removed;
// none → EADDRNOTAVAIL. The QP is detached, undelivered events of the join
// are dropped, and the call waits until every retrieved event of the join
// is acked.
func (id *ID) LeaveMulticast(addr net.Addr) error {
	sa, err := toSockaddr(addr)
	if err != nil {
		return fmt.Errorf("rdmacm: leave multicast: %w", err)
	}
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
		return fmt.Errorf("rdmacm: leave multicast %v: %w", addr, syscall.EADDRNOTAVAIL)
	}
	id.leaveLocked(mc)
	id.mu.Unlock()

	ch := id.ch
	ch.mu.Lock()
	defer ch.mu.Unlock()
	// A synchronous id's parked JOIN event would otherwise never be acked.
	if p := id.parked; p != nil && p.mc == mc && !p.acked {
		p.acked = true
		id.eventsCompleted++
		mc.eventsCompleted++
		id.parked = nil
	}
	for mc.eventsCompleted < mc.eventsReported {
		ch.cond.Wait()
	}
	return nil
}

// leaveLocked undoes a join: detach (errors ignored, as librdmacm), drop
// the membership reference, and purge the join's undelivered events.
func (id *ID) leaveLocked(mc *mcJoin) {
	observeLeave(id, mc)
	mc.left.Store(true)
	if id.qp != nil && !mc.sendOnly && !mc.mgid.IsZero() {
		id.qp.DetachMcast(mc.mgid, mc.mlid)
	}
	if mc.ibm != nil {
		// Waits for a running callback of the group; none runs afterwards.
		id.dev.ib.LeaveMulticast(mc.ibm)
		mc.ibm = nil
	}
	if mc.netRef {
		id.dev.rxe.DecGroup(mc.addr.ip.WithZone("").Unmap())
		mc.netRef = false
	}
	id.ch.mu.Lock()
	id.ch.purgeLocked(func(ev *Event) bool { return ev.mc == mc })
	id.ch.mu.Unlock()
}

func asErrno(err error, e *syscall.Errno) bool { return errors.As(err, e) }
