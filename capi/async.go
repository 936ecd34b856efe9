//go:build capi

package main

/*
#include <capi.h>
*/
import "C"

import (
	"context"
	"sync"
	"syscall"

	"github.com/softrdma/softrdma/verbs"
)

// asyncPump passes a context's asynchronous events to C. It
// starts when the C context is made (ibv_open_device, or the first use of
// a context rdma_cm made), as libibverbs queues events from
// ibv_open_device, so a program may poll async_fd before its first
// ibv_get_async_event. Its goroutine takes each event of
// Context.GetAsyncEvent, queues it and adds one to async_fd, an eventfd
// with EFD_SEMAPHORE: each read of ibv_get_async_event takes one event
// from the queue, and poll(async_fd) is readable exactly while events
// are queued. ibv_close_device stops the goroutine and waits for it before
// async_fd is closed.
type asyncPump struct {
	gc     *verbs.Context
	fd     C.int
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	queue []verbs.AsyncEvent // events counted in fd, not yet taken
}

// asyncs holds the pumps, and the events C took and did not acknowledge:
// ibv_ack_async_event has only the event, not its context, so an ack
// finds the oldest unacknowledged event of the same type and port.
var asyncs = struct {
	mu      sync.Mutex
	pumps   map[*verbs.Context]*asyncPump
	unacked []asyncTaken
}{pumps: map[*verbs.Context]*asyncPump{}}

type asyncTaken struct {
	p  *asyncPump
	ev verbs.AsyncEvent
}

// startAsyncPump starts the pump of a new C context.
func startAsyncPump(gc *verbs.Context, cc *C.struct_sr_context) {
	fd := cc.vc.context.async_fd
	if fd < 0 {
		return
	}
	// Queue from now on, not from when the goroutine first runs.
	gc.WatchAsyncEvents()
	ctx, cancel := context.WithCancel(context.Background())
	p := &asyncPump{gc: gc, fd: fd, cancel: cancel, done: make(chan struct{})}
	asyncs.mu.Lock()
	asyncs.pumps[gc] = p
	asyncs.mu.Unlock()
	go p.run(ctx)
}

func (p *asyncPump) run(ctx context.Context) {
	defer close(p.done)
	for {
		ev, err := p.gc.GetAsyncEvent(ctx)
		if err != nil {
			return // stopped, or the context closed (EBADF)
		}
		p.mu.Lock()
		p.queue = append(p.queue, ev)
		p.mu.Unlock()
		C.sr_eventfd_signal(p.fd)
	}
}

// stopAsyncPump stops the pump of gc and waits for its goroutine, which
// no longer writes async_fd once this returns; the events C did not
// acknowledge are forgotten.
func stopAsyncPump(gc *verbs.Context) {
	asyncs.mu.Lock()
	p := asyncs.pumps[gc]
	delete(asyncs.pumps, gc)
	kept := asyncs.unacked[:0]
	for _, t := range asyncs.unacked {
		if t.p != p {
			kept = append(kept, t)
		}
	}
	clear(asyncs.unacked[len(kept):])
	asyncs.unacked = kept
	asyncs.mu.Unlock()
	if p == nil {
		return
	}
	p.cancel()
	<-p.done
}

// srTakeAsyncEvent takes the next event of context c, after C read one
// from async_fd.
//
//export srTakeAsyncEvent
func srTakeAsyncEvent(c *C.struct_ibv_context, typ, port *C.int) C.int {
	gc, ok := goContext(c)
	if !ok {
		return C.EINVAL
	}
	asyncs.mu.Lock()
	defer asyncs.mu.Unlock()
	p := asyncs.pumps[gc]
	if p == nil {
		return C.EBADF
	}
	p.mu.Lock()
	if len(p.queue) == 0 {
		p.mu.Unlock()
		return C.EAGAIN // not reached: the fd counts the queue
	}
	ev := p.queue[0]
	p.queue = p.queue[1:]
	p.mu.Unlock()
	asyncs.unacked = append(asyncs.unacked, asyncTaken{p, ev})
	*typ, *port = C.int(ev.Type), C.int(ev.PortNum)
	return 0
}

// srAckAsyncEvent acknowledges the oldest unacknowledged event of type
// typ and port port (0 for an event that is not a port's).
//
//export srAckAsyncEvent
func srAckAsyncEvent(typ, port C.int) C.int {
	asyncs.mu.Lock()
	defer asyncs.mu.Unlock()
	for i, t := range asyncs.unacked {
		if C.int(t.ev.Type) != typ || (port != 0 && C.int(t.ev.PortNum) != port) {
			continue
		}
		asyncs.unacked = append(asyncs.unacked[:i], asyncs.unacked[i+1:]...)
		t.p.gc.AckAsyncEvent(t.ev)
		return 0
	}
	return C.int(syscall.EINVAL)
}
