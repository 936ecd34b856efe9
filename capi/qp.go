//go:build capi

package main

/*
#include <stdlib.h>
#include <string.h>
#include <capi.h>
*/
import "C"

import (
	"unsafe"

	"github.com/softrdma/softrdma/verbs"
)

// cqp is the Go side of a C QP (ibv_create_qp, ibv_create_qp_ex or
// rdma_create_qp).
type cqp struct {
	qp *verbs.QP
	c  *C.struct_sr_qp
	id *cmID // the id rdma_create_qp made it for; nil for ibv_create_qp

	sigAll bool // sq_sig_all, for ibv_query_qp

	// The QP's sizes, fixed at its creation.
	maxSendSGE, maxRecvSGE, maxInline int

	send sendPath // guarded by its mu
	recv recvPath // guarded by its mu
}

// newCQP makes the C struct of a new Go QP and registers both.
func newCQP(gq *verbs.QP, pd *C.struct_ibv_pd, qpctx unsafe.Pointer, scq, rcq *C.struct_ibv_cq, id *cmID, sigAll bool) *cqp {
	c := C.sr_qp_alloc()
	b := C.sr_qp_base(c)
	b.context = cContext(gq.PD().Context())
	b.qp_context = qpctx
	b.pd = pd
	b.send_cq = scq
	b.recv_cq = rcq
	b.qp_num = C.uint32_t(gq.Num())
	b.state = uint32(gq.State())
	b.qp_type = uint32(gq.Type())
	cp := gq.Query().Cap
	q := &cqp{qp: gq, c: c, id: id, sigAll: sigAll,
		maxSendSGE: cp.MaxSendSGE, maxRecvSGE: cp.MaxRecvSGE, maxInline: cp.MaxInlineData}
	c.h = reg.put(q)
	b.handle = C.uint32_t(c.h)
	return q
}

// dropBounce deregisters and frees the inline bounce buffer.
func (q *cqp) dropBounce() {
	s := &q.send
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bounceMR != nil {
		s.bounceMR.Dereg()
		s.bounceMR = nil
	}
	if s.bounce != nil {
		C.free(s.bounce)
		s.bounce = nil
	}
}

// free releases the C struct of a destroyed QP.
func (q *cqp) free() {
	q.dropBounce()
	reg.del(q.c.h)
	C.sr_qp_free(q.c)
}

// cPointer is the C memory at address a (an SGE's address).
func cPointer(a uint64) unsafe.Pointer {
	u := uintptr(a)
	return *(*unsafe.Pointer)(unsafe.Pointer(&u))
}

func goQP(qp *C.struct_ibv_qp) (*cqp, bool) {
	if qp == nil {
		return nil, false
	}
	return get[*cqp]((*C.struct_sr_qp)(unsafe.Pointer(qp)).h)
}

//export srQPValid
func srQPValid(qp *C.struct_ibv_qp) C.int {
	if _, ok := goQP(qp); ok {
		return 1
	}
	return 0
}

//export srPDValid
func srPDValid(pd *C.struct_ibv_pd) C.int {
	if _, ok := goPD(pd); ok {
		return 1
	}
	return 0
}

// goQPInit converts the C creation attributes.
func goQPInit(in *C.struct_sr_qp_init) (verbs.QPInitAttr, bool) {
	attr := verbs.QPInitAttr{
		Cap: verbs.QPCap{
			MaxSendWR: int(in.max_send_wr), MaxRecvWR: int(in.max_recv_wr),
			MaxSendSGE: int(in.max_send_sge), MaxRecvSGE: int(in.max_recv_sge),
			MaxInlineData: int(in.max_inline_data),
		},
		QPType:      verbs.QPType(in.qp_type),
		SQSigAll:    in.sq_sig_all != 0,
		CreateFlags: verbs.CreateFlags(in.create_flags),
	}
	var ok bool
	if in.send_cq != nil {
		if attr.SendCQ, ok = goCQ(in.send_cq); !ok {
			return attr, false
		}
	}
	if in.recv_cq != nil {
		if attr.RecvCQ, ok = goCQ(in.recv_cq); !ok {
			return attr, false
		}
	}
	// A C int beyond int32 (negative as uint32) is no valid size.
	for _, v := range []C.uint32_t{in.max_send_wr, in.max_recv_wr, in.max_send_sge, in.max_recv_sge, in.max_inline_data} {
		if v > 1<<30 {
			return attr, false
		}
	}
	return attr, true
}

// putQPCap writes the QP's actual sizes back (libibverbs updates the
// caller's cap).
func putQPCap(in *C.struct_sr_qp_init, c verbs.QPCap) {
	in.max_send_wr = C.uint32_t(c.MaxSendWR)
	in.max_recv_wr = C.uint32_t(c.MaxRecvWR)
	in.max_send_sge = C.uint32_t(c.MaxSendSGE)
	in.max_recv_sge = C.uint32_t(c.MaxRecvSGE)
	in.max_inline_data = C.uint32_t(c.MaxInlineData)
}

//export srCreateVerbsQP
func srCreateVerbsQP(in *C.struct_sr_qp_init, out **C.struct_sr_qp) C.int {
	gpd, ok := goPD(in.pd)
	if !ok {
		return C.EINVAL
	}
	attr, ok := goQPInit(in)
	if !ok || attr.SendCQ == nil || attr.RecvCQ == nil {
		return C.EINVAL
	}
	gq, err := gpd.CreateQP(&attr)
	if err != nil {
		return errno(err)
	}
	q := newCQP(gq, in.pd, in.qp_context, in.send_cq, in.recv_cq, nil, attr.SQSigAll)
	putQPCap(in, gq.Query().Cap)
	*out = q.c
	return 0
}

//export srDestroyVerbsQP
func srDestroyVerbsQP(qp *C.struct_ibv_qp) C.int {
	q, ok := goQP(qp)
	if !ok {
		return C.EINVAL
	}
	if q.id != nil {
		// The QP of an id (rdma_create_qp): the id lets go of it, as
		// rdma_destroy_qp.
		q.id.destroyQP()
		return 0
	}
	q.dropBounce()
	if err := q.qp.Destroy(); err != nil {
		return errno(err)
	}
	q.free()
	return 0
}

// The ibv_qp_attr_mask bits the Go API does not name.
const qpCurState = 1 << 1

//export srModifyQP
func srModifyQP(qp *C.struct_ibv_qp, attr *C.struct_ibv_qp_attr, mask C.int) C.int {
	q, ok := goQP(qp)
	if !ok {
		return C.EINVAL
	}
	m := uint32(mask)
	if m&qpCurState != 0 {
		// The state the caller believes the QP is in must be its state.
		if verbs.QPState(attr.cur_qp_state) != q.qp.State() {
			return C.EINVAL
		}
		m &^= qpCurState
	}
	ga := verbs.QPAttr{
		State:   verbs.QPState(attr.qp_state),
		PKeyIdx: uint16(attr.pkey_index),
		PortNum: uint8(attr.port_num),
		QKey:    uint32(attr.qkey),
		SQPSN:   uint32(attr.sq_psn),
	}
	if m&uint32(verbs.QPAttrState) != 0 && attr.qp_state > C.IBV_QPS_ERR {
		return C.EINVAL
	}
	err := q.qp.Modify(&ga, verbs.QPAttrMask(m))
	qp.state = uint32(q.qp.State())
	return errno(err)
}

//export srQueryQP
func srQueryQP(qp *C.struct_ibv_qp, attr *C.struct_ibv_qp_attr, init *C.struct_ibv_qp_init_attr) C.int {
	q, ok := goQP(qp)
	if !ok {
		return C.EINVAL
	}
	a := q.qp.Query()
	attr.qp_state = uint32(a.State)
	attr.cur_qp_state = uint32(a.State)
	attr.qkey = C.uint32_t(a.QKey)
	attr.sq_psn = C.uint32_t(a.SQPSN)
	attr.pkey_index = C.uint16_t(a.PKeyIdx)
	attr.port_num = C.uint8_t(a.PortNum)
	if a.PortNum != 0 {
		if p, err := q.qp.PD().Context().QueryPort(a.PortNum); err == nil {
			attr.path_mtu = uint32(p.ActiveMTU)
		}
	}
	attr.cap.max_send_wr = C.uint32_t(a.Cap.MaxSendWR)
	attr.cap.max_recv_wr = C.uint32_t(a.Cap.MaxRecvWR)
	attr.cap.max_send_sge = C.uint32_t(a.Cap.MaxSendSGE)
	attr.cap.max_recv_sge = C.uint32_t(a.Cap.MaxRecvSGE)
	attr.cap.max_inline_data = C.uint32_t(a.Cap.MaxInlineData)
	init.qp_context = qp.qp_context
	init.send_cq = qp.send_cq
	init.recv_cq = qp.recv_cq
	init.cap = attr.cap
	init.qp_type = qp.qp_type
	if q.sigAll {
		init.sq_sig_all = 1
	}
	qp.state = attr.qp_state
	return 0
}

// goWC converts struct ibv_wc.
func goWC(c *C.struct_ibv_wc) verbs.WC {
	return verbs.WC{
		WRID:         uint64(c.wr_id),
		Status:       verbs.WCStatus(c.status),
		Opcode:       verbs.WCOpcode(c.opcode),
		VendorErr:    uint32(c.vendor_err),
		ByteLen:      uint32(c.byte_len),
		ImmData:      htonl(uint32(C.sr_wc_imm(c))),
		QPNum:        uint32(c.qp_num),
		SrcQP:        uint32(c.src_qp),
		Flags:        verbs.WCFlags(c.wc_flags),
		PKeyIndex:    uint16(c.pkey_index),
		SLID:         uint16(c.slid),
		SL:           uint8(c.sl),
		DLIDPathBits: uint8(c.dlid_path_bits),
	}
}

//export srInitAHFromWC
func srInitAHFromWC(c *C.struct_ibv_context, port C.uint8_t, wc *C.struct_ibv_wc, grh *C.struct_ibv_grh, out *C.struct_ibv_ah_attr) C.int {
	gc, ok := goContext(c)
	if !ok {
		return C.EINVAL
	}
	gw := goWC(wc)
	var g []byte
	if grh != nil {
		g = unsafe.Slice((*byte)(unsafe.Pointer(grh)), verbs.GRHLen)
	}
	a, err := verbs.InitAHFromWC(gc, uint8(port), &gw, g)
	if err != nil {
		return errno(err)
	}
	putAHAttr(out, &a)
	return 0
}
