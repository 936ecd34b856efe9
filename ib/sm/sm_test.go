package sm

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sa"
	"github.com/softrdma/softrdma/wire"
)

func TestAttachAndLIDs(t *testing.T) {
	s := startSM(t, Config{Ports: []uint64{0x100001, 0x100003, 0x100005, 0x100007}, SendOnlySupport: true})
	b := newFakePort(t, s.FabricAddr(), 0x100003)
	pi := b.attach()
	if pi.LID != 3 || pi.SMLID != 1 || pi.SubnetPrefix != fabric.DefaultSubnetPrefix || len(pi.PKeys) != 1 ||
		pi.PKeys[0] != 0xFFFF || pi.Epoch != s.Epoch() || pi.MTU != 4 || pi.Rate != 3 || pi.State != "active" || pi.GUID != 0x100003 {
		t.Fatalf("port_info %+v", pi)
	}
	n := newFakePort(t, s.FabricAddr(), 0x200000)
	if n.LID() != 6 {
		t.Fatalf("new port LID %d, want 6", n.LID())
	}
	// Detach and come back from another socket: same LID.
	n.sendControl(&fabric.Control{Type: fabric.TypeDetach, GUID: 0x200000})
	n.close()
	n2 := newFakePort(t, s.FabricAddr(), 0x200000)
	if n2.LID() != 6 {
		t.Fatalf("LID after re-attach %d", n2.LID())
	}
	m := newFakePort(t, s.FabricAddr(), 0x200001)
	if m.LID() != 7 {
		t.Fatalf("third LID %d", m.LID())
	}
	st := s.Stats()
	if len(st.Ports) != 6 || st.Ports[0].GUID != 0x100001 || st.Ports[0].LID != 2 || !st.Ports[0].PreRegistered ||
		st.Ports[0].Attached || !st.Ports[1].Attached || st.Ports[1].NodeDesc != "test port" {
		t.Fatalf("stats %+v", st.Ports)
	}
}

// The switch: FullMember and NonMember receive, send-only members and
// the sender do not; joins over the raw SA port and over the fabric (with
// and without GRH).
func TestSwitchMulticast(t *testing.T) {
	s := startSM(t, Config{Ports: []uint64{0x100001, 0x100003, 0x100005, 0x100007}, SendOnlySupport: true})
	a := newFakePort(t, s.FabricAddr(), 0x100001)
	b := newFakePort(t, s.FabricAddr(), 0x100003)
	c := newFakePort(t, s.FabricAddr(), 0x100005)
	d := newFakePort(t, s.FabricAddr(), 0x100007)
	group := mgid("ff12:4001:ffff::601:203")

	// A creates the group over the fabric, local LRH.
	r := mustStatus(t, a.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, group, a.guid, mad.JoinFullMember), false), 0)
	mlid := r.MCMemberRecord().MLID()
	if mlid != 0xC001 {
		t.Fatalf("MLID %#x", mlid)
	}
	// B joins as NonMember over the raw SA port.
	mustStatus(t, rawSA(t, s.SAAddr(), mcReq(mad.MethodSet, mad.CompCreateRequired, group, b.guid, mad.JoinNonMember), waitTimeout), 0)
	// C joins send-only over the fabric with a GRH.
	r = mustStatus(t, c.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, group, c.guid, mad.JoinSendOnlyFullMember), true), 0)
	if r.MCMemberRecord().JoinState() != 8 || r.Method() != mad.MethodGetResp {
		t.Fatal("send-only answer")
	}

	expect := func(sender *fakePort, payload string, want map[*fakePort]bool) {
		t.Helper()
		sender.send(mlid, true, group, wire.MulticastQPN, 0x01234567, []byte(payload))
		for _, p := range []*fakePort{a, b, c, d} {
			if want[p] {
				got := p.recv(waitTimeout)
				if got == nil {
					t.Fatalf("port %#x did not receive %q", p.guid, payload)
				}
				if pl := payloadOf(t, got); string(pl) != payload {
					t.Fatalf("port %#x got %q", p.guid, pl)
				}
			}
		}
		for _, p := range []*fakePort{a, b, c, d} {
			if !want[p] {
				if got := p.recv(200 * time.Millisecond); got != nil {
					t.Fatalf("port %#x received %q (JoinState excludes it)", p.guid, payloadOf(t, got))
				}
			}
		}
	}
	expect(a, "from full member A", map[*fakePort]bool{b: true})
	expect(c, "from send-only C", map[*fakePort]bool{a: true, b: true})
	expect(d, "from non-member D", map[*fakePort]bool{a: true, b: true})
	expect(b, "from NonMember B", map[*fakePort]bool{a: true})

	st := s.Stats()
	byGUID := map[uint64]PortStats{}
	for _, p := range st.Ports {
		byGUID[p.GUID] = p
	}
	if byGUID[a.guid].Forwarded != 1 || byGUID[c.guid].Forwarded != 2 || byGUID[b.guid].TxPackets < 3 ||
		byGUID[c.guid].TxPackets != 1 /* its SA answer only */ || byGUID[d.guid].TxPackets != 0 {
		t.Fatalf("counters %+v", st.Ports)
	}

	// C leaves; the group keeps A (full) and B.
	mustStatus(t, c.sa(mcReq(mad.MethodDelete, mad.CompJoinRequired, group, c.guid, mad.JoinSendOnlyFullMember), false), 0)
	// A leaves: last full member, group gone; B no longer receives.
	r = mustStatus(t, a.sa(mcReq(mad.MethodDelete, mad.CompJoinRequired, group, a.guid, mad.JoinFullMember), false), 0)
	if r.Method() != mad.MethodDeleteResp {
		t.Fatal("DeleteResp")
	}
	expect(d, "after the group died", map[*fakePort]bool{})
	if len(s.Groups()) != 1 {
		t.Fatalf("groups %+v", s.Groups())
	}
}

func TestUnicastAndDrops(t *testing.T) {
	s := startSM(t, Config{})
	a := newFakePort(t, s.FabricAddr(), 0xA)
	b := newFakePort(t, s.FabricAddr(), 0xB)
	a.send(b.LID(), false, wire.GID{}, 0x77, 0x11, []byte("unicast"))
	if got := b.recv(waitTimeout); got == nil || string(payloadOf(t, got)) != "unicast" {
		t.Fatal("unicast not delivered")
	}
	a.send(0x0099, false, wire.GID{}, 0x77, 0x11, []byte("nobody"))
	a.send(0xFFFF, false, wire.GID{}, 0x77, 0x11, []byte("permissive"))
	// A corrupted VCRC is dropped.
	h := &fabric.UDPacket{DLID: b.LID(), SLID: a.LID(), UD: wire.UDHeader{PKey: 0xFFFF, DestQP: 1, QKey: 1, SrcQP: 2}}
	pkt := make([]byte, fabric.PacketLen(4, false, false))
	fabric.EncodeUD(pkt, h, []byte("bad!"))
	pkt[len(pkt)-1] ^= 0xFF
	a.conn.WriteToUDPAddrPort(pkt, s.FabricAddr())
	// An SA MAD with the wrong Q_Key is dropped.
	a.send(fabric.SMLID, false, wire.GID{}, fabric.SAQPN, 0x1234, mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 1, 0))
	if got := b.recv(300 * time.Millisecond); got != nil {
		t.Fatal("bad packet delivered")
	}
	if got := a.recv(100 * time.Millisecond); got != nil {
		t.Fatal("SA answered a bad Q_Key")
	}
	// A stranger's packet is counted and dropped.
	stranger := newFakePort(t, s.FabricAddr(), 0xC)
	stranger.sendControl(&fabric.Control{Type: fabric.TypeDetach})
	time.Sleep(100 * time.Millisecond)
	stranger.send(b.LID(), false, wire.GID{}, 1, 1, []byte("x"))
	waitFor(t, func() bool { return s.Stats().UnknownSource == 1 })
	var sa PortStats
	for _, p := range s.Stats().Ports {
		if p.GUID == 0xA {
			sa = p
		}
	}
	if sa.Drops != 4 || sa.Forwarded != 1 || sa.RxPackets != 5 {
		t.Fatalf("A's counters %+v", sa)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRawSAPort(t *testing.T) {
	s := startSM(t, Config{SendOnlySupport: true})
	m := mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 0xDEADBEEFCAFEF00D, 0)
	r := mustStatus(t, rawSA(t, s.SAAddr(), m, waitTimeout), 0)
	if r.TID() != 0xDEADBEEFCAFEF00D || r.Method() != mad.MethodGetResp {
		t.Fatalf("TID %#x method %#x", r.TID(), r.Method())
	}
	if !r.ClassPortInfo().SendOnlyFullMemberSupported() {
		t.Fatal("bit 12 missing")
	}
	// Not 256 bytes: ignored.
	if rs := rawSA(t, s.SAAddr(), m[:100], 200*time.Millisecond); rs != nil {
		t.Fatal("short MAD answered")
	}
	// The SA counts the short datagram when it handles it: wait for it.
	waitFor(t, func() bool { st := s.Stats(); return st.RawSARequests >= 2 && st.RawSADrops >= 1 })
	if st := s.Stats(); st.RawSARequests != 2 || st.RawSADrops != 1 {
		t.Fatalf("raw counters %+v", st)
	}
	s2 := startSM(t, Config{})
	if rawSA(t, s2.SAAddr(), m, waitTimeout)[0].ClassPortInfo().SendOnlyFullMemberSupported() {
		t.Fatal("bit 12 without send-only support")
	}
	// Send-only join refused by the SM without support.
	s3 := startSM(t, Config{Ports: []uint64{0x100001}})
	mustStatus(t, rawSA(t, s3.SAAddr(), mcReq(mad.MethodSet, mad.CompCreateRequired, mgid("ff12:4001:ffff::1"), 0x100001, 8), waitTimeout), mad.StatusReqInvalid)
}

// GetTable with more than 3 groups comes back RMPP-segmented.
func TestRawGetTableRMPP(t *testing.T) {
	s := startSM(t, Config{Ports: []uint64{0x100001, 0x100003}})
	for i := range 5 {
		g := mgid("ff12:4001:ffff::601:200")
		g[15] = byte(i)
		mustStatus(t, rawSA(t, s.SAAddr(), mcReq(mad.MethodSet, mad.CompCreateRequired, g, 0x100001, 1), waitTimeout), 0)
		mustStatus(t, rawSA(t, s.SAAddr(), mcReq(mad.MethodSet, mad.CompCreateRequired, g, 0x100003, 2), waitTimeout), 0)
	}
	q := mad.NewSARequest(mad.MethodGetTable, mad.AttrMCMemberRecord, 0x55, 0)
	q.SetSMKey(sa.DefaultSMKey) // trusted: one record per member
	segs := rawSA(t, s.SAAddr(), q, waitTimeout)
	// 10 member records = 560 bytes → 3 segments.
	if len(segs) != 3 {
		t.Fatalf("%d segments", len(segs))
	}
	var re mad.Reassembler
	var data []byte
	for _, seg := range segs {
		if seg.TID() != 0x55 || seg.Method() != mad.MethodGetTableResp {
			t.Fatal("segment header")
		}
		done, d, err := re.Add(seg)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			data = d
		}
	}
	if len(data) != 10*mad.MCMemberRecordStride {
		t.Fatalf("%d bytes", len(data))
	}
	r0 := mad.MCMemberRecord(data).Fields()
	if r0.PortGID.String() != "fe80::10:1" || r0.JoinState != 1 || r0.MLID != 0xC001 {
		t.Fatalf("first record %+v", r0)
	}
	// Untrusted: 6 groups (with the broadcast group) → 2 segments.
	segs = rawSA(t, s.SAAddr(), mad.NewSARequest(mad.MethodGetTable, mad.AttrMCMemberRecord, 0x56, 0), waitTimeout)
	if len(segs) != 2 {
		t.Fatalf("untrusted: %d segments", len(segs))
	}
}

// A restarted SM has a new epoch and only the broadcast group; the state
// file keeps the LIDs.
func TestRestart(t *testing.T) {
	state := filepath.Join(t.TempDir(), "softsm.json")
	cfg := Config{Ports: []uint64{0x100001}, StateFile: state, SendOnlySupport: true}
	s1, err := New(withLocal(cfg))
	if err != nil {
		t.Fatal(err)
	}
	ctx1 := runInBackground(t, s1)
	fabricAddr, saAddr := s1.FabricAddr(), s1.SAAddr()
	a := newFakePort(t, fabricAddr, 0x100001)
	x := newFakePort(t, fabricAddr, 0x300000)
	group := mgid("ff12:4001:ffff::601:203")
	mustStatus(t, a.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, group, a.guid, 1), false), 0)
	mustStatus(t, x.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, group, x.guid, 1), false), 0)
	epoch1, lidX := s1.Epoch(), x.LID()
	ctx1()

	cfg.Listen, cfg.SAListen = fabricAddr.String(), saAddr.String()
	s2 := startSM(t, cfg)
	if s2.Epoch() == epoch1 {
		t.Fatal("same epoch")
	}
	if g := s2.Groups(); len(g) != 1 || g[0].Rec.MGID != sa.BroadcastMGID || len(g[0].Members) != 0 {
		t.Fatalf("restarted SM groups %+v", g)
	}
	// The ports' keepalive attach sees the new epoch; LIDs are kept.
	if pi := x.attach(); pi.Epoch != s2.Epoch() || pi.LID != lidX {
		t.Fatalf("port_info after restart %+v (LID was %d)", pi, lidX)
	}
	if pi := a.attach(); pi.LID != 2 {
		t.Fatalf("pre-registered LID %d", pi.LID)
	}
	// The old MLID forwards nothing; a rejoin works and gets the same MLID.
	a.send(0xC001, true, group, wire.MulticastQPN, 0x01234567, []byte("stale"))
	if x.recv(200*time.Millisecond) != nil {
		t.Fatal("stale group forwarded")
	}
	r := mustStatus(t, x.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, group, x.guid, 1), false), 0)
	if r.MCMemberRecord().MLID() != 0xC001 {
		t.Fatal("rejoin MLID")
	}
	b, err := os.ReadFile(state)
	if err != nil || !bytes.Contains(b, []byte(`"0x300000": 3`)) {
		t.Fatalf("state file %s %v", b, err)
	}
}

func withLocal(cfg Config) Config {
	cfg.Listen, cfg.SAListen = "127.0.0.1:0", "127.0.0.1:0"
	return cfg
}

// runInBackground runs s and returns a function that stops it and waits.
func runInBackground(t *testing.T, s *SM) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// A silent port is forgotten after PortTimeout with its memberships.
func TestPortTimeout(t *testing.T) {
	s := startSM(t, Config{PortTimeout: 300 * time.Millisecond})
	a := newFakePort(t, s.FabricAddr(), 0xA)
	b := newFakePort(t, s.FabricAddr(), 0xB)
	group := mgid("ff12:4001:ffff::601:203")
	mustStatus(t, a.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, group, a.guid, 1), false), 0)
	mustStatus(t, b.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, group, b.guid, 2), false), 0)
	// B keeps sending keepalives (every 100ms, well within the timeout), A
	// falls silent; wait until the SM forgot A.
	aKnown := func() bool {
		for _, p := range s.Stats().Ports {
			if p.GUID == 0xA {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(waitTimeout)
	for aKnown() {
		if time.Now().After(deadline) {
			t.Fatalf("A still registered %v after it fell silent (PortTimeout 300ms)", waitTimeout)
		}
		b.attach()
		time.Sleep(100 * time.Millisecond)
	}
	if g := s.Groups(); len(g) != 1 {
		t.Fatalf("A's group survived its silence: %+v", g)
	}
	for _, p := range s.Stats().Ports {
		if p.GUID == 0xA {
			t.Fatal("A still registered")
		}
	}
	// A comes back: same LID, no memberships.
	if pi := a.attach(); pi.LID != 2 {
		t.Fatalf("LID %d", pi.LID)
	}
}

func TestSADropAndDelay(t *testing.T) {
	s := startSM(t, Config{SADrop: true})
	a := newFakePort(t, s.FabricAddr(), 0xA)
	m := mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 1, 0)
	a.send(fabric.SMLID, false, wire.GID{}, fabric.SAQPN, fabric.SAQKey, m)
	if a.recv(300*time.Millisecond) != nil {
		t.Fatal("dropping SA answered")
	}
	if rs := rawSA(t, s.SAAddr(), m, 300*time.Millisecond); rs != nil {
		t.Fatal("dropping raw SA answered")
	}

	d := startSM(t, Config{SADelay: 300 * time.Millisecond, Ports: []uint64{0x100001}})
	start := time.Now()
	r := mustStatus(t, rawSA(t, d.SAAddr(), m, waitTimeout), 0)
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Fatalf("answered after %v", el)
	}
	if r.ClassPortInfo().RespTimeValue() != 17 {
		t.Fatalf("RespTimeValue %d", r.ClassPortInfo().RespTimeValue())
	}
	// A request still pending when the SM closes is never answered (and
	// leaks no goroutine: goleak checks).
	b := newFakePort(t, d.FabricAddr(), 0xB)
	b.send(fabric.SMLID, false, wire.GID{}, fabric.SAQPN, fabric.SAQKey, m)
}
