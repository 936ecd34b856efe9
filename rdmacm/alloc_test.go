package rdmacm

import (
	"testing"
	"time"

	"github.com/softrdma/softrdma/verbs"
)

// TestDataPathAllocs: rdma_post_recv and rdma_post_ud_send, a multicast
// message to the id's own group and both completions polled, allocate
// nothing in the steady state (a WR made per call would escape into the
// provider: one allocation per message).
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
	for range 50 {
		round()
	}
	if a := testing.AllocsPerRun(500, round); a != 0 {
		t.Errorf("%.2f allocations per message, want 0", a)
	}
	if err := id.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
}
