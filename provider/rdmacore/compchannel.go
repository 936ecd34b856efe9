//go:build rdmacore && cgo

package rdmacore

// #include "shim.h"
import "C"

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/pollfd"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// compChannel is the program's completion channel (struct
// ibv_comp_channel): driver.CompChannelOps. Its fd is non-blocking; a
// goroutine waits for an event in ppoll(2) on a duplicate of it, on its
// own thread — not in Go's netpoller — so that the kernel's wake-up
// reaches the waiting thread itself, with no netpoller thread woken and
// no goroutine hand-off; an eventfd (kick) ends the wait when its context
// ends or the channel is destroyed.
type compChannel struct {
	ctx  *kctx
	ch   *C.struct_ibv_comp_channel
	fd   int      // ch.fd, copied out: ch is freed by Destroy
	f    *os.File // the duplicate: its RawConn keeps it open while a goroutine waits
	raw  syscall.RawConn
	kick int // eventfd

	// life orders Destroy after the calls on ch in progress (they hold
	// it for reading and look at dead first).
	life sync.RWMutex
	dead atomic.Bool
	gone *freed

	mu      sync.Mutex
	cqs     map[*C.struct_ibv_cq]*cq
	pending []*C.struct_ibv_cq // events a CQ's PollWait took for others, first out of GetEvent
}

// CreateCompChannel creates a completion channel (ibv_create_comp_channel).
func (k *kctx) CreateCompChannel() (driver.CompChannelOps, error) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	if k.closed {
		return nil, verbs.Errorf("ibv_create_comp_channel", k.dev.name, syscall.EINVAL)
	}
	ch, cerrno := C.ibv_create_comp_channel(k.c)
	if ch == nil {
		return nil, verbs.Errorf("ibv_create_comp_channel", k.dev.name, cerr(cerrno))
	}
	c := &compChannel{ctx: k, ch: ch, fd: int(ch.fd), cqs: map[*C.struct_ibv_cq]*cq{}}
	fd := c.fd
	if err := unix.SetNonblock(fd, true); err != nil {
		C.ibv_destroy_comp_channel(ch)
		return nil, verbs.OpError("fcntl", "O_NONBLOCK", err)
	}
	dfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		C.ibv_destroy_comp_channel(ch)
		return nil, verbs.OpError("fcntl", "F_DUPFD_CLOEXEC", err)
	}
	c.f = os.NewFile(uintptr(dfd), "ibv_comp_channel")
	if c.raw, err = c.f.SyscallConn(); err != nil {
		c.f.Close()
		C.ibv_destroy_comp_channel(ch)
		return nil, verbs.OpError("ibv_create_comp_channel", k.dev.name, err)
	}
	if c.kick, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		c.f.Close()
		C.ibv_destroy_comp_channel(ch)
		return nil, verbs.OpError("eventfd", k.dev.name, err)
	}
	c.gone = watch(c, "completion channel (ibv_comp_channel)")
	return c, nil
}

// NumCompVectors returns context->num_comp_vectors.
func (k *kctx) NumCompVectors() int { return int(k.c.num_comp_vectors) }

// Fd returns the channel's fd (channel->fd).
func (c *compChannel) Fd() int { return c.fd }

func (c *compChannel) add(q *cq) {
	c.mu.Lock()
	c.cqs[q.c] = q
	c.mu.Unlock()
}

func (c *compChannel) remove(q *cq) {
	c.mu.Lock()
	for k, v := range c.cqs {
		if v == q {
			delete(c.cqs, k)
		}
	}
	c.mu.Unlock()
}

// putBack queues an event PollWait took for another CQ of the channel.
func (c *compChannel) putBack(other *C.struct_ibv_cq) {
	c.mu.Lock()
	c.pending = append(c.pending, other)
	c.mu.Unlock()
}

// GetEvent returns the CQ of the next event (ibv_get_cq_event).
func (c *compChannel) GetEvent(ctx context.Context, nonblock bool) (driver.CQOps, error) {
	var got *C.struct_ibv_cq
	var evErr syscall.Errno
	take := func() bool {
		c.mu.Lock()
		if len(c.pending) > 0 {
			got = c.pending[0]
			c.pending = c.pending[1:]
			c.mu.Unlock()
			return true
		}
		c.mu.Unlock()
		c.life.RLock()
		defer c.life.RUnlock()
		if c.dead.Load() {
			evErr = syscall.EBADF
			return true
		}
		switch e := syscall.Errno(C.sr_get_cq_event_of(c.ch, &got)); e {
		case 0:
			return true
		case syscall.EAGAIN:
			return false
		default:
			evErr = e
			return true
		}
	}
	if nonblock {
		if !take() && evErr == 0 {
			return nil, syscall.EAGAIN
		}
	} else if err := c.wait(ctx, take); err != nil {
		return nil, err
	}
	if evErr != 0 {
		return nil, evErr
	}
	c.mu.Lock()
	q := c.cqs[got]
	c.mu.Unlock()
	if q == nil {
		return nil, syscall.EIO
	}
	return q, nil
}

// maxSleep bounds one ppoll of wait (the kick ends it sooner).
const maxSleep = 100 * time.Millisecond

// wait calls take until it reports done, sleeping in ppoll on the
// channel's fd and the kick in between; ctx's end (or the channel's
// destruction: EBADF) ends it.
func (c *compChannel) wait(ctx context.Context, take func() bool) error {
	var stop func() bool
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	for !take() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if stop == nil && ctx.Done() != nil {
			stop = context.AfterFunc(ctx, c.kickNow)
		}
		timeout := maxSleep
		if d, ok := ctx.Deadline(); ok {
			timeout = min(timeout, time.Until(d))
		}
		ts := unix.NsecToTimespec(int64(max(timeout, 0)))
		var kicked bool
		if err := c.raw.Control(func(fd uintptr) {
			if c.dead.Load() {
				return
			}
			if _, kicked = pollfd.Wait2(int(fd), c.kick, &ts); kicked {
				var b [8]byte
				_, _ = unix.Read(c.kick, b[:])
			}
		}); err != nil || c.dead.Load() {
			return syscall.EBADF
		}
	}
	return nil
}

// kickNow ends the waits in progress (they look at their context again).
func (c *compChannel) kickNow() {
	_ = c.raw.Control(func(uintptr) {
		if !c.dead.Load() {
			_, _ = unix.Write(c.kick, []byte{1, 0, 0, 0, 0, 0, 0, 0})
		}
	})
}

// Destroy destroys the channel (ibv_destroy_comp_channel): EBUSY while
// CQs use it (libibverbs' check), EINVAL once destroyed. It frees the C
// channel after the reads of it in progress; a GetEvent waiting on it
// ends with EBADF.
func (c *compChannel) Destroy() error {
	c.life.Lock()
	if c.dead.Load() {
		c.life.Unlock()
		return verbs.Errorf("ibv_destroy_comp_channel", "", syscall.EINVAL)
	}
	c.mu.Lock()
	busy := len(c.cqs) > 0
	c.mu.Unlock()
	if busy {
		c.life.Unlock()
		return verbs.Errorf("ibv_destroy_comp_channel", "", syscall.EBUSY)
	}
	if rc := C.ibv_destroy_comp_channel(c.ch); rc != 0 {
		c.life.Unlock()
		return verbs.Errorf("ibv_destroy_comp_channel", "", ibvErrno(int(rc)))
	}
	c.dead.Store(true)
	c.gone.set()
	c.life.Unlock()
	_, _ = unix.Write(c.kick, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	c.f.Close() // waits for the waits, which the kick ended
	unix.Close(c.kick)
	return nil
}
