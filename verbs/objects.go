package verbs

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/softrdma/softrdma/verbs/driver"
)

// PD is a protection domain (struct ibv_pd).
type PD struct {
	ctx *Context
	ops driver.PDOps
}

// Context returns the device context of the PD.
func (pd *PD) Context() *Context { return pd.ctx }

// Ops returns the backend's side of the PD.
func (pd *PD) Ops() driver.PDOps { return pd.ops }

// Dealloc frees the PD (ibv_dealloc_pd). It fails with EBUSY while memory
// regions, QPs or address handles of the PD exist.
func (pd *PD) Dealloc() error { return OpError("ibv_dealloc_pd", "", pd.ops.Dealloc()) }

// RegMR registers buf (ibv_reg_mr). Receives need AccessLocalWrite. The
// slice must not be resized or reused for other purposes while it is
// registered; the MR keeps a reference, so it stays at the same address.
func (pd *PD) RegMR(buf []byte, access Access) (*MR, error) {
	ops, err := pd.ops.RegMR(buf, access)
	if err != nil {
		return nil, OpError("ibv_reg_mr", "", err)
	}
	return &MR{pd: pd, ops: ops, buf: buf, addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))), lkey: ops.LKey()}, nil
}

// CreateAH creates an address handle (ibv_create_ah). On an Ethernet (RoCE)
// port the GRH is mandatory and its SGID index must exist.
func (pd *PD) CreateAH(attr *AHAttr) (*AH, error) {
	if attr == nil {
		return nil, Errorf("ibv_create_ah", "", syscall.EINVAL)
	}
	ops, err := pd.ops.CreateAH(attr)
	if err != nil {
		return nil, OpError("ibv_create_ah", "", err)
	}
	return &AH{pd: pd, ops: ops, attr: *attr}, nil
}

// CreateQP creates a queue pair (ibv_create_qp / ibv_create_qp_ex).
func (pd *PD) CreateQP(init *QPInitAttr) (*QP, error) {
	if init == nil || init.SendCQ == nil || init.RecvCQ == nil {
		return nil, OpError("ibv_create_qp", "", fmt.Errorf("missing attributes or CQ: %w", syscall.EINVAL))
	}
	ops, err := pd.ops.CreateQP(&driver.QPInitAttr{
		Context: init.Context, SendCQ: init.SendCQ.ops, RecvCQ: init.RecvCQ.ops,
		Cap: init.Cap, QPType: init.QPType, SQSigAll: init.SQSigAll, CreateFlags: init.CreateFlags,
	})
	if err != nil {
		return nil, OpError("ibv_create_qp", "", err)
	}
	return &QP{
		pd: pd, ops: ops, qpn: ops.Num(), sendCQ: init.SendCQ, recvCQ: init.RecvCQ,
		typ: init.QPType, flags: init.CreateFlags, context: init.Context,
	}, nil
}

// MR is a registered memory region (struct ibv_mr) over a Go byte slice.
type MR struct {
	pd   *PD
	ops  driver.MROps
	buf  []byte
	addr uint64
	lkey uint32
}

// Ops returns the backend's side of the MR.
func (mr *MR) Ops() driver.MROps { return mr.ops }

// PD returns the protection domain of the MR.
func (mr *MR) PD() *PD { return mr.pd }

// Dereg deregisters the region (ibv_dereg_mr). Receive WRs already posted
// on it keep their reference; do not dereg memory a QP may still write.
func (mr *MR) Dereg() error { return OpError("ibv_dereg_mr", "", mr.ops.Dereg()) }

// LKey returns the local key.
func (mr *MR) LKey() uint32 { return mr.lkey }

// RKey returns the remote key.
func (mr *MR) RKey() uint32 { return mr.ops.RKey() }

// Addr returns the address of the first registered byte, for SGEs.
func (mr *MR) Addr() uint64 { return mr.addr }

// Len returns the length of the region.
func (mr *MR) Len() int { return len(mr.buf) }

// Buf returns the registered slice.
func (mr *MR) Buf() []byte { return mr.buf }

// SGE returns a scatter/gather element for length bytes at offset off.
func (mr *MR) SGE(off, length int) SGE {
	return SGE{Addr: mr.addr + uint64(off), Length: uint32(length), LKey: mr.lkey}
}

var _ driver.AH = (*AH)(nil)

// AH is an address handle (struct ibv_ah).
type AH struct {
	pd   *PD
	ops  driver.AHOps
	attr AHAttr
}

// Attr returns the attributes the AH was created with.
func (ah *AH) Attr() AHAttr { return ah.attr }

// PD returns the protection domain of the AH.
func (ah *AH) PD() *PD { return ah.pd }

// Ops returns the backend's side of the AH (driver.AH); nil for a nil AH.
func (ah *AH) Ops() driver.AHOps {
	if ah == nil {
		return nil
	}
	return ah.ops
}

// Destroy destroys the address handle (ibv_destroy_ah).
func (ah *AH) Destroy() error { return OpError("ibv_destroy_ah", "", ah.ops.Destroy()) }

// CQ is a completion queue (struct ibv_cq). Poll is non-blocking. A CQ
// without a completion channel has Wait, which blocks until a completion
// is available; a CQ with one reports to it (ReqNotify, GetCQEvent,
// AckEvents), as in C.
type CQ struct {
	ctx         *Context
	ops         driver.CQOps
	cap         int
	userContext any
	channel     *CompChannel

	evMu    sync.Mutex
	evCond  *sync.Cond // signalled on AckEvents
	evGot   int        // events GetCQEvent returned for the CQ
	evAcked int
}

// UserContext returns the CQ's context (cq_context of CreateCQEx).
func (cq *CQ) UserContext() any { return cq.userContext }

// Channel returns the CQ's completion channel, or nil.
func (cq *CQ) Channel() *CompChannel { return cq.channel }

// ReqNotify arms the CQ (ibv_req_notify_cq): the next completion queued —
// with solicitedOnly, the next receive of a solicited message or an
// unsuccessful completion — puts one event for the CQ on its channel.
// Completions already queued raise none: arm, then poll until empty, then
// wait for the event. A CQ without a channel is armed for nothing.
func (cq *CQ) ReqNotify(solicitedOnly bool) error {
	return OpError("ibv_req_notify_cq", "", cq.ops.ReqNotify(solicitedOnly))
}

// AckEvents acknowledges n events of the CQ taken with GetCQEvent
// (ibv_ack_cq_events); Destroy waits until every event is acknowledged.
// Acknowledging several at once is cheaper, as in C.
func (cq *CQ) AckEvents(n int) {
	if n <= 0 {
		return
	}
	cq.ops.AckEvents(n)
	cq.evMu.Lock()
	cq.evAcked += n
	cq.evCond.Broadcast()
	cq.evMu.Unlock()
}

// Cap returns the number of completions the CQ holds.
func (cq *CQ) Cap() int { return cq.cap }

// Context returns the device context of the CQ.
func (cq *CQ) Context() *Context { return cq.ctx }

// Ops returns the backend's side of the CQ.
func (cq *CQ) Ops() driver.CQOps { return cq.ops }

// Poll moves up to len(wc) completions into wc and returns how many
// (ibv_poll_cq). It fails with EOVERFLOW once completions were lost because
// the CQ was full (the CQ then keeps that error, as an overrun CQ does).
func (cq *CQ) Poll(wc []WC) (int, error) {
	n, err := cq.ops.Poll(wc)
	if err != nil {
		return n, OpError("ibv_poll_cq", "", err)
	}
	return n, nil
}

// Len returns the number of completions waiting in the CQ.
func (cq *CQ) Len() int { return cq.ops.Len() }

// Wait blocks until the CQ holds a completion, or ctx ends (its error is
// returned). Several goroutines may wait; each completion wakes one. On a
// CQ with a completion channel Wait uses the channel (arm, check, take
// the event, acknowledge it), as librdmacm's rdma_get_recv_comp does:
// only when the channel serves this CQ alone (the channels CreateQP of
// rdmacm makes), else EINVAL; the program must not take the channel's
// events itself meanwhile.
func (cq *CQ) Wait(ctx context.Context) error {
	if ch := cq.channel; ch != nil {
		return cq.waitChannel(ctx, ch)
	}
	if err := cq.ops.Wait(ctx); err != nil {
		return OpError("ibv_get_cq_event", "", err)
	}
	return nil
}

// Destroy destroys the CQ (ibv_destroy_cq); EBUSY while a QP uses it. A
// CQ with a completion channel first waits until every event GetCQEvent
// returned for it is acknowledged (AckEvents), as libibverbs does.
func (cq *CQ) Destroy() error {
	if ch := cq.channel; ch != nil {
		cq.evMu.Lock()
		for cq.evAcked < cq.evGot {
			cq.evCond.Wait()
		}
		cq.evMu.Unlock()
	}
	if err := cq.ops.Destroy(); err != nil {
		return OpError("ibv_destroy_cq", "", err)
	}
	if ch := cq.channel; ch != nil {
		ch.mu.Lock()
		delete(ch.cqs, cq.ops)
		ch.mu.Unlock()
	}
	return nil
}

// QP is a queue pair (struct ibv_qp). Only UD QPs are supported.
type QP struct {
	pd      *PD
	ops     driver.QPOps
	qpn     uint32
	sendCQ  *CQ
	recvCQ  *CQ
	typ     QPType
	flags   CreateFlags
	context any
}

// Ops returns the backend's side of the QP.
func (qp *QP) Ops() driver.QPOps { return qp.ops }

// Num returns the QP number (qp->qp_num).
func (qp *QP) Num() uint32 { return qp.qpn }

// Type returns the QP type.
func (qp *QP) Type() QPType { return qp.typ }

// PD returns the protection domain of the QP.
func (qp *QP) PD() *PD { return qp.pd }

// UserContext returns the Context given at creation (qp->qp_context).
func (qp *QP) UserContext() any { return qp.context }

// SendCQ returns the send completion queue.
func (qp *QP) SendCQ() *CQ { return qp.sendCQ }

// RecvCQ returns the receive completion queue.
func (qp *QP) RecvCQ() *CQ { return qp.recvCQ }

// CreateFlags returns the creation flags.
func (qp *QP) CreateFlags() CreateFlags { return qp.flags }

// State returns the current QP state.
func (qp *QP) State() QPState { return qp.ops.State() }

// Query returns the QP's attributes (ibv_query_qp).
func (qp *QP) Query() QPAttr { return qp.ops.Query() }

// Modify changes QP attributes and state (ibv_modify_qp). UD QPs walk
// RESET → INIT (P_Key index, port, Q_Key) → RTR → RTS (SQ PSN); any state
// may go to RESET or ERR. A wrong transition or mask gives EINVAL.
func (qp *QP) Modify(attr *QPAttr, mask QPAttrMask) error {
	return OpError("ibv_modify_qp", "", qp.ops.Modify(attr, mask))
}

// PostRecv posts a chain of receive work requests (ibv_post_recv). Each
// buffer must hold the 40-byte GRH area plus the payload. A failure names
// the request it stopped at (BadWRError).
func (qp *QP) PostRecv(wr *RecvWR) error {
	if err := qp.ops.PostRecv(wr); err != nil {
		return OpError("ibv_post_recv", "", err)
	}
	return nil
}

// PostSend posts a chain of send work requests (ibv_post_send). Sends on a
// UD QP in RTS go out immediately; a signaled request (or every request
// with SQSigAll) queues a send completion. A failure names the request it
// stopped at (BadWRError); the requests before it were sent.
func (qp *QP) PostSend(wr *SendWR) error {
	if err := qp.ops.PostSend(wr); err != nil {
		return OpError("ibv_post_send", "", err)
	}
	return nil
}

// AttachMcast attaches the QP to a multicast group (ibv_attach_mcast).
func (qp *QP) AttachMcast(gid GID, lid uint16) error {
	if err := qp.ops.AttachMcast(gid, lid); err != nil {
		return OpError("ibv_attach_mcast", gid.String(), err)
	}
	return nil
}

// DetachMcast detaches the QP from a multicast group (ibv_detach_mcast).
func (qp *QP) DetachMcast(gid GID, lid uint16) error {
	if err := qp.ops.DetachMcast(gid, lid); err != nil {
		return OpError("ibv_detach_mcast", gid.String(), err)
	}
	return nil
}

// Destroy destroys the QP (ibv_destroy_qp).
func (qp *QP) Destroy() error { return OpError("ibv_destroy_qp", "", qp.ops.Destroy()) }

// BadWRError reports the work request a post failed on (C's bad_wr).
type BadWRError struct {
	Index int // position in the chain, from 0
	Err   error
}

// Error describes the failed work request and its errno.
func (e *BadWRError) Error() string { return fmt.Sprintf("verbs: work request %d: %v", e.Index, e.Err) }

// Unwrap returns the errno.
func (e *BadWRError) Unwrap() error { return e.Err }

// waitChannel is Wait on a CQ with a channel of its own.
func (cq *CQ) waitChannel(ctx context.Context, ch *CompChannel) error {
	ch.mu.Lock()
	alone := len(ch.cqs) == 1 && ch.cqs[cq.ops] == cq
	ch.mu.Unlock()
	if !alone {
		return OpError("ibv_get_cq_event", "", fmt.Errorf("the CQ shares its completion channel: %w", syscall.EINVAL))
	}
	if ctx == nil {
		ctx = context.Background()
	}
	for {
		if cq.Len() > 0 {
			return nil
		}
		if err := cq.ReqNotify(false); err != nil {
			return err
		}
		if cq.Len() > 0 {
			return nil
		}
		evCQ, _, err := ch.GetCQEvent(ctx)
		if err != nil {
			return err
		}
		evCQ.AckEvents(1)
	}
}
