//go:build rdmacore && cgo

package rdmacore

// #include "shim.h"
import "C"

import (
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// postBatch bounds the work requests one ibv_post_send or ibv_post_recv
// call takes; a longer chain is posted in order, in several calls.
const postBatch = 32

// CreateQP creates a UD queue pair (ibv_create_qp_ex). Its CQs must be
// this backend's, of the PD's context (EINVAL otherwise); QP types other
// than UD give EOPNOTSUPP. CreateBlockSelfMcastLB goes to the kernel as
// IBV_QP_CREATE_BLOCK_SELF_MCAST_LB, whose verdict (an errno when the
// device does not support it) is returned.
func (p *pd) CreateQP(init *driver.QPInitAttr) (driver.QPOps, error) {
	c, err := p.live("ibv_create_qp")
	defer p.mu.RUnlock()
	if err != nil {
		return nil, err
	}
	if init.QPType != verbs.QPTypeUD {
		return nil, verbs.OpError("ibv_create_qp", "", fmt.Errorf("%v: %w", init.QPType, syscall.EOPNOTSUPP))
	}
	scq, ok1 := init.SendCQ.(*cq)
	rcq, ok2 := init.RecvCQ.(*cq)
	if !ok1 || !ok2 || scq.ctx != p.ctx || rcq.ctx != p.ctx {
		return nil, verbs.OpError("ibv_create_qp", "", fmt.Errorf("CQ of another device or backend: %w", syscall.EINVAL))
	}
	if err := scq.hold(1); err != nil {
		return nil, verbs.OpError("ibv_create_qp", "", fmt.Errorf("send CQ destroyed: %w", syscall.EINVAL))
	}
	if err := rcq.hold(1); err != nil {
		_ = scq.hold(-1)
		return nil, verbs.OpError("ibv_create_qp", "", fmt.Errorf("receive CQ destroyed: %w", syscall.EINVAL))
	}
	q, err := p.createQP(c, init, scq, rcq)
	if err != nil {
		_ = scq.hold(-1)
		_ = rcq.hold(-1)
		return nil, err
	}
	return q, nil
}

func (p *pd) createQP(c *C.struct_ibv_pd, init *driver.QPInitAttr, scq, rcq *cq) (*qp, error) {
	var ia C.struct_ibv_qp_init_attr_ex
	ia.send_cq = scq.c
	ia.recv_cq = rcq.c
	ia.cap.max_send_wr = C.uint32_t(init.Cap.MaxSendWR)
	ia.cap.max_recv_wr = C.uint32_t(init.Cap.MaxRecvWR)
	ia.cap.max_send_sge = C.uint32_t(init.Cap.MaxSendSGE)
	ia.cap.max_recv_sge = C.uint32_t(init.Cap.MaxRecvSGE)
	ia.cap.max_inline_data = C.uint32_t(init.Cap.MaxInlineData)
	ia.qp_type = C.IBV_QPT_UD
	if init.SQSigAll {
		ia.sq_sig_all = 1
	}
	ia.comp_mask = C.IBV_QP_INIT_ATTR_PD
	ia.pd = c
	if init.CreateFlags != 0 {
		ia.comp_mask |= C.IBV_QP_INIT_ATTR_CREATE_FLAGS
		ia.create_flags = C.uint32_t(init.CreateFlags)
	}
	qc, cerrno := C.ibv_create_qp_ex(p.ctx.c, &ia)
	if qc == nil {
		return nil, verbs.Errorf("ibv_create_qp", "", cerr(cerrno))
	}
	q := &qp{pd: p, c: qc, num: uint32(qc.qp_num), scq: scq, rcq: rcq}
	q.sBatch = min(max(int(ia.cap.max_send_wr), 1), postBatch)
	q.sAHs = make([]*ah, 0, q.sBatch)
	q.sMaxSGE = max(int(ia.cap.max_send_sge), 1)
	q.rBatch = min(max(int(ia.cap.max_recv_wr), 1), postBatch)
	q.rMaxSGE = max(int(ia.cap.max_recv_sge), 1)
	q.sInP = (*C.struct_sr_send)(C.calloc(C.size_t(q.sBatch), C.sizeof_struct_sr_send))
	q.sWR = (*C.struct_ibv_send_wr)(C.calloc(C.size_t(q.sBatch), C.sizeof_struct_ibv_send_wr))
	q.sSGEP = (*C.struct_ibv_sge)(C.calloc(C.size_t(q.sBatch*q.sMaxSGE), C.sizeof_struct_ibv_sge))
	q.rWRP = (*C.struct_ibv_recv_wr)(C.calloc(C.size_t(q.rBatch), C.sizeof_struct_ibv_recv_wr))
	q.rSGEP = (*C.struct_ibv_sge)(C.calloc(C.size_t(q.rBatch*q.rMaxSGE), C.sizeof_struct_ibv_sge))
	if q.sInP == nil || q.sWR == nil || q.sSGEP == nil || q.rWRP == nil || q.rSGEP == nil {
		C.ibv_destroy_qp(qc)
		q.free()
		return nil, verbs.Errorf("ibv_create_qp", "", syscall.ENOMEM)
	}
	q.sIn = unsafe.Slice(q.sInP, q.sBatch)
	q.sSGE = unsafe.Slice(q.sSGEP, q.sBatch*q.sMaxSGE)
	q.rWR = unsafe.Slice(q.rWRP, q.rBatch)
	q.rSGE = unsafe.Slice(q.rSGEP, q.rBatch*q.rMaxSGE)
	for i := range q.rWR {
		q.rWR[i].sg_list = &q.rSGE[i*q.rMaxSGE]
	}
	q.gone = watch(q, "queue pair (ibv_qp)")
	return q, nil
}

// qp is a UD queue pair (struct ibv_qp): driver.QPOps. Work requests are
// converted into C arrays made with the QP (sized by its caps, at most
// postBatch requests), so posting allocates nothing.
type qp struct {
	pd       *pd
	c        *C.struct_ibv_qp
	num      uint32
	scq, rcq *cq

	life sync.RWMutex // dead (write); calls on c (read)
	dead bool
	gone *freed

	sendMu  sync.Mutex
	sAHs    []*ah // the AHs of the batch being posted, read-locked (sendMu)
	sBatch  int
	sMaxSGE int
	sInP    *C.struct_sr_send
	sIn     []C.struct_sr_send
	sWR     *C.struct_ibv_send_wr
	sSGEP   *C.struct_ibv_sge
	sSGE    []C.struct_ibv_sge

	recvMu  sync.Mutex
	rBatch  int
	rMaxSGE int
	rWRP    *C.struct_ibv_recv_wr
	rWR     []C.struct_ibv_recv_wr
	rSGEP   *C.struct_ibv_sge
	rSGE    []C.struct_ibv_sge
}

func (q *qp) free() {
	for _, p := range []unsafe.Pointer{unsafe.Pointer(q.sInP), unsafe.Pointer(q.sWR), unsafe.Pointer(q.sSGEP), unsafe.Pointer(q.rWRP), unsafe.Pointer(q.rSGEP)} {
		C.free(p)
	}
	q.sInP, q.sWR, q.sSGEP, q.rWRP, q.rSGEP = nil, nil, nil, nil, nil
	q.sIn, q.sSGE, q.rWR, q.rSGE = nil, nil, nil, nil
}

// Num returns the QP number.
func (q *qp) Num() uint32 { return q.num }

const queryMask = C.IBV_QP_STATE | C.IBV_QP_CUR_STATE | C.IBV_QP_PKEY_INDEX | C.IBV_QP_PORT | C.IBV_QP_QKEY | C.IBV_QP_SQ_PSN | C.IBV_QP_CAP

// query runs ibv_query_qp.
func (q *qp) query() (verbs.QPAttr, error) {
	q.life.RLock()
	defer q.life.RUnlock()
	if q.dead {
		return verbs.QPAttr{}, verbs.Errorf("ibv_query_qp", "", syscall.EINVAL)
	}
	var a C.struct_ibv_qp_attr
	var ia C.struct_ibv_qp_init_attr
	if rc := C.ibv_query_qp(q.c, &a, queryMask, &ia); rc != 0 {
		return verbs.QPAttr{}, verbs.Errorf("ibv_query_qp", "", ibvErrno(int(rc)))
	}
	return verbs.QPAttr{
		State:   verbs.QPState(a.qp_state),
		PKeyIdx: uint16(a.pkey_index),
		PortNum: uint8(a.port_num),
		QKey:    uint32(a.qkey),
		SQPSN:   uint32(a.sq_psn),
		Cap: verbs.QPCap{
			MaxSendWR:     int(a.cap.max_send_wr),
			MaxRecvWR:     int(a.cap.max_recv_wr),
			MaxSendSGE:    int(a.cap.max_send_sge),
			MaxRecvSGE:    int(a.cap.max_recv_sge),
			MaxInlineData: int(a.cap.max_inline_data),
		},
		CurState: verbs.QPState(a.cur_qp_state),
	}, nil
}

// State returns the QP's state as the kernel has it (ibv_query_qp); ERR
// once the QP is destroyed or cannot be queried.
func (q *qp) State() verbs.QPState {
	a, err := q.query()
	if err != nil {
		return verbs.QPSErr
	}
	return a.State
}

// Query returns the QP's attributes (ibv_query_qp); the zero QPAttr with
// State ERR when the query fails.
func (q *qp) Query() verbs.QPAttr {
	a, err := q.query()
	if err != nil {
		return verbs.QPAttr{State: verbs.QPSErr, CurState: verbs.QPSErr}
	}
	return a
}

// Modify changes attributes and state (ibv_modify_qp); verbs.QPAttrMask
// has the C values, and the kernel checks transitions and masks.
func (q *qp) Modify(attr *verbs.QPAttr, mask verbs.QPAttrMask) error {
	q.life.RLock()
	defer q.life.RUnlock()
	if q.dead || attr == nil {
		return verbs.Errorf("ibv_modify_qp", "", syscall.EINVAL)
	}
	var a C.struct_ibv_qp_attr
	a.qp_state = C.enum_ibv_qp_state(attr.State)
	a.cur_qp_state = C.enum_ibv_qp_state(attr.CurState)
	a.pkey_index = C.uint16_t(attr.PKeyIdx)
	a.port_num = C.uint8_t(attr.PortNum)
	a.qkey = C.uint32_t(attr.QKey)
	a.sq_psn = C.uint32_t(attr.SQPSN)
	if rc := C.ibv_modify_qp(q.c, &a, C.int(mask)); rc != 0 {
		return verbs.Errorf("ibv_modify_qp", "", ibvErrno(int(rc)))
	}
	return nil
}

// badWR is the error of a post that failed at request index.
func badWR(op string, index int, e syscall.Errno) error {
	return &verbs.Error{Op: op, Errno: e, Err: &verbs.BadWRError{Index: index, Err: e}}
}

// PostSend posts a chain of UD send requests (ibv_post_send). Each AH must
// be one of this backend's, of the QP's context, not destroyed; a request
// with a foreign AH or more SGEs than the QP takes fails with EINVAL. The
// requests before a failed one are posted, as in C.
func (q *qp) PostSend(wr *verbs.SendWR) error {
	q.life.RLock()
	defer q.life.RUnlock()
	if q.dead {
		return badWR("ibv_post_send", 0, syscall.EINVAL)
	}
	q.sendMu.Lock()
	defer q.sendMu.Unlock()
	defer q.releaseAHs()
	base := 0
	for wr != nil {
		n := 0
		var stop syscall.Errno
		for ; wr != nil && n < q.sBatch; wr = wr.Next {
			if len(wr.SGList) > q.sMaxSGE {
				stop = syscall.EINVAL
				break
			}
			var a *ah
			if wr.UD.AH != nil {
				a, _ = wr.UD.AH.Ops().(*ah)
			}
			if a == nil || a.pd.ctx != q.pd.ctx || !q.holdAH(a) {
				stop = syscall.EINVAL
				break
			}
			in := &q.sIn[n]
			in.wr_id = C.uint64_t(wr.WRID)
			in.ah = a.c
			in.remote_qpn = C.uint32_t(wr.UD.RemoteQPN)
			in.remote_qkey = C.uint32_t(wr.UD.RemoteQKey)
			in.opcode = C.uint32_t(wr.Opcode)
			in.send_flags = C.uint32_t(wr.Flags)
			in.imm = C.uint32_t(wr.ImmData)
			in.num_sge = C.uint32_t(len(wr.SGList))
			sg := q.sSGE[n*q.sMaxSGE:]
			for i, s := range wr.SGList {
				sg[i].addr = C.uint64_t(s.Addr)
				sg[i].length = C.uint32_t(s.Length)
				sg[i].lkey = C.uint32_t(s.LKey)
			}
			n++
		}
		if n > 0 {
			r := int64(C.sr_post_send_u(cptr(q.c), cptr(q.sInP), cptr(q.sWR), cptr(q.sSGEP), C.int(n), C.int(q.sMaxSGE)))
			if r != 0 {
				return badWR("ibv_post_send", base+int(r>>32), syscall.Errno(uint32(r)))
			}
		}
		q.releaseAHs()
		if stop != 0 {
			return badWR("ibv_post_send", base+n, stop)
		}
		base += n
	}
	return nil
}

// holdAH read-locks a (once per batch) for the batch's post, so that its
// Destroy waits until libibverbs has taken the requests; false when a is
// destroyed. sendMu is held.
func (q *qp) holdAH(a *ah) bool {
	for _, h := range q.sAHs {
		if h == a {
			return true // a read lock taken twice could deadlock with a waiting Destroy
		}
	}
	a.life.RLock()
	if a.dead {
		a.life.RUnlock()
		return false
	}
	q.sAHs = append(q.sAHs, a)
	return true
}

// releaseAHs unlocks the AHs of the batch posted; sendMu is held.
func (q *qp) releaseAHs() {
	for i, a := range q.sAHs {
		a.life.RUnlock()
		q.sAHs[i] = nil
	}
	q.sAHs = q.sAHs[:0]
}

// PostRecv posts a chain of receive requests (ibv_post_recv); a request
// with more SGEs than the QP takes fails with EINVAL, after the ones
// before it were posted.
func (q *qp) PostRecv(wr *verbs.RecvWR) error {
	q.life.RLock()
	defer q.life.RUnlock()
	if q.dead {
		return badWR("ibv_post_recv", 0, syscall.EINVAL)
	}
	q.recvMu.Lock()
	defer q.recvMu.Unlock()
	base := 0
	for wr != nil {
		n := 0
		var stop syscall.Errno
		for ; wr != nil && n < q.rBatch; wr = wr.Next {
			if len(wr.SGList) > q.rMaxSGE {
				stop = syscall.EINVAL
				break
			}
			w := &q.rWR[n]
			w.wr_id = C.uint64_t(wr.WRID)
			w.num_sge = C.int(len(wr.SGList))
			sg := q.rSGE[n*q.rMaxSGE:]
			for i, s := range wr.SGList {
				sg[i].addr = C.uint64_t(s.Addr)
				sg[i].length = C.uint32_t(s.Length)
				sg[i].lkey = C.uint32_t(s.LKey)
			}
			n++
		}
		if n > 0 {
			r := int64(C.sr_post_recv_u(cptr(q.c), cptr(q.rWRP), C.int(n)))
			if r != 0 {
				return badWR("ibv_post_recv", base+int(r>>32), syscall.Errno(uint32(r)))
			}
		}
		if stop != 0 {
			return badWR("ibv_post_recv", base+n, stop)
		}
		base += n
	}
	return nil
}

// AttachMcast attaches the QP to a multicast group (ibv_attach_mcast). On
// RoCE this sets the device's multicast MAC filter only: joining the IP
// group (IGMP) is the RDMA CM's part, or the application's.
func (q *qp) AttachMcast(gid verbs.GID, lid uint16) error {
	return q.mcast("ibv_attach_mcast", gid, lid)
}

// DetachMcast detaches the QP from a multicast group (ibv_detach_mcast).
func (q *qp) DetachMcast(gid verbs.GID, lid uint16) error {
	return q.mcast("ibv_detach_mcast", gid, lid)
}

func (q *qp) mcast(op string, gid verbs.GID, lid uint16) error {
	q.life.RLock()
	defer q.life.RUnlock()
	if q.dead {
		return verbs.Errorf(op, gid.String(), syscall.EINVAL)
	}
	var g C.union_ibv_gid
	*(*verbs.GID)(unsafe.Pointer(&g)) = gid
	var rc C.int
	if op == "ibv_attach_mcast" {
		rc = C.ibv_attach_mcast(q.c, &g, C.uint16_t(lid))
	} else {
		rc = C.ibv_detach_mcast(q.c, &g, C.uint16_t(lid))
	}
	if rc != 0 {
		return verbs.Errorf(op, gid.String(), ibvErrno(int(rc)))
	}
	return nil
}

// Destroy destroys the QP (ibv_destroy_qp); EINVAL when destroyed already.
func (q *qp) Destroy() error {
	q.life.Lock()
	defer q.life.Unlock()
	if q.dead {
		return verbs.Errorf("ibv_destroy_qp", "", syscall.EINVAL)
	}
	if rc := C.ibv_destroy_qp(q.c); rc != 0 {
		return verbs.Errorf("ibv_destroy_qp", "", ibvErrno(int(rc)))
	}
	q.dead = true
	q.gone.set()
	_ = q.scq.hold(-1)
	_ = q.rcq.hold(-1)
	q.free()
	return nil
}
