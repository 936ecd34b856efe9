//go:build rdmacore && cgo

package rdmacore

// #include "shim.h"
import "C"

import (
	"context"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/verbs"
)

// pollBatch is the number of completions one ibv_poll_cq call moves.
const pollBatch = 32

// cq is a completion queue (struct ibv_cq) with its own completion
// channel: driver.CQOps.
//
// Verbs cannot count the completions of a CQ without taking them, so Wait
// and Len move completions from the CQ into a stash that Poll empties
// first (the order stays that of the CQ). The stash holds as many
// completions as the CQ (its cqe).
type cq struct {
	ctx  *kctx
	c    *C.struct_ibv_cq
	ch   *C.struct_ibv_comp_channel // its own channel, for Wait (nil with user)
	user *compChannel               // the program's channel, or nil
	f    *os.File                   // a dup of the channel's fd, non-blocking, in Go's netpoller
	raw  syscall.RawConn

	mu    sync.Mutex // everything below up to evMu; calls on c
	dead  bool
	gone  *freed
	qps   int              // QPs using the CQ
	cwc   *C.struct_ibv_wc // pollBatch entries, C memory
	out   []C.struct_sr_wc // pollBatch entries, C memory
	stash []verbs.WC       // ring of completions taken by Wait or Len
	sh    int              // stash head
	sn    int              // stash count
	cout  *C.struct_sr_wc  // &out[0]

	lastEmpty bool // the last Poll found nothing: the next one spins (pollSpin)

	evMu    sync.Mutex // the channel's reader
	reading bool       // a Wait or PollWait reads the channel; the others wait for wake
	closing bool       // Destroy in progress or done
	wake    chan struct{}
	waiters int    // goroutines waiting for wake
	unacked C.uint // events got, not acked yet

	// PollWait's (user CQs only; the reader's, see reading): its C
	// buffers and state, an eventfd that ends its sleep in C, the
	// context whose end kicks it (by its Done channel) and the result of
	// the C call made in the netpoller's callback.
	wwc   *C.struct_ibv_wc
	wout  []C.struct_sr_wc
	wst   *C.struct_sr_wait
	kick  int
	kdone <-chan struct{}
	kstop func() bool
	ready func(uintptr) bool
	wWant C.int
	wRes  C.int
}

// aLongTimeAgo is a read deadline that has passed: it ends a pending read.
var aLongTimeAgo = time.Unix(1, 0)

func newCQ(k *kctx, cqe int, user *compChannel, vector int) (_ *cq, err error) {
	name := k.dev.name
	k.mu.RLock()
	defer k.mu.RUnlock()
	if k.closed {
		return nil, verbs.Errorf("ibv_create_cq", name, syscall.EINVAL)
	}
	if user != nil {
		return newUserCQ(k, cqe, user, vector)
	}
	ch, cerrno := C.ibv_create_comp_channel(k.c)
	if ch == nil {
		return nil, verbs.Errorf("ibv_create_comp_channel", name, cerr(cerrno))
	}
	q := &cq{ctx: k, ch: ch, wake: make(chan struct{}), kick: -1}
	defer func() {
		if err != nil {
			q.free()
		}
	}()
	fd := int(ch.fd)
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, verbs.OpError("fcntl", "O_NONBLOCK", err)
	}
	dfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, verbs.OpError("fcntl", "F_DUPFD_CLOEXEC", err)
	}
	q.f = os.NewFile(uintptr(dfd), "ibv_comp_channel")
	if err := q.f.SetReadDeadline(time.Time{}); err != nil {
		// Not in the netpoller: Wait would block an OS thread.
		return nil, verbs.OpError("ibv_create_comp_channel", name, fmt.Errorf("channel fd not pollable: %v: %w", err, syscall.EOPNOTSUPP))
	}
	if q.raw, err = q.f.SyscallConn(); err != nil {
		return nil, verbs.OpError("ibv_create_comp_channel", name, err)
	}
	c, cerrno := C.ibv_create_cq(k.c, C.int(cqe), nil, ch, 0)
	if c == nil {
		return nil, verbs.Errorf("ibv_create_cq", name, cerr(cerrno))
	}
	q.c = c
	q.cwc = (*C.struct_ibv_wc)(C.calloc(pollBatch, C.sizeof_struct_ibv_wc))
	q.cout = (*C.struct_sr_wc)(C.calloc(pollBatch, C.sizeof_struct_sr_wc))
	if q.cwc == nil || q.cout == nil {
		C.ibv_destroy_cq(c)
		q.c = nil
		return nil, verbs.Errorf("ibv_create_cq", name, syscall.ENOMEM)
	}
	q.initBuffers()
	q.gone = watch(q, "completion queue (ibv_cq)")
	return q, nil
}

// initBuffers sizes the Go side of a created CQ.
func (q *cq) initBuffers() {
	q.out = unsafe.Slice(q.cout, pollBatch)
	q.stash = make([]verbs.WC, max(int(q.c.cqe), 1))
}

// newUserCQ creates a CQ whose events go to the program's channel (k.mu
// is read-held).
func newUserCQ(k *kctx, cqe int, user *compChannel, vector int) (*cq, error) {
	// The channel stays alive (its Destroy waits) until the CQ is on its
	// list, after which Destroy refuses with EBUSY.
	user.life.RLock()
	defer user.life.RUnlock()
	if user.dead.Load() {
		return nil, verbs.Errorf("ibv_create_cq", k.dev.name, syscall.EINVAL)
	}
	q := &cq{ctx: k, user: user, wake: make(chan struct{}), kick: -1}
	if err := q.initPollWait(); err != nil {
		q.free()
		return nil, verbs.OpError("ibv_create_cq", k.dev.name, err)
	}
	c, cerrno := C.ibv_create_cq(k.c, C.int(cqe), nil, user.ch, C.int(vector))
	if c == nil {
		q.free()
		return nil, verbs.Errorf("ibv_create_cq", k.dev.name, cerr(cerrno))
	}
	q.c = c
	q.cwc = (*C.struct_ibv_wc)(C.calloc(pollBatch, C.sizeof_struct_ibv_wc))
	q.cout = (*C.struct_sr_wc)(C.calloc(pollBatch, C.sizeof_struct_sr_wc))
	if q.cwc == nil || q.cout == nil {
		C.ibv_destroy_cq(c)
		q.free()
		return nil, verbs.Errorf("ibv_create_cq", k.dev.name, syscall.ENOMEM)
	}
	q.initBuffers()
	user.add(q)
	q.gone = watch(q, "completion queue (ibv_cq)")
	return q, nil
}

// ReqNotify arms the CQ (ibv_req_notify_cq).
func (q *cq) ReqNotify(solicitedOnly bool) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return verbs.Errorf("ibv_req_notify_cq", "", syscall.EINVAL)
	}
	sol := C.int(0)
	if solicitedOnly {
		sol = 1
	}
	if rc := C.sr_req_notify_cq_sol(q.c, sol); rc != 0 {
		return verbs.Errorf("ibv_req_notify_cq", "", syscall.Errno(rc))
	}
	return nil
}

// AckEvents acknowledges n events of the program's channel
// (ibv_ack_cq_events).
func (q *cq) AckEvents(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.dead && q.user != nil {
		C.ibv_ack_cq_events(q.c, C.uint(n))
	}
}

// free releases what newCQ or Destroy made, except the CQ itself.
func (q *cq) free() {
	if q.f != nil {
		q.f.Close()
		q.f = nil
	}
	if q.ch != nil {
		C.ibv_destroy_comp_channel(q.ch)
		q.ch = nil
	}
	C.free(unsafe.Pointer(q.cwc))
	C.free(unsafe.Pointer(q.cout))
	q.cwc, q.cout, q.out = nil, nil, nil
	q.freePollWait()
}

// hold counts a QP that uses the CQ (d = 1) or no longer does (d = -1);
// EINVAL once the CQ is destroyed.
func (q *cq) hold(d int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return syscall.EINVAL
	}
	q.qps += d
	return nil
}

func convWC(w *verbs.WC, c *C.struct_sr_wc) {
	*w = verbs.WC{
		WRID:         uint64(c.wr_id),
		Status:       verbs.WCStatus(c.status),
		Opcode:       verbs.WCOpcode(c.opcode),
		VendorErr:    uint32(c.vendor_err),
		ByteLen:      uint32(c.byte_len),
		ImmData:      uint32(c.imm),
		QPNum:        uint32(c.qp_num),
		SrcQP:        uint32(c.src_qp),
		Flags:        verbs.WCFlags(c.wc_flags),
		PKeyIndex:    uint16(c.pkey_index),
		SLID:         uint16(c.slid),
		SL:           uint8(c.sl),
		DLIDPathBits: uint8(c.dlid_path_bits),
	}
}

// Poll moves up to len(wc) completions into wc (ibv_poll_cq): those Wait
// or Len took first, then the CQ's. It does not allocate.
func (q *cq) Poll(wc []verbs.WC) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return 0, verbs.Errorf("ibv_poll_cq", "", syscall.EINVAL)
	}
	k := q.takeStash(wc)
	// A busy poll (this Poll follows an empty one) may spin in C for a
	// while on an empty CQ (pollSpin), instead of one call into C per
	// empty poll.
	var spin C.int64_t
	if k == 0 && len(wc) > 0 && q.lastEmpty {
		spin = C.int64_t(pollSpin)
	}
	for k < len(wc) {
		want := min(len(wc)-k, pollBatch)
		r := int(C.sr_poll_cq_spin_u(cptr(q.c), cptr(q.cwc), cptr(q.cout), C.int(want), spin))
		spin = 0
		if r < 0 {
			if k > 0 {
				return k, nil
			}
			return 0, verbs.Errorf("ibv_poll_cq", "", syscall.Errno(-r))
		}
		for i := range r {
			convWC(&wc[k], &q.out[i])
			k++
		}
		if r < want {
			break
		}
	}
	q.lastEmpty = k == 0 && len(wc) > 0
	return k, nil
}

// takeStash moves completions of the stash into wc: how many (q.mu held).
func (q *cq) takeStash(wc []verbs.WC) int {
	k := 0
	for k < len(wc) && q.sn > 0 {
		wc[k] = q.stash[q.sh]
		q.sh++
		if q.sh == len(q.stash) {
			q.sh = 0
		}
		q.sn--
		k++
	}
	return k
}

// fill moves completions from the CQ into the stash while it has room and
// returns the stash count (q.mu held).
func (q *cq) fill() int {
	for q.sn < len(q.stash) {
		want := min(len(q.stash)-q.sn, pollBatch)
		r := int(C.sr_poll_cq(q.c, q.cwc, q.cout, C.int(want)))
		if r <= 0 {
			break // an error stays in the CQ for Poll to report
		}
		for i := range r {
			j := q.sh + q.sn
			if j >= len(q.stash) {
				j -= len(q.stash)
			}
			convWC(&q.stash[j], &q.out[i])
			q.sn++
		}
		if r < want {
			break
		}
	}
	return q.sn
}

// Len returns the number of completions queued. Verbs has no way to count
// a CQ's completions without polling them, so Len polls them into the
// stash that Poll returns first; when more completions are outstanding
// than the CQ holds (cqe), Len returns cqe. 0 once destroyed.
func (q *cq) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return 0
	}
	return q.fill()
}

// available reports whether a completion is queued; EINVAL once destroyed.
func (q *cq) available() (bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return false, verbs.Errorf("ibv_get_cq_event", "", syscall.EINVAL)
	}
	return q.fill() > 0, nil
}

// Wait blocks until a completion is queued or ctx ends (ctx.Err()); EINVAL
// once the CQ is destroyed. One waiter at a time arms the CQ
// (ibv_req_notify_cq) and reads its completion channel
// (ibv_get_cq_event) through Go's netpoller, so no OS thread blocks; the
// others wait for it. Every waiter returns while a completion is queued.
func (q *cq) Wait(ctx context.Context) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		q.evMu.Lock()
		if q.closing {
			q.evMu.Unlock()
			return verbs.Errorf("ibv_get_cq_event", "", syscall.EINVAL)
		}
		if q.reading {
			wake := q.wake
			q.waiters++
			q.evMu.Unlock()
			select {
			case <-wake:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		q.reading = true
		q.evMu.Unlock()

		ready, err := q.awaitEvent(ctx)

		q.evMu.Lock()
		q.endReadLocked()
		q.evMu.Unlock()
		if err != nil || ready {
			return err
		}
	}
}

// awaitEvent arms the CQ, checks it and reads one event of the channel
// (only one goroutine at a time): ready when a completion is queued.
func (q *cq) awaitEvent(ctx context.Context) (ready bool, err error) {
	q.mu.Lock()
	if q.dead {
		q.mu.Unlock()
		return false, verbs.Errorf("ibv_get_cq_event", "", syscall.EINVAL)
	}
	rc := C.sr_req_notify_cq(q.c)
	q.mu.Unlock()
	if rc != 0 {
		return false, verbs.Errorf("ibv_req_notify_cq", "", syscall.Errno(rc))
	}
	// Armed first, then checked: a completion that arrives after the
	// check raises an event.
	if ok, err := q.available(); ok || err != nil {
		return ok, err
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = q.f.SetReadDeadline(aLongTimeAgo)
		close(fired)
	})
	got := false
	var evErr syscall.Errno
	rerr := q.raw.Read(func(uintptr) bool {
		switch e := syscall.Errno(C.sr_get_cq_event(q.ch)); e {
		case 0:
			got = true
		case syscall.EAGAIN:
			return false
		default:
			evErr = e
		}
		return true
	})
	if !stop() {
		<-fired
		_ = q.f.SetReadDeadline(time.Time{})
	}
	if got {
		q.evMu.Lock()
		q.unacked++
		if q.unacked >= 16 {
			C.ibv_ack_cq_events(q.c, q.unacked)
			q.unacked = 0
		}
		q.evMu.Unlock()
	}
	switch {
	case evErr != 0:
		return false, verbs.Errorf("ibv_get_cq_event", "", evErr)
	case rerr != nil && ctx.Err() != nil:
		return false, ctx.Err()
	case rerr != nil:
		q.evMu.Lock()
		closing := q.closing
		q.evMu.Unlock()
		if closing {
			return false, verbs.Errorf("ibv_get_cq_event", "", syscall.EINVAL)
		}
		return false, verbs.OpError("ibv_get_cq_event", "", rerr)
	}
	// An event: the loop in Wait re-arms and checks again.
	return false, nil
}

// Destroy destroys the CQ (ibv_destroy_cq) and its channel: EBUSY while a
// QP uses it, EINVAL when destroyed already. Waiters return EINVAL; the
// events they got are acknowledged first (ibv_ack_cq_events), as
// ibv_destroy_cq requires.
func (q *cq) Destroy() error {
	q.mu.Lock()
	switch {
	case q.dead:
		q.mu.Unlock()
		return verbs.Errorf("ibv_destroy_cq", "", syscall.EINVAL)
	case q.qps > 0:
		q.mu.Unlock()
		return verbs.Errorf("ibv_destroy_cq", "", syscall.EBUSY)
	}
	q.mu.Unlock()

	// Stop the channel's reader, if any.
	q.evMu.Lock()
	if q.closing {
		q.evMu.Unlock()
		return verbs.Errorf("ibv_destroy_cq", "", syscall.EINVAL)
	}
	q.closing = true
	for q.reading {
		q.interruptLocked()
		wake := q.wake
		q.waiters++
		q.evMu.Unlock()
		<-wake
		q.evMu.Lock()
	}
	if q.kstop != nil {
		q.kstop()
		q.kstop, q.kdone = nil, nil
	}
	unacked := q.unacked
	q.unacked = 0
	q.evMu.Unlock()

	q.mu.Lock()
	if unacked > 0 {
		C.ibv_ack_cq_events(q.c, unacked)
	}
	var err error
	if q.qps > 0 {
		err = verbs.Errorf("ibv_destroy_cq", "", syscall.EBUSY)
	} else if rc := C.ibv_destroy_cq(q.c); rc != 0 {
		err = verbs.Errorf("ibv_destroy_cq", "", ibvErrno(int(rc)))
	} else {
		q.dead = true
		q.gone.set()
	}
	q.mu.Unlock()
	if err != nil {
		q.evMu.Lock()
		q.closing = false
		if q.f != nil {
			_ = q.f.SetReadDeadline(time.Time{})
		}
		q.evMu.Unlock()
		return err
	}
	q.free()
	if q.user != nil {
		q.user.remove(q)
	}
	_ = q.ctx.use(0, -1)
	return nil
}
