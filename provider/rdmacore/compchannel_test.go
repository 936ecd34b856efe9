//go:build rdmacore && cgo

package rdmacore

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/verbs"
)

// TestCompChannel: a CQ created with the program's completion channel
// raises one event per ReqNotify, readable on the channel's fd (epoll);
// GetCQEvent returns the CQ and its context; Wait through a shared
// channel is refused, through a channel of the CQ's own it waits (at the
// end); Destroy of the CQ follows AckEvents; the channel is busy while the
// CQ lives.
func TestCompChannel(t *testing.T) {
	e := newEnv(t)
	ch, err := e.ctx.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := e.ctx.CreateCQEx(16, verbs.CQInit{Context: "rcq", Channel: ch})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.ctx.CreateCQEx(4, verbs.CQInit{Vector: e.ctx.NumCompVectors()}); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("vector %d: %v, want EINVAL", e.ctx.NumCompVectors(), err)
	}
	u := e.newQPOn(t, 0, nil, rcq)
	ah := e.selfAH(t)
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ep)
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, ch.Fd(), &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(ch.Fd())}); err != nil {
		t.Fatal(err)
	}
	// Wait on a CQ whose channel serves another CQ too: EINVAL.
	other, err := e.ctx.CreateCQEx(4, verbs.CQInit{Channel: ch})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := rcq.Wait(wctx); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("Wait on a CQ sharing its channel: %v, want EINVAL", err)
	}
	wcancel()
	check(t, other.Destroy())
	send := func(solicited bool) {
		t.Helper()
		flags := verbs.SendSignaled
		if solicited {
			flags |= verbs.SendSolicited
		}
		u.postRecv(t, 0)
		wr := verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: flags, SGList: []verbs.SGE{u.mr.SGE(4*slot, 8)},
			UD: verbs.UDWR{AH: ah, RemoteQPN: u.qp.Num(), RemoteQKey: testQKey}}
		if err := u.qp.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		waitWC(t, u.scq)
	}
	check(t, rcq.ReqNotify(false))
	send(false)
	var evs [1]unix.EpollEvent
	if n, err := unix.EpollWait(ep, evs[:], 5000); n != 1 {
		t.Fatalf("channel fd not readable: %d %v", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cq, cqCtx, err := ch.GetCQEvent(ctx)
	if err != nil || cq != rcq || cqCtx != "rcq" {
		t.Fatalf("GetCQEvent: %v %v %v", cq, cqCtx, err)
	}
	cq.AckEvents(1)
	var wc [2]verbs.WC
	if n, _ := rcq.Poll(wc[:]); n != 1 || wc[0].Status != verbs.WCSuccess {
		t.Fatalf("poll after the event: %d %+v", n, wc[0])
	}
	// Solicited only: the unsolicited receive raises none, the solicited one does.
	check(t, rcq.ReqNotify(true))
	send(false)
	ch.SetNonblocking(true)
	deadline := time.Now().Add(5 * time.Second)
	for rcq.Len() < 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if _, _, err := ch.GetCQEvent(ctx); !errors.Is(err, syscall.EAGAIN) {
		t.Errorf("event for an unsolicited receive: %v, want EAGAIN", err)
	}
	rcq.Poll(wc[:])
	ch.SetNonblocking(false)
	send(true)
	if cq, _, err := ch.GetCQEvent(ctx); err != nil || cq != rcq {
		t.Fatalf("solicited receive: %v %v", cq, err)
	}
	rcq.AckEvents(1)
	rcq.Poll(wc[:])
	// Wait through the channel, which now serves rcq alone.
	done := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- rcq.Wait(wctx)
	}()
	send(false)
	if err := <-done; err != nil {
		t.Errorf("Wait through the CQ's own channel: %v", err)
	}
	rcq.Poll(wc[:])
	if err := ch.Destroy(); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("destroying a channel in use: %v, want EBUSY", err)
	}
	check(t, u.qp.Destroy())
	u.qp = nil
	check(t, rcq.Destroy())
	check(t, ch.Destroy())
}
