package rdmacm

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/verbs"
)

// state is an id's CM state (enum rdma_cm_state in the kernel).
type state uint8

const (
	stateIdle state = iota
	stateAddrQuery
	stateAddrResolved
	stateRouteQuery
	stateRouteResolved
	stateConnect
	stateDisconnect
	stateAddrBound
	stateListen
	stateDeviceRemoval
	stateDestroying
)

// ID is an RDMA CM identifier (struct rdma_cm_id): what librdmacm's id is
// to a program — its channel, context, port space and QP type, its state,
// QP and CQs, joins and events. The CM work and its state (the device,
// addresses, route, Q_Key; on softrdma's devices the port-space
// reservation, options, resolution and UD connections; on the kernel's
// stack the librdmacm id) are the id's engine's (engine.go).
//
// Locking: id.mu guards the id's fields and its engine's (but the
// atomics); the id's channel's mu (id.lockCh) guards ev and the joins'
// event counts. The order is id.mu, then the channel's mu; never the
// other way (GetEvent drops the channel's lock before processEvent takes
// id.mu). cmDevice.mu and the host's port and SIDR locks come after both.
type ID struct {
	chp     atomic.Pointer[EventChannel] // the id's channel (MigrateID changes it)
	syncp   atomic.Bool                  // a synchronous id (its channel is private)
	context any
	ps      PortSpace
	qpType  verbs.QPType

	mu     sync.Mutex
	state  state
	qp     *verbs.QP
	ownCQs []*verbs.CQ
	sendCQ *verbs.CQ
	recvCQ *verbs.CQ
	mcs    []*mcJoin // oldest first; lookups go newest first, like librdmacm's list
	userPD *verbs.PD // a passive endpoint's PD (CreateEP: id->pd)

	// The engine doing the id's CM work (engine.go): softrdma's devices
	// until toKernelLocked gives the id to the kernel's stack.
	eng idEngine

	ev idEvents // guarded by ch.mu
}

// idEvents are an id's event counts, which leave, destroy and migrate wait
// on, and a synchronous id's parked event (guarded by the id's channel's
// mu).
type idEvents struct {
	reported  int
	completed int
	parked    *Event // the last event of a synchronous id
}

// CreateID creates an id (rdma_create_id). A nil channel makes a
// synchronous id: calls that produce an event wait for it and turn a
// failure status into their error. ctx is returned by Context. On a
// channel whose backend is BackendKernel the id is a librdmacm id at once.
func CreateID(ch *EventChannel, ctx any, ps PortSpace) (_ *ID, err error) {
	defer wrapErr(&err, "rdma_create_id", nil)
	return createID(ch, ctx, ps, 0)
}

// createID is rdma_create_id2: the QP type is the port space's, except
// for RDMA_PS_IB, whose ids take qpType (0: RC).
func createID(ch *EventChannel, ctx any, ps PortSpace, qpType verbs.QPType) (_ *ID, err error) {
	switch ps {
	case PS_UDP, PS_IPOIB, PS_TCP, PS_IB:
	default:
		return nil, fmt.Errorf("port space %#x: %w", uint16(ps), syscall.EINVAL)
	}
	id := &ID{context: ctx, ps: ps, qpType: ps.qpType()}
	id.eng = &softEngine{id: id}
	if ps == PS_IB && qpType != 0 {
		id.qpType = qpType
	}
	id.chp.Store(ch)
	if ch == nil {
		if ch, err = CreateEventChannel(); err != nil {
			return nil, err
		}
		ch.private = true
		id.chp.Store(ch)
		id.syncp.Store(true)
	}
	ch.mu.Lock()
	if ch.closed {
		ch.mu.Unlock()
		return nil, syscall.EBADF
	}
	ch.ids++
	kern := ch.backend == BackendKernel
	ch.mu.Unlock()
	if kern {
		id.mu.Lock()
		_, err = id.toKernelLocked(nil)
		id.mu.Unlock()
		if err != nil {
			ch.mu.Lock()
			ch.ids--
			ch.mu.Unlock()
			if id.isSync() {
				ch.Close()
			}
			return nil, err
		}
	}
	return id, nil
}

// ch returns the id's event channel.
func (id *ID) ch() *EventChannel { return id.chp.Load() }

// isSync reports whether the id is synchronous (its channel is private).
func (id *ID) isSync() bool { return id.syncp.Load() }

// lockCh locks the id's event channel and returns it. MigrateID changes
// the channel only while it holds the old channel's lock, so the channel
// returned stays the id's until it is unlocked.
func (id *ID) lockCh() *EventChannel {
	for {
		ch := id.ch()
		ch.mu.Lock()
		if id.ch() == ch {
			return ch
		}
		ch.mu.Unlock()
	}
}

// Context returns the user context given to CreateID.
func (id *ID) Context() any { return id.context }

// Channel returns the event channel of the id (the private one of a
// synchronous id).
func (id *ID) Channel() *EventChannel { return id.ch() }

// PortSpace returns the id's port space.
func (id *ID) PortSpace() PortSpace { return id.ps }

// QPType returns the QP type of the id's port space.
func (id *ID) QPType() verbs.QPType { return id.qpType }

// Verbs returns the device context the id is bound to, or nil.
func (id *ID) Verbs() *verbs.Context {
	id.mu.Lock()
	defer id.mu.Unlock()
	if dev := id.eng.addrs().dev; dev != nil {
		return dev.ctx
	}
	return nil
}

// PD returns the id's default protection domain (id->pd), or nil.
func (id *ID) PD() *verbs.PD {
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.userPD != nil {
		return id.userPD
	}
	if dev := id.eng.addrs().dev; dev != nil {
		return dev.pd
	}
	return nil
}

// PortNum returns the port the id is bound to (0 when unbound).
func (id *ID) PortNum() uint8 {
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.eng.addrs().dev == nil {
		return 0
	}
	return id.eng.portNum(id)
}

// QP returns the id's QP, or nil.
func (id *ID) QP() *verbs.QP {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.qp
}

// SendCQ returns the send CQ of the id's QP.
func (id *ID) SendCQ() *verbs.CQ {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.sendCQ
}

// SendCQChannel returns the completion channel of the send CQ CreateQP
// made for the id (id->send_cq_channel), or nil.
func (id *ID) SendCQChannel() *verbs.CompChannel {
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.sendCQ == nil || !slices.Contains(id.ownCQs, id.sendCQ) {
		return nil
	}
	return id.sendCQ.Channel()
}

// RecvCQChannel returns the completion channel of the receive CQ CreateQP
// made for the id (id->recv_cq_channel), or nil.
func (id *ID) RecvCQChannel() *verbs.CompChannel {
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.recvCQ == nil || !slices.Contains(id.ownCQs, id.recvCQ) {
		return nil
	}
	return id.recvCQ.Channel()
}

// RecvCQ returns the receive CQ of the id's QP.
func (id *ID) RecvCQ() *verbs.CQ {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.recvCQ
}

// SrcAddr returns the bound source address (rdma_get_local_addr).
func (id *ID) SrcAddr() net.Addr {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.eng.addrs().src.netAddr()
}

// DstAddr returns the destination address (rdma_get_peer_addr).
func (id *ID) DstAddr() net.Addr {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.eng.addrs().dst.netAddr()
}

// DeviceName returns the name of the bound device ("" when unbound).
func (id *ID) DeviceName() string {
	id.mu.Lock()
	defer id.mu.Unlock()
	if dev := id.eng.addrs().dev; dev != nil {
		return dev.name()
	}
	return ""
}

// Event returns the last event of a synchronous id (id->event), or nil.
func (id *ID) Event() *Event {
	ch := id.lockCh()
	defer ch.mu.Unlock()
	return id.ev.parked
}

// BindAddr binds the id to a local address (rdma_bind_addr). A specific
// address binds the id to the device of its interface; the wildcard address
// binds no device. Port 0 picks a free port of the id's port space.
func (id *ID) BindAddr(addr net.Addr) (err error) {
	defer wrapErr(&err, "rdma_bind_addr", addr)
	sa, err := toSockaddr(addr)
	if err != nil {
		return err
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	eng, err := id.toKernelLocked(&sa)
	if err != nil {
		return err
	}
	return eng.bindLocked(id, sa)
}

// ResolveAddr resolves the destination address and binds the id to a
// device (rdma_resolve_addr). With a nil or wildcard src the routing tables
// pick the interface (so a multicast group usually resolves to the default
// route's interface: pass src to choose). A destination without a route
// fails the call (ENETUNREACH), as the kernel's rdma_resolve_ip does; a
// route to an interface without an RDMA device is an ADDR_ERROR event. A
// unicast destination resolves once its next hop's link-layer address is
// known, else ADDR_ERROR -ETIMEDOUT when timeout passes (internal/addr).
// The result comes as an ADDR_RESOLVED or ADDR_ERROR event; a synchronous
// id waits for it.
func (id *ID) ResolveAddr(src, dst net.Addr, timeout time.Duration) (err error) {
	defer wrapErr(&err, "rdma_resolve_addr", dst)
	d, err := toSockaddr(dst)
	if err != nil {
		return fmt.Errorf("dst: %w", err)
	}
	var s sockaddr
	if src != nil {
		if s, err = toSockaddr(src); err != nil {
			return fmt.Errorf("src: %w", err)
		}
	}
	var sp *sockaddr
	if src != nil {
		sp = &s
	}
	eng, err := id.engineForResolve(sp, d)
	if err != nil {
		return err
	}
	return eng.resolveAddr(id, sp, d, timeout)
}

// queue enqueues an event of this id and returns it.
func (id *ID) queue(ev *Event) *Event {
	ch := id.lockCh()
	ch.enqueueLocked(ev)
	ch.mu.Unlock()
	return ev
}

// complete makes a synchronous id wait for the event just queued
// (ucma_complete): the previous parked event is acked, the new one parked,
// and a failure status becomes the error. Asynchronous ids return nil.
func (id *ID) complete(_ *Event) error {
	if !id.isSync() {
		return nil
	}
	ch := id.lockCh()
	prev := id.ev.parked
	id.ev.parked = nil
	ch.mu.Unlock()
	if prev != nil {
		prev.Ack()
	}
	ev, err := ch.GetEvent(context.Background())
	if err != nil {
		return err
	}
	ch.mu.Lock()
	id.ev.parked = ev
	ch.mu.Unlock()
	switch {
	case ev.Status == 0:
		return nil
	case ev.Event == EventRejected:
		return fmt.Errorf("%v: %w", ev.Event, syscall.ECONNREFUSED)
	case ev.Status < 0:
		if ev.Status == -1 && ev.Err != nil {
			return fmt.Errorf("%v: %w", ev.Event, syscall.EPERM)
		}
		return fmt.Errorf("%v: %w", ev.Event, syscall.Errno(-ev.Status))
	default:
		return fmt.Errorf("%v: %w", ev.Event, syscall.Errno(ev.Status))
	}
}

// CreateQP creates the id's QP (rdma_create_qp / rdma_create_qp_ex) and
// moves it to RTS with the id's Q_Key. A nil pd means the id's default PD;
// missing CQs are created (sized by the WR capacities) and belong to the id.
// attr.CreateFlags may hold verbs.CreateBlockSelfMcastLB. A zero QPType
// means the id's (UD); ids of connected port spaces (PS_TCP) get EINVAL.
func (id *ID) CreateQP(pd *verbs.PD, attr *verbs.QPInitAttr) (err error) {
	defer wrapErr(&err, "rdma_create_qp", nil)
	if attr == nil {
		return syscall.EINVAL
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	dev := id.eng.addrs().dev
	if id.qp != nil || dev == nil {
		return syscall.EINVAL
	}
	if pd == nil {
		pd = dev.pd
		if id.userPD != nil {
			pd = id.userPD
		}
	}
	if pd.Context().Device() != dev.ctx.Device() {
		return fmt.Errorf("pd of another device: %w", syscall.EINVAL)
	}
	// INIT takes the P_Key index, port and Q_Key of the id: the kernel's
	// (rdma_init_qp_attr) for a kernel id.
	init, initMask, err := id.eng.initQPAttrLocked(id)
	if err != nil {
		return err
	}
	if id.qpType != verbs.QPTypeUD {
		// librdmacm would run the connected-QP init path, which this
		// UD-only stack does not have.
		return fmt.Errorf("%v id: %w", id.ps, syscall.EINVAL)
	}
	a := *attr
	if a.QPType == 0 {
		a.QPType = id.qpType
	}
	// Missing CQs are made as librdmacm's ucma_create_cqs makes them: each
	// with a completion channel of its own and the id as its context.
	var own []*verbs.CQ
	mk := func(n int) (*verbs.CQ, error) {
		ch, err := pd.Context().CreateCompChannel()
		if err != nil {
			return nil, err
		}
		cq, err := pd.Context().CreateCQEx(max(n, 1), verbs.CQInit{Context: id, Channel: ch})
		if err != nil {
			ch.Destroy()
			return nil, err
		}
		own = append(own, cq)
		return cq, nil
	}
	if a.SendCQ == nil {
		if a.SendCQ, err = mk(a.Cap.MaxSendWR); err != nil {
			return err
		}
	}
	if a.RecvCQ == nil {
		if a.RecvCQ, err = mk(a.Cap.MaxRecvWR); err != nil {
			destroyCQs(own)
			return err
		}
	}
	qp, err := pd.CreateQP(&a)
	if err != nil {
		destroyCQs(own)
		return err
	}
	steps := []struct {
		attr verbs.QPAttr
		mask verbs.QPAttrMask
	}{
		{init, initMask},
		{verbs.QPAttr{State: verbs.QPSRTR}, verbs.QPAttrState},
		{verbs.QPAttr{State: verbs.QPSRTS, SQPSN: 0}, verbs.QPAttrState | verbs.QPAttrSQPSN},
	}
	for _, s := range steps {
		if err := qp.Modify(&s.attr, s.mask); err != nil {
			qp.Destroy()
			destroyCQs(own)
			return err
		}
	}
	id.qp, id.ownCQs, id.sendCQ, id.recvCQ = qp, own, a.SendCQ, a.RecvCQ
	*attr = a
	attr.Cap = qp.Query().Cap
	return nil
}

// CreateQPEx is CreateQP taking the extended attributes (create flags).
func (id *ID) CreateQPEx(pd *verbs.PD, attr *verbs.QPInitAttr) error { return id.CreateQP(pd, attr) }

// destroyCQs destroys CQs the id made, and their completion channels.
func destroyCQs(cqs []*verbs.CQ) {
	for _, cq := range cqs {
		ch := cq.Channel()
		cq.Destroy()
		if ch != nil {
			ch.Destroy()
		}
	}
}

// DestroyQP destroys the id's QP (rdma_destroy_qp).
func (id *ID) DestroyQP() (err error) {
	defer wrapErr(&err, "rdma_destroy_qp", nil)
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.qp == nil {
		return syscall.EINVAL
	}
	err = id.qp.Destroy()
	id.qp = nil
	return err
}

// Destroy destroys the id (rdma_destroy_id): it leaves every group, drops
// the id's undelivered events, and waits until every event already
// retrieved for it is acked. The QP should be destroyed first; if it still
// exists it is detached from the id's groups and destroyed. On InfiniBand
// it waits for the SA Deletes of its joins; an SA that refuses or does not
// answer gives its errno (the id is destroyed all the same).
func (id *ID) Destroy() (err error) {
	defer wrapErr(&err, "rdma_destroy_id", nil)
	id.mu.Lock()
	if wait := id.eng.cancelLocked(id); wait != nil {
		id.mu.Unlock()
		wait()
		id.mu.Lock()
	}
	if id.state == stateDestroying {
		id.mu.Unlock()
		return syscall.EINVAL
	}
	id.state = stateDestroying
	mcs := id.mcs
	id.mcs = nil
	var waits []func() error
	for _, mc := range mcs {
		if w := id.leaveLocked(mc); w != nil {
			waits = append(waits, w)
		}
	}
	if id.qp != nil {
		id.qp.Destroy()
		id.qp = nil
	}
	destroyCQs(id.ownCQs)
	id.ownCQs = nil
	dev := id.eng.addrs().dev
	// The engine's wait first: a soft id's UD connection part closes
	// before the SA Deletes are waited for.
	if w := id.eng.releaseLocked(id); w != nil {
		waits = append([]func() error{w}, waits...)
	}
	id.mu.Unlock()
	// The SA Deletes of the id's IB joins were started together: Destroy
	// returns when all were answered or timed out.
	var leaveErr error
	for _, w := range waits {
		if err := w(); err != nil && leaveErr == nil {
			leaveErr = err
		}
	}
	if dev != nil {
		dev.detach(id)
	}
	ch := id.lockCh()
	// A listener's unread CONNECT_REQUESTs go with it, and their new ids
	// too (destroyed below: their requests are rejected, as the kernel's
	// CM does with a listen's pending requests).
	var orphans []*ID
	ch.purgeLocked(func(ev *Event) bool {
		if ev.ListenID == id && ev.ID != id {
			orphans = append(orphans, ev.ID)
			return true
		}
		return ev.ID == id
	})
	if p := id.ev.parked; p != nil {
		id.ackLocked(p)
	}
	id.ev.parked = nil
	for id.ev.completed < id.ev.reported {
		ch.cond.Wait()
	}
	ch.ids--
	ch.mu.Unlock()
	for _, o := range orphans {
		o.Destroy()
	}
	if id.isSync() {
		ch.Close()
	}
	return leaveErr
}
