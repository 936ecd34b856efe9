package rdmacm

import (
	"context"
	"testing"
	"time"

	"github.com/softrdma/softrdma/verbs"
)

// TestDataPathAllocs: rdma_post_recv and rdma_post_ud_send, a multicast
// message to the id's own group and both completions polled or waited
// for, allocate nothing in the steady state (a WR, a WC, a closure or a
// context.AfterFunc made per call would: ten allocations a message
// before).
func TestDataPathAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops what it is given: measured without -race (.ci/run)")
	}
	const size = verbs.GRHLen + 64
	_, id := newID(t, PS_UDP)
	mr := withQP(t, id, 1, size, 0)
	g := randGroup()
	ev := join(t, id, g, MCJoinFlagFullMember, nil)
	ah, err := id.PD().CreateAH(&ev.Param.AHAttr)
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Destroy()
	qpn, qkey := ev.Param.QPNum, ev.Param.QKey
	ev.Ack()
	if qkey != UDPQKey {
		t.Fatalf("the join's Q_Key %#x, want RDMA_UDP_QKEY", qkey)
	}
	msg := make([]byte, 64)
	smr, err := id.RegMsgs(msg)
	if err != nil {
		t.Fatal(err)
	}
	defer smr.Dereg()
	var wc [1]verbs.WC
	poll := func(cq *verbs.CQ) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			n, err := cq.Poll(wc[:])
			if err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				if wc[0].Status != verbs.WCSuccess {
					t.Fatalf("completion: %v", wc[0].Status)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("no completion in 10 s")
			}
		}
	}
	round := func() {
		if err := id.PostUDSend(1, smr, 0, len(msg), verbs.SendSignaled, ah, qpn); err != nil {
			t.Fatal(err)
		}
		poll(id.SendCQ())
		poll(id.RecvCQ())
		if err := id.PostRecv(0, mr, 0, size); err != nil {
			t.Fatal(err)
		}
	}
	// The same with the blocking waits, rdma_get_send_comp and
	// rdma_get_recv_comp, under one context that can end (a Done: the
	// channel's cancellation watch, the sleep on the device's socket).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	roundBlocking := func() {
		if err := id.PostUDSend(1, smr, 0, len(msg), verbs.SendSignaled, ah, qpn); err != nil {
			t.Fatal(err)
		}
		if wc, err := id.GetSendComp(ctx); err != nil || wc.Status != verbs.WCSuccess {
			t.Fatalf("send completion: %v %v", wc.Status, err)
		}
		if wc, err := id.GetRecvComp(ctx); err != nil || wc.Status != verbs.WCSuccess {
			t.Fatalf("receive completion: %v %v", wc.Status, err)
		}
		if err := id.PostRecv(0, mr, 0, size); err != nil {
			t.Fatal(err)
		}
	}
	for name, f := range map[string]func(){"poll": round, "block": roundBlocking} {
		for range 50 {
			f()
		}
		if a := testing.AllocsPerRun(500, f); a != 0 {
			t.Errorf("%s: %.2f allocations per message, want 0", name, a)
		}
	}
	if err := id.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
}
