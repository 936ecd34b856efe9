package softverbs

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/pollfd"
	"github.com/softrdma/softrdma/verbs"
)

// pipeInput is an Input over a pipe: each byte written to it is a
// datagram that Progress turns into a completion of cq.
type pipeInput struct {
	r, w  int
	cq    *cqObj
	kicks atomic.Int32 // Waits a kick ended
}

func (p *pipeInput) Progress() {
	var b [16]byte
	for {
		n, err := unix.Read(p.r, b[:])
		if err != nil || n <= 0 {
			return
		}
		for range n {
			p.cq.push(&verbs.WC{Status: verbs.WCSuccess, Opcode: verbs.WCOpRecv}, false)
		}
	}
}

func (p *pipeInput) ReadNow() { p.Progress() }

// kicked returns the number of Waits a kick ended.
func (p *pipeInput) kicked() int32 { return p.kicks.Load() }
func (p *pipeInput) EndLease()     {}

func (p *pipeInput) Wait(kick *pollfd.Kick, timeout time.Duration, woke func()) (bool, error) {
	fds := []unix.PollFd{{Fd: int32(p.r), Events: unix.POLLIN}, {Fd: int32(kick.Fd), Events: unix.POLLIN}}
	unix.Poll(fds, int(timeout/time.Millisecond))
	if woke != nil {
		woke()
	}
	p.Progress()
	if fds[1].Revents != 0 {
		p.kicks.Add(1)
	}
	return fds[1].Revents != 0, nil
}

// channelEnv is a CQ with a completion channel whose source is a pipe.
func channelEnv(t *testing.T) (*verbs.CompChannel, *verbs.CQ, *pipeInput) {
	t.Helper()
	e := newFakeEnv(t, false, 16)
	ctx := e.pd.Context()
	ch, err := ctx.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ctx.CreateCQEx(16, verbs.CQInit{Channel: ch})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cq.Destroy()
		ch.Destroy()
	})
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	in := &pipeInput{r: fds[0], w: fds[1], cq: cq.Ops().(*cqObj)}
	in.cq.src.Store(NewSource(in))
	return ch, cq, in
}

// getEvent takes the next event of ch in a goroutine; the result comes on
// the channel returned.
func getEvent(ctx context.Context, ch *verbs.CompChannel) <-chan error {
	res := make(chan error, 1)
	go func() {
		cq, _, err := ch.GetCQEvent(ctx)
		if err == nil {
			cq.AckEvents(1)
		}
		res <- err
	}()
	return res
}

func within(t *testing.T, what string, res <-chan error) error {
	t.Helper()
	select {
	case err := <-res:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: GetCQEvent still waits", what)
		return nil
	}
}

// TestChannelSleepsOnSource: a GetCQEvent with no event pending sleeps on
// the source of its CQ and reads it when it is readable; an event that
// comes another way, a cancelled context and a ended deadline wake it.
func TestChannelSleepsOnSource(t *testing.T) {
	ch, cq, in := channelEnv(t)
	var wc [4]verbs.WC

	// Data on the source: the sleeper reads it itself.
	cq.ReqNotify(false)
	res := getEvent(context.Background(), ch)
	time.Sleep(20 * time.Millisecond)
	unix.Write(in.w, []byte{1})
	if err := within(t, "data on the source", res); err != nil {
		t.Fatal(err)
	}
	if n, _ := cq.Poll(wc[:]); n != 1 {
		t.Fatalf("%d completions after the event, want 1", n)
	}

	// A completion that comes another way kicks the sleeper.
	cq.ReqNotify(false)
	res = getEvent(context.Background(), ch)
	time.Sleep(20 * time.Millisecond)
	in.cq.push(&verbs.WC{Status: verbs.WCSuccess}, false)
	if err := within(t, "a completion from elsewhere", res); err != nil {
		t.Fatal(err)
	}
	cq.Poll(wc[:])

	// A cancelled context.
	cq.ReqNotify(false)
	ctx, cancel := context.WithCancel(context.Background())
	res = getEvent(ctx, ch)
	time.Sleep(20 * time.Millisecond)
	cancel()
	if err := within(t, "a cancelled context", res); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}

	// A deadline.
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := within(t, "a deadline", getEvent(ctx, ch)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}
}

// TestChannelFdCountsQueued: asking for the fd makes it count the events
// already queued in memory.
func TestChannelFdCountsQueued(t *testing.T) {
	ch, cq, in := channelEnv(t)
	cq.ReqNotify(false)
	unix.Write(in.w, []byte{1})
	var wc [1]verbs.WC
	if n, _ := cq.Poll(wc[:]); n != 1 { // progress: the event is queued
		t.Fatalf("poll: %d", n)
	}
	fds := []unix.PollFd{{Fd: int32(ch.Fd()), Events: unix.POLLIN}}
	if n, _ := unix.Poll(fds, 0); n != 1 {
		t.Fatal("the fd is not readable with an event queued")
	}
	if err := within(t, "an exported channel", getEvent(context.Background(), ch)); err != nil {
		t.Fatal(err)
	}
	if n, _ := unix.Poll(fds, 0); n != 0 {
		t.Fatal("the fd is readable with no event queued")
	}
}

// TestChannelWatchesContexts: the end of a context kicks the sleepers
// waiting with it — through the channel's standing registration (the
// context it watches) or, for another context while a sleeper relies on
// the standing one, through one of the wait's own — and the kick, not the
// sleep's timeout, ends their wait; waiting again with the watched
// context registers nothing new; Destroy drops the standing registration.
func TestChannelWatchesContexts(t *testing.T) {
	ch, cq, in := channelEnv(t)
	cch := cq.Ops().(*cqObj).ch
	watch := func() (done <-chan struct{}, users int) {
		cch.mu.Lock()
		defer cch.mu.Unlock()
		return cch.watched, cch.watchUsers
	}
	waitAsleep := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			cch.mu.Lock()
			asleep := cch.asleep
			cch.mu.Unlock()
			if asleep == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d sleepers, want %d", asleep, n)
			}
			runtime.Gosched()
		}
	}
	cancelled := func(what string, res <-chan error, kicksBefore int32) {
		t.Helper()
		if err := within(t, what, res); !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: %v, want context.Canceled", what, err)
		}
		if in.kicked() <= kicksBefore {
			t.Fatalf("%s: the wait ended without a kick (its sleep's timeout)", what)
		}
	}

	// A waits alone with ctxA: the standing registration; its end kicks A.
	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	cq.ReqNotify(false)
	resA := getEvent(ctxA, ch)
	waitAsleep(1)
	if done, users := watch(); done != ctxA.Done() || users != 1 {
		t.Fatalf("watching %v with %d users, want ctxA's Done with 1", done, users)
	}
	k := in.kicked()
	cancelA()
	cancelled("A's context", resA, k)
	if _, users := watch(); users != 0 {
		t.Fatalf("%d users after A returned", users)
	}

	// D waits with ctxD (it replaces the standing registration: nobody
	// relies on A's); B, meanwhile, with ctxB: one of its own, whose end
	// kicks B (no other registration can have kicked then).
	ctxD, cancelD := context.WithCancel(context.Background())
	defer cancelD()
	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	cq.ReqNotify(false)
	resD := getEvent(ctxD, ch)
	waitAsleep(1)
	resB := getEvent(ctxB, ch)
	waitAsleep(2)
	if done, users := watch(); done != ctxD.Done() || users != 1 {
		t.Fatalf("with B asleep: watching %v with %d users, want ctxD's Done with 1", done, users)
	}
	k = in.kicked()
	cancelB()
	cancelled("B's context", resB, k)
	select {
	case err := <-resD:
		t.Fatalf("D returned with B's end: %v", err)
	default:
	}
	// (B's kick may have woken D too, which then slept again: D's own
	// kick count cannot be told apart here; the next part checks it.)
	cancelD()
	if err := within(t, "D's context", resD); !errors.Is(err, context.Canceled) {
		t.Fatalf("D: %v, want context.Canceled", err)
	}

	// Waiting again and again with one context keeps watching it; its end
	// kicks the sleeper.
	ctxC, cancelC := context.WithCancel(context.Background())
	defer cancelC()
	for i := range 3 {
		cq.ReqNotify(false)
		res := getEvent(ctxC, ch)
		waitAsleep(1)
		unix.Write(in.w, []byte{1}) // a datagram ends this wait
		if err := within(t, "data on the source", res); err != nil {
			t.Fatal(err)
		}
		var wc [1]verbs.WC
		cq.Poll(wc[:])
		// (That no new registration is made, rdmacm's
		// TestDataPathAllocs shows: an AfterFunc allocates.)
		if done, users := watch(); done != ctxC.Done() || users != 0 {
			t.Fatalf("wait %d: watching %v with %d users, want ctxC's Done with 0", i, done, users)
		}
	}
	cq.ReqNotify(false)
	res := getEvent(ctxC, ch)
	waitAsleep(1)
	k = in.kicked()
	cancelC()
	cancelled("the watched context", res, k)

	// Destroy drops it.
	cq.Destroy()
	if err := ch.Destroy(); err != nil {
		t.Fatal(err)
	}
	cch.mu.Lock()
	defer cch.mu.Unlock()
	if cch.watchStop != nil || cch.watched != nil {
		t.Fatal("a destroyed channel still watches a context")
	}
}
