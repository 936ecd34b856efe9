package saclient

import (
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sa"
	"github.com/softrdma/softrdma/verbs"
)

// TestGetTableAcks: the SA client reassembles a GetTable's RMPP answer and
// acknowledges it as the kernel's RMPP receiver does: segment 1 with a
// window of 1+64, the completed transfer, and a segment resent after a
// lost final ACK again.
func TestGetTableAcks(t *testing.T) {
	p := newFakePort(t, Config{Timeout: 10 * time.Second})
	const n = 9 // 10 records with the broadcast group: 560 bytes, 3 segments
	for i := range n {
		m := mad.NewSARequest(mad.MethodSet, mad.AttrMCMemberRecord, uint64(i+1), mad.CompCreateRequired)
		g := verbs.GID{0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 15: byte(i)}
		m.MCMemberRecord().Encode(&GroupRecord{MGID: g, PortGID: p.PortGID(), QKey: 1, PKey: 0xFFFF, JoinState: 1})
		if r := p.sa.Handle(m, sa.From{GUID: testGUID}); len(r) != 1 || r[0].Status() != 0 {
			t.Fatalf("group %d", i)
		}
	}
	p.silent.Store(true)
	type result struct {
		recs []GroupRecord
		err  error
	}
	res := make(chan result, 1)
	go func() {
		recs, err := p.e.GetTable(GroupRecord{}, 0)
		res <- result{recs, err}
	}()
	waitFor(t, "the GetTable", func() bool { return p.count(mad.MethodGetTable) == 1 })
	p.mu.Lock()
	segs := p.sa.Handle(p.last, sa.From{GUID: testGUID})
	p.mu.Unlock()
	if len(segs) != 3 {
		t.Fatalf("%d segments", len(segs))
	}
	lastAck := func() mad.MAD {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.last
	}
	ackOf := func(what string, seg, win uint32) {
		t.Helper()
		a := lastAck()
		if a.RMPPType() != mad.RMPPTypeAck || a.Method() != mad.MethodGetTable || a.TID() != segs[0].TID() ||
			a.SegmentNumber() != seg || a.PayloadLength() != win {
			t.Fatalf("%s: sent type %d method %#x segment %d window %d, want ACK %d/%d",
				what, a.RMPPType(), a.Method(), a.SegmentNumber(), a.PayloadLength(), seg, win)
		}
	}
	if !p.e.Receive(fabric.SMLID, mad.GSIQPN, segs[0]) {
		t.Fatal("segment 1 not taken")
	}
	ackOf("after segment 1", 1, 1+mad.RMPPWindow)
	acks := p.count(mad.MethodGetTable)
	p.e.Receive(fabric.SMLID, mad.GSIQPN, segs[1])
	if p.count(mad.MethodGetTable) != acks {
		t.Fatal("segment 2 acknowledged inside the window")
	}
	p.e.Receive(fabric.SMLID, mad.GSIQPN, segs[2])
	ackOf("after the last segment", 3, 1+mad.RMPPWindow)
	r := <-res
	if r.err != nil || len(r.recs) != n+1 {
		t.Fatalf("GetTable: %d records, %v", len(r.recs), r.err)
	}
	// The SA did not get the final ACK and sends segment 3 again: the
	// client acknowledges it again.
	p.mu.Lock()
	p.last = nil
	p.mu.Unlock()
	if !p.e.Receive(fabric.SMLID, mad.GSIQPN, segs[2]) {
		t.Fatal("resent segment not taken")
	}
	ackOf("after the resent segment", 3, 1+mad.RMPPWindow)
	// A segment of no transfer is stray.
	other := append(mad.MAD(nil), segs[0]...)
	other.SetTID(other.TID() + 99)
	if p.e.Receive(fabric.SMLID, mad.GSIQPN, other) {
		t.Fatal("segment of another TID taken")
	}
	if st := p.e.Stats(); st.Answers != 1 {
		t.Fatalf("stats %+v", st)
	}
}
