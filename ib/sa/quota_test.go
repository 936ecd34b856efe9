package sa

import (
	"fmt"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// quotaMGID is the i-th group of the quota tests.
func quotaMGID(i int) wire.GID {
	return wire.GID{0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 14: byte(i >> 8), 15: byte(i)}
}

// TestGroupQuota: a port that created
// MaxGroupsPerPort groups gets 0x0100 for one more (counted, logged);
// another port still creates groups; a group that goes gives the quota
// back; joining an existing group is no create.
func TestGroupQuota(t *testing.T) {
	var logs []string
	s := newSA(Config{MaxGroupsPerPort: 3, Logf: func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }})
	full := mad.CompCreateRequired
	for i := range 3 {
		mustOK(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(i), guidA, 1)), From{GUID: guidA})
	}
	for range 3 {
		if r := one(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(3), guidA, 1)), From{GUID: guidA}); r.Status() != mad.StatusNoResources {
			t.Fatalf("4th create: status %#04x, want 0x0100", r.Status())
		}
	}
	if q := s.QuotaRefusals(); q.Groups != 3 || q.Memberships != 0 {
		t.Fatalf("QuotaRefusals %+v", q)
	}
	if len(logs) != 2 || !strings.Contains(logs[0], "group quota") { // refusals 1 and 2, not 3
		t.Fatalf("logs %q", logs)
	}
	if s.GroupsCreated(guidA) != 3 || len(s.Groups()) != 4 {
		t.Fatalf("created %d, groups %d", s.GroupsCreated(guidA), len(s.Groups()))
	}
	// Another port creates a group, and A may join it (no create).
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(3), guidB, 1)), From{GUID: guidB})
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(3), guidA, 1)), From{GUID: guidA})
	// A's group 0 goes with A's leave: A may create again.
	mustOK(t, s, req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(quotaMGID(0), guidA, 1)), From{GUID: guidA})
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(4), guidA, 1)), From{GUID: guidA})
	// A proxy join is charged to the requester.
	if r := one(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(5), guidC, 1)), From{GUID: guidA}); r.Status() != mad.StatusNoResources {
		t.Fatalf("proxy create over the requester's quota: status %#04x", r.Status())
	}
	// A group that lives on after its creator left still counts for it;
	// when it goes, the count goes.
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(1), guidB, 1)), From{GUID: guidB})
	s.RemovePort(guidA)
	if n := s.GroupsCreated(guidA); n != 1 {
		t.Fatalf("after RemovePort A, A's groups %d, want 1 (group 1, which B holds)", n)
	}
	s.RemovePort(guidB)
	if n := s.GroupsCreated(guidA) + s.GroupsCreated(guidB); n != 0 || len(s.Groups()) != 1 {
		t.Fatalf("created %d, groups %+v", n, s.Groups())
	}
}

// TestMembershipQuota: a port that is a member of MaxMembershipsPerPort
// groups gets 0x0100 for one more membership, created or joined; a change
// of an existing membership is no new one.
func TestMembershipQuota(t *testing.T) {
	s := newSA(Config{MaxMembershipsPerPort: 2, SendOnlySupport: true})
	full := mad.CompCreateRequired
	for i := range 2 {
		mustOK(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(i), guidA, 1)), From{GUID: guidA})
	}
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(2), guidC, 1)), From{GUID: guidC})
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(0), guidB, 2)), From{GUID: guidB})
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(1), guidB, 2)), From{GUID: guidB})
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(1), guidB, 1)), From{GUID: guidB}) // same membership
	for _, m := range []wire.GID{quotaMGID(2), quotaMGID(9)} {                                 // join, create
		if r := one(t, s, req(mad.MethodSet, full, udpJoin(m, guidB, 1)), From{GUID: guidB}); r.Status() != mad.StatusNoResources {
			t.Fatalf("third membership (%v): status %#04x, want 0x0100", m, r.Status())
		}
	}
	if q := s.QuotaRefusals(); q.Memberships != 2 || s.Memberships(guidB) != 2 || len(s.Groups()) != 4 {
		t.Fatalf("QuotaRefusals %+v, B's memberships %d, groups %d", q, s.Memberships(guidB), len(s.Groups()))
	}
	mustOK(t, s, req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(quotaMGID(0), guidB, 2)), From{GUID: guidB})
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(quotaMGID(2), guidB, 1)), From{GUID: guidB})
	// Groups deleted with their last full member take the others'
	// memberships along.
	mustOK(t, s, req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(quotaMGID(1), guidA, 1)), From{GUID: guidA})
	if n := s.Memberships(guidB); n != 2 { // B was a full member of group 1 too
		t.Fatalf("B's memberships %d", n)
	}
	s.RemovePort(guidA)
	if n := s.Memberships(guidA); n != 0 {
		t.Fatalf("A's memberships after RemovePort: %d", n)
	}
}
