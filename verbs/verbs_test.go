package verbs_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/provider/rxe"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	testenv.OwnNetns() // lo to this package alone
	testenv.ClearSoftRDMA()
	code := m.Run()
	rxe.CloseAll()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

func wantErrno(t *testing.T, err error, want syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("error %v, want %v", err, want)
	}
}

// env is an open lo device with a PD and a CQ.
type env struct {
	ctx *verbs.Context
	pd  *verbs.PD
	cq  *verbs.CQ
}

func newEnv(t *testing.T) *env {
	t.Helper()
	d, err := rxe.ForName("lo")
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := d.Verbs().Open()
	if err != nil {
		t.Fatal(err)
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ctx.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	return &env{ctx, pd, cq}
}

func (e *env) qp(t *testing.T, flags verbs.CreateFlags) *verbs.QP {
	t.Helper()
	qp, err := e.pd.CreateQP(&verbs.QPInitAttr{SendCQ: e.cq, RecvCQ: e.cq, QPType: verbs.QPTypeUD, CreateFlags: flags,
		Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 2, MaxRecvSGE: 2}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qp.Destroy() })
	return qp
}

func toRTS(t *testing.T, qp *verbs.QP, qkey uint32) {
	t.Helper()
	steps := []struct {
		a verbs.QPAttr
		m verbs.QPAttrMask
	}{
		{verbs.QPAttr{State: verbs.QPSInit, PortNum: 1, QKey: qkey}, verbs.QPAttrState | verbs.QPAttrPKeyIdx | verbs.QPAttrPort | verbs.QPAttrQKey},
		{verbs.QPAttr{State: verbs.QPSRTR}, verbs.QPAttrState},
		{verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState | verbs.QPAttrSQPSN},
	}
	for _, s := range steps {
		if err := qp.Modify(&s.a, s.m); err != nil {
			t.Fatal(err)
		}
	}
}

func randMGID() verbs.GID {
	return wire.RoCEv2MGID(netip.AddrFrom4([4]byte{239, byte(1 + rand.IntN(250)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))}))
}

func TestDeviceAndPort(t *testing.T) {
	e := newEnv(t)
	if verbs.DeviceByName("rxe_lo") == nil {
		t.Fatal("rxe_lo not in the device list")
	}
	da := e.ctx.QueryDevice()
	if da.PhysPortCnt != 1 || da.MaxMcastGrp < 10000 || da.MaxMcastQPAttach < 1 {
		t.Errorf("device attr %+v", da)
	}
	pa, err := e.ctx.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	if pa.State != verbs.PortActive || pa.LinkLayer != verbs.LinkLayerEthernet || pa.ActiveMTU != verbs.MTU4096 {
		t.Errorf("port attr %+v", pa)
	}
	_, err = e.ctx.QueryPort(2)
	wantErrno(t, err, syscall.EINVAL)
	g, err := e.ctx.QueryGID(1, 0)
	if err != nil || g.String() != "::ffff:127.0.0.1" {
		t.Errorf("gid 0 = %v, %v", g, err)
	}
	wantErrno(t, e.ctx.Close(), syscall.EBUSY) // PD and CQ still exist
}

func TestMTU(t *testing.T) {
	for _, c := range []struct {
		n int
		m verbs.MTU
	}{{1500 - 80, verbs.MTU1024}, {65536 - 80, verbs.MTU4096}, {255, 0}, {256, verbs.MTU256}, {2048, verbs.MTU2048}} {
		if got := verbs.MTUFromBytes(c.n); got != c.m {
			t.Errorf("MTUFromBytes(%d) = %d, want %d", c.n, got, c.m)
		}
	}
	if verbs.MTU1024.Bytes() != 1024 || verbs.MTU(9).Bytes() != 0 {
		t.Error("MTU.Bytes")
	}
}

func TestQPStateMachine(t *testing.T) {
	e := newEnv(t)
	qp := e.qp(t, 0)
	if qp.State() != verbs.QPSReset || qp.Num() == 0 {
		t.Fatalf("new qp state %v num %#x", qp.State(), qp.Num())
	}
	// RESET→RTR skips INIT.
	wantErrno(t, qp.Modify(&verbs.QPAttr{State: verbs.QPSRTR}, verbs.QPAttrState), syscall.EINVAL)
	// RESET→INIT needs P_Key index, port and Q_Key.
	wantErrno(t, qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, PortNum: 1}, verbs.QPAttrState|verbs.QPAttrPort), syscall.EINVAL)
	wantErrno(t, qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, PortNum: 3, QKey: 1},
		verbs.QPAttrState|verbs.QPAttrPKeyIdx|verbs.QPAttrPort|verbs.QPAttrQKey), syscall.EINVAL)
	// Posting a receive in RESET fails.
	mr, _ := e.pd.RegMR(make([]byte, 256), verbs.AccessLocalWrite)
	defer mr.Dereg()
	wantErrno(t, qp.PostRecv(&verbs.RecvWR{SGList: []verbs.SGE{mr.SGE(0, 256)}}), syscall.EINVAL)
	toRTS(t, qp, 0x1234)
	if a := qp.Query(); a.State != verbs.QPSRTS || a.QKey != 0x1234 || a.PortNum != 1 {
		t.Errorf("query %+v", a)
	}
	// RTS→RTS may change the Q_Key; RTS→INIT is not a transition.
	if err := qp.Modify(&verbs.QPAttr{QKey: 0x99}, verbs.QPAttrQKey); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, qp.Modify(&verbs.QPAttr{State: verbs.QPSInit}, verbs.QPAttrState), syscall.EINVAL)
	// Posted receives are flushed with an error completion on ERR.
	if err := qp.PostRecv(&verbs.RecvWR{WRID: 77, SGList: []verbs.SGE{mr.SGE(0, 256)}}); err != nil {
		t.Fatal(err)
	}
	if err := qp.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	var wc [2]verbs.WC
	n, _ := e.cq.Poll(wc[:])
	if n != 1 || wc[0].WRID != 77 || wc[0].Status != verbs.WCWRFlushErr {
		t.Errorf("flush: %d %+v", n, wc[0])
	}
	if err := qp.Modify(&verbs.QPAttr{State: verbs.QPSReset}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
}

func TestCreateQPErrors(t *testing.T) {
	e := newEnv(t)
	wantErrno(t, errOf(e.pd.CreateQP(nil)), syscall.EINVAL)
	wantErrno(t, errOf(e.pd.CreateQP(&verbs.QPInitAttr{SendCQ: e.cq, QPType: verbs.QPTypeUD})), syscall.EINVAL)
	wantErrno(t, errOf(e.pd.CreateQP(&verbs.QPInitAttr{SendCQ: e.cq, RecvCQ: e.cq, QPType: verbs.QPTypeRC})), syscall.EOPNOTSUPP)
	wantErrno(t, errOf(e.pd.CreateQP(&verbs.QPInitAttr{SendCQ: e.cq, RecvCQ: e.cq, QPType: verbs.QPTypeUD, CreateFlags: 1 << 9})), syscall.EOPNOTSUPP)
	wantErrno(t, errOf(e.pd.CreateQP(&verbs.QPInitAttr{SendCQ: e.cq, RecvCQ: e.cq, QPType: verbs.QPTypeUD, Cap: verbs.QPCap{MaxSendWR: 1 << 30}})), syscall.EINVAL)
	_, err := e.ctx.CreateCQ(0)
	wantErrno(t, err, syscall.EINVAL)
	qp := e.qp(t, 0)
	wantErrno(t, e.cq.Destroy(), syscall.EBUSY)
	wantErrno(t, e.pd.Dealloc(), syscall.EBUSY)
	if err := qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, qp.Destroy(), syscall.EINVAL)
	if err := e.cq.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := e.pd.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := e.ctx.Close(); err != nil {
		t.Fatal(err)
	}
}

func errOf[T any](_ T, err error) error { return err }

func TestMRAndSGE(t *testing.T) {
	e := newEnv(t)
	_, err := e.pd.RegMR(nil, verbs.AccessLocalWrite)
	wantErrno(t, err, syscall.EINVAL)
	_, err = e.pd.RegMR(make([]byte, 8), verbs.AccessRemoteWrite)
	wantErrno(t, err, syscall.EINVAL)
	ro, _ := e.pd.RegMR(make([]byte, 128), 0)
	rw, _ := e.pd.RegMR(make([]byte, 128), verbs.AccessLocalWrite)
	qp := e.qp(t, 0)
	toRTS(t, qp, 1)
	post := func(s ...verbs.SGE) error { return qp.PostRecv(&verbs.RecvWR{SGList: s}) }
	wantErrno(t, post(ro.SGE(0, 64)), syscall.EACCES)                                  // no local write
	wantErrno(t, post(rw.SGE(100, 64)), syscall.EINVAL)                                // past the end
	wantErrno(t, post(verbs.SGE{Addr: rw.Addr(), Length: 8, LKey: 1}), syscall.EINVAL) // unknown key
	wantErrno(t, post(rw.SGE(0, 8), rw.SGE(8, 8), rw.SGE(16, 8)), syscall.EINVAL)      // 3 SGEs > max 2
	var bad *verbs.BadWRError
	err = qp.PostRecv(&verbs.RecvWR{SGList: []verbs.SGE{rw.SGE(0, 64)}, Next: &verbs.RecvWR{SGList: []verbs.SGE{ro.SGE(0, 1)}}})
	if !errors.As(err, &bad) || bad.Index != 1 {
		t.Errorf("bad wr index: %v", err)
	}
	if err := rw.Dereg(); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, rw.Dereg(), syscall.EINVAL)
	ro.Dereg()
}

func TestAttachRules(t *testing.T) {
	e := newEnv(t)
	qp := e.qp(t, 0)
	g := randMGID()
	wantErrno(t, qp.AttachMcast(wire.GIDFromAddr(netip.MustParseAddr("10.1.2.3")), 0), syscall.EINVAL) // not multicast
	if err := qp.AttachMcast(g, 0); err != nil {
		t.Fatal(err)
	}
	if err := qp.AttachMcast(g, 0); err != nil { // idempotent
		t.Fatal(err)
	}
	if err := qp.DetachMcast(g, 0); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, qp.DetachMcast(g, 0), syscall.EINVAL)          // no longer attached
	wantErrno(t, qp.DetachMcast(randMGID(), 0), syscall.EINVAL) // never attached
	other := e.qp(t, 0)
	if err := qp.AttachMcast(g, 0); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, other.DetachMcast(g, 0), syscall.EINVAL) // not a member
}

// TestAttachLimits: ENOMEM past max_mcast_qp_attach and max_mcast_grp, on a
// device of its own (a veth would need root; a limit change on lo is
// restored after the test).
func TestAttachLimits(t *testing.T) {
	d, err := rxe.ForName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetLimits(rxe.Options{MaxMcastGrp: 3, MaxMcastQPAttach: 2}); err != nil {
		t.Fatal(err)
	}
	defer d.SetLimits(rxe.Options{})
	e := newEnv(t)
	a, b, c := e.qp(t, 0), e.qp(t, 0), e.qp(t, 0)
	g := randMGID()
	if err := a.AttachMcast(g, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.AttachMcast(g, 0); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, c.AttachMcast(g, 0), syscall.ENOMEM)
	var gs []verbs.GID
	for {
		x := randMGID()
		if err := a.AttachMcast(x, 0); err != nil {
			wantErrno(t, err, syscall.ENOMEM)
			break
		}
		gs = append(gs, x)
		if len(gs) > 5 {
			t.Fatal("max_mcast_grp not enforced")
		}
	}
	if len(d.Groups()) > 3 {
		t.Errorf("%d groups", len(d.Groups()))
	}
}

// TestLoopbackDatagram sends between two QPs of one process on lo and checks
// the completion and the self-loopback filter.
func TestLoopbackDatagram(t *testing.T) {
	e := newEnv(t)
	rx, tx := e.qp(t, 0), e.qp(t, verbs.CreateBlockSelfMcastLB)
	toRTS(t, rx, 0x11)
	toRTS(t, tx, 0x11)
	g := randMGID()
	for _, qp := range []*verbs.QP{rx, tx} {
		if err := qp.AttachMcast(g, 0); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 2*(40+64))
	mr, _ := e.pd.RegMR(buf, verbs.AccessLocalWrite)
	defer mr.Dereg()
	// A scattered receive: GRH area + first bytes in one SGE, the rest in another.
	if err := rx.PostRecv(&verbs.RecvWR{WRID: 1, SGList: []verbs.SGE{mr.SGE(0, 50), mr.SGE(50, 54)}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.PostRecv(&verbs.RecvWR{WRID: 2, SGList: []verbs.SGE{mr.SGE(104, 104)}}); err != nil {
		t.Fatal(err)
	}
	ah, err := e.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: 1, GRH: verbs.GlobalRoute{DGID: g, HopLimit: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Destroy()
	_, err = e.pd.CreateAH(&verbs.AHAttr{PortNum: 1}) // RoCE needs a GRH
	wantErrno(t, err, syscall.EINVAL)
	src := make([]byte, 64)
	for i := range src {
		src[i] = byte(i)
	}
	smr, _ := e.pd.RegMR(src, 0)
	defer smr.Dereg()
	wr := verbs.SendWR{WRID: 5, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{smr.SGE(0, 30), smr.SGE(30, 34)},
		UD: verbs.UDWR{AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: 0x11}}
	if err := tx.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	got := map[verbs.WCOpcode]verbs.WC{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for len(got) < 2 {
		if err := e.cq.Wait(ctx); err != nil {
			t.Fatalf("waiting: %v (have %v)", err, got)
		}
		var wc [4]verbs.WC
		n, _ := e.cq.Poll(wc[:])
		for _, c := range wc[:n] {
			if _, dup := got[c.Opcode]; dup {
				t.Fatalf("extra completion %+v", c)
			}
			got[c.Opcode] = c
		}
	}
	r := got[verbs.WCOpRecv]
	if r.WRID != 1 || r.QPNum != rx.Num() || r.SrcQP != tx.Num() || r.ByteLen != 104 || r.Flags != verbs.WCGRH {
		t.Errorf("recv wc %+v", r)
	}
	if string(buf[40:104]) != string(src) {
		t.Errorf("payload % x", buf[40:104])
	}
	time.Sleep(50 * time.Millisecond)
	if n := e.cq.Len(); n != 0 {
		t.Errorf("the BLOCK_SELF_MCAST_LB sender got %d completions of its own datagram", n)
	}
	// Out of RTS, posting a send fails.
	if err := tx.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, tx.PostSend(&wr), syscall.EINVAL)
}
