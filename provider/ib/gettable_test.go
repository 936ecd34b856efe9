package ib_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/rdmacm/saclient"
	"github.com/softrdma/softrdma/verbs"
)

// TestGetTableManyGroups: a GetTable of 300 groups through the port's SA
// client works end to end: the SM's RMPP sender starts with a window of
// one segment and moves on only with the client's ACKs (85 segments, more
// than one receive window of 64), and nothing is resent or aborted.
func TestGetTableManyGroups(t *testing.T) {
	s, err := sm.New(sm.Config{Listen: "127.0.0.1:0", SAListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	p := openPort(t, s, "127.0.0.2")

	// The groups are created through the raw SA port, for the port.
	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(s.SAAddr()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const n = 300
	want := map[verbs.GID]bool{saclient.IPoIBBroadcastMGID: true}
	buf := make([]byte, 512)
	for i := range n {
		g := verbs.GID{0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 14: byte(i >> 8), 15: byte(i)}
		want[g] = true
		m := mad.NewSARequest(mad.MethodSet, mad.AttrMCMemberRecord, uint64(1000+i), mad.CompCreateRequired)
		m.MCMemberRecord().Encode(&mad.MCMemberFields{MGID: g, PortGID: p.dev.PortGID(), QKey: 0x01234567, PKey: 0xFFFF, JoinState: 1})
		if _, err := conn.Write(m); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, err := conn.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		if r := mad.MAD(buf[:k]); k != mad.Len || r.TID() != uint64(1000+i) || r.Status() != 0 {
			t.Fatalf("join %d: % x", i, buf[:min(k, 8)])
		}
	}

	recs, err := saAgent(t, p.dev).GetTable(saclient.GroupRecord{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != n+1 {
		t.Fatalf("%d records, want %d", len(recs), n+1)
	}
	for _, r := range recs {
		if !want[r.MGID] {
			t.Fatalf("unexpected group %v", r.MGID)
		}
		delete(want, r.MGID)
	}
	// A GetTable of one group (an RMPP transfer of one segment).
	one, err := saAgent(t, p.dev).GetTable(saclient.GroupRecord{MGID: saclient.IPoIBBroadcastMGID}, mad.CompMGID)
	if err != nil || len(one) != 1 || one[0].MLID != 0xC000 {
		t.Fatalf("broadcast group: %v %+v", err, one)
	}
	st := s.Stats()
	if st.RMPPTransfers != 2 || st.RMPPRetransmits != 0 || st.RMPPTimeouts != 0 || st.RMPPAborts != 0 {
		t.Fatalf("RMPP transfers %d, retransmits %d, timeouts %d, aborts %d",
			st.RMPPTransfers, st.RMPPRetransmits, st.RMPPTimeouts, st.RMPPAborts)
	}
}
