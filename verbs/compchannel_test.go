package verbs_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/provider/rxe"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// chanEnv is a receiver QP whose receive CQ reports to a completion
// channel, and a sender QP on a plain CQ, both attached to one group.
type chanEnv struct {
	*env
	ch       *verbs.CompChannel
	rcq      *verbs.CQ
	rx, tx   *verbs.QP
	ah       *verbs.AH
	rmr, smr *verbs.MR
	next     uint64
}

func newChanEnv(t *testing.T) *chanEnv {
	t.Helper()
	e := &chanEnv{env: newEnv(t)}
	var err error
	if e.ch, err = e.ctx.CreateCompChannel(); err != nil {
		t.Fatal(err)
	}
	if e.rcq, err = e.ctx.CreateCQEx(16, verbs.CQInit{Context: "rcq", Channel: e.ch}); err != nil {
		t.Fatal(err)
	}
	mk := func(rcq *verbs.CQ, flags verbs.CreateFlags) *verbs.QP {
		qp, err := e.pd.CreateQP(&verbs.QPInitAttr{SendCQ: e.cq, RecvCQ: rcq, QPType: verbs.QPTypeUD, CreateFlags: flags,
			Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		toRTS(t, qp, 0x11)
		return qp
	}
	e.rx, e.tx = mk(e.rcq, 0), mk(e.cq, verbs.CreateBlockSelfMcastLB)
	g := randMGID()
	for _, qp := range []*verbs.QP{e.rx, e.tx} {
		if err := qp.AttachMcast(g, 0); err != nil {
			t.Fatal(err)
		}
	}
	if e.ah, err = e.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: 1, GRH: verbs.GlobalRoute{DGID: g, HopLimit: 1}}); err != nil {
		t.Fatal(err)
	}
	e.rmr, _ = e.pd.RegMR(make([]byte, 8*128), verbs.AccessLocalWrite)
	e.smr, _ = e.pd.RegMR(make([]byte, 64), 0)
	for i := range 8 {
		if err := e.rx.PostRecv(&verbs.RecvWR{WRID: uint64(i), SGList: []verbs.SGE{e.rmr.SGE(i*128, 128)}}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		e.rx.Destroy()
		e.tx.Destroy()
		e.ah.Destroy()
		e.rmr.Dereg()
		e.smr.Dereg()
		e.rcq.Destroy()
		e.ch.Destroy()
	})
	return e
}

// send sends one datagram (solicited: with the SE bit) and waits for its
// send completion.
func (e *chanEnv) send(t *testing.T, solicited bool) {
	t.Helper()
	flags := verbs.SendSignaled
	if solicited {
		flags |= verbs.SendSolicited
	}
	e.next++
	wr := verbs.SendWR{WRID: e.next, Opcode: verbs.WRSend, Flags: flags, SGList: []verbs.SGE{e.smr.SGE(0, 16)},
		UD: verbs.UDWR{AH: e.ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: 0x11}}
	if err := e.tx.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.cq.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	var wc [1]verbs.WC
	if n, _ := e.cq.Poll(wc[:]); n != 1 || wc[0].Status != verbs.WCSuccess {
		t.Fatalf("send completion %d %+v", n, wc[0])
	}
}

// waitLen waits until the receive CQ holds n completions.
func (e *chanEnv) waitLen(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for e.rcq.Len() < n {
		if time.Now().After(deadline) {
			t.Fatalf("receive CQ holds %d completions, want %d", e.rcq.Len(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func (e *chanEnv) drain(t *testing.T) int {
	t.Helper()
	var wc [8]verbs.WC
	n, err := e.rcq.Poll(wc[:])
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range wc[:n] {
		if err := e.rx.PostRecv(&verbs.RecvWR{WRID: c.WRID, SGList: []verbs.SGE{e.rmr.SGE(int(c.WRID)*128, 128)}}); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// TestCompChannel: an armed CQ raises one event on its channel, which
// makes the channel's fd readable in epoll; an unarmed CQ raises none; a
// CQ armed for solicited completions ignores unsolicited ones.
func TestCompChannel(t *testing.T) {
	e := newChanEnv(t)
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ep)
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, e.ch.Fd(), &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(e.ch.Fd())}); err != nil {
		t.Fatal(err)
	}
	readable := func(ms int) bool {
		var evs [1]unix.EpollEvent
		n, err := unix.EpollWait(ep, evs[:], ms)
		if err != nil && err != unix.EINTR {
			t.Fatal(err)
		}
		return n == 1
	}
	if readable(0) {
		t.Fatal("channel fd readable before any event")
	}
	if err := e.rcq.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	e.send(t, false)
	if !readable(5000) {
		t.Fatal("channel fd not readable after a completion on the armed CQ")
	}
	cq, cqCtx, err := e.ch.GetCQEvent(context.Background())
	if err != nil || cq != e.rcq || cqCtx != "rcq" {
		t.Fatalf("GetCQEvent: %v %v %v", cq, cqCtx, err)
	}
	cq.AckEvents(1)
	if n := e.drain(t); n != 1 {
		t.Fatalf("%d completions, want 1", n)
	}
	if readable(0) {
		t.Error("channel fd readable after its only event was taken")
	}

	// Not re-armed: a completion, no event.
	e.ch.SetNonblocking(true)
	e.send(t, false)
	e.waitLen(t, 1)
	if _, _, err := e.ch.GetCQEvent(context.Background()); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("event without arming: %v, want EAGAIN", err)
	}
	e.drain(t)

	// Solicited only: an unsolicited receive raises nothing, a solicited one does.
	if err := e.rcq.ReqNotify(true); err != nil {
		t.Fatal(err)
	}
	e.send(t, false)
	e.waitLen(t, 1)
	if _, _, err := e.ch.GetCQEvent(context.Background()); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("event for an unsolicited completion: %v, want EAGAIN", err)
	}
	e.ch.SetNonblocking(false)
	e.send(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if cq, _, err := e.ch.GetCQEvent(ctx); err != nil || cq != e.rcq {
		t.Fatalf("solicited completion: %v %v", cq, err)
	}
	e.rcq.AckEvents(1)
	e.drain(t)

	// A blocking GetCQEvent ends with its context.
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if _, _, err := e.ch.GetCQEvent(short); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, syscall.ETIMEDOUT) {
		t.Fatalf("GetCQEvent after its deadline: %v", err)
	}
}

// TestCompChannelWait: Wait on a CQ with a channel of its own waits
// through the channel.
func TestCompChannelWait(t *testing.T) {
	e := newChanEnv(t)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- e.rcq.Wait(ctx)
	}()
	e.send(t, false)
	if err := <-done; err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if n := e.drain(t); n != 1 {
		t.Errorf("%d completions after Wait, want 1", n)
	}
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := e.rcq.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait with nothing to come: %v", err)
	}
}

// TestCompChannelRules: the errnos, and Destroy waiting for acks.
func TestCompChannelRules(t *testing.T) {
	e := newChanEnv(t)
	if _, err := e.ctx.CreateCQEx(4, verbs.CQInit{Vector: e.ctx.NumCompVectors()}); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("CreateCQEx with vector %d: %v, want EINVAL", e.ctx.NumCompVectors(), err)
	}
	// Wait on a CQ whose channel has other CQs too: EINVAL.
	other, err := e.ctx.CreateCQEx(4, verbs.CQInit{Channel: e.ch})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.rcq.Wait(context.Background()); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("Wait on a CQ sharing its channel: %v, want EINVAL", err)
	}
	other.Destroy()
	if err := e.ch.Destroy(); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("destroying a channel a CQ uses: %v, want EBUSY", err)
	}
	// An event taken and not acked holds Destroy of its CQ.
	cq2, err := e.ctx.CreateCQEx(4, verbs.CQInit{Channel: e.ch})
	if err != nil {
		t.Fatal(err)
	}
	qp, err := e.pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq2, RecvCQ: cq2, QPType: verbs.QPTypeUD,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	toRTS(t, qp, 0x11)
	cq2.ReqNotify(false)
	wr := verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{e.smr.SGE(0, 8)},
		UD: verbs.UDWR{AH: e.ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: 0x11}}
	if err := qp.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if cq, _, err := e.ch.GetCQEvent(ctx); err != nil || cq != cq2 {
		t.Fatalf("event of the send CQ: %v %v", cq, err)
	}
	qp.Destroy()
	done := make(chan error, 1)
	go func() { done <- cq2.Destroy() }()
	select {
	case err := <-done:
		t.Fatalf("Destroy returned (%v) with an event not acked", err)
	case <-time.After(200 * time.Millisecond):
	}
	cq2.AckEvents(1)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Destroy still waiting 5 s after the ack")
	}
}

// ExampleCompChannel waits for a receive completion the way a C program
// does with a completion channel: arm the CQ, wait for the channel's
// event (here GetCQEvent; the channel's Fd works in poll or epoll too),
// acknowledge it, poll, re-arm.
func ExampleCompChannel() {
	dev, _ := rxe.ForName("lo")
	ctx, _ := dev.Verbs().Open()
	defer ctx.Close()
	pd, _ := ctx.AllocPD()
	defer pd.Dealloc()
	ch, _ := ctx.CreateCompChannel()
	defer ch.Destroy()
	cq, _ := ctx.CreateCQEx(8, verbs.CQInit{Context: "my cq", Channel: ch})
	defer cq.Destroy()
	qp, _ := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTypeUD,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	defer qp.Destroy()
	qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, PortNum: 1, QKey: 0x11}, verbs.QPAttrState|verbs.QPAttrPKeyIdx|verbs.QPAttrPort|verbs.QPAttrQKey)
	qp.Modify(&verbs.QPAttr{State: verbs.QPSRTR}, verbs.QPAttrState)
	qp.Modify(&verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState|verbs.QPAttrSQPSN)
	mgid := wire.RoCEv2MGID(netip.MustParseAddr("239.254.8.9"))
	qp.AttachMcast(mgid, 0)
	defer qp.DetachMcast(mgid, 0)
	buf := make([]byte, verbs.GRHLen+5)
	mr, _ := pd.RegMR(buf, verbs.AccessLocalWrite)
	defer mr.Dereg()
	qp.PostRecv(&verbs.RecvWR{WRID: 1, SGList: []verbs.SGE{mr.SGE(0, len(buf))}})
	ah, _ := pd.CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: 1, GRH: verbs.GlobalRoute{DGID: mgid, HopLimit: 1}})
	defer ah.Destroy()
	msg := []byte("hello")
	smr, _ := pd.RegMR(msg, 0)
	defer smr.Dereg()

	cq.ReqNotify(false) // ibv_req_notify_cq(cq, 0)
	qp.PostSend(&verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, SGList: []verbs.SGE{smr.SGE(0, len(msg))},
		UD: verbs.UDWR{AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: 0x11}})
	evCQ, evCtx, err := ch.GetCQEvent(context.Background()) // ibv_get_cq_event
	fmt.Println(evCQ == cq, evCtx, err)
	evCQ.AckEvents(1) // ibv_ack_cq_events
	var wc [1]verbs.WC
	n, _ := cq.Poll(wc[:])
	fmt.Printf("%d completion, a receive: %v, %q\n", n, wc[0].Opcode == verbs.WCOpRecv, buf[verbs.GRHLen:wc[0].ByteLen])
	cq.ReqNotify(false) // re-arm for the next one
	// Output:
	// true my cq <nil>
	// 1 completion, a receive: true, "hello"
}
