package sma

import (
	"encoding/binary"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/simproto"
)

// routed sets the LIDs an SM would: SM host 1, switch 5, CA 0xa1 LID 2
// on switch port 2, CA 0xa2 LID 3 on switch port 3, and the LFT.
func routed(t *testing.T, f *Fabric) {
	t.Helper()
	set(t, f, mad.AttrPortInfo, 0, portInfoWith(1, 1, 0))
	set(t, f, mad.AttrPortInfo, 0, portInfoWith(5, 1, 0), 0, 1)
	set(t, f, mad.AttrPortInfo, 0, portInfoWith(2, 1, 0), 0, 1, 2)
	set(t, f, mad.AttrPortInfo, 0, portInfoWith(3, 1, 0), 0, 1, 3)
	si := make([]byte, 64)
	mad.SwitchInfo(si).SetLinearFDBTop(5)
	set(t, f, mad.AttrSwitchInfo, 0, si, 0, 1)
	lft := slices.Repeat([]byte{0xFF}, 64)
	lft[1], lft[2], lft[3], lft[5] = 1, 2, 3, 0
	set(t, f, mad.AttrLinearFT, 0, lft, 0, 1)
}

// TestTablesSnapshot: every Set publishes a new immutable snapshot and
// signals Changes; an older snapshot keeps what it had.
func TestTablesSnapshot(t *testing.T) {
	f := newFabric(t)
	t0 := f.Tables()
	if t0.Version == 0 || t0.HostLID != 0 || !slices.Equal(t0.Ports[1:5], []uint64{DefaultHostGUID + 1, 0xa1, 0xa2, 0xa3}) || t0.Ports[0] != 0 {
		t.Fatalf("first snapshot %+v", t0)
	}
	select { // drain New's signal
	case <-f.Changes():
	default:
	}
	routed(t, f)
	select {
	case <-f.Changes():
	default:
		t.Fatal("no change signalled")
	}
	t1 := f.Tables()
	if t1.Version <= t0.Version || t1.HostLID != 1 || t1.UnicastPort(2) != 2 || t1.UnicastPort(3) != 3 || t1.UnicastPort(4) != -1 ||
		t1.UnicastPort(0) != -1 || t1.UnicastPort(0xC001) != -1 {
		t.Fatalf("snapshot %+v", t1)
	}
	mft := make([]byte, 64)
	binary.BigEndian.PutUint16(mft[2:], 1<<2|1<<3)
	set(t, f, mad.AttrMulticastFT, 0, mft, 0, 1)
	t2 := f.Tables()
	if m := t2.MulticastMask(0xC001); !slices.Equal(m, []uint16{1<<2 | 1<<3}) || t2.MulticastMask(0xC000) != nil || t2.MulticastMask(0xBFFF) != nil {
		t.Fatalf("MFT snapshot: %v", t2.MFT[:2])
	}
	if t1.MulticastMask(0xC001) != nil {
		t.Fatal("an older snapshot changed")
	}
	binary.BigEndian.PutUint16(mft[2:], 1<<2)
	set(t, f, mad.AttrMulticastFT, 0, mft, 0, 1)
	if m := t2.MulticastMask(0xC001); !slices.Equal(m, []uint16{1<<2 | 1<<3}) {
		t.Fatal("an older snapshot's MFT entry changed")
	}
	if m := f.Tables().MulticastMask(0xC001); !slices.Equal(m, []uint16{1 << 2}) {
		t.Fatalf("new MFT entry %v", m)
	}
	// A Get publishes nothing.
	v := f.Tables().Version
	get(t, f, mad.AttrNodeInfo, 0, 0, 1)
	if f.Tables().Version != v {
		t.Fatal("a Get published a snapshot")
	}
}

// TestRouteGMP: GMPs go by the LFT between the SM host and the CAs.
func TestRouteGMP(t *testing.T) {
	f := newFabric(t)
	routed(t, f)
	for _, c := range []struct {
		from uint64
		dlid uint16
		guid uint64
		host bool
		src  uint16
		ok   bool
	}{
		{0, 2, 0xa1, false, 1, true},
		{0, 3, 0xa2, false, 1, true},
		{0xa1, 1, 0, true, 2, true},
		{0xa2, 2, 0xa1, false, 3, true},
		{0, 5, 0, false, 1, false},    // the switch has no GMP agents
		{0, 4, 0, false, 1, false},    // no route
		{0xbb, 1, 0, false, 0, false}, // no such CA
	} {
		guid, host, src, ok := f.RouteGMP(c.from, c.dlid)
		if guid != c.guid || host != c.host || ok != c.ok || (ok && src != c.src) {
			t.Errorf("from %#x to %d: %#x host %v src %d ok %v", c.from, c.dlid, guid, host, src, ok)
		}
	}
}

// saMAD builds an SA request (or response) as a Request.
func saMAD(method uint8, dlid, slid uint16, dqp, sqp uint32, tid uint64) simproto.Request {
	r := simproto.Request(make([]byte, simproto.RequestLen))
	r.SetDLID(dlid)
	r.SetSLID(slid)
	r.SetDQP(dqp)
	r.SetSQP(sqp)
	r.SetLength(simproto.MADLen)
	m := mad.NewSARequest(method, mad.AttrMCMemberRecord, 0, 0)
	m.SetTID(tid)
	copy(r.MAD(), m)
	return r
}

// TestServerRelay: a CA's SA request reaches the SM host's SM; the SM's
// answer and its Reports go to ToPort; the CA's answer to a Report comes
// back to the SM by the TID, once, and no other CA's.
func TestServerRelay(t *testing.T) {
	f := New(Config{Ports: cas, SwitchPorts: 8})
	routed(t, f)
	type got struct {
		guid uint64
		r    simproto.Request
	}
	var (
		mu   sync.Mutex
		outs []got
	)
	srv, base := runServer(t, f, ServerConfig{Logf: t.Logf, ToPort: func(guid uint64, r simproto.Request) {
		mu.Lock()
		outs = append(outs, got{guid, slices.Clone(r)})
		mu.Unlock()
	}})
	sm := newFakeClient(t, base, 5151, true)
	if err := srv.FromPort(0xa1, saMAD(mad.MethodSet, 1, 2, 1, 0x77, 0x1234)); err != nil {
		t.Fatal(err)
	}
	r := sm.recv()
	if m := mad.MAD(r.MAD()); m.TID() != 0x1234 || r.SLID() != 2 || r.SQP() != 0x77 || m.MgmtClass() != mad.ClassSubnAdm {
		t.Fatalf("relayed: tid %#x slid %d sqp %#x", m.TID(), r.SLID(), r.SQP())
	}
	// Not to the SM host, not a GMP, no such CA: refused.
	for _, bad := range []struct {
		guid uint64
		r    simproto.Request
	}{
		{0xa1, saMAD(mad.MethodSet, 3, 2, 1, 0x77, 1)},
		{0xbb, saMAD(mad.MethodSet, 1, 2, 1, 0x77, 1)},
		{0xa1, drSMP(mad.MethodGet, mad.AttrNodeInfo, 0)},
		{0xa1, simproto.Request(make([]byte, 10))},
	} {
		if err := srv.FromPort(bad.guid, bad.r); err == nil {
			t.Errorf("FromPort(%#x) took a MAD it should refuse", bad.guid)
		}
	}
	// The SM answers (a response to LID 2, QP 0x77) and sends a Report.
	ans := saMAD(mad.MethodGetResp, 2, 0, 0x77, 1, 0x1234)
	rep := saMAD(mad.MethodReport, 3, 0, 1, 1, 0x99)
	if err := sm.send(ans); err != nil {
		t.Fatal(err)
	}
	if err := sm.send(rep); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(outs)
		mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ToPort got %d MADs, want 2", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	a, rp := outs[0], outs[1]
	if a.guid != 0xa1 || a.r.SLID() != 1 || a.r.DQP() != 0x77 || mad.MAD(a.r.MAD()).TID() != 0x1234 {
		t.Fatalf("answer to %#x: slid %d dqp %#x tid %#x", a.guid, a.r.SLID(), a.r.DQP(), mad.MAD(a.r.MAD()).TID())
	}
	if rp.guid != 0xa2 || mad.MAD(rp.r.MAD()).TID()>>48 != uint64(sm.id) {
		t.Fatalf("report to %#x tid %#x", rp.guid, mad.MAD(rp.r.MAD()).TID())
	}
	// The CA answers the Report: back to the SM by the TID. Another CA's
	// answer to it, before, and a second answer, after, are refused.
	resp := slices.Clone(rp.r)
	mad.MAD(resp.MAD()).SetMethod(mad.MethodReport | mad.MethodResp)
	if err := srv.FromPort(0xa1, slices.Clone(resp)); err == nil {
		t.Error("a CA's answer to a Report another CA was sent: relayed")
	}
	if err := srv.FromPort(0xa2, slices.Clone(resp)); err != nil {
		t.Fatal(err)
	}
	if r := sm.recv(); mad.MAD(r.MAD()).Method() != mad.MethodReport|mad.MethodResp {
		t.Fatalf("the Report's answer: method %#x", mad.MAD(r.MAD()).Method())
	}
	if err := srv.FromPort(0xa2, resp); err == nil {
		t.Error("a second answer to the same Report: relayed")
	}
}

// TestServerHostSLID: a GMP between two clients of the SM host (saquery
// and OpenSM) carries the host's LID as its SLID where the client left 0
// ("the sender's port's"), as a GMP to a CA does, so that the receiver
// can answer it: the request reaches the SM from the host's LID, and the
// SM's answer to that LID comes back to the asking client from it.
func TestServerHostSLID(t *testing.T) {
	f := New(Config{Ports: cas, SwitchPorts: 8})
	routed(t, f)
	_, base := runServer(t, f, ServerConfig{Logf: t.Logf, ToPort: func(uint64, simproto.Request) {}})
	host := f.Host().LID
	sm := newFakeClient(t, base, 5252, true)
	tool := newFakeClient(t, base, 5353, false)
	if err := tool.send(saMAD(mad.MethodGetTable, host, 0, 1, 1, 0x4321)); err != nil {
		t.Fatal(err)
	}
	req := sm.recv()
	if req.SLID() != host || mad.MAD(req.MAD()).TID()&0xffff != 0x4321 {
		t.Fatalf("the SM got the request from LID %d (TID %#x), want the host's %d", req.SLID(), mad.MAD(req.MAD()).TID(), host)
	}
	if err := sm.send(saMAD(mad.MethodGetTableResp, req.SLID(), 0, 1, 1, mad.MAD(req.MAD()).TID())); err != nil {
		t.Fatal(err)
	}
	if ans := tool.recv(); ans.SLID() != host || mad.MAD(ans.MAD()).Method() != mad.MethodGetTableResp {
		t.Fatalf("the answer: method %#x from LID %d, want GetTableResp from the host's %d", mad.MAD(ans.MAD()).Method(), ans.SLID(), host)
	}
}
