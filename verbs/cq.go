package verbs

import (
	"context"
	"fmt"
	"sync"
	"syscall"
)

// CQ is a completion queue (struct ibv_cq). Poll is non-blocking; Wait
// blocks until a completion is available, like a completion channel.
type CQ struct {
	ctx *Context
	cap int

	mu      sync.Mutex
	ring    []WC
	head    int
	n       int
	waitCh  chan struct{}
	qps     int
	dead    bool
	overrun bool
}

// CreateCQ creates a CQ with room for at least cqe completions (ibv_create_cq).
func (c *Context) CreateCQ(cqe int) (*CQ, error) {
	if cqe < 1 || cqe > c.dev.drv.Attr().MaxCQE {
		return nil, fmt.Errorf("verbs: create cq %d: %w", cqe, syscall.EINVAL)
	}
	if err := c.use(0, 1); err != nil {
		return nil, fmt.Errorf("verbs: create cq: %w", err)
	}
	return &CQ{ctx: c, cap: cqe, ring: make([]WC, cqe)}, nil
}

// Cap returns the number of completions the CQ holds.
func (cq *CQ) Cap() int { return cq.cap }

// Context returns the device context of the CQ.
func (cq *CQ) Context() *Context { return cq.ctx }

// Poll moves up to len(wc) completions into wc and returns how many
// (ibv_poll_cq). It fails with EOVERFLOW once completions were lost because
// the CQ was full (the CQ then keeps that error, as an overrun CQ does).
func (cq *CQ) Poll(wc []WC) (int, error) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead {
		return 0, fmt.Errorf("verbs: poll cq: %w", syscall.EINVAL)
	}
	k := 0
	for k < len(wc) && cq.n > 0 {
		wc[k] = cq.ring[cq.head]
		cq.head = (cq.head + 1) % len(cq.ring)
		cq.n--
		k++
	}
	if k == 0 && cq.overrun {
		return 0, fmt.Errorf("verbs: poll cq: overrun: %w", syscall.EOVERFLOW)
	}
	return k, nil
}

// Len returns the number of completions waiting to be polled.
func (cq *CQ) Len() int {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.n
}

// Wait blocks until at least one completion can be polled, the context is
// done, or the CQ is destroyed (then EINVAL).
func (cq *CQ) Wait(ctx context.Context) error {
	for {
		cq.mu.Lock()
		if cq.dead {
			cq.mu.Unlock()
			return fmt.Errorf("verbs: wait cq: %w", syscall.EINVAL)
		}
		if cq.n > 0 || cq.overrun {
			cq.mu.Unlock()
			return nil
		}
		if cq.waitCh == nil {
			cq.waitCh = make(chan struct{})
		}
		ch := cq.waitCh
		cq.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// push queues a completion; it reports false when the CQ is full.
func (cq *CQ) push(wc *WC) bool {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead || cq.n == len(cq.ring) {
		return false
	}
	cq.ring[(cq.head+cq.n)%len(cq.ring)] = *wc
	cq.n++
	cq.wake()
	return true
}

// pushOrOverrun queues a completion or marks the CQ overrun.
func (cq *CQ) pushOrOverrun(wc *WC) {
	if !cq.push(wc) {
		cq.mu.Lock()
		cq.overrun = true
		cq.wake()
		cq.mu.Unlock()
	}
}

func (cq *CQ) wake() {
	if cq.waitCh != nil {
		close(cq.waitCh)
		cq.waitCh = nil
	}
}

// room reports whether the CQ can take one more completion.
func (cq *CQ) room() bool {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return !cq.dead && cq.n < len(cq.ring)
}

func (cq *CQ) hold(d int) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead {
		return syscall.EINVAL
	}
	cq.qps += d
	return nil
}

// Destroy destroys the CQ (ibv_destroy_cq); EBUSY while a QP uses it.
func (cq *CQ) Destroy() error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead {
		return fmt.Errorf("verbs: destroy cq: %w", syscall.EINVAL)
	}
	if cq.qps > 0 {
		return fmt.Errorf("verbs: destroy cq: %w", syscall.EBUSY)
	}
	cq.dead = true
	cq.wake()
	cq.ctx.release(0, 1)
	return nil
}
