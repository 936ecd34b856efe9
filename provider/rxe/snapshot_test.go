package rxe

import (
	"slices"
	"testing"
	"time"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
)

// TestSnapshot checks a device snapshot against the state the test built:
// QPs (state, Q_Key, flags, groups in attach order), verbs groups,
// memberships with their CM references, and counters.
func TestSnapshot(t *testing.T) {
	d := loDev(t)
	g1, g2 := randGroup(), randGroup()
	for g2 == g1 {
		g2 = randGroup()
	}
	rx := newFakeRx()
	a := newQP(t, d, rx, 0, 0x11)
	b := newQP(t, d, newFakeRx(), verbs.CreateBlockSelfMcastLB, 0x22)
	for _, step := range []struct {
		q *tqp
		g verbs.GID
	}{{a, mgid(g1)}, {b, mgid(g1)}, {a, mgid(g2)}} {
		if err := step.q.AttachMcast(step.g, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.IncGroup(g1); err != nil {
		t.Fatal(err)
	}
	defer d.DecGroup(g1)
	if err := a.Send(&softverbs.UDSend{AH: mcastAH(g2), RemoteQPN: verbs.MulticastQPN, RemoteQKey: 0x11, Payload: []byte("hi")}); err != nil {
		t.Fatal(err)
	}
	rx.wait(t)
	// The receive goroutine counts a delivery right after handing it over.
	s := d.Snapshot()
	for deadline := time.Now().Add(2 * time.Second); s.Counters.Get(softverbs.Delivered) == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		s = d.Snapshot()
	}
	if s.Name != "rxe_lo" || s.Ifname != "lo" || !s.Up || s.Port.State != verbs.PortActive || s.Port.ActiveMTU != verbs.MTU4096 {
		t.Errorf("device: %s %s up=%v port %v mtu %v", s.Name, s.Ifname, s.Up, s.Port.State, s.Port.ActiveMTU)
	}
	if len(s.GIDs) == 0 || s.GIDs[0].GID.String() != "::ffff:127.0.0.1" {
		t.Errorf("GIDs %v", s.GIDs)
	}
	if s.Attr.MaxMcastQPAttach != DefaultMaxMcastQPAttach {
		t.Errorf("attr %+v", s.Attr)
	}
	if len(s.QPs) != 2 {
		t.Fatalf("%d QPs", len(s.QPs))
	}
	byQPN := map[uint32]QPSnapshot{}
	for _, q := range s.QPs {
		byQPN[q.QPN] = q
	}
	qa, qb := byQPN[a.QPN()], byQPN[b.QPN()]
	if qa.State != verbs.QPSRTS || qa.QKey != 0x11 || qa.BlockSelfMcastLB || qa.Port != 1 {
		t.Errorf("qp a %+v", qa)
	}
	if !slices.Equal(qa.Groups, []verbs.GID{mgid(g1), mgid(g2)}) {
		t.Errorf("qp a groups %v", qa.Groups)
	}
	if qb.QKey != 0x22 || !qb.BlockSelfMcastLB || !slices.Equal(qb.Groups, []verbs.GID{mgid(g1)}) {
		t.Errorf("qp b %+v", qb)
	}
	if qa.Counters.Get(softverbs.SentPkts) != 1 || qa.Counters.Get(softverbs.Delivered) != 1 {
		t.Errorf("qp a counters %+v", qa.Counters)
	}
	if s.Counters.Get(softverbs.SentPkts) != 1 || s.Counters.Get(softverbs.RcvdPkts) != 1 || s.Counters.Get(softverbs.Delivered) != 1 {
		t.Errorf("device counters %+v", s.Counters)
	}
	if s.Attachments != 3 || len(s.Groups) != 2 {
		t.Errorf("attachments %d, groups %d", s.Attachments, len(s.Groups))
	}
	for _, gs := range s.Groups {
		switch gs.MGID {
		case mgid(g1):
			if !slices.Equal(gs.QPNs, []uint32{a.QPN(), b.QPN()}) || gs.Membership != g1 {
				t.Errorf("group 1 %+v", gs)
			}
		case mgid(g2):
			if !slices.Equal(gs.QPNs, []uint32{a.QPN()}) {
				t.Errorf("group 2 %+v", gs)
			}
		}
	}
	if len(s.Memberships) != 2 {
		t.Fatalf("memberships %+v", s.Memberships)
	}
	for _, m := range s.Memberships {
		want := 0
		if m.Group == g1 {
			want = 1
		}
		if m.CMRefs != want || !m.Attached || !m.Joined {
			t.Errorf("membership %+v, want %d CM refs, attached, joined", m, want)
		}
	}
	if s.RecvSockets < 1 || s.SendSockets < 1 {
		t.Errorf("sockets: %d recv, %d send", s.RecvSockets, s.SendSockets)
	}
}
