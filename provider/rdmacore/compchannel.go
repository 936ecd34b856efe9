//go:build rdmacore && cgo

package rdmacore

// #include "shim.h"
import "C"

import (
	"context"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/pollfd"
	"github.com/softrdma/softrdma/verbs"
)

// compChannel is the program's completion channel (struct
// ibv_comp_channel): verbs.CompChannelOps. Its fd is non-blocking; a
// duplicate in Go's netpoller waits for events.
type compChannel struct {
	ctx *kctx
	ch  *C.struct_ibv_comp_channel
	f   *os.File
	raw syscall.RawConn

	mu  sync.Mutex
	cqs map[*C.struct_ibv_cq]*cq
}

// CreateCompChannel creates a completion channel (ibv_create_comp_channel).
func (k *kctx) CreateCompChannel() (verbs.CompChannelOps, error) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	if k.closed {
		return nil, verbs.Errorf("ibv_create_comp_channel", k.dev.name, syscall.EINVAL)
	}
	ch, cerrno := C.ibv_create_comp_channel(k.c)
	if ch == nil {
		return nil, verbs.Errorf("ibv_create_comp_channel", k.dev.name, cerr(cerrno))
	}
	c := &compChannel{ctx: k, ch: ch, cqs: map[*C.struct_ibv_cq]*cq{}}
	fd := int(ch.fd)
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
	return c, nil
}

// NumCompVectors returns context->num_comp_vectors.
func (k *kctx) NumCompVectors() int { return int(k.c.num_comp_vectors) }

// Fd returns the channel's fd (channel->fd).
func (c *compChannel) Fd() int { return int(c.ch.fd) }

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

// GetEvent returns the CQ of the next event (ibv_get_cq_event).
func (c *compChannel) GetEvent(ctx context.Context, nonblock bool) (verbs.CQOps, error) {
	var got *C.struct_ibv_cq
	var evErr syscall.Errno
	take := func() bool {
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
	} else if err := pollfd.Read(ctx, c.f, c.raw, func(uintptr) bool { return take() }); err != nil {
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

// Destroy destroys the channel (ibv_destroy_comp_channel).
func (c *compChannel) Destroy() error {
	c.f.Close()
	if rc := C.ibv_destroy_comp_channel(c.ch); rc != 0 {
		return ibvErrno(int(rc))
	}
	return nil
}
