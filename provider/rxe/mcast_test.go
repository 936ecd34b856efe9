package rxe

import (
	"net/netip"
	"slices"
	"syscall"
	"testing"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

func TestAttachDetachRules(t *testing.T) {
	d := loDevOpts(t, Options{MaxMcastGrp: 2, MaxMcastQPAttach: 2, MaxTotalMcastQP: 3})
	if a := d.Attr(); a.MaxMcastGrp != 2 || a.MaxMcastQPAttach != 2 || a.MaxTotalMcastQP != 3 {
		t.Fatalf("attr %+v", a)
	}
	q1 := newQP(t, d, newFakeRx(), 0, 1)
	q2 := newQP(t, d, newFakeRx(), 0, 1)
	q3 := newQP(t, d, newFakeRx(), 0, 1)
	g1, g2, g3 := randGroup(), randGroup(), randGroup()
	m1, m2, m3 := mgid(g1), mgid(g2), mgid(g3)

	type step struct {
		name string
		op   func() error
		want syscall.Errno // 0 = success
	}
	steps := []step{
		{"attach q1 g1", func() error { return q1.AttachMcast(m1, 0) }, 0},
		{"attach q1 g1 again (idempotent)", func() error { return q1.AttachMcast(m1, 0) }, 0},
		{"detach unknown MGID", func() error { return q1.DetachMcast(m3, 0) }, syscall.EINVAL},
		{"detach non-member QP", func() error { return q2.DetachMcast(m1, 0) }, syscall.EINVAL},
		{"attach q2 g1", func() error { return q2.AttachMcast(m1, 0) }, 0},
		{"attach q3 g1: max_mcast_qp_attach", func() error { return q3.AttachMcast(m1, 0) }, syscall.ENOMEM},
		{"attach q1 g2", func() error { return q1.AttachMcast(m2, 0) }, 0},
		{"attach q1 g3: max_mcast_grp", func() error { return q1.AttachMcast(m3, 0) }, syscall.ENOMEM},
		{"raise group limit", func() error { return d.SetLimits(Options{MaxMcastGrp: 10, MaxMcastQPAttach: 2, MaxTotalMcastQP: 3}) }, 0},
		{"attach q1 g3: max_total_mcast_qp_attach", func() error { return q1.AttachMcast(m3, 0) }, syscall.ENOMEM},
		{"attach q2 g2: max_total_mcast_qp_attach", func() error { return q2.AttachMcast(m2, 0) }, syscall.ENOMEM},
		{"detach q1 g1", func() error { return q1.DetachMcast(m1, 0) }, 0},
		{"detach q1 g1 again", func() error { return q1.DetachMcast(m1, 0) }, syscall.EINVAL},
		{"attach q1 g3 now fits", func() error { return q1.AttachMcast(m3, 0) }, 0},
	}
	for _, s := range steps {
		err := s.op()
		if s.want == 0 && err != nil || s.want != 0 && !isErrno(err, s.want) {
			t.Fatalf("%s: got %v, want errno %d", s.name, err, s.want)
		}
	}
	// One membership per group however many QPs; failed attaches leave
	// nothing behind.
	if got := d.AttachedQPs(m1); !slices.Equal(got, []uint32{q2.QPN()}) {
		t.Errorf("g1 QPs %x", got)
	}
	if got := d.Groups(); !sameAddrs(got, g1, g2, g3) {
		t.Errorf("memberships %v", got)
	}
	// The last detach removes the group and its membership.
	if err := q2.DetachMcast(m1, 0); err != nil {
		t.Fatal(err)
	}
	if err := q2.DetachMcast(m1, 0); !isErrno(err, syscall.EINVAL) {
		t.Errorf("detach from removed group: %v", err)
	}
	if d.AttachedQPs(m1) != nil || slices.Contains(d.Groups(), g1) || !igmpState(t, "lo", g1, false) {
		t.Errorf("group g1 still present")
	}
	// Destroy detaches from everything.
	if err := q1.Destroy(); err != nil {
		t.Fatal(err)
	}
	if d.AttachedQPs(m2) != nil || d.AttachedQPs(m3) != nil || len(d.Groups()) != 0 {
		t.Errorf("groups after destroy: %v", d.Groups())
	}
	if err := q1.AttachMcast(m2, 0); !isErrno(err, syscall.EINVAL) {
		t.Errorf("attach destroyed QP: %v", err)
	}
	// An MGID that is not a multicast address is refused, as the kernel's
	// ib_attach_mcast does (rdma_is_multicast_addr).
	uni := wire.GIDFromAddr(netip.MustParseAddr("10.1.2.3"))
	if err := q2.AttachMcast(uni, 0); !isErrno(err, syscall.EINVAL) {
		t.Errorf("attach unicast MGID: %v", err)
	}
	if len(d.Groups()) != 0 || d.AttachedQPs(uni) != nil {
		t.Errorf("non-multicast MGID: memberships %v", d.Groups())
	}
}

func sameAddrs(got []netip.Addr, want ...netip.Addr) bool {
	w := slices.Clone(want)
	slices.SortFunc(w, func(a, b netip.Addr) int { return a.Compare(b) })
	w = slices.Compact(w)
	return slices.Equal(got, w)
}

func TestMembershipReferences(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	if err := d.IncGroup(netip.MustParseAddr("10.0.0.1")); !isErrno(err, syscall.EINVAL) {
		t.Errorf("IncGroup unicast: %v", err)
	}
	if err := d.DecGroup(g); !isErrno(err, syscall.EADDRNOTAVAIL) {
		t.Errorf("DecGroup not joined: %v", err)
	}
	if !igmpState(t, "lo", g, false) {
		t.Fatalf("%v already joined on lo", g)
	}
	// Two CM references, then a verbs attach.
	for i := 0; i < 2; i++ {
		if err := d.IncGroup(g); err != nil {
			t.Fatal(err)
		}
	}
	if !igmpState(t, "lo", g, true) {
		t.Fatalf("lo not in %v after IncGroup", g)
	}
	q := newQP(t, d, newFakeRx(), 0, 1)
	if err := q.AttachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := d.DecGroup(netip.AddrFrom16(g.As16())); err != nil { // IPv4-mapped form works too
			t.Fatal(err)
		}
	}
	if err := d.DecGroup(g); !isErrno(err, syscall.EADDRNOTAVAIL) {
		t.Errorf("DecGroup below zero: %v", err)
	}
	if !igmpState(t, "lo", g, true) {
		t.Fatalf("attach reference lost")
	}
	if err := q.DetachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	if !igmpState(t, "lo", g, false) {
		t.Errorf("lo still in %v after the last reference", g)
	}
	eventually(t, "receive goroutine gone", func() bool { return receiveGoroutines() == 0 })
}

// TestManyGroups joins more groups than one socket may hold
// (igmp_max_memberships) and receives on the last one.
func TestManyGroups(t *testing.T) {
	d := loDev(t)
	per := membershipsPerSocket()
	n := 2*per + 5
	groups := map[netip.Addr]bool{}
	for len(groups) < n {
		groups[randGroup()] = true
	}
	var list []netip.Addr
	for g := range groups {
		if err := d.IncGroup(g); err != nil {
			t.Fatalf("IncGroup #%d %v: %v", len(list), g, err)
		}
		list = append(list, g)
	}
	d.mu.Lock()
	nsock := len(d.rsocks)
	d.mu.Unlock()
	if nsock != 3 {
		t.Errorf("%d groups on %d sockets (limit %d per socket)", n, nsock, per)
	}
	for _, g := range list {
		if !igmpState(t, "lo", g, true) {
			t.Errorf("lo not in %v", g)
		}
	}
	eventually(t, "receive goroutines", func() bool { return receiveGoroutines() == 3 })

	// Traffic to the last group (held by the third socket) is received.
	last := list[len(list)-1]
	rx := newFakeRx()
	q := newQP(t, d, rx, 0, 5)
	if err := q.AttachMcast(mgid(last), 0); err != nil {
		t.Fatal(err)
	}
	if err := q.Send(&softverbs.UDSend{AH: mcastAH(last), RemoteQPN: verbs.MulticastQPN, RemoteQKey: 5, Payload: []byte("last")}); err != nil {
		t.Fatal(err)
	}
	if got := rx.wait(t); string(got.payload) != "last" {
		t.Errorf("got %q", got.payload)
	}
	if err := q.DetachMcast(mgid(last), 0); err != nil {
		t.Fatal(err)
	}

	for _, g := range list {
		if err := d.DecGroup(g); err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range list {
		if !igmpState(t, "lo", g, false) {
			t.Errorf("lo still in %v", g)
		}
	}
	eventually(t, "receive goroutines gone", func() bool { return receiveGoroutines() == 0 })
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.rsocks) != 0 || len(d.mships) != 0 {
		t.Errorf("sockets %d memberships %d left", len(d.rsocks), len(d.mships))
	}
}

// TestMembershipLimit: the RDMA CM's IP memberships are bounded by
// max_mcast_grp like verbs groups, with ENOMEM.
func TestMembershipLimit(t *testing.T) {
	d := loDevOpts(t, Options{MaxMcastGrp: 2})
	g1, g2, g3 := randGroup(), randGroup(), randGroup()
	for _, g := range []netip.Addr{g1, g2} {
		if err := d.IncGroup(g); err != nil {
			t.Fatal(err)
		}
		defer d.DecGroup(g)
	}
	if err := d.IncGroup(g3); !isErrno(err, syscall.ENOMEM) {
		t.Errorf("third membership: %v, want ENOMEM", err)
		d.DecGroup(g3)
	}
	// Another reference on a group held is not a new membership.
	if err := d.IncGroup(g1); err != nil {
		t.Errorf("second reference: %v", err)
	} else {
		d.DecGroup(g1)
	}
}
