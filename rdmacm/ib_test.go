package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/rdmacm/saclient"
	"github.com/softrdma/softrdma/test/testsm"
	"github.com/softrdma/softrdma/verbs"
)

// subnet is an in-process subnet manager with ports of this process.
type subnet struct {
	sm     *sm.SM
	cancel context.CancelFunc
	done   chan struct{}
}

func startSM(t *testing.T, cfg sm.Config) *subnet {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	s, err := sm.New(testsm.SMConfig(t, cfg)) // SOFTRDMA_TEST_SM=opensm: OpenSM in charge
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &subnet{sm: s, cancel: cancel, done: make(chan struct{})}
	go func() { s.Run(ctx); close(n.done) }()
	t.Cleanup(n.stop)
	testsm.WaitSMUp(t, s)
	return n
}

func (n *subnet) stop() {
	n.cancel()
	<-n.done
}

// openPort attaches a port of this process with IPoIB address local.
func openPort(t *testing.T, n *subnet, local string, cfg ib.Config) *ib.Device {
	t.Helper()
	cfg.SM = n.sm.FabricAddr().String()
	cfg.Local = netip.MustParseAddr(local)
	if cfg.ActivateTimeout == 0 && testsm.OnOpenSM() {
		cfg.ActivateTimeout = testsm.OpenSMActivate // Active at OpenSM's next sweep
	}
	d, err := ib.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// joinState returns the port's JoinState in the group mgid as the SA
// has it, and whether the port is a member: softsm's SA table, or with
// OpenSM in charge OpenSM's answers to the port's GetTable(MCMemberRecord)
// of that MGID and its own PortGID (a GetTable with the MGID is not a
// broad query, which softsm would throttle). OpenSM zeroes PortGID and
// JoinState in what it answers a requester without the SM_Key (IBA p923,
// mcmr_query_mgrp) but matches a comp-masked JoinState exactly
// (mcmr_by_comp_mask): the state is the one such a query finds.
func (n *subnet) joinState(t *testing.T, port *ib.Device, mgid string) (uint8, bool) {
	t.Helper()
	g, err := verbs.ParseGID(mgid)
	if err != nil {
		t.Fatal(err)
	}
	if n.sm.Model() == nil {
		for _, grp := range n.sm.Groups() {
			if grp.Rec.MGID == g {
				for _, m := range grp.Members {
					if m.PortGID == port.PortGID() {
						return m.JoinState, true
					}
				}
			}
		}
		return 0, false
	}
	agent, ok := saclient.For(port.Verbs())
	if !ok {
		t.Fatalf("no SA client for port %s", port.Name())
	}
	ask := func(state uint8, mask uint64) bool {
		recs, err := agent.GetTable(saclient.GroupRecord{MGID: g, PortGID: port.PortGID(), JoinState: state}, mad.CompMGID|mad.CompPortGID|mask)
		if err != nil {
			t.Fatalf("GetTable(MCMemberRecord %v) through OpenSM: %v", g, err)
		}
		return len(recs) > 0
	}
	if !ask(0, 0) {
		return 0, false
	}
	for _, state := range []uint8{0x1, 0x8, 0x9, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7, 0xA, 0xB, 0xC, 0xD, 0xE, 0xF} {
		if ask(state, mad.CompJoinState) {
			return state, true
		}
	}
	t.Fatalf("OpenSM has port %s in %v with no JoinState", port.Name(), g)
	return 0, false
}

// forwarded waits, with OpenSM in charge, until OpenSM's multicast
// forwarding table leads mlid to the switch port of every port in to.
// OpenSM answers a join before it programs the switch (it routes the
// group afterwards, as on a real fabric), so a datagram sent at once can
// find no port for it; softsm's own SM sets its table before it answers.
func (n *subnet) forwarded(t *testing.T, mlid uint16, to ...*ib.Device) {
	t.Helper()
	f := n.sm.Model()
	if f == nil {
		return
	}
	eventually(t, fmt.Sprintf("OpenSM's MFT leads MLID %#x to the members", mlid), func() bool {
		mft := f.MFT(mlid)
		for _, d := range to {
			v, ok := f.Port(d.GUID())
			if !ok || !slices.Contains(mft, v.SwitchPort) {
				return false
			}
		}
		return true
	})
}

func ibID(t *testing.T, local string, ps PortSpace) (*EventChannel, *ID) {
	t.Helper()
	ch, _ := CreateEventChannel()
	id, err := CreateID(ch, nil, ps)
	if err != nil {
		t.Fatal(err)
	}
	if err := id.BindAddr(UDPAddr(netip.MustParseAddr(local))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { id.Destroy(); ch.Close() })
	return ch, id
}

func nextEvent(t *testing.T, ch *EventChannel) *Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := ch.GetEvent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func TestIBJoinAndTraffic(t *testing.T) {
	n := startSM(t, sm.Config{SendOnlySupport: true})
	rxPort := openPort(t, n, "127.0.0.2", ib.Config{})
	txPort := openPort(t, n, "127.0.0.3", ib.Config{})
	g := UDPAddr(netip.MustParseAddr("230.1.2.3"))

	rch, rx := ibID(t, "127.0.0.2", PS_UDP)
	tch, tx := ibID(t, "127.0.0.3", PS_UDP)
	if !strings.HasPrefix(rx.DeviceName(), "softib") {
		t.Fatalf("device %q", rx.DeviceName())
	}
	rmr := withQP(t, rx, 4, 40+64, 0)
	tmr := withQP(t, tx, 4, 40+64, 0)
	if err := rx.JoinMulticast(g, "r"); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, rch)
	if ev.Event != EventMulticastJoin {
		t.Fatalf("%v %d", ev.Event, ev.Status)
	}
	p := ev.Param
	if p.AHAttr.GRH.DGID.String() != "ff12:4001:ffff::601:203" || p.AHAttr.DLID < 0xc001 || p.QKey != UDPQKey ||
		p.QPNum != 0xffffff || !p.AHAttr.IsGlobal || p.PrivateData != "r" {
		t.Fatalf("join param %+v", p)
	}
	mlid := p.AHAttr.DLID
	ev.Ack()
	// The sender joins send-only: same group, same MLID, never attached.
	if err := tx.JoinMulticastEx(&JoinMCAttrEx{CompMask: 3, JoinFlags: MCJoinFlagSendOnlyFullMember, Addr: g}, "t"); err != nil {
		t.Fatal(err)
	}
	ev = nextEvent(t, tch)
	if ev.Event != EventMulticastJoin || ev.Param.AHAttr.DLID != mlid {
		t.Fatalf("send-only join: %v %d %+v", ev.Event, ev.Status, ev.Param)
	}
	ah, err := tx.PD().CreateAH(&ev.Param.AHAttr)
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Destroy()
	ev.Ack()
	n.forwarded(t, mlid, rxPort)
	copy(tmr.Buf(), "over InfiniBand")
	if err := tx.PostUDSend(1, tmr, 0, 15, verbs.SendSignaled, ah, MulticastQPN); err != nil {
		t.Fatal(err)
	}
	if wc, err := tx.GetSendComp(ctxT(t)); err != nil || wc.Status != verbs.WCSuccess {
		t.Fatalf("send %+v %v", wc, err)
	}
	wc, err := rx.GetRecvComp(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	b := rmr.Buf()[int(wc.WRID)*(40+64):]
	if string(b[40:55]) != "over InfiniBand" || wc.ByteLen != 55 || wc.SrcQP != tx.QP().Num() || wc.Flags&verbs.WCGRH == 0 || wc.SLID == 0 {
		t.Errorf("wc %+v payload %q", wc, b[40:55])
	}
	// GRH area: the IB GRH, DGID = MGID.
	if verbs.GID(b[24:40]) != p.AHAttr.GRH.DGID || b[0]>>4 != 6 {
		t.Errorf("grh % x", b[:40])
	}
	time.Sleep(100 * time.Millisecond)
	if n := tx.RecvCQ().Len(); n != 0 {
		t.Errorf("the send-only member received %d datagrams", n)
	}
	if err := tx.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
	if err := rx.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
	// The last full member left: the SA deletes the group.
	eventually(t, "the group is deleted after the last leave", func() bool {
		if n.sm.Model() != nil { // OpenSM in charge: neither port is a member
			_, rxIn := n.joinState(t, rxPort, p.AHAttr.GRH.DGID.String())
			_, txIn := n.joinState(t, txPort, p.AHAttr.GRH.DGID.String())
			return !rxIn && !txIn
		}
		for _, grp := range n.sm.Groups() {
			if grp.Rec.MGID == p.AHAttr.GRH.DGID {
				return false
			}
		}
		return true
	})
}

// eventually waits up to 5 s for cond (SA deletes go out asynchronously).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestIBSendOnlyWithoutSMSupport: EOPNOTSUPP at join time.
func TestIBSendOnlyWithoutSMSupport(t *testing.T) {
	testsm.SkipOnOpenSM(t, "SendOnlySupport: false turns off softsm's own SA's send-only full member support; OpenSM 3.3.23's SA always has it (its ClassPortInfo sets IsSendOnlyFullMemberSupported and the join succeeds)")
	n := startSM(t, sm.Config{SendOnlySupport: false})
	openPort(t, n, "127.0.0.4", ib.Config{})
	ch, id := ibID(t, "127.0.0.4", PS_UDP)
	g := UDPAddr(netip.MustParseAddr("230.9.9.9"))
	err := id.JoinMulticastEx(&JoinMCAttrEx{CompMask: 3, JoinFlags: MCJoinFlagSendOnlyFullMember, Addr: g}, nil)
	wantErrno(t, err, syscall.EOPNOTSUPP)
	wantErrno(t, id.LeaveMulticast(g), syscall.EADDRNOTAVAIL)
	// A full-member join still works.
	if err := id.JoinMulticast(g, nil); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, ch)
	ev.Ack()
	if ev.Event != EventMulticastJoin {
		t.Fatalf("%v %d", ev.Event, ev.Status)
	}
}

// TestIBRejectAndSharedMembership: an SA rejection is MULTICAST_ERROR -22;
// two ids of one port share one SA membership.
func TestIBRejectAndSharedMembership(t *testing.T) {
	n := startSM(t, sm.Config{SendOnlySupport: true})
	port := openPort(t, n, "127.0.0.5", ib.Config{})
	ch, a := ibID(t, "127.0.0.5", PS_UDP)
	_, b := ibID(t, "127.0.0.5", PS_UDP)
	// The IPoIB broadcast group has Q_Key 0x0B1B; a PS_UDP id asks 0x01234567.
	bc := &IBAddr{GID: saclient.IPoIBBroadcastMGID, PKey: 0xffff}
	if err := a.JoinMulticast(bc, "bc"); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, ch)
	ev.Ack()
	if ev.Event != EventMulticastError || ev.Status != -22 || ev.Param.PrivateData != "bc" {
		t.Fatalf("join with a wrong Q_Key: %v %d", ev.Event, ev.Status)
	}
	if err := a.LeaveMulticast(bc); err != nil {
		t.Errorf("leave after MULTICAST_ERROR: %v", err)
	}

	g := UDPAddr(netip.MustParseAddr("230.7.7.7"))
	for _, id := range []*ID{a, b} {
		if err := id.JoinMulticast(g, nil); err != nil {
			t.Fatal(err)
		}
		ev := nextEvent(t, id.Channel())
		ev.Ack()
		if ev.Event != EventMulticastJoin {
			t.Fatalf("%v %d", ev.Event, ev.Status)
		}
	}
	mgid := port.PortGID()
	members := func() (int, bool) {
		if n.sm.Model() != nil { // OpenSM in charge: the port's own record
			if _, ok := n.joinState(t, port, "ff12:4001:ffff::607:707"); ok {
				return 1, true
			}
			return 0, false
		}
		for _, grp := range n.sm.Groups() {
			if grp.Rec.MGID.String() == "ff12:4001:ffff::607:707" {
				k := 0
				for _, m := range grp.Members {
					if m.PortGID == mgid {
						k++
					}
				}
				return k, true
			}
		}
		return 0, false
	}
	if k, ok := members(); !ok || k != 1 {
		t.Fatalf("SA membership of the port: %d (group exists: %v)", k, ok)
	}
	if err := a.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
	if k, ok := members(); !ok || k != 1 {
		t.Fatalf("after one of two local members left: %d, group exists %v", k, ok)
	}
	if err := b.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
	// LeaveMulticast returned after the SA answered the Delete: no waiting.
	if k, ok := members(); ok {
		t.Fatalf("the SA still has the group (%d members of the port) when the last leave returned", k)
	}
	// Destroy, too, returns after the SA answered.
	if err := b.JoinMulticast(g, nil); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, b.Channel()); ev.Event != EventMulticastJoin {
		t.Fatalf("%v %d", ev.Event, ev.Status)
	} else {
		ev.Ack()
	}
	if k, ok := members(); !ok || k != 1 {
		t.Fatalf("rejoin: %d members, group exists %v", k, ok)
	}
	if err := b.Destroy(); err != nil {
		t.Fatal(err)
	}
	if k, ok := members(); ok {
		t.Fatalf("the SA still has the group (%d members of the port) when Destroy returned", k)
	}
}

// TestIBAssignedMGID: the zero address asks the SA for an MGID.
func TestIBAssignedMGID(t *testing.T) {
	n := startSM(t, sm.Config{SendOnlySupport: true})
	openPort(t, n, "127.0.0.6", ib.Config{})
	ch, id := ibID(t, "127.0.0.6", PS_UDP)
	z := UDPAddr(netip.IPv4Unspecified())
	if err := id.JoinMulticast(z, nil); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, ch)
	ev.Ack()
	if ev.Event != EventMulticastJoin || !strings.HasPrefix(ev.Param.AHAttr.GRH.DGID.String(), "ff12:a01b:fe80::") {
		t.Fatalf("%v %d %v", ev.Event, ev.Status, ev.Param.AHAttr.GRH.DGID)
	}
	if err := id.LeaveMulticast(z); err != nil {
		t.Fatal(err)
	}
}

// TestIBSMRestart: a restarted SM re-registers the clients: every joined
// id gets MULTICAST_ERROR -ENETRESET, and can leave and join again.
func TestIBSMRestart(t *testing.T) {
	first := startSM(t, sm.Config{SendOnlySupport: true})
	addr := first.sm.FabricAddr().String()
	openPort(t, first, "127.0.0.7", ib.Config{})
	ch, id := ibID(t, "127.0.0.7", PS_UDP)
	g := UDPAddr(netip.MustParseAddr("230.5.5.5"))
	if err := id.JoinMulticast(g, "g"); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, ch)
	ev.Ack()
	if ev.Event != EventMulticastJoin {
		t.Fatalf("%v %d", ev.Event, ev.Status)
	}
	first.stop()
	t0 := time.Now()
	startSM(t, sm.Config{Listen: addr, SendOnlySupport: true})
	ev = nextEvent(t, ch)
	t.Logf("reset after %v", time.Since(t0))
	ev.Ack()
	if ev.Event != EventMulticastError || ev.Status != -int(syscall.ENETRESET) || ev.Param.PrivateData != "g" {
		t.Fatalf("after the SM restart: %v %d", ev.Event, ev.Status)
	}
	if err := id.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
	// The port re-registered; joining again works (retry while the port
	// refreshes its SA data).
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := id.JoinMulticast(g, nil)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rejoin: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	ev = nextEvent(t, ch)
	ev.Ack()
	if ev.Event != EventMulticastJoin {
		t.Fatalf("rejoin: %v %d", ev.Event, ev.Status)
	}
	if err := id.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
}

// TestIBAttachRules: on InfiniBand the multicast LID must be ≥ 0xC000.
func TestIBAttachRules(t *testing.T) {
	n := startSM(t, sm.Config{SendOnlySupport: true})
	openPort(t, n, "127.0.0.8", ib.Config{})
	_, id := ibID(t, "127.0.0.8", PS_UDP)
	withQP(t, id, 1, 64, 0)
	mgid, _ := verbs.ParseGID("ff12:4001:ffff::1")
	wantErrno(t, id.QP().AttachMcast(mgid, 0x10), syscall.EINVAL)
	wantErrno(t, id.QP().AttachMcast(mgid, 0xffff), syscall.EINVAL)
	if err := id.QP().AttachMcast(mgid, 0xc123); err != nil {
		t.Fatal(err)
	}
	if err := id.QP().DetachMcast(mgid, 0xc123); err != nil {
		t.Fatal(err)
	}
}

// TestIBSASilence: a join the SA never answers fails with -ETIMEDOUT.
func TestIBSASilence(t *testing.T) {
	n := startSM(t, sm.Config{SendOnlySupport: true})
	openPort(t, n, "127.0.0.9", ib.Config{SATimeout: 200 * time.Millisecond, SARetries: 1})
	ch, id := ibID(t, "127.0.0.9", PS_UDP)
	n.sm.SetSADrop(true)
	g := UDPAddr(netip.MustParseAddr("230.3.3.3"))
	if err := id.JoinMulticast(g, "silent"); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, ch)
	ev.Ack()
	if ev.Event != EventMulticastError || ev.Status != -int(syscall.ETIMEDOUT) || ev.Param.PrivateData != "silent" {
		t.Fatalf("%v %d", ev.Event, ev.Status)
	}
	n.sm.SetSADrop(false)
	if err := id.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
}

// TestIBLeaveSASilence: a leave whose SA Delete is never answered returns
// ETIMEDOUT after the SA timeout and its retry, and the join is gone.
func TestIBLeaveSASilence(t *testing.T) {
	n := startSM(t, sm.Config{SendOnlySupport: true})
	openPort(t, n, "127.0.0.12", ib.Config{SATimeout: 200 * time.Millisecond, SARetries: 1})
	ch, id := ibID(t, "127.0.0.12", PS_UDP)
	g := UDPAddr(netip.MustParseAddr("230.3.3.4"))
	if err := id.JoinMulticast(g, nil); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, ch); ev.Event != EventMulticastJoin {
		t.Fatalf("%v %d", ev.Event, ev.Status)
	} else {
		ev.Ack()
	}
	n.sm.SetSADrop(true)
	start := time.Now()
	err := id.LeaveMulticast(g)
	if !errors.Is(err, syscall.ETIMEDOUT) {
		t.Fatalf("leave with a silent SA: %v, want ETIMEDOUT", err)
	}
	if el := time.Since(start); el < 400*time.Millisecond {
		t.Errorf("leave gave up after %v, before two SA timeouts", el)
	}
	if err := id.LeaveMulticast(g); !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Errorf("second leave: %v, want EADDRNOTAVAIL (the join is gone)", err)
	}
}

// TestIBPortSpaceIPoIB: a PS_IPOIB id uses the IPoIB signature and the
// broadcast group's Q_Key.
func TestIBPortSpaceIPoIB(t *testing.T) {
	n := startSM(t, sm.Config{SendOnlySupport: true})
	openPort(t, n, "127.0.0.10", ib.Config{})
	ch, id := ibID(t, "127.0.0.10", PS_IPOIB)
	withQP(t, id, 1, 64, 0) // before the join: the Q_Key comes from the broadcast group
	g := UDPAddr(netip.MustParseAddr("230.1.2.3"))
	if err := id.JoinMulticast(g, nil); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, ch)
	ev.Ack()
	if ev.Event != EventMulticastJoin || ev.Param.AHAttr.GRH.DGID.String() != "ff12:401b:ffff::601:203" || ev.Param.QKey != IPoIBQKey {
		t.Fatalf("%v %d %v qkey %#x", ev.Event, ev.Status, ev.Param.AHAttr.GRH.DGID, ev.Param.QKey)
	}
	if q := id.QP().Query().QKey; q != IPoIBQKey {
		t.Errorf("QP Q_Key %#x", q)
	}
	if err := id.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
}

// TestIBIPv6Group: an IPv6 group maps to an ff1S:6001 MGID (PS_UDP).
func TestIBIPv6Group(t *testing.T) {
	n := startSM(t, sm.Config{SendOnlySupport: true})
	openPort(t, n, "127.0.0.11", ib.Config{})
	ch, id := ibID(t, "127.0.0.11", PS_UDP)
	g := UDPAddr(netip.MustParseAddr("ff05::1234"))
	if err := id.JoinMulticast(g, nil); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, ch)
	ev.Ack()
	if ev.Event != EventMulticastJoin || ev.Param.AHAttr.GRH.DGID.String() != "ff12:6001:ffff::1234" {
		t.Fatalf("%v %d %v", ev.Event, ev.Status, ev.Param.AHAttr.GRH.DGID)
	}
	if err := id.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
}
