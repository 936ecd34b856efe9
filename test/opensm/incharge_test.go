package opensm

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/rdmacm/saclient"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/test/testep"
	"github.com/softrdma/softrdma/verbs"
)

// startInCharge runs an in-process SM with OpenSM in charge (the SM
// starts opensm itself) and opens n IB ports of this process, IPoIB
// addresses 127.0.0.2… (each waits until OpenSM made it Active).
func startInCharge(t *testing.T, n int) (*sm.SM, []*ib.Device) {
	t.Helper()
	return startInChargeWith(t, n, sm.OpenSMConfig{})
}

// startInChargeWith is startInCharge with OpenSM's configuration osm
// (its Dir and Verbose are the test's).
func startInChargeWith(t *testing.T, n int, osm sm.OpenSMConfig) (*sm.SM, []*ib.Device) {
	t.Helper()
	return startInChargeLog(t, n, osm, t.Logf)
}

// startInChargeLog is startInChargeWith with softsm's log to logf.
func startInChargeLog(t *testing.T, n int, osm sm.OpenSMConfig, logf func(string, ...any)) (*sm.SM, []*ib.Device) {
	t.Helper()
	return startInChargeConfig(t, n, sm.Config{Logf: logf, OpenSM: osm})
}

// startInChargeConfig is startInCharge with softsm's configuration cfg:
// its listener, manager and OpenSM's Dir and Verbose are the test's.
func startInChargeConfig(t *testing.T, n int, cfg sm.Config) (*sm.SM, []*ib.Device) {
	t.Helper()
	osm := &cfg.OpenSM
	osm.Dir, osm.Verbose = os.Getenv("SOFTRDMA_TEST_OPENSM_DIR"), true
	// SOFTRDMA_TEST_OPENSM_NO_RMPP=1: OpenSM without softsm's RMPP layer,
	// to see which tests need it.
	osm.NoRMPPLayer = os.Getenv("SOFTRDMA_TEST_OPENSM_NO_RMPP") == "1"
	cfg.Listen, cfg.Manager = "127.0.0.1:0", sm.ManagerOpenSM
	s, err := sm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunUntilEnd(t, "softsm", s.Run)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(s.OpenSMDir() + "/osm.log")
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("OpenSM log (end):\n%s", b)
		}
	})
	devs := make([]*ib.Device, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			devs[i], errs[i] = ib.Open(ib.Config{SM: s.FabricAddr().String(), Local: netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + i)}),
				ActivateTimeout: 60 * time.Second})
		}()
	}
	wg.Wait()
	for i, d := range devs {
		if d != nil {
			t.Cleanup(func() { d.Close() })
		}
		if errs[i] != nil {
			t.Fatalf("port %d: %v", i, errs[i])
		}
	}
	t.Logf("%d ports Active by OpenSM after %v", n, time.Since(start).Round(time.Millisecond))
	return s, devs
}

// TestOpenSMInCharge: with OpenSM in charge of softsm's subnet, the
// ports' LIDs are OpenSM's, their SA is OpenSM's (joins, a send-only
// join, a leave) and the switch forwards by the tables OpenSM programs.
func TestOpenSMInCharge(t *testing.T) {
	prereqs(t)
	s, devs := startInCharge(t, 3)
	f := s.Model()
	host := f.Host()
	lft := f.LFT()
	t.Logf("OpenSM's port: LID %d; LFT %s", host.LID, lftString(lft))
	sp := map[uint64]int{}
	for _, d := range devs {
		v, ok := f.Port(d.GUID())
		if !ok {
			t.Fatalf("port %#x: not in the model", d.GUID())
		}
		sp[d.GUID()] = v.SwitchPort
		t.Logf("port %s %#x: switch port %d, LID %d (OpenSM's %d), SM LID %d (OpenSM's port %d)", d.Name(), d.GUID(), v.SwitchPort, d.LID(), v.LID, d.SMLID(), host.LID)
		if d.LID() != v.LID || d.SMLID() != host.LID || v.SMLID != host.LID {
			t.Errorf("port %#x: LID %d SM LID %d; OpenSM set LID %d SM LID %d, its port has %d", d.GUID(), d.LID(), d.SMLID(), v.LID, v.SMLID, host.LID)
		}
		if int(v.LID) >= len(lft) || int(lft[v.LID]) != v.SwitchPort {
			t.Errorf("port %#x: OpenSM's LFT does not lead LID %d to switch port %d", d.GUID(), v.LID, v.SwitchPort)
		}
	}

	ch, err := rdmacm.CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	eps := make([]*testep.EP, len(devs))
	for i := range devs {
		id, err := rdmacm.CreateID(ch, nil, rdmacm.PS_UDP)
		if err != nil {
			t.Fatal(err)
		}
		if err := id.BindAddr(rdmacm.UDPAddr(netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + i)}))); err != nil {
			t.Fatal(err)
		}
		eps[i] = endpoint(t, id, 8)
	}
	a, b, c := eps[0], eps[1], eps[2]
	g := netip.MustParseAddr("230.4.5.6")
	pa := joined(t, ch, a.ID(), g, rdmacm.MCJoinFlagFullMember)
	pb := joined(t, ch, b.ID(), g, rdmacm.MCJoinFlagFullMember)
	pc := joined(t, ch, c.ID(), g, rdmacm.MCJoinFlagSendOnlyFullMember)
	mlid := pa.AHAttr.DLID
	if pb.AHAttr.DLID != mlid || pc.AHAttr.DLID != mlid || mlid < 0xC000 {
		t.Fatalf("MLIDs in the join answers: %#x %#x %#x", mlid, pb.AHAttr.DLID, pc.AHAttr.DLID)
	}
	// OpenSM 3.3.23 builds a group's spanning tree over every member
	// port, send-only ones too: its MFT holds the full members' switch
	// ports and the send-only member's (whose HCA drops what it gets: no
	// QP of it is attached), and no other CA port.
	full := []int{sp[devs[0].GUID()], sp[devs[1].GUID()]}
	members := append(slices.Clone(full), sp[devs[2].GUID()])
	slices.Sort(full)
	slices.Sort(members)
	waitFor(t, 10*time.Second, "OpenSM's MFT holds the members' switch ports", func() (bool, string) {
		got := f.MFT(mlid)
		return slices.Equal(caPorts(got), members), fmt.Sprintf("MFT[%#x] = %v, want the CA ports %v", mlid, got, members)
	})
	t.Logf("OpenSM chose MLID %#x for %v (MGID %v); MFT mask: switch ports %v (full members on %v, the send-only member on %d)",
		mlid, g, pa.AHAttr.GRH.DGID, f.MFT(mlid), full, sp[devs[2].GUID()])

	c.Send(t, pc, "from the send-only port", 1)
	for i, e := range []*testep.EP{a, b} {
		got := e.Recv(t, 1)
		t.Logf("full member %d received %q", i, got)
		if got[0] != "from the send-only port 0" {
			t.Errorf("full member %d received %q", i, got)
		}
	}

	// b leaves: OpenSM's MFT loses its switch port, and the switch sends
	// it nothing more.
	if err := b.ID().LeaveMulticast(rdmacm.UDPAddr(g)); err != nil {
		t.Fatal(err)
	}
	bPort := sp[devs[1].GUID()]
	waitFor(t, 10*time.Second, "OpenSM's MFT without the member that left", func() (bool, string) {
		got := f.MFT(mlid)
		return !slices.Contains(got, bPort) && slices.Contains(got, sp[devs[0].GUID()]), fmt.Sprintf("MFT[%#x] = %v", mlid, got)
	})
	t.Logf("after the leave: MFT[%#x] = switch ports %v", mlid, f.MFT(mlid))
	before := txOf(s, devs[1].GUID())
	c.Send(t, pc, "after the leave", 1)
	if got := a.Recv(t, 1); got[0] != "after the leave 0" {
		t.Errorf("full member received %q", got)
	}
	// The switch sends a multicast packet to every port of its mask
	// together: once a has it, b would have been sent it too.
	if after := txOf(s, devs[1].GUID()); after != before {
		t.Errorf("the port that left got %d packets from the switch after its leave", after-before)
	}
	if n := b.ID().RecvCQ().Len(); n != 0 {
		t.Errorf("the port that left received %d datagrams", n)
	}
	if n := c.ID().RecvCQ().Len(); n != 0 {
		t.Errorf("the send-only member received %d datagrams", n)
	}
}

// caPorts drops the switch's own port 0 and OpenSM's port 1 from a list
// of switch ports.
func caPorts(ps []int) []int {
	var out []int
	for _, p := range ps {
		if p >= 2 {
			out = append(out, p)
		}
	}
	return out
}

// txOf returns how many packets the switch sent the port guid.
func txOf(s *sm.SM, guid uint64) uint64 {
	for _, p := range s.Stats().Ports {
		if p.GUID == guid {
			return p.TxPackets
		}
	}
	return 0
}

// joined joins g and returns the acked JOIN event's parameters.
func joined(t *testing.T, ch *rdmacm.EventChannel, id *rdmacm.ID, g netip.Addr, flags uint32) rdmacm.UDParam {
	t.Helper()
	if err := id.JoinMulticastEx(&rdmacm.JoinMCAttrEx{
		CompMask: rdmacm.JoinMCAttrAddress | rdmacm.JoinMCAttrJoinFlags, JoinFlags: flags, Addr: rdmacm.UDPAddr(g),
	}, nil); err != nil {
		t.Fatalf("join %v (flags %d): %v", g, flags, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ev, err := ch.GetEvent(ctx)
	if err != nil {
		t.Fatalf("join %v: %v", g, err)
	}
	defer ev.Ack()
	if ev.Event != rdmacm.EventMulticastJoin || ev.ID != id {
		t.Fatalf("join %v: event %v (status %d, err %v), want MULTICAST_JOIN of the id", g, ev.Event, ev.Status, ev.Err)
	}
	return ev.Param
}

// portID returns a UD id of channel ch bound to the address of
// startInCharge's port i (127.0.0.2+i), with a QP and one posted receive;
// it goes with the test.
func portID(t *testing.T, ch *rdmacm.EventChannel, i int) *rdmacm.ID {
	t.Helper()
	id, err := rdmacm.CreateID(ch, nil, rdmacm.PS_UDP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { id.Destroy() })
	if err := id.BindAddr(rdmacm.UDPAddr(netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + i)}))); err != nil {
		t.Fatal(err)
	}
	endpoint(t, id, 1)
	return id
}

// endpoint creates the id's QP and posts n receives (package testep);
// the QP and the id go with the test.
func endpoint(t *testing.T, id *rdmacm.ID, n int) *testep.EP {
	t.Helper()
	return testep.New(t, id, n, 0, nil)
}

// waitUp waits for OpenSM's SUBNET UP.
func waitUp(t *testing.T, s *sm.SM) {
	t.Helper()
	select {
	case <-s.OpenSMUp():
	case <-time.After(30 * time.Second):
		t.Fatal("no SUBNET UP in OpenSM's log within 30s")
	}
}

// TestOpenSMInChargeLateAttach: a port that attaches after OpenSM's
// SUBNET UP gets a LID from OpenSM (the model's switch sets
// PortStateChange and sends OpenSM trap 128: TestOpenSMLinkTrap), and
// OpenSM's tables drop it when it detaches.
func TestOpenSMInChargeLateAttach(t *testing.T) {
	prereqs(t)
	s, devs := startInCharge(t, 1)
	waitUp(t, s)
	f := s.Model()
	start := time.Now()
	d, err := ib.Open(ib.Config{SM: s.FabricAddr().String(), Local: netip.MustParseAddr("127.0.0.9"), ActivateTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			d.Close()
		}
	})
	v, _ := f.Port(d.GUID())
	lft := f.LFT()
	t.Logf("port %#x attached after SUBNET UP: Active with LID %d (OpenSM's %d, SM LID %d) after %v, on switch port %d; LFT %s",
		d.GUID(), d.LID(), v.LID, d.SMLID(), time.Since(start).Round(time.Millisecond), v.SwitchPort, lftString(lft))
	if d.LID() != v.LID || d.SMLID() != f.Host().LID || int(v.LID) >= len(lft) || int(lft[v.LID]) != v.SwitchPort {
		t.Errorf("port %#x: LID %d SM LID %d; OpenSM's view %+v, its port's LID %d", d.GUID(), d.LID(), d.SMLID(), v, f.Host().LID)
	}
	if d.LID() == devs[0].LID() {
		t.Errorf("both ports have LID %d", d.LID())
	}
	lid := v.LID
	d.Close()
	closed = true
	waitFor(t, 15*time.Second, "OpenSM's LFT without the port that detached", func() (bool, string) {
		lft := f.LFT()
		return int(lid) >= len(lft) || lft[lid] == 0xFF, fmt.Sprintf("LFT %s", lftString(lft))
	})
	t.Logf("after the detach: LFT %s", lftString(f.LFT()))
}

// TestOpenSMGetTable: a GetTable of MCMemberRecords from a port of
// softsm's subnet reaches OpenSM's SA and its RMPP-active answer comes back
// framed as the kernel's MAD layer frames it (softsm's RMPP layer plays that
// layer for OpenSM under umad2sim, with softsm's RMPP sender to the port):
// to a requester without the SM_Key OpenSM answers
// one record a group (PortGID, JoinState and ProxyJoin zeroed), here the
// IPoIB broadcast group and a group three ports joined (one segment), with
// the MLIDs of the joins.
func TestOpenSMGetTable(t *testing.T) {
	prereqs(t)
	_, devs := startInCharge(t, 3)
	ch, err := rdmacm.CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	g := netip.MustParseAddr("230.4.5.8")
	var ids []*rdmacm.ID
	var mlid uint16
	for i := range devs {
		id := portID(t, ch, i)
		mlid = joined(t, ch, id, g, rdmacm.MCJoinFlagFullMember).AHAttr.DLID
		ids = append(ids, id)
	}
	agent, ok := saclient.For(ids[0].Verbs().Device())
	if !ok {
		t.Fatal("no SA client for the port")
	}
	recs, err := agent.GetTable(saclient.GroupRecord{}, 0)
	if err != nil {
		t.Fatalf("GetTable through OpenSM: %v", err)
	}
	t.Logf("GetTable(MCMemberRecord) through OpenSM: %d records", len(recs))
	// (OpenSM zeroes the PortGID of what it answers a requester without
	// the SM_Key.)
	byGroup := map[verbs.GID]uint16{}
	for _, r := range recs {
		byGroup[r.MGID] = r.MLID
	}
	bc, ok := byGroup[saclient.IPoIBBroadcastMGID]
	if !ok || len(byGroup) != 2 || len(recs) != 2 {
		t.Fatalf("records by MGID %v (%d in all), want one of the broadcast group and one of %v", byGroup, len(recs), g)
	}
	for mgid, l := range byGroup {
		if mgid != saclient.IPoIBBroadcastMGID && l != mlid {
			t.Errorf("%v's record: MLID %#x, want the join's %#x", mgid, l, mlid)
		}
	}
	t.Logf("the broadcast group's MLID %#x, %v's %#x", bc, g, mlid)
	for _, id := range ids {
		if err := id.LeaveMulticast(rdmacm.UDPAddr(g)); err != nil {
			t.Logf("leave: %v", err)
		}
	}
}

// joinGroups has id (bound, with its QP) join n groups 230.4.<b>.1… as a
// full member and returns each group's MLID by MGID, from the joins.
func joinGroups(t *testing.T, ch *rdmacm.EventChannel, id *rdmacm.ID, b byte, n int) map[verbs.GID]uint16 {
	t.Helper()
	mlids := make(map[verbs.GID]uint16, n)
	for i := range n {
		p := joined(t, ch, id, netip.AddrFrom4([4]byte{230, 4, b, byte(1 + i)}), rdmacm.MCJoinFlagFullMember)
		mlids[p.AHAttr.GRH.DGID] = p.AHAttr.DLID
	}
	return mlids
}

// TestOpenSMGetTableSegments: a port's GetTable of MCMemberRecords whose
// answer takes several RMPP segments (ten groups and the IPoIB broadcast
// group: eleven 56-byte records, 616 bytes, four segments of 200) comes
// back whole: OpenSM's answer is cut into kernel-framed segments by
// softsm's RMPP layer in OpenSM's process, reassembled by softsm and sent
// to the port by softsm's RMPP sender, whose ACKs the port sends. Every
// group is there with the MLID its join got. Without the layer
// (SOFTRDMA_TEST_OPENSM_NO_RMPP=1) the answer is dropped and the request
// times out.
func TestOpenSMGetTableSegments(t *testing.T) {
	prereqs(t)
	s, devs := startInCharge(t, 1)
	ch, err := rdmacm.CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	id := portID(t, ch, 0)
	const groups = 10
	want := joinGroups(t, ch, id, 6, groups)
	agent, ok := saclient.For(verbsDevice(t, devs[0]))
	if !ok {
		t.Fatal("no SA client for the port")
	}
	bc, ok := agent.BroadcastGroup()
	if !ok {
		t.Fatal("no IPoIB broadcast group")
	}
	want[bc.MGID] = bc.MLID
	before := s.Stats()
	start := time.Now()
	recs, err := agent.GetTable(saclient.GroupRecord{}, 0)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("GetTable through OpenSM (%d records, %d segments): %v", len(want), segments(len(want)), err)
	}
	after := s.Stats()
	t.Logf("GetTable(MCMemberRecord) through OpenSM: %d records (%d bytes, %d segments) in %v; softsm's RMPP transfers %d, retransmits %d",
		len(recs), len(recs)*mad.MCMemberRecordStride, segments(len(recs)), took.Round(time.Millisecond),
		after.RMPPTransfers-before.RMPPTransfers, after.RMPPRetransmits-before.RMPPRetransmits)
	got := make(map[verbs.GID]uint16, len(recs))
	for _, r := range recs {
		got[r.MGID] = r.MLID
	}
	if len(recs) != len(want) || len(got) != len(want) {
		t.Errorf("%d records of %d groups, want one record for each of %d groups", len(recs), len(got), len(want))
	}
	for mgid, mlid := range want {
		if l, ok := got[mgid]; !ok || l != mlid {
			t.Errorf("group %v: MLID %#x (listed %v), want the join's %#x", mgid, l, ok, mlid)
		}
	}
	if n := after.RMPPTransfers - before.RMPPTransfers; n != 1 {
		t.Errorf("softsm's RMPP sender started %d transfers, want 1 (OpenSM's answer)", n)
	}
}

// TestOpenSMNoCompiler: without a C compiler softsm's RMPP layer cannot
// be built; softsm says so in its log and runs OpenSM under
// libumad2sim.so alone, where an answer of one segment still reaches the
// port (framed by softsm) and a longer one cannot
// (TestOpenSMGetTableSegments with SOFTRDMA_TEST_OPENSM_NO_RMPP=1: dropped,
// logged, the request times out).
func TestOpenSMNoCompiler(t *testing.T) {
	prereqs(t)
	var mu sync.Mutex
	var logs []string
	logf := func(format string, args ...any) {
		mu.Lock()
		logs = append(logs, fmt.Sprintf(format, args...))
		mu.Unlock()
		t.Logf(format, args...)
	}
	s, devs := startInChargeLog(t, 1, sm.OpenSMConfig{CC: "/nonexistent/cc"}, logf)
	if p := s.OpenSMPreload(); p != umad2sim {
		t.Errorf("OpenSM's LD_PRELOAD %q, want libumad2sim.so alone (%s)", p, umad2sim)
	}
	mu.Lock()
	said := slices.ContainsFunc(logs, func(l string) bool {
		return strings.Contains(l, "without softsm's RMPP layer") && strings.Contains(l, "no C compiler") &&
			strings.Contains(l, "more than one RMPP segment")
	})
	mu.Unlock()
	if !said {
		t.Errorf("softsm's log does not say that the RMPP layer is missing, and why")
	}
	agent, ok := saclient.For(verbsDevice(t, devs[0]))
	if !ok {
		t.Fatal("no SA client for the port")
	}
	recs, err := agent.GetTable(saclient.GroupRecord{}, 0)
	if err != nil || len(recs) != 1 || recs[0].MGID != saclient.IPoIBBroadcastMGID {
		t.Fatalf("GetTable of one segment without the layer: %d records, %v; want the broadcast group's", len(recs), err)
	}
}

// segments is how many RMPP segments n MCMemberRecords take.
func segments(n int) int { return max(1, (n*mad.MCMemberRecordStride+mad.SADataLen-1)/mad.SADataLen) }

// TestOpenSMLinkTrap: a port that attaches or detaches after SUBNET UP
// makes softsm's switch send OpenSM trap 128 (link state change), as a
// switch does, and OpenSM sweeps at once: with a sweep interval of two
// minutes, only the trap can make the late port Active within the wait
// below, and take its LID out of the LFT after the detach.
func TestOpenSMLinkTrap(t *testing.T) {
	prereqs(t)
	s, _ := startInChargeWith(t, 1, sm.OpenSMConfig{SweepInterval: 120})
	waitUp(t, s)
	f := s.Model()
	start := time.Now()
	d, err := ib.Open(ib.Config{SM: s.FabricAddr().String(), Local: netip.MustParseAddr("127.0.0.10"), ActivateTimeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("a port attaching after SUBNET UP (sweep interval 120 s): %v", err)
	}
	v, _ := f.Port(d.GUID())
	t.Logf("port %#x Active with LID %d (OpenSM's %d) after %v", d.GUID(), d.LID(), v.LID, time.Since(start).Round(time.Millisecond))
	lid := v.LID
	d.Close()
	waitFor(t, 30*time.Second, "OpenSM's LFT without the port that detached", func() (bool, string) {
		lft := f.LFT()
		return int(lid) >= len(lft) || lft[lid] == 0xFF, fmt.Sprintf("LFT %s", lftString(lft))
	})
	b, err := os.ReadFile(s.OpenSMDir() + "/osm.log")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "Received Generic Notice type:1 num:128"); n < 2 {
		t.Errorf("OpenSM logged %d traps 128, want one for the attach and one for the detach", n)
	}
}
