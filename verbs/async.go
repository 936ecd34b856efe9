package verbs

import (
	"context"
	"fmt"
	"sync"
	"syscall"

	"github.com/softrdma/softrdma/verbs/driver"
)

// asyncState is a context's queue of asynchronous events.
type asyncState struct {
	mu      sync.Mutex
	started bool
	closed  bool
	cancel  func()
	queue   []AsyncEvent
	ready   chan struct{} // a value while queue is not empty or the context closed
	unacked int
}

// WatchAsyncEvents starts queuing the device's asynchronous events for the
// context (libibverbs queues them from ibv_open_device; a Go context
// starts on this call or the first GetAsyncEvent, so that a context that
// never reads them costs nothing). It is idempotent; Close stops it.
func (c *Context) WatchAsyncEvents() {
	a := &c.async
	a.mu.Lock()
	if a.started || a.closed {
		a.mu.Unlock()
		return
	}
	a.started = true
	if a.ready == nil {
		a.ready = make(chan struct{}, 1)
	}
	a.mu.Unlock()
	// The context's own events (a kernel context's async_fd), else its
	// device's.
	src, ok := c.ops.(driver.AsyncEventSource)
	if !ok {
		if src, ok = c.dev.ops.(driver.AsyncEventSource); !ok {
			return
		}
	}
	// Outside a.mu: a source may deliver from inside SubscribeAsync.
	cancel := src.SubscribeAsync(func(ev AsyncEvent) {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.closed {
			return
		}
		a.queue = append(a.queue, ev)
		a.signal()
	})
	a.mu.Lock()
	closed := a.closed
	if !closed {
		a.cancel = cancel
	}
	a.mu.Unlock()
	if closed {
		cancel()
	}
}

// signal marks the queue ready; a.mu is held.
func (a *asyncState) signal() {
	select {
	case a.ready <- struct{}{}:
	default:
	}
}

// GetAsyncEvent returns the context's next asynchronous event
// (ibv_get_async_event), waiting for one until ctx is done (its error)
// or the context is closed (EBADF). Each event should be acknowledged
// with AckAsyncEvent.
func (c *Context) GetAsyncEvent(ctx context.Context) (AsyncEvent, error) {
	c.WatchAsyncEvents()
	a := &c.async
	for {
		a.mu.Lock()
		if len(a.queue) > 0 {
			ev := a.queue[0]
			a.queue = a.queue[1:]
			a.unacked++
			if len(a.queue) > 0 {
				a.signal()
			}
			a.mu.Unlock()
			return ev, nil
		}
		if a.closed {
			a.signal()
			a.mu.Unlock()
			return AsyncEvent{}, OpError("ibv_get_async_event", c.dev.Name(), fmt.Errorf("context closed: %w", syscall.EBADF))
		}
		ready := a.ready
		a.mu.Unlock()
		select {
		case <-ready:
		case <-ctx.Done():
			return AsyncEvent{}, ctx.Err()
		}
	}
}

// AsyncEventReady returns a channel that has a value when GetAsyncEvent
// may have an event (or the context closed) without waiting: a poller of
// the context's events (the async fd of the C library) selects on it.
// It starts the queue as WatchAsyncEvents does.
func (c *Context) AsyncEventReady() <-chan struct{} {
	c.WatchAsyncEvents()
	c.async.mu.Lock()
	defer c.async.mu.Unlock()
	return c.async.ready
}

// AckAsyncEvent acknowledges an event GetAsyncEvent returned
// (ibv_ack_async_event).
func (c *Context) AckAsyncEvent(AsyncEvent) {
	c.async.mu.Lock()
	if c.async.unacked > 0 {
		c.async.unacked--
	}
	c.async.mu.Unlock()
}

// UnackedAsyncEvents returns how many events GetAsyncEvent returned that
// were not acknowledged.
func (c *Context) UnackedAsyncEvents() int {
	c.async.mu.Lock()
	defer c.async.mu.Unlock()
	return c.async.unacked
}

// stopAsync ends the context's subscription (Close): a waiting
// GetAsyncEvent returns EBADF.
func (c *Context) stopAsync() {
	a := &c.async
	a.mu.Lock()
	a.closed = true
	cancel := a.cancel
	a.cancel = nil
	a.queue = nil
	if a.ready == nil {
		a.ready = make(chan struct{}, 1)
	}
	a.signal()
	a.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}
