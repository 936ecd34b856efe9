//go:build rdmacore && cgo

package rdmacore

// #include "shim.h"
import "C"

import (
	"context"
	"os"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/verbs"
)

// pollSpin is how long a Poll that follows an empty Poll of the same CQ
// (a busy-poll loop) keeps polling an empty CQ in C before it returns 0:
// one call into C instead of one per empty poll. 0 by default (one poll
// per Poll, as ibv_poll_cq): in the TCG guests 10 µs (below the Go
// runtime's first sysmon tick, 20 µs) cut the calls into C of a busy-poll
// ping-pong 10-fold but not its latency, measurably (docs/performance.md),
// and it makes every Poll of an empty CQ in a loop over several CQs wait.
// SOFTRDMA_RDMACORE_POLLSPIN (a duration, e.g. 10us) sets it, read once.
var pollSpin = envDuration("SOFTRDMA_RDMACORE_POLLSPIN", 0)

// waitMode is SOFTRDMA_RDMACORE_WAIT (read once, for measurements):
// "thread" or "netpoll" fix how PollWait sleeps (waitInThread), "verbs"
// turns PollWait off (the caller's loop of verbs calls, as before it).
var waitMode = os.Getenv("SOFTRDMA_RDMACORE_WAIT")

// waitInThread says how PollWait sleeps: in ppoll inside its call into C,
// on the waiting goroutine's thread (one call into C per completion), or
// in Go's netpoller (the goroutine parks: two calls into C when it had to
// wait). A goroutine in C holds its P; when the call lasts longer than a
// sysmon tick (20 µs or more) sysmon hands the P to another thread — but
// only while no P is idle: with one P (GOMAXPROCS=1) always, and the
// return then waits for the P to come back (a thread switch or two, under
// TCG about 2.5 ms of CPU per round trip of the ping-pong, measured). So:
// in C with more than one P, in the netpoller with one.
func waitInThread() bool {
	switch waitMode {
	case "thread":
		return true
	case "netpoll":
		return false
	}
	return runtime.GOMAXPROCS(0) > 1
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d >= 0 {
		return d
	}
	return def
}

// initPollWait makes what PollWait needs on a CQ of the program's channel
// (before the CQ itself; free releases it).
func (q *cq) initPollWait() error {
	q.wwc = (*C.struct_ibv_wc)(C.calloc(pollBatch, C.sizeof_struct_ibv_wc))
	wout := (*C.struct_sr_wc)(C.calloc(pollBatch, C.sizeof_struct_sr_wc))
	q.wst = (*C.struct_sr_wait)(C.calloc(1, C.sizeof_struct_sr_wait))
	if wout != nil {
		q.wout = unsafe.Slice(wout, pollBatch)
	}
	if q.wwc == nil || wout == nil || q.wst == nil {
		return syscall.ENOMEM
	}
	var err error
	if q.kick, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		q.kick = -1
		return err
	}
	// The channel's fd is non-blocking; a duplicate of it in Go's
	// netpoller, of this CQ alone, so that a deadline ends this CQ's
	// wait and no other.
	dfd, err := unix.FcntlInt(uintptr(q.user.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return err
	}
	q.f = os.NewFile(uintptr(dfd), "ibv_comp_channel")
	if err := q.f.SetReadDeadline(time.Time{}); err != nil {
		return err // not in the netpoller
	}
	if q.raw, err = q.f.SyscallConn(); err != nil {
		return err
	}
	// The netpoller's callback (made once: a closure per wait would be
	// an allocation per message): one round in C, done unless nothing is
	// queued and no event pending.
	q.ready = func(uintptr) bool {
		q.wRes = C.sr_cq_wait_poll_u(cptr(q.c), cptr(q.user.ch), -1, 0, cptr(q.wwc), cptr(&q.wout[0]), q.wWant, cptr(q.wst))
		return q.wRes != 0 || q.wst.why != C.SR_WAIT_AGAIN
	}
	return nil
}

// freePollWait releases what initPollWait made (q.f is closed by free).
func (q *cq) freePollWait() {
	if q.kick >= 0 {
		unix.Close(q.kick)
		q.kick = -1
	}
	C.free(unsafe.Pointer(q.wwc))
	if q.wout != nil {
		C.free(unsafe.Pointer(&q.wout[0]))
	}
	C.free(unsafe.Pointer(q.wst))
	q.wwc, q.wout, q.wst = nil, nil, nil
}

// endReadLocked ends the reader's turn and wakes the goroutines waiting
// for it (q.evMu held). The wake channel is renewed only when someone
// waited on it: no allocation on a wait nobody else waits behind.
func (q *cq) endReadLocked() {
	q.reading = false
	if q.waiters > 0 {
		close(q.wake)
		q.wake = make(chan struct{})
		q.waiters = 0
	}
}

// interruptLocked ends the reader's sleep (q.evMu held): the netpoller's
// through a deadline that has passed, the one in C through the kick.
func (q *cq) interruptLocked() {
	if q.f != nil {
		_ = q.f.SetReadDeadline(aLongTimeAgo)
	}
	if q.kick >= 0 {
		_, _ = unix.Write(q.kick, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	}
}

// ctxEnded interrupts the reader whose context ended (context.AfterFunc).
func (q *cq) ctxEnded() {
	q.evMu.Lock()
	if !q.closing {
		q.interruptLocked()
	}
	q.evMu.Unlock()
}

// PollWait is rdma_get_recv_comp's loop (driver.CQPollWaiter) on a CQ
// whose completion channel is the program's and serves this CQ alone (the
// ones rdmacm's CreateQP makes): up to len(wc) completions, waiting until
// there is one or ctx ends; the channel's events for the CQ are taken and
// acknowledged here. One call into C when a completion is queued; when it
// had to wait, two if it slept in Go's netpoller, one if in C
// (waitInThread). ok is false, with nothing done, on another CQ: the
// caller uses the verbs calls. Completions Len or Wait took come first;
// one goroutine at a time waits, the others wait for it; the order of
// completions among goroutines that poll the CQ at once is any.
func (q *cq) PollWait(ctx context.Context, wc []verbs.WC) (n int, ok bool, err error) {
	if q.user == nil || q.kick < 0 || len(wc) == 0 || waitMode == "verbs" {
		return 0, false, nil
	}
	q.user.mu.Lock()
	alone := len(q.user.cqs) == 1
	q.user.mu.Unlock()
	if !alone {
		return 0, false, nil
	}
	if ctx == nil {
		ctx = context.Background()
	}
	for {
		if err := ctx.Err(); err != nil {
			return 0, true, err
		}
		q.mu.Lock()
		if q.dead {
			q.mu.Unlock()
			return 0, true, verbs.Errorf("ibv_poll_cq", "", syscall.EINVAL)
		}
		if k := q.takeStash(wc); k > 0 {
			q.mu.Unlock()
			return k, true, nil
		}
		q.mu.Unlock()

		q.evMu.Lock()
		if q.closing {
			q.evMu.Unlock()
			return 0, true, verbs.Errorf("ibv_poll_cq", "", syscall.EINVAL)
		}
		if q.reading {
			wake := q.wake
			q.waiters++
			q.evMu.Unlock()
			select {
			case <-wake:
				continue
			case <-ctx.Done():
				return 0, true, ctx.Err()
			}
		}
		q.reading = true
		q.evMu.Unlock()

		n, err := q.pollWaitRead(ctx, wc)

		q.evMu.Lock()
		q.endReadLocked()
		q.evMu.Unlock()
		if n > 0 || err != nil {
			return n, true, err
		}
	}
}

// pollWaitRead is PollWait's turn as the channel's reader: completions, an
// error, or 0 when PollWait should look again (its context, Destroy, the
// stash).
func (q *cq) pollWaitRead(ctx context.Context, wc []verbs.WC) (int, error) {
	want := min(len(wc), pollBatch)
	// Armed afresh by this turn: the events of an earlier one may have
	// been taken by the program meanwhile.
	q.wst.armed = 0
	if done := ctx.Done(); done != nil && done != q.kdone {
		// One watch per context (a program waits under the same one
		// again and again), not one per wait.
		if q.kstop != nil {
			q.kstop()
		}
		if q.f != nil {
			_ = q.f.SetReadDeadline(time.Time{})
		}
		q.kdone, q.kstop = done, context.AfterFunc(ctx, q.ctxEnded)
	}
	var r C.int
	if waitInThread() {
		timeout := maxSleep
		if d, ok := ctx.Deadline(); ok {
			timeout = max(min(timeout, time.Until(d)), 0)
		}
		r = C.sr_cq_wait_poll_u(cptr(q.c), cptr(q.user.ch), C.int(q.kick), C.int64_t(timeout), cptr(q.wwc), cptr(&q.wout[0]), C.int(want), cptr(q.wst))
	} else {
		q.wWant = C.int(want)
		if rerr := q.raw.Read(q.ready); rerr != nil {
			q.wst.armed = 0
			if ctx.Err() == nil {
				// A deadline of a context PollWait no longer waits under,
				// or Destroy's (PollWait looks at closing).
				q.evMu.Lock()
				if !q.closing {
					_ = q.f.SetReadDeadline(time.Time{})
				}
				q.evMu.Unlock()
			}
			return 0, nil
		}
		r = q.wRes
	}
	if r > 0 {
		for i := range int(r) {
			convWC(&wc[i], &q.wout[i])
		}
		return int(r), nil
	}
	if r < 0 {
		q.wst.armed = 0
		op := "ibv_poll_cq"
		switch q.wst.why {
		case C.SR_ERR_NOTIFY:
			op = "ibv_req_notify_cq"
		case C.SR_ERR_EVENT:
			op = "ibv_get_cq_event"
		case C.SR_ERR_PPOLL:
			op = "ppoll"
		}
		return 0, verbs.Errorf(op, "", syscall.Errno(-r))
	}
	switch q.wst.why {
	case C.SR_WAIT_OTHER:
		// The channel gained another CQ meanwhile: its event stays for
		// GetEvent; this CQ is still armed.
		q.user.putBack(q.wst.other)
	case C.SR_WAIT_KICKED, C.SR_WAIT_TIMEOUT:
		// Re-arm on the next round: whoever kicked may have taken the
		// event.
		q.wst.armed = 0
	}
	return 0, nil
}
