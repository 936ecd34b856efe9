package ib_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/provider/softverbs"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/rdmacm/saclient"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/test/testsm"
	"github.com/softrdma/softrdma/verbs"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(fakeSMEnv) != "" {
		os.Exit(fakeSMChild(os.Args[1:]))
	}
	testenv.OwnNetns() // lo to this package alone
	testenv.ClearSoftRDMA()
	code := m.Run()
	ib.CloseAll()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

func startSM(t *testing.T) *sm.SM {
	t.Helper()
	s, err := sm.New(testsm.SMConfig(t, sm.Config{Listen: "127.0.0.1:0", SendOnlySupport: true})) // SOFTRDMA_TEST_SM=opensm: OpenSM in charge
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	testsm.WaitSMUp(t, s)
	return s
}

// activateTimeout is how long a port waits to be made Active: provider/ib's
// default (0) with softsm's own SM, longer with OpenSM in charge (Active
// at its next light sweep).
func activateTimeout() time.Duration {
	if testsm.OnOpenSM() {
		return testsm.OpenSMActivate
	}
	return 0
}

// forwarded waits, with OpenSM in charge, until OpenSM's multicast
// forwarding table leads mlid to the switch port of every port in to:
// OpenSM answers a join before it routes the group (as on a real fabric),
// softsm's own SM sets its table before it answers.
func forwarded(t *testing.T, s *sm.SM, mlid uint16, to ...*port) {
	t.Helper()
	f := s.Model()
	if f == nil {
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mft, missing := f.MFT(mlid), 0
		for _, p := range to {
			if v, ok := f.Port(p.dev.GUID()); !ok || !slices.Contains(mft, v.SwitchPort) {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("OpenSM's MFT for MLID %#x (switch ports %v) lacks %d of the members' ports after 10s", mlid, mft, missing)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// port is an open IB port with a PD, a CQ and one UD QP in RTS.
type port struct {
	dev *ib.Device
	pd  *verbs.PD
	cq  *verbs.CQ
	qp  *verbs.QP
	mr  *verbs.MR
}

func openPort(t *testing.T, s *sm.SM, local string) *port {
	t.Helper()
	d, err := ib.Open(ib.Config{SM: s.FabricAddr().String(), Local: netip.MustParseAddr(local), ActivateTimeout: activateTimeout()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, _ := d.Verbs().Open()
	pd, _ := ctx.AllocPD()
	cq, _ := ctx.CreateCQ(64)
	qp := udQP(t, pd, cq, 8)
	mr, _ := pd.RegMR(make([]byte, 8*(40+64)), verbs.AccessLocalWrite)
	for i := 0; i < 8; i++ {
		if err := qp.PostRecv(&verbs.RecvWR{WRID: uint64(i), SGList: []verbs.SGE{mr.SGE(i*(40+64), 40+64)}}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		qp.Destroy()
		mr.Dereg()
		cq.Destroy()
		pd.Dealloc()
		ctx.Close()
		d.Close()
	})
	return &port{dev: d, pd: pd, cq: cq, qp: qp, mr: mr}
}

// udQP creates a UD QP on cq with room for maxRecv receive WRs, Q_Key
// 0x01234567, and brings it to RTS.
func udQP(t *testing.T, pd *verbs.PD, cq *verbs.CQ, maxRecv int) *verbs.QP {
	t.Helper()
	qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTypeUD, Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: maxRecv}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		a verbs.QPAttr
		m verbs.QPAttrMask
	}{
		{verbs.QPAttr{State: verbs.QPSInit, PortNum: 1, QKey: 0x01234567}, verbs.QPAttrState | verbs.QPAttrPKeyIdx | verbs.QPAttrPort | verbs.QPAttrQKey},
		{verbs.QPAttr{State: verbs.QPSRTR}, verbs.QPAttrState},
		{verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState | verbs.QPAttrSQPSN},
	} {
		if err := qp.Modify(&s.a, s.m); err != nil {
			t.Fatal(err)
		}
	}
	return qp
}

// join joins the port to mgid with a JoinState and waits for the answer.
func (p *port) join(t *testing.T, mgid verbs.GID, state uint8) (*saclient.Member, *saclient.GroupRecord) {
	t.Helper()
	bc, ok := saAgent(t, p.dev).BroadcastGroup()
	if !ok {
		t.Fatal("no broadcast group")
	}
	req := bc
	req.MGID, req.PortGID, req.QKey, req.MLID, req.JoinState = mgid, p.dev.PortGID(), 0x01234567, 0, state
	type res struct {
		status int
		rec    *saclient.GroupRecord
	}
	ch := make(chan res, 1)
	m, err := saAgent(t, p.dev).Join(req, mad.CompCreateRequired, func(status int, rec *saclient.GroupRecord) {
		select {
		case ch <- res{status, rec}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ch:
		if r.status != 0 {
			t.Fatalf("join state %#x: status %d", state, r.status)
		}
		return m, r.rec
	case <-time.After(5 * time.Second):
		t.Fatal("no join answer")
	}
	return nil, nil
}

// TestJoinStatesAndForwarding: the switch forwards a group's packets to
// FullMember and NonMember ports, never to a SendOnlyFullMember port.
func TestJoinStatesAndForwarding(t *testing.T) {
	s := startSM(t)
	full, non, sendOnly, sender := openPort(t, s, "127.0.2.1"), openPort(t, s, "127.0.2.2"), openPort(t, s, "127.0.2.3"), openPort(t, s, "127.0.2.4")
	mgid, _ := verbs.ParseGID("ff12:4001:ffff::abcd")
	_, rec := full.join(t, mgid, mad.JoinFullMember)
	non.join(t, mgid, mad.JoinNonMember)
	sendOnly.join(t, mgid, mad.JoinSendOnlyFullMember)
	sender.join(t, mgid, mad.JoinSendOnlyFullMember)
	if rec.MLID < 0xc001 {
		t.Fatalf("MLID %#x", rec.MLID)
	}
	var ms []saclient.Membership
	for _, m := range saAgent(t, non.dev).Memberships() {
		if m.MGID == mgid {
			ms = append(ms, m)
		}
	}
	if len(ms) != 1 || ms[0].JoinState != mad.JoinNonMember || ms[0].Members != [4]int{0, 1, 0, 0} || ms[0].MLID != rec.MLID {
		t.Errorf("memberships of the NonMember port: %+v", ms)
	}
	for _, p := range []*port{full, non, sendOnly} {
		// A send-only port that attached its QP anyway still gets nothing:
		// the switch does not forward to it.
		if err := p.qp.AttachMcast(mgid, rec.MLID); err != nil {
			t.Fatal(err)
		}
	}
	ah, err := sender.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: 1, DLID: rec.MLID, GRH: verbs.GlobalRoute{DGID: mgid, HopLimit: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Destroy()
	forwarded(t, s, rec.MLID, full, non)
	wr := verbs.SendWR{Opcode: verbs.WRSend, SGList: []verbs.SGE{sender.mr.SGE(0, 32)}, UD: verbs.UDWR{AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: 0x01234567}}
	for i := 0; i < 3; i++ {
		if err := sender.qp.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, p := range []*port{full, non} {
		got := 0
		for got < 3 {
			if err := p.cq.Wait(ctx); err != nil {
				t.Fatalf("port %v got %d of 3: %v", p.dev.LID(), got, err)
			}
			var wc [4]verbs.WC
			n, _ := p.cq.Poll(wc[:])
			for _, c := range wc[:n] {
				if c.Status != verbs.WCSuccess || c.SrcQP != sender.qp.Num() || c.SLID != sender.dev.LID() || c.ByteLen != 72 {
					t.Errorf("wc %+v", c)
				}
			}
			got += n
		}
	}
	t.Run("nothing to the send-only port", func(t *testing.T) {
		testsm.SkipOnOpenSM(t, "OpenSM 3.3.23 puts a SendOnlyFullMember port's switch port in the group's MFT (its spanning tree covers every member): the send-only port, whose QP attached anyway, received the 3 packets; softsm's switch forwards to full and non members only")
		time.Sleep(100 * time.Millisecond)
		if n := sendOnly.cq.Len(); n != 0 {
			t.Errorf("the send-only port received %d packets", n)
		}
	})
	if c := sender.dev.Counters(); c.Get(softverbs.SentPkts) < 3 {
		t.Errorf("sender counters %+v", c)
	}
	// IB attach rules.
	if err := full.qp.AttachMcast(mgid, 0x1234); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("attach with a unicast LID: %v", err)
	}
}

// TestOpenWithoutSM: no SM answering gives ETIMEDOUT, not a hang.
func TestOpenWithoutSM(t *testing.T) {
	_, err := ib.Open(ib.Config{SM: "127.0.0.1:1", Local: netip.MustParseAddr("127.0.2.9"), ActivateTimeout: 300 * time.Millisecond})
	if !errors.Is(err, syscall.ETIMEDOUT) {
		t.Fatalf("open: %v", err)
	}
}

// TestGUIDInUseRefused: a second port with the GUID of a live port, from
// another address, is refused by the SM and its Open fails at once with
// EADDRINUSE (not ETIMEDOUT after ActivateTimeout, which is a minute
// here); the first port keeps its LID and keeps working.
func TestGUIDInUseRefused(t *testing.T) {
	s := startSM(t)
	first := openPort(t, s, "127.0.2.10")
	lid := first.dev.LID()
	_, err := ib.Open(ib.Config{SM: s.FabricAddr().String(), Local: netip.MustParseAddr("127.0.2.11"),
		GUID: first.dev.GUID(), ActivateTimeout: time.Minute})
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), "in use at another address") {
		t.Fatalf("open with a GUID in use: %v, want EADDRINUSE (in use at another address)", err)
	}
	if st := s.Stats(); st.RefusedAttaches != 1 {
		t.Errorf("RefusedAttaches %d, want 1", st.RefusedAttaches)
	}
	mgid, _ := verbs.ParseGID("ff12:4001:ffff::abce")
	_, rec := first.join(t, mgid, mad.JoinFullMember)
	if rec.MLID < 0xc001 || first.dev.LID() != lid {
		t.Errorf("first port after the refusal: MLID %#x LID %d (was %d)", rec.MLID, first.dev.LID(), lid)
	}
	if pa, _ := first.dev.QueryPort(1); pa.State != verbs.PortActive {
		t.Errorf("first port state %v", pa.State)
	}
}

// TestOpenProvesAddress: a port proves its address to
// the SM (attach, retry, attach with the cookie) within Open, in one more
// round trip: no bad cookie, nothing dropped, the port registered at its
// socket.
func TestOpenProvesAddress(t *testing.T) {
	s := startSM(t)
	t0 := time.Now()
	d, err := ib.Open(ib.Config{SM: s.FabricAddr().String(), Local: netip.MustParseAddr("127.0.2.12"), ActivateTimeout: activateTimeout()})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	defer d.Close()
	st := s.Stats()
	if st.Retries != 1 || st.BadCookies != 0 || st.UnpaddedAttaches != 0 || len(st.Ports) != 1 || st.Ports[0].GUID != d.GUID() || !st.Ports[0].Attached {
		t.Fatalf("SM stats %+v", st)
	}
	t.Logf("Open took %v", took)
}

// saAgent returns the host's SA client of a port (rdmacm/saclient, which
// this test imports as rdmacm does).
func saAgent(t *testing.T, d *ib.Device) *saclient.Agent {
	t.Helper()
	e, ok := saclient.For(d.Verbs())
	if !ok {
		t.Fatalf("%s: no SA client", d.Name())
	}
	return e
}
