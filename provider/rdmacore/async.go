//go:build rdmacore && cgo

package rdmacore

// #include "shim.h"
import "C"

import (
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/pollfd"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// SubscribeAsync delivers the context's asynchronous events (its
// ibv_context's async_fd, as ibv_get_async_event reads them: port active
// and error, LID, P_Key, SM and GID changes, client reregister, and
// events of QPs, CQs and SRQs, whose element the Go API does not carry)
// to fn until cancel is called (driver.AsyncEventSource, asked of the
// context before its device). Each event is acknowledged when read. A
// goroutine waits in ppoll on a duplicate of the fd, on its own thread;
// the context's Close ends it.
func (k *kctx) SubscribeAsync(fn func(verbs.AsyncEvent)) (cancel func()) {
	k.mu.RLock()
	closed := k.closed
	var fd int
	if !closed {
		fd = int(k.c.async_fd)
	}
	k.mu.RUnlock()
	if closed {
		return func() {}
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		return func() {}
	}
	dfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return func() {}
	}
	kick, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(dfd)
		return func() {}
	}
	f := os.NewFile(uintptr(dfd), "ibv_context async_fd")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		unix.Close(kick)
		return func() {}
	}
	r := &asyncReader{k: k, raw: raw, kick: kick, fn: fn, done: make(chan struct{})}
	k.mu.Lock()
	k.readers = append(k.readers, r)
	k.mu.Unlock()
	go r.run()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.stop()
			<-r.done
			f.Close()
			unix.Close(kick)
			k.mu.Lock()
			for i, x := range k.readers {
				if x == r {
					k.readers = append(k.readers[:i], k.readers[i+1:]...)
					break
				}
			}
			k.mu.Unlock()
		})
	}
}

// asyncReader reads a context's asynchronous events for one subscriber.
type asyncReader struct {
	k    *kctx
	raw  syscall.RawConn
	kick int // eventfd: stop, or the context closed
	fn   func(verbs.AsyncEvent)

	mu      sync.Mutex
	stopped bool
	done    chan struct{}
}

// stop ends run (it looks at stopped after its next wake-up).
func (r *asyncReader) stop() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	_, _ = unix.Write(r.kick, []byte{1, 0, 0, 0, 0, 0, 0, 0})
}

func (r *asyncReader) isStopped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopped
}

// run waits for the fd, then reads every event there is (under the
// context's read lock: Close waits for it, and ends run with a kick).
func (r *asyncReader) run() {
	defer close(r.done)
	var evs []verbs.AsyncEvent
	for !r.isStopped() {
		_ = r.raw.Control(func(fd uintptr) {
			pollfd.Wait2(int(fd), r.kick, nil)
		})
		evs = evs[:0]
		r.k.mu.RLock()
		if r.k.closed {
			r.k.mu.RUnlock()
			return
		}
		var rc C.int
		for {
			var typ, port C.int
			if rc = C.sr_get_async_event(r.k.c, &typ, &port); rc != 0 {
				break
			}
			evs = append(evs, verbs.AsyncEvent{Type: verbs.AsyncEventType(typ), PortNum: uint8(port)})
		}
		r.k.mu.RUnlock()
		if syscall.Errno(rc) != syscall.EAGAIN {
			// The fd failed: no event will come any more (and ppoll
			// would not wait).
			evs = evs[:0]
			r.stop()
		}
		for _, ev := range evs {
			if r.isStopped() {
				return
			}
			r.fn(ev)
		}
	}
}

var _ driver.AsyncEventSource = (*kctx)(nil)
