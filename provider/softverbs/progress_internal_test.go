package softverbs

import (
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/pollfd"
	"github.com/softrdma/softrdma/verbs"
)

// pipeInput is an Input over a pipe: each byte written to it is a
// datagram that Progress turns into a completion of cq.
type pipeInput struct {
	r, w int
	cq   *cqObj
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

func (p *pipeInput) ReadNow()  { p.Progress() }
func (p *pipeInput) EndLease() {}

func (p *pipeInput) Wait(kick *pollfd.Kick, timeout time.Duration, woke func()) (bool, error) {
	fds := []unix.PollFd{{Fd: int32(p.r), Events: unix.POLLIN}, {Fd: int32(kick.Fd), Events: unix.POLLIN}}
	unix.Poll(fds, int(timeout/time.Millisecond))
	if woke != nil {
		woke()
	}
	p.Progress()
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
