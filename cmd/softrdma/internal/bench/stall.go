package bench

import (
	"context"
	"sync/atomic"
	"time"
)

// stallWatch gives an RDMA CM peer's blocking waits a context that ends
// when one wait has lasted rttTimeout, and only then.
//
// A context.WithTimeout per wait (what the latency part used before) costs
// a timer, a context and a cancel-propagation record each time, about
// 1.5 µs a round trip on the 2-core VM and a quarter of the p99 (measured
// side by side, 2026-12-06) — Go's cost, not the device's — while the UDP
// baseline's SO_RCVTIMEO, set once, costs nothing per call. So both sides
// of the comparison time out the same way: a wait that lasts too long
// ends, and no wait pays for the timeout until then. rdma_get_recv_comp
// itself has no timeout.
type stallWatch struct {
	cur   atomic.Pointer[stallCtx]
	since atomic.Int64 // when the current wait began (ns since epoch), 0: none
	quit  chan struct{}
	done  chan struct{}
}

type stallCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newStallWatch() *stallWatch {
	w := &stallWatch{quit: make(chan struct{}), done: make(chan struct{})}
	w.renew()
	go w.watch()
	return w
}

func (w *stallWatch) renew() {
	ctx, cancel := context.WithCancel(context.Background())
	w.cur.Store(&stallCtx{ctx, cancel})
}

// begin starts a wait and returns its context; end ends it and reports
// whether the context has ended (a wait that failed then timed out; the
// next wait gets a new context).
func (w *stallWatch) begin() context.Context {
	w.since.Store(time.Now().UnixNano())
	return w.cur.Load().ctx
}

func (w *stallWatch) end(ctx context.Context) (ended bool) {
	w.since.Store(0)
	if ctx.Err() == nil {
		return false
	}
	if c := w.cur.Load(); c.ctx == ctx {
		w.renew()
	}
	return true
}

// watch ends the current wait's context once it has lasted rttTimeout.
func (w *stallWatch) watch() {
	defer close(w.done)
	t := time.NewTicker(rttTimeout / 8)
	defer t.Stop()
	for {
		select {
		case <-w.quit:
			return
		case now := <-t.C:
			if s := w.since.Load(); s != 0 && now.UnixNano()-s > int64(rttTimeout) {
				w.cur.Load().cancel()
			}
		}
	}
}

// close stops the watch and ends the current context.
func (w *stallWatch) close() {
	close(w.quit)
	<-w.done
	w.cur.Load().cancel()
}
