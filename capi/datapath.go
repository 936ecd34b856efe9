//go:build capi

package main

/*
#include <stdlib.h>
#include <capi.h>
*/
import "C"

import (
	"errors"
	"sync"
	"syscall"
	"unsafe"

	"github.com/softrdma/softrdma/verbs"
)

// The data path: ibv_post_send, ibv_post_recv and ibv_poll_cq. Each C call
// enters Go once for up to SR_CHAIN work requests (verbs.c flattens the
// chain) or 16 completions, and allocates nothing: the Go work requests
// and scatter/gather lists are the QP's own scratch, which softverbs does
// not keep (it copies what it needs before PostSend and PostRecv return).

// chain is how many work requests verbs.c hands over at a time.
const chain = C.SR_CHAIN

// sendPath is the scratch of a QP's send side.
type sendPath struct {
	mu  sync.Mutex // serializes the QP's posts from C; guards the fields below
	wrs [chain]verbs.SendWR
	sge []verbs.SGE // chain × max_send_sge

	// The AH of the last request, found without the registry while its C
	// struct holds the same handle (handles are never reused).
	ahC *C.struct_ibv_ah
	ahH C.uintptr_t
	ahG *verbs.AH

	// Inline sends (IBV_SEND_INLINE) may name memory no MR covers, as
	// libibverbs copies it into the work queue: their bytes are copied
	// into bounce, C memory with a slot of max_inline_data bytes per
	// request of a batch, registered on the QP's PD when the first
	// inline send comes (and deregistered before the QP or its id goes,
	// so that the PD can be freed).
	bounce   unsafe.Pointer
	bounceMR *verbs.MR
}

// recvPath is the scratch of a QP's receive side.
type recvPath struct {
	mu  sync.Mutex // serializes the QP's receive posts from C; guards the fields below
	wrs [chain]verbs.RecvWR
	sge []verbs.SGE // chain × max_recv_sge
}

// badIndex is the index of the work request err names (BadWRError), 0
// when it names none.
func badIndex(err error) C.int {
	var be *verbs.BadWRError
	if errors.As(err, &be) {
		return C.int(be.Index)
	}
	return 0
}

// cSGEs is the gather list of a flattened request, n elements.
func cSGEs(sg *C.struct_ibv_sge, n C.int) []C.struct_ibv_sge {
	if n <= 0 {
		return nil
	}
	return unsafe.Slice(sg, int(n))
}

// ah returns the Go AH of a send request's C AH.
func (s *sendPath) ah(ah *C.struct_ibv_ah) (*verbs.AH, bool) {
	if ah == nil {
		return nil, false
	}
	h := (*C.struct_sr_ah)(unsafe.Pointer(ah)).h
	if ah == s.ahC && h == s.ahH {
		return s.ahG, true
	}
	g, ok := get[*verbs.AH](h)
	if ok {
		s.ahC, s.ahH, s.ahG = ah, h, g
	}
	return g, ok
}

// inline copies the bytes of an inline request into bounce slot i and
// points the request's gather list at them.
func (q *cqp) inline(i int, wr *verbs.SendWR, sg []C.struct_ibv_sge) error {
	s := &q.send
	n := 0
	for _, e := range sg {
		n += int(e.length)
	}
	if n > q.maxInline {
		return syscall.EINVAL
	}
	if n == 0 {
		wr.SGList = nil
		return nil
	}
	if s.bounceMR == nil {
		size := q.maxInline * chain
		s.bounce = C.malloc(C.size_t(size))
		mr, err := q.qp.PD().RegMR(unsafe.Slice((*byte)(s.bounce), size), verbs.AccessLocalWrite)
		if err != nil {
			C.free(s.bounce)
			s.bounce = nil
			return err
		}
		s.bounceMR = mr
	}
	off := i * q.maxInline
	dst := unsafe.Slice((*byte)(unsafe.Add(s.bounce, off)), n)
	k := 0
	for _, e := range sg {
		if e.length == 0 {
			continue
		}
		if e.addr == 0 {
			return syscall.EFAULT
		}
		k += copy(dst[k:], unsafe.Slice((*byte)(cPointer(uint64(e.addr))), int(e.length)))
	}
	wr.SGList = append(wr.SGList[:0], s.bounceMR.SGE(off, n))
	return nil
}

//export srPostSendFlat
func srPostSendFlat(qp *C.struct_ibv_qp, w *C.struct_sr_swr, n C.int, bad *C.int) C.int {
	*bad = 0
	q, ok := goQP(qp)
	if !ok {
		return C.EINVAL
	}
	ws := unsafe.Slice(w, int(n))
	s := &q.send
	s.mu.Lock()
	defer s.mu.Unlock()
	if need := chain * max(q.maxSendSGE, 1); len(s.sge) < need {
		s.sge = make([]verbs.SGE, need)
	}
	ud := q.qp.Type() == verbs.QPTypeUD
	k := 0 // requests converted
	var cerr error
	for ; k < len(ws); k++ {
		c := &ws[k]
		wr := &s.wrs[k]
		// More elements than the QP takes fail in softverbs' checks
		// (EINVAL); they are not read.
		m := min(int(c.num_sge), q.maxSendSGE+1)
		list := s.sge[k*max(q.maxSendSGE, 1) : k*max(q.maxSendSGE, 1)]
		sg := cSGEs(c.sg, C.int(m))
		if m > q.maxSendSGE {
			cerr = syscall.EINVAL
			break
		}
		*wr = verbs.SendWR{
			WRID:    uint64(c.wr_id),
			Opcode:  verbs.WROpcode(c.opcode),
			Flags:   verbs.SendFlags(c.flags),
			ImmData: htonl(uint32(c.imm)),
		}
		if ud {
			ah, ok := s.ah(c.ah)
			if !ok {
				cerr = syscall.EINVAL
				break
			}
			wr.UD = verbs.UDWR{AH: ah, RemoteQPN: uint32(c.rqpn), RemoteQKey: uint32(c.rqkey)}
		}
		if wr.Flags&verbs.SendInline != 0 {
			wr.SGList = list
			if cerr = q.inline(k, wr, sg); cerr != nil {
				break
			}
		} else {
			for _, e := range sg {
				list = append(list, verbs.SGE{Addr: uint64(e.addr), Length: uint32(e.length), LKey: uint32(e.lkey)})
			}
			wr.SGList = list
		}
		if k > 0 {
			s.wrs[k-1].Next = wr
		}
	}
	if k > 0 {
		s.wrs[k-1].Next = nil
		if err := q.qp.PostSend(&s.wrs[0]); err != nil {
			*bad = badIndex(err)
			return errno(err)
		}
	}
	if cerr != nil {
		*bad = C.int(k)
		return errno(cerr)
	}
	return 0
}

//export srPostRecvFlat
func srPostRecvFlat(qp *C.struct_ibv_qp, w *C.struct_sr_rwr, n C.int, bad *C.int) C.int {
	*bad = 0
	q, ok := goQP(qp)
	if !ok {
		return C.EINVAL
	}
	ws := unsafe.Slice(w, int(n))
	r := &q.recv
	r.mu.Lock()
	defer r.mu.Unlock()
	per := max(q.maxRecvSGE, 1)
	if len(r.sge) < chain*per {
		r.sge = make([]verbs.SGE, chain*per)
	}
	k := 0
	var cerr error
	for ; k < len(ws); k++ {
		c := &ws[k]
		if int(c.num_sge) > q.maxRecvSGE {
			cerr = syscall.EINVAL
			break
		}
		list := r.sge[k*per : k*per]
		for _, e := range cSGEs(c.sg, c.num_sge) {
			list = append(list, verbs.SGE{Addr: uint64(e.addr), Length: uint32(e.length), LKey: uint32(e.lkey)})
		}
		r.wrs[k] = verbs.RecvWR{WRID: uint64(c.wr_id), SGList: list}
		if k > 0 {
			r.wrs[k-1].Next = &r.wrs[k]
		}
	}
	if k > 0 {
		r.wrs[k-1].Next = nil
		if err := q.qp.PostRecv(&r.wrs[0]); err != nil {
			*bad = badIndex(err)
			return errno(err)
		}
	}
	if cerr != nil {
		*bad = C.int(k)
		return errno(cerr)
	}
	return 0
}

// wcBufs are the Go completions srPollCQ converts from (a buffer on its
// stack would escape through the CQ's interface, an allocation per call).
var wcBufs = sync.Pool{New: func() any { return new([16]verbs.WC) }}

//export srPollCQ
func srPollCQ(cq *C.struct_ibv_cq, n C.int, wc *C.struct_ibv_wc) C.int {
	gcq, ok := goCQ(cq)
	if !ok {
		return -C.EINVAL
	}
	out := unsafe.Slice(wc, int(n))
	buf := wcBufs.Get().(*[16]verbs.WC)
	defer wcBufs.Put(buf)
	done := 0
	for done < len(out) {
		k, err := gcq.Poll(buf[:min(len(buf), len(out)-done)])
		if err != nil {
			if done > 0 {
				break
			}
			return -errno(err)
		}
		for i := 0; i < k; i++ {
			putWC(&out[done+i], &buf[i])
		}
		done += k
		if k < len(buf) {
			break
		}
	}
	return C.int(done)
}

// putWC writes struct ibv_wc.
func putWC(c *C.struct_ibv_wc, w *verbs.WC) {
	c.wr_id = C.uint64_t(w.WRID)
	c.status = uint32(w.Status)
	c.opcode = uint32(w.Opcode)
	c.vendor_err = C.uint32_t(w.VendorErr)
	c.byte_len = C.uint32_t(w.ByteLen)
	*(*uint32)(unsafe.Add(unsafe.Pointer(c), C.SR_WC_IMM_OFF)) = htonl(w.ImmData)
	c.qp_num = C.uint32_t(w.QPNum)
	c.src_qp = C.uint32_t(w.SrcQP)
	c.wc_flags = C.uint(w.Flags)
	c.pkey_index = C.uint16_t(w.PKeyIndex)
	c.slid = C.uint16_t(w.SLID)
	c.sl = C.uint8_t(w.SL)
	c.dlid_path_bits = C.uint8_t(w.DLIDPathBits)
}
