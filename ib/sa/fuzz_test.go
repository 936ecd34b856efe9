package sa

import (
	"testing"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// FuzzHandle feeds arbitrary 256-byte MADs to the SA: it must never panic,
// answer at most with well-formed MADs echoing the TID, and keep its
// invariants (every group but the broadcast one has a full-type member).
func FuzzHandle(f *testing.F) {
	f.Add([]byte(req(mad.MethodSet, mad.CompCreateRequired, udpJoin(mgidUDP, guidA, 1))), false)
	f.Add([]byte(req(mad.MethodSet, mad.CompCreateRequired, udpJoin(wire.GID{}, guidB, 8))), true)
	f.Add([]byte(req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(mgidUDP, guidA, 1))), false)
	f.Add([]byte(req(mad.MethodGetTable, 0, mad.MCMemberFields{})), true)
	f.Add([]byte(mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 1, 0)), false)
	f.Fuzz(func(t *testing.T, b []byte, fabricFrom bool) {
		s := newSA(Config{SendOnlySupport: true})
		mustOK(t, s, req(mad.MethodSet, mad.CompCreateRequired, udpJoin(mgidUDP, guidC, 1)), raw)
		from := raw
		if fabricFrom {
			from = From{GUID: guidB}
		}
		in := make([]byte, mad.Len)
		copy(in, b)
		m := mad.MAD(in)
		for _, r := range s.Handle(m, from) {
			if len(r) != mad.Len || r.TID() != m.TID() || !r.IsResponse() {
				t.Fatal("malformed answer")
			}
		}
		for _, g := range s.Groups() {
			full := 0
			for _, mb := range g.Members {
				if mb.JoinState == 0 {
					t.Fatal("member without JoinState")
				}
				if mb.JoinState&mad.JoinFullTypes != 0 {
					full++
				}
			}
			if !g.WellKnown && full == 0 {
				t.Fatalf("group %v without a full member", g.Rec.MGID)
			}
		}
	})
}
