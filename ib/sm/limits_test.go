package sm

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// logRecorder collects an SM's log lines.
type logRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (l *logRecorder) logf(t *testing.T) func(string, ...any) {
	return func(f string, a ...any) {
		t.Logf(f, a...)
		l.mu.Lock()
		l.lines = append(l.lines, fmt.Sprintf(f, a...))
		l.mu.Unlock()
	}
}

// has reports whether a line contains s.
func (l *logRecorder) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, x := range l.lines {
		if strings.Contains(x, s) {
			return true
		}
	}
	return false
}

// newFakePortAt opens a fake port bound to a loopback address of its own
// choosing and attaches it.
func newFakePortAt(t *testing.T, sm netip.AddrPort, ip netip.Addr, guid uint64) *fakePort {
	t.Helper()
	p := newFakePortNoAttach(t, sm, guid)
	p.conn.Close()
	p.wg.Wait()
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, 0)))
	if err != nil {
		t.Fatal(err)
	}
	p.conn = conn
	p.wg.Add(1)
	go p.readLoop()
	p.attach()
	return p
}

// TestGroupQuotaOverFabric: a port that created
// MaxGroupsPerPort groups gets 0x0100 for the next create, counted in
// Stats and logged; another port still creates groups.
func TestGroupQuotaOverFabric(t *testing.T) {
	var logs logRecorder
	s := startSM(t, Config{MaxGroupsPerPort: 4, Logf: logs.logf(t)})
	greedy := newFakePort(t, s.FabricAddr(), 0x600001)
	other := newFakePort(t, s.FabricAddr(), 0x600002)
	g := func(i int) wire.GID { return wire.GID{0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 14: 0x60, 15: byte(i)} }
	for i := range 4 {
		mustStatus(t, greedy.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, g(i), greedy.guid, mad.JoinFullMember), false), 0)
	}
	mustStatus(t, greedy.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, g(4), greedy.guid, mad.JoinFullMember), false), mad.StatusNoResources)
	// An SA-assigned MGID is a create too.
	mustStatus(t, greedy.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, wire.GID{}, greedy.guid, mad.JoinFullMember), false), mad.StatusNoResources)
	mustStatus(t, other.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, g(4), other.guid, mad.JoinFullMember), false), 0)
	// Joining a group another port created is no create.
	mustStatus(t, greedy.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, g(4), greedy.guid, mad.JoinFullMember), false), 0)
	if st := s.Stats(); st.GroupQuotaRefusals != 2 || st.MembershipQuotaRefusals != 0 {
		t.Errorf("GroupQuotaRefusals %d MembershipQuotaRefusals %d, want 2 and 0", st.GroupQuotaRefusals, st.MembershipQuotaRefusals)
	}
	if !logs.has("at its group quota (4)") {
		t.Error("the quota refusal was not logged")
	}
	// The greedy port goes: its groups go, and so does its count.
	greedy.sendControl(&fabric.Control{Type: fabric.TypeDetach, GUID: greedy.guid})
	waitUntil(t, "the greedy port's groups to go", func() bool { return len(s.Groups()) == 2 })
}

// TestMembershipQuotaOverFabric: a port that is a member of
// MaxMembershipsPerPort groups gets 0x0100 for one more, counted.
func TestMembershipQuotaOverFabric(t *testing.T) {
	s := startSM(t, Config{MaxMembershipsPerPort: 2})
	a := newFakePort(t, s.FabricAddr(), 0x600003)
	b := newFakePort(t, s.FabricAddr(), 0x600004)
	g := func(i int) wire.GID { return wire.GID{0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 14: 0x61, 15: byte(i)} }
	for i := range 2 {
		mustStatus(t, a.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, g(i), a.guid, mad.JoinFullMember), false), 0)
	}
	mustStatus(t, a.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, g(2), a.guid, mad.JoinFullMember), false), mad.StatusNoResources)
	mustStatus(t, b.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, g(2), b.guid, mad.JoinFullMember), false), 0)
	mustStatus(t, a.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, g(2), a.guid, mad.JoinFullMember), false), mad.StatusNoResources)
	if st := s.Stats(); st.MembershipQuotaRefusals != 2 {
		t.Errorf("MembershipQuotaRefusals %d, want 2", st.MembershipQuotaRefusals)
	}
}

// TestSourceLimit: a source IP address may attach
// MaxPortsPerSource ports; one more is refused (source_limit), counted and
// logged, while the attached ports' keepalives go on and another address
// attaches; once a port detaches, the address may attach one again.
func TestSourceLimit(t *testing.T) {
	var logs logRecorder
	s := startSM(t, Config{MaxPortsPerSource: 2, Logf: logs.logf(t)})
	lo := netip.MustParseAddr("127.0.0.1")
	a := newFakePortAt(t, s.FabricAddr(), lo, 0x610001)
	newFakePortAt(t, s.FabricAddr(), lo, 0x610002)
	c := newFakePortNoAttach(t, s.FabricAddr(), 0x610003)
	c.sendControl(&fabric.Control{Type: fabric.TypeAttach, GUID: c.guid})
	if m := c.control(); m.Type != fabric.TypeRefused || m.Reason != fabric.ReasonSourceLimit || m.GUID != c.guid {
		t.Fatalf("third attach from %v: %+v, want refused %s", lo, m, fabric.ReasonSourceLimit)
	}
	if pi := a.attach(); pi.Type != fabric.TypePortInfo || pi.ClientReregister {
		t.Fatalf("keepalive of an attached port: %+v", pi)
	}
	newFakePortAt(t, s.FabricAddr(), netip.MustParseAddr("127.0.0.2"), 0x610004)
	if st := s.Stats(); st.SourceLimitAttaches != 1 || len(st.Ports) != 3 {
		t.Fatalf("SourceLimitAttaches %d, %d ports; want 1 and 3", st.SourceLimitAttaches, len(st.Ports))
	}
	if !logs.has("the most one source address may attach") {
		t.Error("the refusal was not logged")
	}
	a.sendControl(&fabric.Control{Type: fabric.TypeDetach, GUID: a.guid})
	waitUntil(t, "a's detach", func() bool { return len(s.Stats().Ports) == 2 })
	if pi := c.attach(); pi.LID == 0 {
		t.Fatalf("attach after a detach: %+v", pi)
	}
}

// TestControlThrottle: an attached port's address that sends control
// messages far beyond its keepalive gets ControlBurst of them answered at
// once, the rest dropped and counted; it is not forgotten.
func TestControlThrottle(t *testing.T) {
	var logs logRecorder
	s := startSM(t, Config{Logf: logs.logf(t)})
	p := newFakePort(t, s.FabricAddr(), 0x620001)
	const n = 200
	for range n {
		p.sendControl(&fabric.Control{Type: fabric.TypeAttach, GUID: p.guid})
	}
	waitUntil(t, "the throttled messages to be counted", func() bool {
		return s.Stats().ThrottledControls >= n-ControlBurst-portPending-2*ControlRate
	})
	if !logs.has("a second") {
		t.Error("the throttle was not logged")
	}
	// The port still answers SA requests and is still attached.
	mustStatus(t, p.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, mgid("ff12:4001:ffff::601:620"), p.guid, mad.JoinFullMember), false), 0)
	if st := portStats(t, s, p.guid); !st.Attached {
		t.Fatal("the port was forgotten")
	}
}

// TestControlBounds: a NodeDesc is kept to MaxNodeDesc bytes (not cut in
// a UTF-8 sequence); a control message longer than MaxControlLen is
// dropped unread and counted.
func TestControlBounds(t *testing.T) {
	s := startSM(t, Config{})
	p := newFakePortNoAttach(t, s.FabricAddr(), 0x630001)
	p.sendControl(&fabric.Control{Type: fabric.TypeAttach, GUID: p.guid, NodeDesc: strings.Repeat("é", 300)})
	if c := p.control(); c.Type != fabric.TypePortInfo {
		t.Fatalf("%+v", c)
	}
	if d := portStats(t, s, p.guid).NodeDesc; len(d) > MaxNodeDesc || d != strings.Repeat("é", MaxNodeDesc/2) {
		t.Fatalf("NodeDesc of %d bytes: %q", len(d), d)
	}
	q := newFakePortNoAttach(t, s.FabricAddr(), 0x630002)
	q.sendControl(&fabric.Control{Type: fabric.TypeAttach, GUID: q.guid, NodeDesc: strings.Repeat("x", MaxControlLen)})
	waitUntil(t, "the long message to be dropped", func() bool { return s.Stats().ControlDrops == 1 })
	if pi := q.attach(); pi.LID == 0 { // and a proper attach works
		t.Fatalf("%+v", pi)
	}
}
