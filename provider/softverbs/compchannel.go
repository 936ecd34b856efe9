package softverbs

import (
	"context"
	"encoding/binary"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/pollfd"
	"github.com/softrdma/softrdma/verbs/driver"
)

// compChannel is a completion event channel: a FIFO of CQ events and an
// eventfd (semaphore mode).
//
// Until the program asks for the fd (Fd), nobody else can see it: the
// events wait in memory, and a goroutine in GetEvent with none pending
// sleeps on the source of the channel's last completion (a receive socket;
// see Source) and reads it itself when it is readable, so that a datagram
// wakes the consumer's thread and no other. The eventfd is then only a
// kick: written while a goroutine sleeps, by an event that came another
// way, a cancelled context or Destroy. From the first Fd on, the eventfd's
// count is the number of pending events (the fd is readable exactly while
// one is pending, for the program's poll or epoll) and GetEvent reads it
// through Go's netpoller.
type compChannel struct {
	f  *os.File
	rc syscall.RawConn
	fd int // f's descriptor (File.Fd would make it blocking)

	// bell is the sleepers' Kick: those in a ppoll of the eventfd see it
	// readable, those blocked in a source's receive get a signal.
	bell pollfd.Kick

	mu       sync.Mutex
	queue    []*cqObj    // pending events, oldest first
	cqs      int         // CQs using the channel
	exported atomic.Bool // Fd was called: the eventfd counts the events (set under mu)
	closed   bool
	asleep   int    // goroutines sleeping in GetEvent that an event must kick
	hint     *cqObj // a CQ of the channel with a source, where sleepers sleep
	wokeFn   func()
	kickFn   func()

	// The context whose end kicks the sleepers through a registration
	// of the channel's (watchLocked): its Done, the registration's stop,
	// and the sleepers relying on it.
	watched    <-chan struct{}
	watchStop  func() bool
	watchUsers int
}

// CreateCompChannel creates a completion event channel
// (ibv_create_comp_channel).
func (c *ctxObj) CreateCompChannel() (driver.CompChannelOps, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_SEMAPHORE|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "comp_channel")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	ch := &compChannel{f: f, rc: rc, fd: fd, bell: pollfd.Kick{Fd: fd}}
	ch.wokeFn, ch.kickFn = ch.woke, ch.kick
	return ch, nil
}

// NumCompVectors returns 1: the software device has one completion vector.
func (c *ctxObj) NumCompVectors() int { return 1 }

// Fd returns the eventfd. From now on it counts the pending events: the
// ones already queued are added to it.
func (ch *compChannel) Fd() int {
	ch.mu.Lock()
	if !ch.exported.Load() && !ch.closed {
		ch.exported.Store(true)
		ch.drainLocked()
		ch.addLocked(uint64(len(ch.queue)))
	}
	ch.mu.Unlock()
	return ch.fd
}

// addLocked adds n to the eventfd's count (ch.mu held, so that no
// change of mode falls between a decision to write and the write).
func (ch *compChannel) addLocked(n uint64) {
	if n == 0 || ch.closed {
		return
	}
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], n)
	_ = ch.rc.Control(func(fd uintptr) { _ = eventfdIO(unix.SYS_WRITE, fd, &b) })
	if ch.asleep > 0 {
		ch.bell.Ring()
	}
}

// drainLocked reads the eventfd to zero (ch.mu held): the kicks of a
// channel whose fd is not exported.
func (ch *compChannel) drainLocked() {
	var b [8]byte
	_ = ch.rc.Control(func(fd uintptr) {
		for eventfdIO(unix.SYS_READ, fd, &b) == 0 {
		}
	})
}

// eventfdIO reads or writes (trap) the 8-byte count of the non-blocking
// eventfd fd. A raw system call: it never blocks, and a Syscall would wake
// the runtime's sysmon thread whenever it sleeps — a thread wake-up on
// every completion event of a process that otherwise waits.
func eventfdIO(trap uintptr, fd uintptr, b *[8]byte) syscall.Errno {
	_, _, e := unix.RawSyscall(trap, fd, uintptr(unsafe.Pointer(&b[0])), 8)
	return e
}

// post queues an event of cq (cq.mu is held).
func (ch *compChannel) post(cq *cqObj) {
	ch.mu.Lock()
	ch.queue = append(ch.queue, cq)
	ch.noteLocked(cq)
	if ch.exported.Load() || ch.asleep > 0 {
		ch.addLocked(1)
	}
	ch.mu.Unlock()
}

// noteArmed notes that cq was armed (cq.mu is held): its source is where
// the channel's sleepers sleep if none is known yet.
func (ch *compChannel) noteArmed(cq *cqObj) {
	ch.mu.Lock()
	ch.noteLocked(cq)
	ch.mu.Unlock()
}

// noteLocked makes cq the channel's hint unless cq has no source and the
// hint has one.
func (ch *compChannel) noteLocked(cq *cqObj) {
	if ch.hint == nil || cq.src.Load() != nil || ch.hint.src.Load() == nil {
		ch.hint = cq
	}
}

// maxSleep bounds one sleep of GetEvent on a source (the kick ends it
// sooner when something happens).
const maxSleep = 100 * time.Millisecond

// GetEvent returns the CQ of the next event (ibv_get_cq_event).
func (ch *compChannel) GetEvent(ctx context.Context, nonblock bool) (driver.CQOps, error) {
	var (
		stop   func() bool // this call's own AfterFunc
		shared bool        // counted in ch.watchUsers
	)
	defer func() {
		if stop != nil {
			stop()
		}
		if shared {
			ch.mu.Lock()
			ch.watchUsers--
			ch.mu.Unlock()
		}
	}()
	progressed := false
	for {
		ch.mu.Lock()
		switch {
		case ch.closed:
			ch.mu.Unlock()
			return nil, syscall.EBADF
		case ch.exported.Load():
			ch.mu.Unlock()
			return ch.getEventFd(ctx, nonblock)
		case len(ch.queue) > 0:
			cq := ch.popLocked()
			ch.mu.Unlock()
			return cq, nil
		}
		var src *Source
		if ch.hint != nil {
			src = ch.hint.src.Load()
		}
		if src != nil && nonblock && !progressed {
			// What waits on the source, before EAGAIN. (Before a sleep
			// there is no need: a readable source ends it at once.)
			ch.mu.Unlock()
			progressed = true
			src.in.Progress()
			continue
		}
		if nonblock {
			ch.mu.Unlock()
			return nil, syscall.EAGAIN
		}
		if err := ctx.Err(); err != nil {
			ch.mu.Unlock()
			return nil, err
		}
		if stop == nil && !shared {
			stop, shared = ch.watchLocked(ctx)
		}
		ch.asleep++
		ch.mu.Unlock()
		kicked, woke := ch.sleep(ctx, src)
		ch.mu.Lock()
		if !woke {
			ch.asleep--
		}
		if kicked && !ch.exported.Load() && !ch.closed {
			ch.drainLocked()
		}
		ch.mu.Unlock()
	}
}

// watchLocked makes the end of ctx kick the channel's sleepers (ch.mu
// held). context.AfterFunc costs two allocations and a record in the
// parent's cancellation list each time, and a program that waits again
// and again mostly does so with one context (one for the run, or for the
// connection): so the channel keeps one registration standing, for the
// context it watches, and a wait with that context, or with another when
// no sleeper relies on the standing one (which it then replaces), uses it
// (shared: count it out of ch.watchUsers when done). A wait with yet
// another context while some sleeper relies on the standing one gets an
// AfterFunc of its own (own: stop it when done). Destroy stops the
// standing one. A context without Done needs nothing.
func (ch *compChannel) watchLocked(ctx context.Context) (own func() bool, shared bool) {
	done := ctx.Done()
	switch {
	case done == nil:
		return nil, false
	case ch.watched == done:
	case ch.watchUsers == 0:
		if ch.watchStop != nil {
			ch.watchStop()
		}
		ch.watched, ch.watchStop = done, context.AfterFunc(ctx, ch.kickFn)
	default:
		return context.AfterFunc(ctx, ch.kickFn), false
	}
	ch.watchUsers++
	return nil, true
}

// kick wakes the channel's sleepers (a context ended).
func (ch *compChannel) kick() {
	ch.mu.Lock()
	if !ch.exported.Load() && ch.asleep > 0 {
		ch.addLocked(1)
	}
	ch.mu.Unlock()
}

// woke counts a sleeper on a source out before it reads the source, so that
// what it delivers to the channel kicks nobody.
func (ch *compChannel) woke() {
	ch.mu.Lock()
	ch.asleep--
	ch.mu.Unlock()
}

// sleep waits until src (nil: none known) may have something to read, and
// reads it, or until the channel is kicked; it reports whether it was
// kicked and whether it counted itself out of ch.asleep (woke).
func (ch *compChannel) sleep(ctx context.Context, src *Source) (kicked, woke bool) {
	if src != nil {
		timeout := maxSleep
		if d, ok := ctx.Deadline(); ok {
			timeout = min(timeout, time.Until(d))
		}
		c := sleepCalls.Get().(*sleepCall)
		c.ch, c.src, c.timeout = ch, src, timeout
		cerr := ch.rc.Control(c.fn)
		kicked, err := c.kicked, c.err
		*c = sleepCall{fn: c.fn}
		sleepCalls.Put(c)
		if cerr != nil {
			return false, false // closed: GetEvent sees it
		}
		if err == nil {
			return kicked, true
		}
		ch.mu.Lock()
		if ch.hint != nil && ch.hint.src.Load() == src {
			ch.hint.src.CompareAndSwap(src, nil) // the source is closed
		}
		ch.mu.Unlock()
	}
	// No source: the kick, through Go's netpoller.
	_ = pollfd.Read(ctx, ch.f, ch.rc, func(fd uintptr) bool {
		var b [8]byte
		return eventfdIO(unix.SYS_READ, fd, &b) != unix.EAGAIN
	})
	return true, false
}

// sleepCall is one sleep on a source, for the function it runs under the
// channel's Control: a closure made per sleep would be a heap allocation
// on every wait (it escapes into the RawConn).
type sleepCall struct {
	ch      *compChannel
	src     *Source
	timeout time.Duration
	kicked  bool
	err     error
	fn      func(uintptr) // run, bound once
}

var sleepCalls = sync.Pool{New: func() any {
	c := new(sleepCall)
	c.fn = c.run
	return c
}}

func (c *sleepCall) run(uintptr) {
	c.kicked, c.err = c.src.in.Wait(&c.ch.bell, c.timeout, c.ch.wokeFn)
}

// popLocked takes the oldest event (ch.mu held, the queue not empty).
func (ch *compChannel) popLocked() *cqObj {
	cq := ch.queue[0]
	n := copy(ch.queue, ch.queue[1:]) // a few events at most: the array is kept
	ch.queue[n] = nil
	ch.queue = ch.queue[:n]
	return cq
}

// getEventFd is GetEvent once the fd is exported: the eventfd's count is
// taken first, then the event.
func (ch *compChannel) getEventFd(ctx context.Context, nonblock bool) (driver.CQOps, error) {
	var buf [8]byte
	take := func(fd uintptr) (bool, error) {
		switch e := eventfdIO(unix.SYS_READ, fd, &buf); e {
		case 0:
			return true, nil
		case unix.EAGAIN:
			return false, nil
		default:
			return true, e
		}
	}
	var got bool
	var rerr error
	if nonblock {
		err := ch.rc.Control(func(fd uintptr) { got, rerr = take(fd) })
		if err == nil && rerr == nil && !got {
			return nil, syscall.EAGAIN
		}
		if err != nil {
			rerr = err
		}
	} else if err := pollfd.Read(ctx, ch.f, ch.rc, func(fd uintptr) bool {
		got, rerr = take(fd)
		return got || rerr != nil
	}); err != nil {
		return nil, err
	}
	if rerr != nil {
		return nil, rerr
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if len(ch.queue) == 0 {
		return nil, syscall.EIO // the count and the queue always agree
	}
	return ch.popLocked(), nil
}

// drop removes the pending events of a destroyed CQ, with their counts.
func (ch *compChannel) drop(cq *cqObj) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	q := ch.queue[:0]
	n := 0
	for _, c := range ch.queue {
		if c == cq {
			n++
		} else {
			q = append(q, c)
		}
	}
	clear(ch.queue[len(q):])
	ch.queue = q
	ch.cqs--
	if ch.hint == cq {
		ch.hint = nil
	}
	if !ch.exported.Load() {
		return
	}
	var buf [8]byte
	for range n {
		_ = ch.rc.Control(func(fd uintptr) { _ = eventfdIO(unix.SYS_READ, fd, &buf) })
	}
}

// Destroy closes the channel (verbs checked that no CQ uses it); its
// sleepers are kicked and fail with EBADF.
func (ch *compChannel) Destroy() error {
	ch.mu.Lock()
	if ch.cqs > 0 {
		ch.mu.Unlock()
		return syscall.EBUSY
	}
	if ch.asleep > 0 {
		ch.addLocked(1)
	}
	ch.closed = true
	if ch.watchStop != nil {
		ch.watchStop() // the context keeps no reference to the channel
		ch.watched, ch.watchStop = nil, nil
	}
	ch.mu.Unlock()
	return ch.f.Close()
}
