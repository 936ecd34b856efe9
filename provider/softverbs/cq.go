package softverbs

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// cqObj is a completion queue (struct ibv_cq). Poll is non-blocking; Wait
// blocks until a completion is available, like a completion channel.
type cqObj struct {
	ctx *ctxObj
	cap int

	mu      sync.Mutex
	ring    []verbs.WC
	head    int
	n       int
	waiters int           // goroutines in Wait
	bell    chan struct{} // capacity 1: rung for a waiter when something changed
	qps     int
	dead    bool
	overrun bool
	ch      *compChannel // nil: no completion channel
	armed   uint8        // armNone, armAll or armSolicited

	// src is the source of the last completion delivered with a Burst:
	// Poll on the empty CQ reads it, and its channel's waiter sleeps on it.
	src atomic.Pointer[Source]
	// pollable mirrors n > 0 || overrun || dead, for Poll to find an
	// empty CQ without its lock (a consumer polls in a loop).
	pollable atomic.Bool
	empty    atomic.Uint32 // empty polls, for the yield
	// hint is the word of SetPollHint, or nil; written under mu.
	hint atomic.Pointer[atomic.Uint32]
}

// The bits of a poll hint (SetPollHint).
const (
	// PollHintReady: Poll may return completions or an error.
	PollHintReady = 1 << 0
	// PollHintSource: an empty Poll makes progress on the CQ's source.
	PollHintSource = 1 << 1
)

// SetPollHint has the CQ keep *w up to date for a consumer that looks at
// it before calling Poll (softrdma's C libraries, whose ibv_poll_cq would
// otherwise enter Go on every call): w is 0 only while Poll would return
// nothing without doing anything — no completion, no error, and no source
// to make progress on — else a set of PollHint bits. w may be memory Go
// does not manage. nil stops the updates: once SetPollHint(nil) returns,
// the old word is not written again.
func (cq *cqObj) SetPollHint(w *atomic.Uint32) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	cq.hint.Store(w)
	cq.writeHintLocked()
}

// writeHintLocked updates the word of SetPollHint, if any (cq.mu held).
func (cq *cqObj) writeHintLocked() {
	w := cq.hint.Load()
	if w == nil {
		return
	}
	var v uint32
	if cq.pollable.Load() {
		v |= PollHintReady
	}
	if cq.src.Load() != nil {
		v |= PollHintSource
	}
	w.Store(v)
}

// Arming states of a CQ with a completion channel.
const (
	armNone uint8 = iota
	armAll
	armSolicited
)

// CreateCQ creates a CQ with room for at least cqe completions
// (ibv_create_cq), reporting events to ch when it is not nil.
func (c *ctxObj) CreateCQ(cqe int, ch driver.CompChannelOps, vector int) (driver.CQOps, error) {
	var cch *compChannel
	if ch != nil {
		var ok bool
		if cch, ok = ch.(*compChannel); !ok {
			return nil, fmt.Errorf("channel of another backend: %w", syscall.EINVAL)
		}
	}
	if maxCQE := c.dev.drv.Attr().MaxCQE; cqe < 1 || cqe > maxCQE {
		return nil, fmt.Errorf("%d entries, the device takes 1 to %d (max_cqe): %w", cqe, maxCQE, syscall.EINVAL)
	}
	if err := c.dev.take(objCQ); err != nil {
		return nil, err
	}
	if err := c.use(0, 1); err != nil {
		c.dev.put(objCQ)
		return nil, err
	}
	if cch != nil {
		cch.mu.Lock()
		cch.cqs++
		cch.mu.Unlock()
	}
	return &cqObj{ctx: c, cap: cqe, ring: make([]verbs.WC, cqe), bell: make(chan struct{}, 1), ch: cch}, nil
}

// ReqNotify arms the CQ for its next completion, or with solicitedOnly
// its next solicited receive or unsuccessful completion
// (ibv_req_notify_cq). Arming twice keeps the wider arming.
func (cq *cqObj) ReqNotify(solicitedOnly bool) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead {
		return syscall.EINVAL
	}
	if !solicitedOnly {
		cq.armed = armAll
	} else if cq.armed == armNone {
		cq.armed = armSolicited
	}
	if cq.ch != nil {
		cq.ch.noteArmed(cq)
	}
	return nil
}

// AckEvents does nothing: verbs counts the acknowledgements.
func (cq *cqObj) AckEvents(int) {}

// notifyLocked raises the CQ's event when it is armed for this
// completion (cq.mu is held).
func (cq *cqObj) notifyLocked(wc *verbs.WC, solicited bool) {
	if cq.armed == armNone || cq.ch == nil {
		return
	}
	if cq.armed == armSolicited && !solicited && wc.Status == verbs.WCSuccess {
		return
	}
	cq.armed = armNone
	cq.ch.post(cq)
}

// Cap returns the number of completions the CQ holds.
func (cq *cqObj) Cap() int { return cq.cap }

// Context returns the device context of the CQ.
func (cq *cqObj) Context() *ctxObj { return cq.ctx }

// Poll moves up to len(wc) completions into wc and returns how many
// (ibv_poll_cq). It fails with EOVERFLOW once completions were lost because
// the CQ was full (the CQ then keeps that error, as an overrun CQ does).
//
// An empty CQ makes progress: it reads, without blocking, the source of
// its last completion (a receive socket) and polls again, so that a
// consumer polling in a loop receives on its own core, as a plain
// non-blocking socket would, with no goroutine to wait for.
func (cq *cqObj) Poll(wc []verbs.WC) (int, error) {
	if cq.pollable.Load() || len(wc) == 0 {
		if n, err := cq.poll(wc); n > 0 || err != nil || len(wc) == 0 {
			return n, err
		}
	}
	if src := cq.src.Load(); src != nil {
		if cq.ch != nil && cq.ch.exported.Load() {
			src.in.ReadNow() // the program waits for the fd: the provider reads on
		} else {
			src.in.Progress()
		}
		if cq.pollable.Load() {
			return cq.poll(wc)
		}
		if cq.empty.Add(1)&src.yieldMask == 0 {
			// A program polling in a loop holds a core; now and then it
			// lets another process on that core run (softsm's switch,
			// the peer): with no one else there it costs one system call.
			_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		}
	}
	return 0, nil
}

// yieldEvery+1 is how many empty polls of a CQ pass between two yields;
// relayedYieldEvery+1 on a source another process relays (NewRelayedSource).
const (
	yieldEvery        = 255
	relayedYieldEvery = 15
)

// setPollable updates pollable (cq.mu held).
func (cq *cqObj) setPollable() {
	cq.pollable.Store(cq.n > 0 || cq.overrun || cq.dead)
	cq.writeHintLocked()
}

// markPollable sets pollable (cq.mu held).
func (cq *cqObj) markPollable() {
	cq.pollable.Store(true)
	cq.writeHintLocked()
}

// poll is Poll without progress.
func (cq *cqObj) poll(wc []verbs.WC) (int, error) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead {
		return 0, syscall.EINVAL
	}
	k := 0
	for k < len(wc) && cq.n > 0 {
		wc[k] = cq.ring[cq.head]
		cq.head = (cq.head + 1) % len(cq.ring)
		cq.n--
		k++
	}
	cq.setPollable()
	if k == 0 && cq.overrun {
		return 0, fmt.Errorf("overrun: %w", syscall.EOVERFLOW)
	}
	return k, nil
}

// Len returns the number of completions waiting to be polled.
func (cq *cqObj) Len() int {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.n
}

// Wait blocks until at least one completion can be polled, the context is
// done, or the CQ is destroyed (then EINVAL). It does not allocate.
func (cq *cqObj) Wait(ctx context.Context) error {
	for {
		cq.mu.Lock()
		if cq.dead {
			cq.wakeNext()
			cq.mu.Unlock()
			return syscall.EINVAL
		}
		if cq.n > 0 || cq.overrun {
			cq.wakeNext()
			cq.mu.Unlock()
			return nil
		}
		src := cq.src.Load()
		cq.waiters++
		cq.mu.Unlock()
		if src != nil {
			// What waits on the source; then it goes back to the
			// provider's goroutine, whose deliveries ring the bell.
			src.in.EndLease()
			src.in.ReadNow()
			cq.mu.Lock()
			got := cq.n > 0 || cq.overrun || cq.dead
			if got {
				cq.waiters--
			}
			cq.mu.Unlock()
			if got {
				continue
			}
		}
		select {
		case <-cq.bell:
			cq.mu.Lock()
			cq.waiters--
			cq.mu.Unlock()
		case <-ctx.Done():
			cq.mu.Lock()
			cq.waiters--
			cq.mu.Unlock()
			return ctx.Err()
		}
	}
}

// wakeNext passes a wake-up on to the next waiter, if any: one ring wakes
// one waiter, which rings again for the others before it returns.
func (cq *cqObj) wakeNext() {
	if cq.waiters > 0 {
		cq.ring1()
	}
}

// ring1 rings the bell unless it is already ringing.
func (cq *cqObj) ring1() {
	select {
	case cq.bell <- struct{}{}:
	default:
	}
}

// push queues a completion and wakes a waiter; it reports false when the
// CQ is full.
func (cq *cqObj) push(wc *verbs.WC, solicited bool) bool {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if !cq.enqueueLocked(wc, solicited) {
		return false
	}
	cq.wake()
	return true
}

// pushQuiet queues a completion without waking a waiter (the caller's
// Burst will); it reports false when the CQ is full.
func (cq *cqObj) pushQuiet(wc *verbs.WC, solicited bool) bool {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.enqueueLocked(wc, solicited)
}

// enqueueLocked queues a completion (solicited: a receive of a message
// with the SE bit) and raises the channel event it arms for.
func (cq *cqObj) enqueueLocked(wc *verbs.WC, solicited bool) bool {
	if cq.dead || cq.n == len(cq.ring) {
		return false
	}
	i := cq.head + cq.n
	if i >= len(cq.ring) {
		i -= len(cq.ring)
	}
	cq.ring[i] = *wc
	cq.n++
	cq.markPollable()
	cq.notifyLocked(wc, solicited)
	return true
}

// pushOrOverrun queues a completion or marks the CQ overrun.
func (cq *cqObj) pushOrOverrun(wc *verbs.WC) {
	if !cq.push(wc, false) {
		cq.mu.Lock()
		cq.overrun = true
		cq.markPollable()
		cq.wake()
		cq.mu.Unlock()
	}
}

// pushAllOrOverrun queues the completions wcs under one lock and wakes a
// waiter once; the CQ is marked overrun when they do not all fit.
func (cq *cqObj) pushAllOrOverrun(wcs []verbs.WC) {
	if len(wcs) == 0 {
		return
	}
	cq.mu.Lock()
	defer cq.mu.Unlock()
	for i := range wcs {
		if !cq.enqueueLocked(&wcs[i], false) {
			cq.overrun = true
			cq.markPollable()
			break
		}
	}
	cq.wake()
}

// wake wakes a goroutine in Wait, if any (cq.mu held).
func (cq *cqObj) wake() {
	if cq.waiters > 0 {
		cq.ring1()
	}
}

// roomFor reports whether the CQ can take k more completions.
func (cq *cqObj) roomFor(k int) bool {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return !cq.dead && cq.n+k <= len(cq.ring)
}

func (cq *cqObj) hold(d int) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead {
		return syscall.EINVAL
	}
	cq.qps += d
	return nil
}

// Destroy destroys the CQ (ibv_destroy_cq); EBUSY while a QP uses it.
func (cq *cqObj) Destroy() error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead {
		return syscall.EINVAL
	}
	if cq.qps > 0 {
		return syscall.EBUSY
	}
	cq.dead = true
	cq.markPollable()
	cq.wake()
	if cq.ch != nil {
		cq.ch.drop(cq)
	}
	cq.ctx.release(0, 1)
	cq.ctx.dev.put(objCQ)
	return nil
}
