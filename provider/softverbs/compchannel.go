package softverbs

import (
	"context"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/pollfd"
	"github.com/softrdma/softrdma/verbs"
)

// CompChannel is a completion event channel: a FIFO of CQ events and an
// eventfd (semaphore mode) whose count is the number of pending events,
// so its fd is readable exactly while one is pending, for the program's
// poll or epoll. GetEvent reads the eventfd through Go's netpoller.
type CompChannel struct {
	f  *os.File
	rc syscall.RawConn

	mu    sync.Mutex
	queue []*CQ // pending events, oldest first
	cqs   int   // CQs using the channel
}

// CreateCompChannel creates a completion event channel
// (ibv_create_comp_channel).
func (c *Context) CreateCompChannel() (verbs.CompChannelOps, error) {
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
	return &CompChannel{f: f, rc: rc}, nil
}

// NumCompVectors returns 1: the software device has one completion vector.
func (c *Context) NumCompVectors() int { return 1 }

// Fd returns the eventfd.
func (ch *CompChannel) Fd() int { return int(ch.f.Fd()) }

// post queues an event of cq (cq.mu is held).
func (ch *CompChannel) post(cq *CQ) {
	ch.mu.Lock()
	ch.queue = append(ch.queue, cq)
	ch.mu.Unlock()
	var one [8]byte
	one[0] = 1 // native endian: little on every platform this runs on
	_ = ch.rc.Write(func(fd uintptr) bool {
		_, err := unix.Write(int(fd), one[:])
		return err != unix.EAGAIN
	})
}

// GetEvent returns the CQ of the next event (ibv_get_cq_event).
func (ch *CompChannel) GetEvent(ctx context.Context, nonblock bool) (verbs.CQOps, error) {
	var buf [8]byte
	take := func(fd uintptr) (bool, error) {
		_, err := unix.Read(int(fd), buf[:])
		if err == unix.EAGAIN {
			return false, nil
		}
		return true, err
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
	cq := ch.queue[0]
	ch.queue[0] = nil
	ch.queue = ch.queue[1:]
	return cq, nil
}

// drop removes the pending events of a destroyed CQ, with their counts.
func (ch *CompChannel) drop(cq *CQ) {
	ch.mu.Lock()
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
	ch.mu.Unlock()
	var buf [8]byte
	for range n {
		_ = ch.rc.Control(func(fd uintptr) { _, _ = unix.Read(int(fd), buf[:]) })
	}
}

// Destroy closes the channel (verbs checked that no CQ uses it).
func (ch *CompChannel) Destroy() error {
	ch.mu.Lock()
	busy := ch.cqs > 0
	ch.mu.Unlock()
	if busy {
		return syscall.EBUSY
	}
	return ch.f.Close()
}
