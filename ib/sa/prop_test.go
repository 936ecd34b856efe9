package sa

import (
	"slices"
	"testing"

	"github.com/softrdma/softrdma/ib/mad"
	"pgregory.net/rapid"
)

// Random sequences of joins, leaves and port departures keep the SA's
// invariants: a group other than the broadcast group always has a
// full-type member, the full-member count is exact, MLIDs are unique, the
// forwarding table lists exactly the FullMember/NonMember ports, and a
// successful join answers with the OR of the bits.
func TestPropMembershipInvariants(t *testing.T) {
	mgids := []string{"ff12:4001:ffff::1", "ff12:4001:ffff::2", "ff12:4001:ffff::3"}
	guids := []uint64{guidA, guidB, guidC, guidD}
	rapid.Check(t, func(t *rapid.T) {
		s := newSA(Config{SendOnlySupport: true})
		held := map[[2]uint64]uint8{} // (mgid index, guid) → JoinState the SA should hold
		// An incrementally kept copy of the forwarding table, as softsm
		// keeps it: TakeChanged and MulticastEntry.
		inc := s.MulticastTable()
		s.TakeChanged()
		for range rapid.IntRange(1, 40).Draw(t, "ops") {
			mi := rapid.IntRange(0, len(mgids)-1).Draw(t, "mgid")
			g := gid(mgids[mi])
			guid := rapid.SampledFrom(guids).Draw(t, "guid")
			js := uint8(rapid.IntRange(0, 15).Draw(t, "js"))
			key := [2]uint64{uint64(mi), guid}
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				r := s.Handle(req(mad.MethodSet, mad.CompCreateRequired, udpJoin(g, guid, js)), raw)[0]
				if r.Status() == 0 {
					held[key] |= js
					if r.MCMemberRecord().JoinState() != held[key] {
						t.Fatalf("join answered %#x, want %#x", r.MCMemberRecord().JoinState(), held[key])
					}
				}
			case 1:
				r := s.Handle(req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(g, guid, js)), raw)[0]
				if r.Status() == 0 {
					held[key] &^= js
				}
			case 2:
				s.LeaveAll(guid)
				for k := range held {
					if k[1] == guid {
						delete(held, k)
					}
				}
			}
			// Groups that lost their last full member lose every member.
			for mi := range mgids {
				alive := false
				for _, guid := range guids {
					if held[[2]uint64{uint64(mi), guid}]&mad.JoinFullTypes != 0 {
						alive = true
					}
				}
				if !alive {
					for _, guid := range guids {
						delete(held, [2]uint64{uint64(mi), guid})
					}
				}
			}
			for _, mlid := range s.TakeChanged() {
				if e, ok := s.MulticastEntry(mlid); ok {
					inc[mlid] = e
				} else {
					delete(inc, mlid)
				}
			}
			full := s.MulticastTable()
			if len(inc) != len(full) {
				t.Fatalf("incremental table %x, full %x", inc, full)
			}
			for mlid, e := range full {
				if got, ok := inc[mlid]; !ok || !slices.Equal(got, e) {
					t.Fatalf("incremental table %x, full %x", inc, full)
				}
			}
			mlids := map[uint16]bool{}
			for _, grp := range s.Groups() {
				if mlids[grp.Rec.MLID] {
					t.Fatalf("MLID %#x twice", grp.Rec.MLID)
				}
				mlids[grp.Rec.MLID] = true
				if grp.WellKnown {
					continue
				}
				mi := slices.IndexFunc(mgids, func(s string) bool { return gid(s) == grp.Rec.MGID })
				full := 0
				var receivers []uint64
				for _, m := range grp.Members {
					if m.JoinState != held[[2]uint64{uint64(mi), m.GUID}] {
						t.Fatalf("%v %#x holds %#x, want %#x", grp.Rec.MGID, m.GUID, m.JoinState, held[[2]uint64{uint64(mi), m.GUID}])
					}
					if m.JoinState&mad.JoinFullTypes != 0 {
						full++
					}
					if m.JoinState&mad.JoinReceivers != 0 {
						receivers = append(receivers, m.GUID)
					}
				}
				if full == 0 || full != s.groups[grp.Rec.MGID].full {
					t.Fatalf("%v: %d full members, counter %d", grp.Rec.MGID, full, s.groups[grp.Rec.MGID].full)
				}
				if got := s.MulticastTable()[grp.Rec.MLID]; !slices.Equal(got, receivers) {
					t.Fatalf("forwarding table %x, want %x", got, receivers)
				}
			}
			for k, js := range held {
				if js != 0 && s.groups[gid(mgids[k[0]])] == nil {
					t.Fatalf("membership %x of a missing group", k)
				}
			}
		}
	})
}
