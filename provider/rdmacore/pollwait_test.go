//go:build rdmacore && cgo

package rdmacore

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// TestPollWait: rdma_get_recv_comp's loop in C (driver.CQPollWaiter) on a
// CQ whose channel serves it alone, sleeping in Go's netpoller and in C:
// woken by a completion, one that Len took first, contexts that end
// (several waiters at once; a deadline), still woken afterwards, no
// allocation per message, refused (ok false) on a CQ sharing its channel,
// and a Destroy that ends a wait in progress.
func TestPollWait(t *testing.T) {
	for _, mode := range []string{"netpoll", "thread"} {
		t.Run(mode, func(t *testing.T) {
			old := waitMode
			waitMode = mode
			defer func() { waitMode = old }()
			testPollWait(t)
		})
	}
}

// inWait waits until a goroutine waits in q's PollWait (holds the reader's
// turn).
func inWait(t *testing.T, q *cq) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		q.evMu.Lock()
		r := q.reading
		q.evMu.Unlock()
		if r {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("PollWait not waiting after 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}

type pollWaitResult struct {
	n   int
	ok  bool
	err error
	wc  verbs.WC
}

func testPollWait(t *testing.T) {
	e := newEnv(t)
	ch, err := e.ctx.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := e.ctx.CreateCQEx(16, verbs.CQInit{Channel: ch})
	if err != nil {
		t.Fatal(err)
	}
	q := rcq.Ops().(*cq)
	pw := rcq.Ops().(driver.CQPollWaiter)
	u := e.newQPOn(t, 0, nil, rcq)
	ah := e.selfAH(t)
	send := func(i int) {
		t.Helper()
		u.postRecv(t, i)
		wr := verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{u.mr.SGE(7*slot, 8)},
			UD: verbs.UDWR{AH: ah, RemoteQPN: u.qp.Num(), RemoteQKey: testQKey}}
		if err := u.qp.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		waitWC(t, u.scq)
	}
	start := func(ctx context.Context) chan pollWaitResult {
		res := make(chan pollWaitResult, 1)
		go func() {
			var wc [4]verbs.WC
			n, ok, err := pw.PollWait(ctx, wc[:])
			res <- pollWaitResult{n, ok, err, wc[0]}
		}()
		return res
	}
	get := func(res chan pollWaitResult) pollWaitResult {
		t.Helper()
		select {
		case r := <-res:
			if !r.ok {
				t.Fatal("PollWait: not done (ok false) on a CQ with a channel of its own")
			}
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("PollWait still waiting after 10 s")
		}
		return pollWaitResult{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Woken by a completion.
	res := start(ctx)
	inWait(t, q)
	send(0)
	if r := get(res); r.err != nil || r.n != 1 || r.wc.WRID != 100 || r.wc.Status != verbs.WCSuccess {
		t.Fatalf("PollWait woken by a completion: %d %v %+v", r.n, r.err, r.wc)
	}
	// A completion Len took into the stash comes first.
	send(1)
	for deadline := time.Now().Add(10 * time.Second); rcq.Len() < 1; {
		if time.Now().After(deadline) {
			t.Fatal("no receive completion in 10 s")
		}
		time.Sleep(time.Millisecond)
	}
	if r := get(start(ctx)); r.err != nil || r.n != 1 || r.wc.WRID != 101 {
		t.Fatalf("PollWait after Len: %d %v %+v", r.n, r.err, r.wc)
	}

	// Ended by cancellation, several waiters at once.
	cctx, ccancel := context.WithCancel(context.Background())
	var waiters []chan pollWaitResult
	for range 3 {
		waiters = append(waiters, start(cctx))
	}
	inWait(t, q)
	ccancel()
	for _, w := range waiters {
		if r := get(w); !errors.Is(r.err, context.Canceled) {
			t.Errorf("cancelled PollWait: %d %v", r.n, r.err)
		}
	}
	// A deadline.
	dctx, dcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer dcancel()
	if r := get(start(dctx)); !errors.Is(r.err, context.DeadlineExceeded) {
		t.Errorf("PollWait past its deadline: %d %v", r.n, r.err)
	}
	// Still woken afterwards, without a context that can end.
	res = start(context.Background())
	inWait(t, q)
	send(2)
	if r := get(res); r.err != nil || r.n != 1 || r.wc.WRID != 102 {
		t.Fatalf("PollWait after ended contexts: %d %v %+v", r.n, r.err, r.wc)
	}

	// No allocation per message: post, send, poll the send CQ, PollWait
	// for the receive, under one context that can end.
	rwr := verbs.RecvWR{WRID: 103, SGList: []verbs.SGE{u.mr.SGE(3*slot, slot)}}
	swr := verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{u.mr.SGE(7*slot, 8)},
		UD: verbs.UDWR{AH: ah, RemoteQPN: u.qp.Num(), RemoteQKey: testQKey}}
	var wc [1]verbs.WC
	var failed error
	one := func() {
		if failed != nil {
			return
		}
		if failed = u.qp.PostRecv(&rwr); failed != nil {
			return
		}
		if failed = u.qp.PostSend(&swr); failed != nil {
			return
		}
		for deadline := time.Now().Add(10 * time.Second); ; {
			n, err := u.scq.Poll(wc[:])
			if err != nil || n == 1 {
				failed = err
				break
			}
			if time.Now().After(deadline) {
				failed = errors.New("no send completion in 10 s")
				return
			}
		}
		n, ok, err := pw.PollWait(ctx, wc[:])
		if !ok || err != nil || n != 1 || wc[0].WRID != 103 {
			failed = errors.Join(err, errors.New("PollWait: no receive completion"))
		}
	}
	allocs := testing.AllocsPerRun(100, one)
	if failed != nil {
		t.Fatal(failed)
	}
	t.Logf("PostRecv+PostSend+Poll+PollWait: %v allocations per message", allocs)
	if allocs != 0 {
		t.Errorf("%v allocations per message, want 0", allocs)
	}

	// A CQ that shares its channel: not done.
	other, err := e.ctx.CreateCQEx(4, verbs.CQInit{Channel: ch})
	if err != nil {
		t.Fatal(err)
	}
	if n, ok, err := pw.PollWait(ctx, wc[:]); ok || n != 0 || err != nil {
		t.Errorf("PollWait on a CQ sharing its channel: %d %v %v, want not done", n, ok, err)
	}
	check(t, other.Destroy())

	// Destroy ends a wait in progress (a CQ no QP uses, on a channel of
	// its own).
	ch2, err := e.ctx.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	lone, err := e.ctx.CreateCQEx(4, verbs.CQInit{Channel: ch2})
	if err != nil {
		t.Fatal(err)
	}
	lq := lone.Ops().(*cq)
	res = make(chan pollWaitResult, 1)
	go func() {
		var wc [1]verbs.WC
		n, ok, err := lq.PollWait(context.Background(), wc[:])
		res <- pollWaitResult{n, ok, err, wc[0]}
	}()
	inWait(t, lq)
	check(t, lone.Destroy())
	if r := get(res); !errors.Is(r.err, syscall.EINVAL) {
		t.Errorf("PollWait on a destroyed CQ: %d %v, want EINVAL", r.n, r.err)
	}
	check(t, ch2.Destroy())

	check(t, u.qp.Destroy())
	u.qp = nil
	check(t, rcq.Destroy())
	check(t, ch.Destroy())
}
