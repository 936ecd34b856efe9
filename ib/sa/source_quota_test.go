package sa

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/ib/mad"
)

// TestGroupQuotaPerSource: four ports of one source address, each within
// MaxGroupsPerPort (a quarter of the MLIDs), cannot take every MLID
// together: past MaxGroupsPerSource their creates get 0x0100 (counted,
// logged), a port of another address still creates groups; a raw SA
// peer's creates count for its address; a group that goes gives the
// source's quota back, a group that lives on after its creator left
// still counts.
func TestGroupQuotaPerSource(t *testing.T) {
	const perPort, perSource = 4096, 4096
	var logs []string
	s := newSA(Config{MaxGroupsPerPort: perPort, MaxGroupsPerSource: perSource,
		Logf: func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }})
	const guidE = 0x100009
	s.AddPort(Port{GUID: guidE})
	lo, other := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	full := mad.CompCreateRequired
	ok, refused, i := 0, 0, 0
	for range perPort {
		for _, guid := range []uint64{guidA, guidB, guidC, guidD} {
			r := one(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(i), guid, 1)), From{GUID: guid, Source: lo})
			i++
			switch r.Status() {
			case 0:
				ok++
			case mad.StatusNoResources:
				refused++
			default:
				t.Fatalf("create %d: status %#04x", i, r.Status())
			}
		}
	}
	if ok != perSource || refused != 4*perPort-perSource || s.GroupsCreatedFrom(lo) != perSource {
		t.Fatalf("from %v: %d created, %d refused, %d counted; want %d, %d, %d", lo, ok, refused, s.GroupsCreatedFrom(lo), perSource, 4*perPort-perSource, perSource)
	}
	if q := s.QuotaRefusals(); q.Groups != uint64(refused) {
		t.Fatalf("QuotaRefusals %+v, want %d group refusals", q, refused)
	}
	if len(logs) == 0 || !strings.Contains(logs[0], "source 127.0.0.1 is at its group quota") || len(logs) > 14 {
		t.Fatalf("%d log lines, first %q", len(logs), logs[:min(1, len(logs))])
	}
	// Another address creates, and the source's ports may join its group
	// (no create).
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(i), guidE, 1)), From{GUID: guidE, Source: other})
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(i), guidA, 1)), From{GUID: guidA, Source: lo})
	// The raw SA port's peers count for their address.
	if r := one(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(i+1), guidE, 1)), From{Raw: true, Source: lo}); r.Status() != mad.StatusNoResources {
		t.Fatalf("raw create from %v: status %#04x, want 0x0100", lo, r.Status())
	}
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(i+1), guidE, 1)), From{Raw: true, Source: other})
	if n := s.GroupsCreatedFrom(other); n != 2 {
		t.Fatalf("groups from %v: %d, want 2", other, n)
	}
	// A's first group goes with A's leave: the source may create one.
	mustOK(t, s, req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(quotaMGID(0), guidA, 1)), From{GUID: guidA, Source: lo})
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(i+2), guidB, 1)), From{GUID: guidB, Source: lo})
	// A group the source created lives on with E after its creator went:
	// it still counts; when it goes, the count goes.
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(4), guidE, 1)), From{GUID: guidE, Source: other}) // A's
	s.RemovePort(guidA)
	bcd := s.GroupsCreated(guidB) + s.GroupsCreated(guidC) + s.GroupsCreated(guidD)
	if n := s.GroupsCreatedFrom(lo); s.GroupsCreated(guidA) != 1 || n != bcd+1 {
		t.Fatalf("after RemovePort A: %d groups from %v, A's %d; want %d, 1", n, lo, s.GroupsCreated(guidA), bcd+1)
	}
	mustOK(t, s, req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(quotaMGID(4), guidE, 1)), From{GUID: guidE, Source: other})
	if n := s.GroupsCreatedFrom(lo); n != bcd {
		t.Fatalf("after A's last group went: %d groups from %v, want %d", n, lo, bcd)
	}
	for _, guid := range []uint64{guidB, guidC, guidD} {
		s.RemovePort(guid)
	}
	if n := s.GroupsCreatedFrom(lo); n != 0 {
		t.Fatalf("groups from %v after its ports went: %d", lo, n)
	}
}

// TestGroupQuotaNoSource: requests without a source address (From.Source
// zero) are bound by the per-port quota only.
func TestGroupQuotaNoSource(t *testing.T) {
	s := newSA(Config{MaxGroupsPerSource: 1})
	for i, guid := range []uint64{guidA, guidA, guidB} {
		mustOK(t, s, req(mad.MethodSet, mad.CompCreateRequired, udpJoin(quotaMGID(i), guid, 1)), From{GUID: guid})
	}
	if q := s.QuotaRefusals(); q.Groups != 0 {
		t.Fatalf("QuotaRefusals %+v", q)
	}
}
