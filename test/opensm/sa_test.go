package opensm

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/rdmacm/saclient"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// What OpenSM 3.3.23's SA answers a ClassPortInfo Get with, with the
// opensm.conf defaults softsm keeps (osm_sa_class_port_info.c; the masks as
// test/saoracle measured them under ibsim).
const (
	// osmCapMask: IsSubnetGetSetNoticeSupported, IsUDMulticastSupported,
	// IsPortInfoCapMaskMatchSupported and bit 13.
	osmCapMask = 0x2602
	// osmCapMask2: full PortInfoRecord, extended speeds, alias GUIDs,
	// MulticastServiceRecord, PortInfo CapMask2 matching, link width 2x
	// (and IsSendOnlyFullMemberSupported, 0x1000).
	osmCapMask2 = 0xB5E8
	// osmRespTimeValue: 8 + the first index of OpenSM's table of 4.096 µs ×
	// 2^(8+i) in ms not below its transaction_timeout (200 ms: 268, i = 8).
	osmRespTimeValue = 16
	// osmPacketLifeTime is a unicast path's PacketLifeTime: OpenSM's
	// default subnet_timeout.
	osmPacketLifeTime = 18
)

// InformInfo (IBA 13.4.8.3) and Notice (13.4.8.2), as much as the test
// needs: the SA attribute IDs and the traps OpenSM's SM issues.
const (
	attrInformInfo = 0x0003
	informInfoLen  = 36
	trapGIDIn      = 64 // GID in service (a port became reachable)
	trapGIDOut     = 65 // GID out of service
	trapMCGCreated = 66
	trapMCGDeleted = 67
	// noticeSubnMgmt is IsGeneric with type 3 (subnet management), as
	// OpenSM issues traps 64–67; producer type 4, a class manager.
	noticeSubnMgmt   = 0x83
	producerClassMgr = 4
)

// informInfo encodes a subscription (Subscribe=1) of every source (GID 0,
// LIDRangeBegin 0xFFFF) to the generic trap trap of any type and producer.
func informInfo(trap uint16) []byte {
	b := make([]byte, informInfoLen)
	binary.BigEndian.PutUint16(b[16:], 0xFFFF) // LIDRangeBegin: all
	b[22] = 1                                  // IsGeneric
	b[23] = 1                                  // Subscribe
	binary.BigEndian.PutUint16(b[24:], 0xFFFF) // Type: all
	binary.BigEndian.PutUint16(b[26:], trap)   // TrapNumber
	binary.BigEndian.PutUint32(b[32:], 0xFFFFFF)
	return b
}

// report is a Report(Notice) a port received from the SA.
type report struct {
	slid  uint16
	srcQP uint32
	m     mad.MAD
}

func (r report) trap() uint16   { return binary.BigEndian.Uint16(r.m.SAData()[4:]) }
func (r report) gid() verbs.GID { return verbs.GID(r.m.SAData()[16:32]) }
func (r report) String() string { return fmt.Sprintf("trap %d GID %v", r.trap(), r.gid()) }

// takeReports hands every Report(Notice) port d receives on QP1 to the
// returned channel and answers it with a ReportResp, as a subscriber
// must (OpenSM sends a Report again until it is answered).
func takeReports(t *testing.T, d *ib.Device) <-chan report {
	ch := make(chan report, 64)
	unregister := d.RegisterMADAgent(func(slid uint16, srcQP uint32, b []byte) bool {
		m := mad.MAD(b)
		if len(b) < mad.Len || m.MgmtClass() != mad.ClassSubnAdm || m.Method() != mad.MethodReport || m.AttrID() != mad.AttrNotice {
			return false
		}
		resp := append(mad.MAD(nil), m[:mad.Len]...)
		resp.SetMethod(mad.MethodReport | mad.MethodResp)
		resp.SetStatus(0)
		if err := d.SendSA(resp); err != nil {
			t.Errorf("ReportResp: %v", err)
		}
		select {
		case ch <- report{slid, srcQP, append(mad.MAD(nil), m[:mad.Len]...)}:
		default:
			t.Errorf("more than %d Reports unread", cap(ch))
		}
		return true
	})
	t.Cleanup(unregister)
	return ch
}

// waitReport waits for the Report of trap about gid, skipping others.
func waitReport(t *testing.T, ch <-chan report, trap uint16, gid verbs.GID, within time.Duration) report {
	t.Helper()
	deadline := time.After(within)
	var seen []string
	for {
		select {
		case r := <-ch:
			if r.trap() == trap && r.gid() == gid {
				return r
			}
			seen = append(seen, r.String())
		case <-deadline:
			t.Fatalf("no Report of trap %d for %v within %v (others: %v)", trap, gid, within, seen)
		}
	}
}

// TestOpenSMSAQueries: a port's SA client asks OpenSM's SA through
// softsm's relay for a PathRecord (rdmacm's ResolveRoute on IB, and a raw
// Get), ClassPortInfo and InformInfo (subscriptions to traps 64–67), and
// each answer is checked field by field against what OpenSM 3.3.23 must
// answer: the LIDs OpenSM assigned, the MTU and rate of the ports the
// model shows it, its ClassPortInfo; then the Reports of the traps OpenSM
// issues reach the subscriber: a group created and deleted by another
// port, a port that attaches and one that leaves.
func TestOpenSMSAQueries(t *testing.T) {
	prereqs(t)
	s, devs := startInCharge(t, 2)
	f := s.Model()
	host := f.Host()
	a, b := devs[0], devs[1]
	va, _ := f.Port(a.GUID())
	vb, _ := f.Port(b.GUID())
	t.Logf("OpenSM's port LID %d; port a %#x LID %d, port b %#x LID %d", host.LID, a.GUID(), va.LID, b.GUID(), vb.LID)

	// PathRecord, as the RDMA CM asks it (cma_query_ib_route's mask): from
	// a to b's GID. OpenSM answers the LIDs it assigned, the ports' MTU
	// and rate (the model's PortInfo: 2048, 4X SDR = 10 Gb/s), the P_Key
	// asked, SL 0 (no QoS), its subnet timeout as PacketLifeTime, and
	// Reversible; nothing else.
	ch, err := rdmacm.CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	newID := func(local string, ps rdmacm.PortSpace) *rdmacm.ID {
		id, err := rdmacm.CreateID(ch, nil, ps)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { id.Destroy() })
		if err := id.BindAddr(rdmacm.UDPAddr(netip.MustParseAddr(local))); err != nil {
			t.Fatal(err)
		}
		return id
	}
	route := func(id *rdmacm.ID, dst any) *rdmacm.Event {
		t.Helper()
		switch d := dst.(type) {
		case netip.Addr:
			err = id.ResolveAddr(id.SrcAddr(), rdmacm.UDPAddr(d), 5*time.Second)
		case *rdmacm.IBAddr:
			err = id.ResolveAddr(nil, d, 5*time.Second)
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev := next(t, ch); ev.Ack() != nil || ev.Event != rdmacm.EventAddrResolved {
			t.Fatalf("address: %v %d", ev.Event, ev.Status)
		}
		if err := id.ResolveRoute(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		return next(t, ch)
	}
	for _, c := range []struct {
		name     string
		from, to *ib.Device
		local    string
		src, dst uint16
	}{{"a to b", a, b, "127.0.0.2", va.LID, vb.LID}, {"b to a", b, a, "127.0.0.3", vb.LID, va.LID}} {
		id := newID(c.local, rdmacm.PS_UDP)
		ev := route(id, &rdmacm.IBAddr{GID: c.to.PortGID(), PKey: 0xFFFF})
		ev.Ack()
		if ev.Event != rdmacm.EventRouteResolved || len(id.Route()) != 1 {
			t.Fatalf("path %s: %v %d, %d paths", c.name, ev.Event, ev.Status, len(id.Route()))
		}
		want := rdmacm.PathRecord{
			SGID: c.from.PortGID(), DGID: c.to.PortGID(), SLID: c.src, DLID: c.dst, Reversible: true, PKey: 0xFFFF,
			MTUSelector: mad.SelExactly, MTU: fabric.PortMTU, RateSelector: mad.SelExactly, Rate: fabric.PortRate,
			PacketLifeTimeSelector: mad.SelExactly, PacketLifeTime: osmPacketLifeTime,
		}
		if got := id.Route()[0]; got != want {
			t.Errorf("path %s from OpenSM:\n got %+v\nwant %+v", c.name, got, want)
		} else {
			t.Logf("path %s from OpenSM: SLID %d DLID %d MTU %d rate %d P_Key %#x SL %d PacketLifeTime %d reversible %v",
				c.name, got.SLID, got.DLID, got.MTU, got.Rate, got.PKey, got.SL, got.PacketLifeTime, got.Reversible)
		}
	}

	// A group's path (the IPoIB MGID of an IP group): answered to a member
	// port with the group's MLID, not reversible; refused to a port that
	// is not a member (OpenSM's rule for a multicast DGID with a given
	// SGID), which the RDMA CM reports as ROUTE_ERROR -EINVAL.
	g := netip.MustParseAddr("230.9.9.9")
	member := newID("127.0.0.2", rdmacm.PS_IPOIB)
	if err := member.JoinMulticast(rdmacm.UDPAddr(g), nil); err != nil {
		t.Fatal(err)
	}
	jev := next(t, ch)
	jp := jev.Param
	jev.Ack()
	if jev.Event != rdmacm.EventMulticastJoin {
		t.Fatalf("join %v: %v %d", g, jev.Event, jev.Status)
	}
	mlid, mgid := jp.AHAttr.DLID, jp.AHAttr.GRH.DGID
	id := newID("127.0.0.2", rdmacm.PS_UDP)
	ev := route(id, g)
	ev.Ack()
	if ev.Event != rdmacm.EventRouteResolved || len(id.Route()) != 1 {
		t.Fatalf("group path: %v %d", ev.Event, ev.Status)
	}
	if p := id.Route()[0]; p.DLID != mlid || p.DGID != mgid || p.SGID != a.PortGID() || p.Reversible || p.PKey != 0xFFFF ||
		p.MTU != fabric.PortMTU || p.Rate != fabric.PortRate {
		t.Errorf("group path from OpenSM: %+v, want DLID %#x (the join's MLID), DGID %v, SGID %v, not reversible, MTU %d rate %d",
			p, mlid, mgid, a.PortGID(), fabric.PortMTU, fabric.PortRate)
	} else {
		t.Logf("group path from OpenSM: DGID %v DLID %#x (the join's MLID) reversible %v", p.DGID, p.DLID, p.Reversible)
	}
	other := newID("127.0.0.3", rdmacm.PS_UDP)
	if ev := route(other, g); ev.Ack() != nil || ev.Event != rdmacm.EventRouteError || ev.Status != -int(syscall.EINVAL) {
		t.Errorf("group path from a port that is not a member: %v %d, want ROUTE_ERROR -EINVAL", ev.Event, ev.Status)
	}

	agentA, ok := saclient.For(member.Verbs().Device())
	if !ok {
		t.Fatal("no SA client for port a")
	}
	// A raw PathRecord Get to a GID no port has: ERR_NO_RECORDS.
	q := mad.PathRecord(make([]byte, mad.PathRecordLen))
	q.SetSGID(a.PortGID())
	q.SetDGID(fabric.PortGID(fabric.DefaultSubnetPrefix, 0xdead))
	if ans, err := agentA.Query(mad.MethodGet, mad.AttrPathRecord, mad.PathCompSGID|mad.PathCompDGID, q); err != nil {
		t.Errorf("PathRecord Get of an unknown GID: %v", err)
	} else if ans.Method() != mad.MethodGetResp || ans.Status() != mad.StatusNoRecords {
		t.Errorf("PathRecord Get of an unknown GID: method %#x status %#04x, want GetResp 0x0300", ans.Method(), ans.Status())
	}

	// ClassPortInfo: every field as OpenSM's SA sets it.
	cpiMAD, err := agentA.Query(mad.MethodGet, mad.AttrClassPortInfo, 0, nil)
	if err != nil {
		t.Fatalf("ClassPortInfo through OpenSM: %v", err)
	}
	cpi := cpiMAD.ClassPortInfo()
	t.Logf("ClassPortInfo from OpenSM: % x", []byte(cpi))
	var zeroGID wire.GID
	for _, c := range []struct {
		field     string
		got, want uint64
	}{
		{"method", uint64(cpiMAD.Method()), mad.MethodGetResp},
		{"status", uint64(cpiMAD.Status()), 0},
		{"SM_Key", cpiMAD.SMKey(), 0},
		{"BaseVersion", uint64(cpi.BaseVersion()), 1},
		{"ClassVersion", uint64(cpi.ClassVersion()), 2},
		{"CapabilityMask", uint64(cpi.CapabilityMask()), osmCapMask},
		{"CapabilityMask2", uint64(cpi.CapabilityMask2()), osmCapMask2},
		{"RespTimeValue", uint64(cpi.RespTimeValue()), osmRespTimeValue},
		{"RedirectGID zero", b2u(cpi.RedirectGID() == zeroGID), 1},
		{"RedirectTC/SL/FL", uint64(cpi.RedirectTCSLFL()), 0},
		{"RedirectLID", uint64(cpi.RedirectLID()), 0},
		{"RedirectP_Key", uint64(cpi.RedirectPKey()), 0},
		{"RedirectQP", uint64(cpi.RedirectQP()), 1},
		{"RedirectQ_Key", uint64(cpi.RedirectQKey()), fabric.SAQKey},
		{"TrapGID zero", b2u(cpi.TrapGID() == zeroGID), 1},
		{"TrapTC/SL/FL", uint64(cpi.TrapTCSLFL()), 0},
		{"TrapLID", uint64(cpi.TrapLID()), 0},
		{"TrapP_Key", uint64(cpi.TrapPKey()), 0},
		{"TrapHopLimit", uint64(cpi.TrapHopLimit()), 0},
		{"TrapQP", uint64(cpi.TrapQP()), 0},
		{"TrapQ_Key", uint64(cpi.TrapQKey()), fabric.SAQKey},
		{"send-only support cached at activation", b2u(agentA.SendOnlyFullMemberSupported()), 1},
	} {
		if c.got != c.want {
			t.Errorf("ClassPortInfo from OpenSM: %s %#x, want %#x", c.field, c.got, c.want)
		}
	}

	// InformInfo: port a subscribes to traps 64–67; OpenSM confirms each
	// with a copy of the request's InformInfo.
	reports := takeReports(t, a)
	for _, trap := range []uint16{trapGIDIn, trapGIDOut, trapMCGCreated, trapMCGDeleted} {
		ii := informInfo(trap)
		ans, err := agentA.Query(mad.MethodSet, attrInformInfo, 0, ii)
		if err != nil {
			t.Fatalf("InformInfo Set (trap %d) through OpenSM: %v", trap, err)
		}
		if ans.Method() != mad.MethodGetResp || ans.Status() != 0 || ans.AttrID() != attrInformInfo || !bytes.Equal(ans.SAData()[:informInfoLen], ii) {
			t.Fatalf("InformInfo Set (trap %d): method %#x status %#04x attr %#x InformInfo % x, want GetResp 0 %#x and the request's % x",
				trap, ans.Method(), ans.Status(), ans.AttrID(), ans.SAData()[:informInfoLen], attrInformInfo, ii)
		}
	}
	t.Logf("subscribed port a to traps 64, 65, 66, 67: OpenSM answered each with its InformInfo")

	checkNotice := func(r report, trap uint16, gid verbs.GID) {
		t.Helper()
		n := r.m.SAData()
		issuerGID := fabric.PortGID(fabric.DefaultSubnetPrefix, host.GUID)
		if r.slid != host.LID || r.srcQP != mad.GSIQPN || n[0] != noticeSubnMgmt ||
			uint32(n[1])<<16|uint32(n[2])<<8|uint32(n[3]) != producerClassMgr ||
			binary.BigEndian.Uint16(n[4:]) != trap || binary.BigEndian.Uint16(n[6:]) != host.LID ||
			verbs.GID(n[16:32]) != gid || !bytes.Equal(n[64:80], issuerGID[:]) {
			t.Errorf("Report of trap %d: from LID %d QP %d, Notice % x; want from OpenSM's LID %d QP 1, generic type 3 producer 4, trap %d, issuer LID %d, GID %v, issuer GID %v",
				trap, r.slid, r.srcQP, n[:80], host.LID, trap, host.LID, gid, issuerGID)
		} else {
			t.Logf("Report from OpenSM (LID %d): trap %d, GID %v, issuer GID %v", r.slid, trap, gid, verbs.GID(n[64:80]))
		}
	}

	// Trap 66 and 67: port b creates a group, and deletes it by leaving.
	g2 := netip.MustParseAddr("230.9.9.10")
	creator := newID("127.0.0.3", rdmacm.PS_UDP)
	endpoint(t, creator, 1)
	p2 := joined(t, ch, creator, g2, rdmacm.MCJoinFlagFullMember)
	checkNotice(waitReport(t, reports, trapMCGCreated, p2.AHAttr.GRH.DGID, 20*time.Second), trapMCGCreated, p2.AHAttr.GRH.DGID)
	if err := creator.LeaveMulticast(rdmacm.UDPAddr(g2)); err != nil {
		t.Fatal(err)
	}
	checkNotice(waitReport(t, reports, trapMCGDeleted, p2.AHAttr.GRH.DGID, 20*time.Second), trapMCGDeleted, p2.AHAttr.GRH.DGID)

	// Trap 64 and 65: a port attaches (OpenSM reports it in service after
	// the sweep that made it Active) and detaches.
	c, err := ib.Open(ib.Config{SM: s.FabricAddr().String(), Local: netip.MustParseAddr("127.0.0.4"), ActivateTimeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cGID := c.PortGID()
	checkNotice(waitReport(t, reports, trapGIDIn, cGID, 30*time.Second), trapGIDIn, cGID)
	c.Close()
	checkNotice(waitReport(t, reports, trapGIDOut, cGID, 30*time.Second), trapGIDOut, cGID)
}

func b2u(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}

// next returns the channel's next event.
func next(t *testing.T, ch *rdmacm.EventChannel) *rdmacm.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ev, err := ch.GetEvent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// TestOpenSMSaquery: infiniband-diags' saquery, run under libumad2sim.so
// and softsm's RMPP layer (sm.OpenSMPreload) against the model of softsm's
// subnet as a client of OpenSM's host, lists every multicast group OpenSM's
// SA has (saquery -g, a GetTable of MCMemberRecords): the IPoIB broadcast
// group, a group two ports of softsm joined and six groups one port
// joined, with the MLIDs of their joins: eight 56-byte records, 448 bytes,
// three RMPP segments, cut by the layer in OpenSM's process and
// reassembled (and acknowledged) by the layer in saquery's. Without the
// layer (SOFTRDMA_TEST_OPENSM_NO_RMPP=1, saquery under libumad2sim.so
// alone) saquery listed the first three groups (one segment's worth) and
// exited 0.
func TestOpenSMSaquery(t *testing.T) {
	prereqs(t)
	if _, err := exec.LookPath("saquery"); err != nil {
		testenv.Require(t, "saquery not found (apt-get install infiniband-diags): %v", err)
	}
	var b [6]byte
	rand.Read(b[:])
	socket := "softrdma-saquery-" + hex.EncodeToString(b[:])
	s, devs := startInChargeWith(t, 2, sm.OpenSMConfig{Socket: socket})
	ch, err := rdmacm.CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	g := netip.MustParseAddr("230.4.5.9")
	var p rdmacm.UDParam
	var ids []*rdmacm.ID
	for i := range devs {
		id := portID(t, ch, i)
		p = joined(t, ch, id, g, rdmacm.MCJoinFlagFullMember)
		ids = append(ids, id)
	}
	bc, ok := saclient.For(verbsDevice(t, devs[0]))
	if !ok {
		t.Fatal("no SA client")
	}
	bcRec, ok := bc.BroadcastGroup()
	if !ok {
		t.Fatal("no IPoIB broadcast group")
	}
	want := map[string]uint16{bcRec.MGID.String(): bcRec.MLID, p.AHAttr.GRH.DGID.String(): p.AHAttr.DLID}
	for mgid, mlid := range joinGroups(t, ch, ids[0], 9, 6) {
		want[mgid.String()] = mlid
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "saquery", "-g")
	cmd.Dir = s.OpenSMDir()
	cmd.Env = append(os.Environ(), "IBSIM_SOCKNAME="+socket, "LD_PRELOAD="+s.OpenSMPreload())
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("saquery -g (LD_PRELOAD=%s) took %v, answered by OpenSM in charge of softsm's subnet:\n%s",
		s.OpenSMPreload(), time.Since(start).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("saquery -g: %v", err)
	}
	// saquery -g prints each group's MCMemberRecord: "MGID....0x..." and
	// "Mlid....0x...".
	groups := parseSaqueryGroups(string(out))
	for mgid, mlid := range want {
		if got, ok := groups[mgid]; !ok || got != mlid {
			t.Errorf("saquery -g: group %s MLID %#x (listed: %v), want MLID %#x", mgid, got, ok, mlid)
		}
	}
	if len(groups) != len(want) {
		t.Errorf("saquery -g listed %d groups %v, want %d", len(groups), groups, len(want))
	} else if !t.Failed() {
		t.Logf("saquery -g listed all %d groups (%d bytes of records, %d RMPP segments)", len(groups), len(groups)*mad.MCMemberRecordStride, segments(len(groups)))
	}
}

// parseSaqueryGroups reads saquery -g's output: MLID by MGID.
func parseSaqueryGroups(out string) map[string]uint16 {
	groups := map[string]uint16{}
	var mgid string
	for _, l := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), "..")
		if !ok {
			continue
		}
		v = strings.TrimLeft(v, ".")
		switch strings.ToLower(k) {
		case "mgid":
			mgid = v
		case "mlid":
			if n, err := strconv.ParseUint(strings.TrimPrefix(v, "0x"), 16, 16); err == nil && mgid != "" {
				groups[mgid] = uint16(n)
				mgid = ""
			}
		}
	}
	return groups
}
