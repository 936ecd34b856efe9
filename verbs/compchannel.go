package verbs

import (
	"context"
	"fmt"
	"sync"
	"syscall"

	"github.com/softrdma/softrdma/verbs/driver"
)

// CompChannel is a completion event channel (struct ibv_comp_channel): the
// CQs created with it put an event on it for each completion that follows
// a ReqNotify. Its Fd is readable while an event is pending, so a program
// can wait for several channels (and sockets) in one poll or epoll, as in
// C; GetCQEvent takes the next event.
type CompChannel struct {
	ctx *Context
	ops driver.CompChannelOps

	mu       sync.Mutex
	cqs      map[driver.CQOps]*CQ
	nonblock bool
	dead     bool
}

// CreateCompChannel creates a completion event channel
// (ibv_create_comp_channel).
func (c *Context) CreateCompChannel() (*CompChannel, error) {
	ops, err := c.ops.CreateCompChannel()
	if err != nil {
		return nil, OpError("ibv_create_comp_channel", c.dev.Name(), err)
	}
	return &CompChannel{ctx: c, ops: ops, cqs: map[driver.CQOps]*CQ{}}, nil
}

// NumCompVectors returns the number of completion vectors of the device
// (context->num_comp_vectors); CreateCQEx takes a vector below it.
func (c *Context) NumCompVectors() int { return c.ops.NumCompVectors() }

// Context returns the device context of the channel.
func (ch *CompChannel) Context() *Context { return ch.ctx }

// Fd returns the channel's file descriptor (channel->fd): readable while
// an event is pending. It belongs to the channel: do not close it or read
// from it; use GetCQEvent.
func (ch *CompChannel) Fd() int { return ch.ops.Fd() }

// SetNonblocking makes GetCQEvent fail with EAGAIN instead of waiting when
// no event is pending (in C: O_NONBLOCK on channel->fd).
func (ch *CompChannel) SetNonblocking(nb bool) {
	ch.mu.Lock()
	ch.nonblock = nb
	ch.mu.Unlock()
}

// GetCQEvent takes the next event of the channel (ibv_get_cq_event) and
// returns its CQ and the CQ's context (cq_context of CreateCQEx). It waits
// until an event is pending or ctx ends (its error), unless the channel is
// non-blocking (then EAGAIN). Every event must be acknowledged with
// CQ.AckEvents; the CQ is disarmed until the next ReqNotify.
func (ch *CompChannel) GetCQEvent(ctx context.Context) (*CQ, any, error) {
	ch.mu.Lock()
	nb, dead := ch.nonblock, ch.dead
	ch.mu.Unlock()
	if dead {
		return nil, nil, Errorf("ibv_get_cq_event", "", syscall.EBADF)
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ops, err := ch.ops.GetEvent(ctx, nb)
	if err != nil {
		return nil, nil, OpError("ibv_get_cq_event", "", err)
	}
	ch.mu.Lock()
	cq := ch.cqs[ops]
	ch.mu.Unlock()
	if cq == nil {
		// The CQ was destroyed between the backend's event and here.
		return nil, nil, OpError("ibv_get_cq_event", "", fmt.Errorf("event of a destroyed CQ: %w", syscall.EAGAIN))
	}
	cq.evMu.Lock()
	cq.evGot++
	cq.evMu.Unlock()
	return cq, cq.userContext, nil
}

// Destroy destroys the channel (ibv_destroy_comp_channel): EBUSY while a
// CQ uses it.
func (ch *CompChannel) Destroy() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	switch {
	case ch.dead:
		return Errorf("ibv_destroy_comp_channel", "", syscall.EINVAL)
	case len(ch.cqs) > 0:
		return Errorf("ibv_destroy_comp_channel", "", syscall.EBUSY)
	}
	if err := ch.ops.Destroy(); err != nil {
		return OpError("ibv_destroy_comp_channel", "", err)
	}
	ch.dead = true
	return nil
}

// CQInit holds the optional arguments of ibv_create_cq.
type CQInit struct {
	// Context is the CQ's user context (cq_context), returned by
	// GetCQEvent and CQ.UserContext.
	Context any
	// Channel receives the CQ's events (nil: none).
	Channel *CompChannel
	// Vector is the completion vector, below Context.NumCompVectors.
	Vector int
}

// CreateCQEx creates a CQ with room for at least cqe completions, a user
// context, a completion channel and a completion vector (ibv_create_cq
// with all its arguments).
func (c *Context) CreateCQEx(cqe int, init CQInit) (*CQ, error) {
	if init.Vector < 0 || init.Vector >= c.ops.NumCompVectors() {
		return nil, OpError("ibv_create_cq", c.dev.Name(), fmt.Errorf("completion vector %d of %d: %w", init.Vector, c.ops.NumCompVectors(), syscall.EINVAL))
	}
	var chOps driver.CompChannelOps
	if ch := init.Channel; ch != nil {
		if ch.ctx.dev != c.dev {
			return nil, OpError("ibv_create_cq", c.dev.Name(), fmt.Errorf("channel of another device: %w", syscall.EINVAL))
		}
		ch.mu.Lock()
		dead := ch.dead
		ch.mu.Unlock()
		if dead {
			return nil, OpError("ibv_create_cq", c.dev.Name(), fmt.Errorf("destroyed channel: %w", syscall.EINVAL))
		}
		chOps = ch.ops
	}
	ops, err := c.ops.CreateCQ(cqe, chOps, init.Vector)
	if err != nil {
		return nil, OpError("ibv_create_cq", c.dev.Name(), err)
	}
	cq := &CQ{ctx: c, ops: ops, cap: cqe, userContext: init.Context, channel: init.Channel}
	cq.evCond = sync.NewCond(&cq.evMu)
	if ch := init.Channel; ch != nil {
		ch.mu.Lock()
		ch.cqs[ops] = cq
		ch.mu.Unlock()
	}
	return cq, nil
}
