package sm

import (
	"errors"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

func portStats(t *testing.T, s *SM, guid uint64) PortStats {
	t.Helper()
	for _, p := range s.Stats().Ports {
		if p.GUID == guid {
			return p
		}
	}
	t.Fatalf("no port %#x", guid)
	return PortStats{}
}

// members returns the GUIDs the SA holds in a group.
func members(s *SM, g wire.GID) map[uint64]uint8 {
	out := map[uint64]uint8{}
	for _, grp := range s.Groups() {
		if grp.Rec.MGID == g {
			for _, m := range grp.Members {
				out[m.GUID] = m.JoinState
			}
		}
	}
	return out
}

// TestNoTakeover: an attach for a GUID live at another address is refused,
// counted and answered with "refused" (guid_in_use); a detach naming it from there is ignored and counted; the
// victim keeps its address, LID and memberships.
func TestNoTakeover(t *testing.T) {
	s := startSM(t, Config{SendOnlySupport: true})
	victim := newFakePort(t, s.FabricAddr(), 0x300001)
	group := mgid("ff12:4001:ffff::601:204")
	mustStatus(t, victim.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, group, victim.guid, mad.JoinFullMember), false), 0)
	before := portStats(t, s, victim.guid)

	evil := newFakePort(t, s.FabricAddr(), 0x300002)
	evil.sendControl(&fabric.Control{Type: fabric.TypeAttach, GUID: victim.guid})
	if c := evil.control(); c.Type != fabric.TypeRefused || c.GUID != victim.guid || c.Reason != fabric.ReasonGUIDInUse {
		t.Fatalf("answer to the takeover: %+v, want refused %#x %s", c, victim.guid, fabric.ReasonGUIDInUse)
	}
	evil.sendControl(&fabric.Control{Type: fabric.TypeDetach, GUID: victim.guid})
	// The SM reads one socket in order: once evil's own attach is answered,
	// the two messages before it were handled.
	if pi := evil.attach(); pi.GUID != evil.guid {
		t.Fatalf("port_info for %#x: the takeover was answered", pi.GUID)
	}
	after := portStats(t, s, victim.guid)
	if !after.Attached || after.Addr != before.Addr || after.LID != before.LID {
		t.Errorf("victim before %+v, after %+v", before, after)
	}
	if js := members(s, group)[victim.guid]; js != mad.JoinFullMember {
		t.Errorf("victim's membership: join state %#x", js)
	}
	if st := s.Stats(); st.RefusedAttaches != 1 || st.ForeignDetaches != 1 {
		t.Errorf("RefusedAttaches %d ForeignDetaches %d, want 1 and 1", st.RefusedAttaches, st.ForeignDetaches)
	}
	// The owner's own detach counts.
	victim.sendControl(&fabric.Control{Type: fabric.TypeDetach, GUID: victim.guid})
	waitUntil(t, "the owner's detach", func() bool { return len(members(s, group)) == 0 })
}

// TestExpiredPortReregisters: a port the SM forgot (silent for longer than
// PortTimeout) gets ClientReregister in the port_info of its next attach,
// so it learns its memberships are gone; a live port's keepalives do not.
func TestExpiredPortReregisters(t *testing.T) {
	s := startSM(t, Config{SendOnlySupport: true, PortTimeout: 300 * time.Millisecond})
	p := newFakePort(t, s.FabricAddr(), 0x300003)
	group := mgid("ff12:4001:ffff::601:205")
	mustStatus(t, p.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, group, p.guid, mad.JoinFullMember), false), 0)
	if pi := p.attach(); pi.ClientReregister {
		t.Fatal("a keepalive of a live port carries ClientReregister")
	}
	waitUntil(t, "the SM to forget the silent port", func() bool { return len(members(s, group)) == 0 })
	if pi := p.attach(); !pi.ClientReregister {
		t.Fatalf("port_info after expiry %+v: no ClientReregister", pi)
	}
	if pi := p.attach(); pi.ClientReregister {
		t.Fatal("ClientReregister repeated on the next keepalive")
	}
}

// TestLIDExhaustionAndReuse: with LIDs 2..4, a fourth live port is
// refused (counted, answered with "refused" no_lid); once a port is forgotten its LID is reused.
func TestLIDExhaustionAndReuse(t *testing.T) {
	s := startSM(t, Config{MaxLID: 4})
	a := newFakePort(t, s.FabricAddr(), 0x400001)
	b := newFakePort(t, s.FabricAddr(), 0x400002)
	c := newFakePort(t, s.FabricAddr(), 0x400003)
	if a.LID() != 2 || b.LID() != 3 || c.LID() != 4 {
		t.Fatalf("LIDs %d %d %d", a.LID(), b.LID(), c.LID())
	}
	d := newFakePortNoAttach(t, s.FabricAddr(), 0x400004)
	d.sendControl(&fabric.Control{Type: fabric.TypeAttach, GUID: d.guid})
	if c := d.control(); c.Type != fabric.TypeRefused || c.GUID != d.guid || c.Reason != fabric.ReasonNoLID {
		t.Fatalf("answer to the fourth attach: %+v, want refused %#x %s", c, d.guid, fabric.ReasonNoLID)
	}
	if n := s.Stats().NoLIDAttaches; n != 1 {
		t.Fatalf("NoLIDAttaches %d, want 1", n)
	}
	a.sendControl(&fabric.Control{Type: fabric.TypeDetach, GUID: a.guid})
	waitUntil(t, "a's detach", func() bool { return len(s.Stats().Ports) == 2 })
	if pi := d.attach(); pi.LID != 2 {
		t.Fatalf("LID after reuse %d, want 2", pi.LID)
	}
}

// TestLIDAllocatorRules: 70,000 GUIDs registering one after another (each
// forgotten before the next) never get LID 0, the SM's LID, a multicast
// or the permissive LID, and two registered GUIDs never share a LID.
func TestLIDAllocatorRules(t *testing.T) {
	a := newLIDAlloc(0)
	live := map[uint16]uint64{}
	var window []uint64
	for g := uint64(1); g <= 70000; g++ {
		lid, err := a.lidFor(g)
		if err != nil {
			t.Fatalf("GUID %d: %v", g, err)
		}
		if !validUnicast(lid) || lid == fabric.SMLID {
			t.Fatalf("GUID %d got LID %#x", g, lid)
		}
		if o, ok := live[lid]; ok {
			t.Fatalf("LID %#x given to %d while %d holds it", lid, g, o)
		}
		live[lid] = g
		window = append(window, g)
		if len(window) > 100 { // at most 100 registered at once
			old := window[0]
			window = window[1:]
			delete(live, a.byGUID[old])
			a.forget(old)
		}
	}
	// Fill up: with every LID bound to a registered GUID, the next fails.
	b := newLIDAlloc(10)
	for g := uint64(1); g <= 9; g++ {
		if _, err := b.lidFor(g); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.lidFor(100); !errors.Is(err, ErrNoLID) {
		t.Fatalf("exhausted: %v", err)
	}
}

// TestRawSAPortLoopbackOnly: the raw SA port is off unless configured,
// and refuses a non-loopback address unless widened.
func TestRawSAPortLoopbackOnly(t *testing.T) {
	s, err := New(Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if s.SAAddr().IsValid() {
		t.Errorf("raw SA port on by default at %v", s.SAAddr())
	}
	s.Close()
	if _, err := New(Config{Listen: "127.0.0.1:0", SAListen: "0.0.0.0:0"}); err == nil {
		t.Fatal("raw SA port on 0.0.0.0 accepted without SAAllowRemote")
	}
	s, err = New(Config{Listen: "127.0.0.1:0", SAListen: "0.0.0.0:0", SAAllowRemote: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := New(Config{Listen: "127.0.0.1:0", PortTimeout: -time.Second}); err == nil {
		t.Fatal("negative port timeout accepted")
	}
}

func newFakePortNoAttach(t *testing.T, sm interface{ String() string }, guid uint64) *fakePort {
	t.Helper()
	return newFakePortOpts(t, sm, guid, false)
}

// waitUntil polls cond until it holds or 10 s pass.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
