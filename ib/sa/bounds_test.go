package sa

import (
	"bytes"
	"sync"
	"testing"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// boundsSA is an SA of n ports with LIDs (2…) holding 3 groups of 4
// members (12 memberships; the ports of guidA on).
func boundsSA(t *testing.T, cfg Config, n int) *SA {
	t.Helper()
	s := New(cfg)
	for i := range n {
		s.AddPort(Port{GUID: guidA + uint64(i), LID: uint16(2 + i)})
	}
	for g := range 3 {
		for m := range 4 {
			mustOK(t, s, req(mad.MethodSet, mad.CompCreateRequired, udpJoin(quotaMGID(g), guidA+uint64(m), 1)), From{GUID: guidA + uint64(m)})
		}
	}
	return s
}

func boundsPathReq(method uint8, comp uint64, sgid wire.GID) mad.MAD {
	nextTID++
	m := mad.NewSARequest(method, mad.AttrPathRecord, nextTID, comp)
	m.PathRecord().SetSGID(sgid)
	return m
}

func trustedReq(method uint8, comp uint64, f mad.MCMemberFields) mad.MAD {
	m := req(method, comp, f)
	m.SetSMKey(DefaultSMKey)
	return m
}

// tableRecords returns the status of a GetTable's answer and its records.
func tableRecords(t *testing.T, rs []mad.MAD) (uint16, int) {
	t.Helper()
	if len(rs) == 0 {
		t.Fatal("no answer")
	}
	if rs[0].RMPPFlags()&mad.RMPPFlagActive == 0 {
		return rs[0].Status(), 0
	}
	stride := int(rs[0].AttrOffset()) * 8
	if stride == 0 {
		return rs[0].Status(), 0
	}
	return rs[0].Status(), (int(rs[0].PayloadLength()) - 20*len(rs)) / stride
}

// TestQueryBounds: with MaxRecords 10, a query answering more records, or
// examining more than WorkFactor × 10 candidates, is answered 0x0100 and
// no record (Build says so); smaller ones are answered in full, and
// without MaxRecords nothing is refused.
func TestQueryBounds(t *testing.T) {
	s := boundsSA(t, Config{MaxRecords: 10}, 6)
	from := From{GUID: guidA}
	cases := []struct {
		name    string
		req     mad.MAD
		status  uint16
		records int
		tooBig  bool
	}{
		{"paths of all pairs (36 records)", boundsPathReq(mad.MethodGetTable, 0, wire.GID{}), mad.StatusNoResources, 0, true},
		{"paths from one port (6)", boundsPathReq(mad.MethodGetTable, mad.PathCompSGID, portGID(guidA)), 0, 6, false},
		{"a Get of a path", boundsPathReq(mad.MethodGet, 0, wire.GID{}), 0, 0, false},
		{"every member (12)", trustedReq(mad.MethodGetTable, 0, mad.MCMemberFields{}), mad.StatusNoResources, 0, true},
		{"every group (4)", req(mad.MethodGetTable, 0, mad.MCMemberFields{}), 0, 4, false},
		{"the members of a group (4)", trustedReq(mad.MethodGetTable, mad.CompMGID, mad.MCMemberFields{MGID: quotaMGID(1)}), 0, 4, false},
		{"the members with JoinState 1 (12)", trustedReq(mad.MethodGetTable, mad.CompJoinState, mad.MCMemberFields{JoinState: 1}), mad.StatusNoResources, 0, true},
		{"a Get of every member", trustedReq(mad.MethodGet, 0, mad.MCMemberFields{}), mad.StatusTooManyRecords, 0, false},
	}
	for _, c := range cases {
		_, q := s.Prepare(c.req, from)
		if q == nil {
			t.Fatalf("%s: no Query", c.name)
		}
		rs, tooBig := q.Build()
		st, n := tableRecords(t, rs)
		if st != c.status || n != c.records || tooBig != c.tooBig || (st != 0 && len(rs) != 1) {
			t.Errorf("%s: status %#04x, %d records, %d MADs, too large %v; want %#04x, %d, %v", c.name, st, n, len(rs), tooBig, c.status, c.records, c.tooBig)
		}
	}
	// 7 ports: 49 pairs, beyond 4 × 10 candidates: refused before any is
	// copied.
	s.AddPort(Port{GUID: guidA + 6, LID: 8})
	if _, q := s.Prepare(boundsPathReq(mad.MethodGetTable, 0, wire.GID{}), from); !q.done || !q.tooLarge || len(q.srcs) != 0 {
		t.Errorf("49 pairs: done %v too large %v, %d sources copied", q.done, q.tooLarge, len(q.srcs))
	}
	// No bound: every record.
	s = boundsSA(t, Config{}, 6)
	if st, n := tableRecords(t, s.Handle(boundsPathReq(mad.MethodGetTable, 0, wire.GID{}), from)); st != 0 || n != 36 {
		t.Errorf("no bound: status %#04x, %d paths", st, n)
	}
	if st, n := tableRecords(t, s.Handle(trustedReq(mad.MethodGetTable, 0, mad.MCMemberFields{}), from)); st != 0 || n != 12 {
		t.Errorf("no bound: status %#04x, %d members", st, n)
	}
}

// TestQueryBuildConcurrent: Build needs nothing of the SA: run beside
// joins, leaves and port changes (under -race), it answers what the SA
// held at Prepare, byte for byte.
func TestQueryBuildConcurrent(t *testing.T) {
	s := boundsSA(t, Config{MaxRecords: 100}, 8)
	reqs := []mad.MAD{
		boundsPathReq(mad.MethodGetTable, 0, wire.GID{}),
		boundsPathReq(mad.MethodGet, 0, wire.GID{}),
		trustedReq(mad.MethodGetTable, 0, mad.MCMemberFields{}),
		req(mad.MethodGetTable, 0, mad.MCMemberFields{}),
		trustedReq(mad.MethodGetTable, mad.CompPortGID, mad.MCMemberFields{PortGID: portGID(guidA)}),
	}
	var want [][]mad.MAD
	var qs []*Query
	for _, r := range reqs {
		want = append(want, s.Handle(r, From{GUID: guidA}))
		_, q := s.Prepare(r, From{GUID: guidA})
		qs = append(qs, q)
	}
	var wg sync.WaitGroup
	got := make([][]mad.MAD, len(qs))
	for i, q := range qs {
		wg.Add(1)
		go func() { defer wg.Done(); got[i], _ = q.Build() }()
	}
	for i := range 200 {
		g := quotaMGID(i % 3)
		guid := guidA + uint64(i%8)
		s.Handle(req(mad.MethodSet, mad.CompCreateRequired, udpJoin(g, guid, 2)), From{GUID: guid})
		s.Handle(req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(g, guid, 1)), From{GUID: guid})
		if i%50 == 0 {
			s.RemovePort(guidA + 7)
			s.AddPort(Port{GUID: guidA + 7, LID: 9})
		}
	}
	wg.Wait()
	for i := range reqs {
		if len(got[i]) != len(want[i]) {
			t.Fatalf("query %d: %d MADs, want %d", i, len(got[i]), len(want[i]))
		}
		for k := range got[i] {
			if !bytes.Equal(got[i][k], want[i][k]) {
				t.Errorf("query %d MAD %d differs from the answer at Prepare", i, k)
			}
		}
	}
}

// TestBroad: the queries whose work grows with the subnet are those that
// name no group (and, trusted, no member), nor a group or both ends of a
// path.
func TestBroad(t *testing.T) {
	s := New(Config{})
	group := mad.MCMemberFields{MGID: quotaMGID(1), PortGID: portGID(guidA)}
	mcast := mad.NewSARequest(mad.MethodGet, mad.AttrPathRecord, 1, mad.PathCompDGID)
	mcast.PathRecord().SetDGID(quotaMGID(1))
	for _, c := range []struct {
		name  string
		req   mad.MAD
		broad bool
	}{
		{"GetTable of every group", req(mad.MethodGetTable, 0, group), true},
		{"Get of one group", req(mad.MethodGet, mad.CompMGID, group), false},
		{"trusted Get of one group's members", trustedReq(mad.MethodGet, mad.CompMGID, group), true},
		{"trusted Get of one member", trustedReq(mad.MethodGet, mad.CompMGID|mad.CompPortGID, group), false},
		{"a join", req(mad.MethodSet, mad.CompCreateRequired, group), false},
		{"every path", boundsPathReq(mad.MethodGetTable, 0, wire.GID{}), true},
		{"the paths from one port", boundsPathReq(mad.MethodGetTable, mad.PathCompSGID, portGID(guidA)), true},
		{"the path between two ports", boundsPathReq(mad.MethodGet, mad.PathCompSGID|mad.PathCompDLID, portGID(guidA)), false},
		{"the path to a group", mcast, false},
		{"ClassPortInfo", mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 2, 0), false},
	} {
		if got := s.Broad(c.req); got != c.broad {
			t.Errorf("%s: Broad %v, want %v", c.name, got, c.broad)
		}
	}
}
