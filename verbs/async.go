package verbs

import (
	"context"
	"fmt"
	"sync"
	"syscall"
)

// AsyncEventType is the kind of an asynchronous event (enum
// ibv_event_type, with libibverbs' values).
type AsyncEventType int

// Asynchronous event types.
const (
	EventCQErr            AsyncEventType = 0
	EventQPFatal          AsyncEventType = 1
	EventQPReqErr         AsyncEventType = 2
	EventQPAccessErr      AsyncEventType = 3
	EventCommEst          AsyncEventType = 4
	EventSQDrained        AsyncEventType = 5
	EventPathMig          AsyncEventType = 6
	EventPathMigErr       AsyncEventType = 7
	EventDeviceFatal      AsyncEventType = 8
	EventPortActive       AsyncEventType = 9
	EventPortErr          AsyncEventType = 10
	EventLIDChange        AsyncEventType = 11
	EventPKeyChange       AsyncEventType = 12
	EventSMChange         AsyncEventType = 13
	EventSRQErr           AsyncEventType = 14
	EventSRQLimitReached  AsyncEventType = 15
	EventQPLastWQEReached AsyncEventType = 16
	EventClientReregister AsyncEventType = 17
	EventGIDChange        AsyncEventType = 18
	EventWQFatal          AsyncEventType = 19
)

var asyncEventNames = [...]string{
	"CQ error", "local work queue catastrophic error", "invalid request local work queue error",
	"local access violation work queue error", "communication established", "send queue drained",
	"path migrated", "path migration request error", "local catastrophic error", "port active",
	"port error", "LID change", "P_Key change", "SM change", "SRQ catastrophic error",
	"SRQ limit reached", "last WQE reached", "client reregistration", "GID table change",
	"WQ fatal",
}

// String returns ibv_event_type_str's text.
func (t AsyncEventType) String() string {
	if t >= 0 && int(t) < len(asyncEventNames) {
		return asyncEventNames[t]
	}
	return "unknown"
}

// AsyncEvent is an asynchronous event of a device (struct
// ibv_async_event). softrdma's devices raise port events: PortNum names
// the port.
type AsyncEvent struct {
	Type    AsyncEventType
	PortNum uint8
}

// AsyncEventSource is an optional interface of a ContextOps or, failing
// that, of a DeviceOps: a backend that raises asynchronous events (of the
// context, or of the device for each context) delivers them to fn until
// cancel is called (a call already under way may end after cancel
// returns: a context ignores events once closed). Without it a device has
// no asynchronous events.
type AsyncEventSource interface {
	SubscribeAsync(fn func(AsyncEvent)) (cancel func())
}

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
	src, ok := c.ops.(AsyncEventSource)
	if !ok {
		if src, ok = c.dev.ops.(AsyncEventSource); !ok {
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
