//go:build rdmacore && cgo

package rdmacore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/softrdma/softrdma/verbs"
)

// These tests need a kernel RDMA device (an RDMA NIC or Soft-RoCE's
// rdma_rxe on a network interface with an IPv4 address): they skip
// without one. test/interop's TestKernelVerbs runs them in a QEMU guest
// with rxe0. SOFTRDMA_RDMACORE_DEVICE picks a device by name.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testQKey = 0x11111111

// env is an open kernel device with a RoCEv2 IPv4 GID and a PD.
type env struct {
	h    *verbs.Host
	dev  *verbs.Device
	ctx  *verbs.Context
	pd   *verbs.PD
	port uint8
	gid  verbs.GIDEntry // the port's RoCEv2 GID of an IPv4 address
	ip   netip.Addr
}

// kernelDevice returns a fresh host and its kernel device, or skips.
func kernelDevice(t *testing.T) (*verbs.Host, *verbs.Device) {
	t.Helper()
	h := verbs.NewHost()
	t.Cleanup(h.Close)
	devs := On(h)
	if len(devs) == 0 {
		t.Skip("no kernel RDMA device (ibv_get_device_list is empty; load rdma_rxe and `rdma link add`): test/interop's TestKernelVerbs runs these tests in a guest with rxe0")
	}
	if name := os.Getenv("SOFTRDMA_RDMACORE_DEVICE"); name != "" {
		for _, d := range devs {
			if d.Name() == name {
				return h, d
			}
		}
		t.Fatalf("SOFTRDMA_RDMACORE_DEVICE=%s: no such kernel device among %v", name, devs)
	}
	return h, devs[0]
}

func newEnv(t *testing.T) *env {
	t.Helper()
	h, dev := kernelDevice(t)
	e := &env{h: h, dev: dev, port: 1}
	ctx, err := dev.Open()
	if err != nil {
		t.Fatal(err)
	}
	e.ctx = ctx
	t.Cleanup(func() {
		if err := ctx.Close(); err != nil {
			t.Errorf("context close: %v", err)
		}
	})
	tbl, err := ctx.QueryGIDTable(e.port)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range tbl {
		a := netip.AddrFrom16(g.GID)
		if g.Type == verbs.GIDTypeRoCEv2 && a.Is4In6() {
			e.gid, e.ip = g, a.Unmap()
			break
		}
	}
	if !e.ip.IsValid() {
		t.Skipf("%s port %d has no RoCEv2 GID of an IPv4 address: %+v", dev.Name(), e.port, tbl)
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	e.pd = pd
	t.Cleanup(func() {
		if err := pd.Dealloc(); err != nil {
			t.Errorf("pd dealloc: %v", err)
		}
	})
	return e
}

// udqp is a UD QP in RTS with its CQs and a registered buffer of slots.
type udqp struct {
	qp       *verbs.QP
	scq, rcq *verbs.CQ
	mr       *verbs.MR
	buf      []byte
}

const slot = 2048

func (e *env) newQP(t *testing.T, flags verbs.CreateFlags) *udqp {
	t.Helper()
	return e.newQPOn(t, flags, nil, nil)
}

// newQPOn makes a QP with the given CQs (new ones when nil).
func (e *env) newQPOn(t *testing.T, flags verbs.CreateFlags, scq, rcq *verbs.CQ) *udqp {
	t.Helper()
	u := &udqp{buf: make([]byte, 8*slot), scq: scq, rcq: rcq}
	var err error
	if u.scq == nil {
		if u.scq, err = e.ctx.CreateCQ(64); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { check(t, u.scq.Destroy()) })
	}
	if u.rcq == nil {
		if u.rcq, err = e.ctx.CreateCQ(64); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { check(t, u.rcq.Destroy()) })
	}
	if u.mr, err = e.pd.RegMR(u.buf, verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, u.mr.Dereg()) })
	u.qp, err = e.pd.CreateQP(&verbs.QPInitAttr{
		SendCQ: u.scq, RecvCQ: u.rcq, QPType: verbs.QPTypeUD, CreateFlags: flags,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if u.qp != nil {
			check(t, u.qp.Destroy())
		}
	})
	toRTS(t, u.qp, e.port)
	return u
}

func check(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Error(err)
	}
}

func toRTS(t *testing.T, qp *verbs.QP, port uint8) {
	t.Helper()
	steps := []struct {
		attr verbs.QPAttr
		mask verbs.QPAttrMask
	}{
		{verbs.QPAttr{State: verbs.QPSInit, PKeyIdx: 0, PortNum: port, QKey: testQKey}, verbs.QPAttrState | verbs.QPAttrPKeyIdx | verbs.QPAttrPort | verbs.QPAttrQKey},
		{verbs.QPAttr{State: verbs.QPSRTR}, verbs.QPAttrState},
		{verbs.QPAttr{State: verbs.QPSRTS, SQPSN: 0x1234}, verbs.QPAttrState | verbs.QPAttrSQPSN},
	}
	for _, s := range steps {
		if err := qp.Modify(&s.attr, s.mask); err != nil {
			t.Fatalf("modify to %v: %v", s.attr.State, err)
		}
		if got := qp.State(); got != s.attr.State {
			t.Fatalf("state %v after modify to %v", got, s.attr.State)
		}
	}
}

// postRecv posts slot i of u's buffer.
func (u *udqp) postRecv(t testing.TB, i int) {
	t.Helper()
	wr := verbs.RecvWR{WRID: uint64(100 + i), SGList: []verbs.SGE{u.mr.SGE(i*slot, slot)}}
	if err := u.qp.PostRecv(&wr); err != nil {
		t.Fatal(err)
	}
}

// waitWC waits for one completion of cq, through Wait.
func waitWC(t testing.TB, cq *verbs.CQ) verbs.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wc [1]verbs.WC
	for {
		n, err := cq.Poll(wc[:])
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return wc[0]
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("waiting for a completion: %v", err)
		}
	}
}

func wantErrno(t *testing.T, what string, err error, op string, errno syscall.Errno) {
	t.Helper()
	var ve *verbs.Error
	if !errors.As(err, &ve) || !errors.Is(err, errno) {
		t.Errorf("%s: %v, want a *verbs.Error with %v", what, err, errno)
		return
	}
	if ve.Op != op {
		t.Errorf("%s: op %q, want %q (%v)", what, ve.Op, op, err)
	}
}

func TestDeviceListAndAttr(t *testing.T) {
	h, dev := kernelDevice(t)
	if !IsKernelDevice(dev) || IsKernelDevice(nil) {
		t.Fatal("IsKernelDevice")
	}
	again := On(h)
	found := false
	for _, d := range again {
		found = found || d == dev
	}
	if !found {
		t.Fatalf("On registered %s again: %v", dev.Name(), again)
	}
	if got := h.DeviceByName(dev.Name()); got != dev {
		t.Fatalf("DeviceByName(%q) = %v", dev.Name(), got)
	}
	n := 0
	for _, d := range h.DeviceList() {
		if d.Name() == dev.Name() {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%s listed %d times", dev.Name(), n)
	}
	// The provider serves every host, DefaultHost too (verbs.DeviceList).
	t.Cleanup(verbs.DefaultHost().Close)
	if d := verbs.DeviceByName(dev.Name()); d == nil || !IsKernelDevice(d) || d == dev {
		t.Errorf("verbs.DeviceByName(%q) = %v", dev.Name(), d)
	}
	a := dev.Ops().Attr()
	t.Logf("%s: %+v", dev.Name(), a)
	if a.PhysPortCnt < 1 || a.MaxQP <= 0 || a.MaxCQE <= 0 || a.MaxSGE <= 0 || a.MaxMcastGrp <= 0 || a.MaxMcastQPAttach <= 0 || a.MaxTotalMcastQP <= 0 || a.NodeGUID == 0 {
		t.Errorf("attributes: %+v", a)
	}
	if dev.GUID() != a.NodeGUID {
		t.Errorf("GUID %x, attr %x", dev.GUID(), a.NodeGUID)
	}
	// A closed host drops its devices and finds them anew.
	h.Close()
	if d := h.Devices(); len(d) != 0 {
		t.Errorf("devices after Close: %v", d)
	}
	if d := h.DeviceByName(dev.Name()); d == nil || d == dev {
		t.Errorf("after Close: DeviceByName = %v", d)
	}
	if _, err := dev.Open(); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("Open of an unregistered device: %v", err)
	}
}

func TestPortAndGIDTable(t *testing.T) {
	e := newEnv(t)
	pa, err := e.ctx.QueryPort(e.port)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("port %d: %+v", e.port, pa)
	if pa.State != verbs.PortActive || pa.LinkLayer != verbs.LinkLayerEthernet || pa.ActiveMTU.Bytes() == 0 || pa.MaxMTU.Bytes() == 0 || pa.GIDTblLen == 0 {
		t.Errorf("port attributes: %+v", pa)
	}
	ifi, err := net.InterfaceByIndex(e.gid.NetdevIdx)
	if err != nil {
		t.Fatalf("GID %v netdev %d: %v", e.gid.GID, e.gid.NetdevIdx, err)
	}
	if pa.NetdevMTU != ifi.MTU {
		t.Errorf("NetdevMTU %d, %s has %d", pa.NetdevMTU, ifi.Name, ifi.MTU)
	}
	for _, p := range []uint8{0, 77} {
		_, err := e.ctx.QueryPort(p)
		wantErrno(t, fmt.Sprintf("QueryPort(%d)", p), err, "ibv_query_port", syscall.EINVAL)
		_, err = e.ctx.QueryGIDTable(p)
		wantErrno(t, fmt.Sprintf("QueryGIDTable(%d)", p), err, "ibv_query_gid_table", syscall.EINVAL)
	}
	tbl, err := e.ctx.QueryGIDTable(e.port)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range tbl {
		t.Logf("gid %d %v %v netdev %d", g.Index, g.GID, g.Type, g.NetdevIdx)
		if g.PortNum != e.port {
			t.Errorf("entry of port %d in port %d's table", g.PortNum, e.port)
		}
	}
	// The interface of the GID holds its address.
	addrs, _ := ifi.Addrs()
	has := false
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr() == e.ip {
			has = true
		}
	}
	if !has {
		t.Errorf("%s (GID %v's netdev) does not hold %v: %v", ifi.Name, e.gid.GID, e.ip, addrs)
	}
	// Both types of the address: RoCE v1 and v2 (rxe), and the GID entry
	// by index.
	ent, err := e.ctx.QueryGIDEntry(e.port, e.gid.Index)
	if err != nil || ent != e.gid {
		t.Errorf("QueryGIDEntry(%d) = %+v, %v; want %+v", e.gid.Index, ent, err, e.gid)
	}
	// OwnerOf.
	if d := OwnerOf(e.h, e.ip); d != e.dev {
		t.Errorf("OwnerOf(%v) = %v, want %v", e.ip, d, e.dev)
	}
	if d := OwnerOf(e.h, netip.AddrFrom16(e.ip.As16())); d != e.dev {
		t.Errorf("OwnerOf(IPv4-mapped %v) = %v", e.ip, d)
	}
	if d := OwnerOf(e.h, e.ip.WithZone(ifi.Name)); d != nil {
		// IPv4 addresses have no zone; WithZone ignores it.
		_ = d
	}
	if d := OwnerOf(e.h, netip.MustParseAddr("192.0.2.254")); d != nil {
		t.Errorf("OwnerOf(192.0.2.254) = %v", d)
	}
}

func TestLifecycleAndEBUSY(t *testing.T) {
	_, dev := kernelDevice(t)
	ctx, err := dev.Open()
	if err != nil {
		t.Fatal(err)
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ctx.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if mr.LKey() == 0 && mr.RKey() == 0 {
		t.Errorf("MR keys 0")
	}
	qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTypeUD, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if qp.Num() == 0 || qp.State() != verbs.QPSReset {
		t.Errorf("new QP: num %d state %v", qp.Num(), qp.State())
	}
	if cDevice(dev) == nil || cContext(ctx) == nil || cPD(pd) == nil || cQP(qp) == nil || deviceNamed(dev.Name()) == nil || deviceNamed("no-such-device") != nil {
		t.Errorf("C handles: %p %p %p %p", cDevice(dev), cContext(ctx), cPD(pd), cQP(qp))
	}

	wantErrno(t, "close with PD and CQ", ctx.Close(), "ibv_close_device", syscall.EBUSY)
	wantErrno(t, "dealloc PD with MR and QP", pd.Dealloc(), "ibv_dealloc_pd", syscall.EBUSY)
	wantErrno(t, "destroy CQ with QP", cq.Destroy(), "ibv_destroy_cq", syscall.EBUSY)

	// A QP type other than UD; CQs of another context.
	_, err = pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTypeRC, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	wantErrno(t, "RC QP", err, "ibv_create_qp", syscall.EOPNOTSUPP)
	ctx2, err := dev.Open()
	if err != nil {
		t.Fatal(err)
	}
	cq2, err := ctx2.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq2, RecvCQ: cq2, QPType: verbs.QPTypeUD, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	wantErrno(t, "CQ of another context", err, "ibv_create_qp", syscall.EINVAL)
	check(t, cq2.Destroy())
	check(t, ctx2.Close())

	// The self-multicast-loopback block: the kernel decides.
	qpb, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTypeUD, CreateFlags: verbs.CreateBlockSelfMcastLB, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		var ve *verbs.Error
		if !errors.As(err, &ve) || ve.Op != "ibv_create_qp" {
			t.Errorf("CreateBlockSelfMcastLB: %v", err)
		}
		t.Logf("CreateBlockSelfMcastLB: %s refuses it: %v", dev.Name(), err)
	} else {
		t.Logf("CreateBlockSelfMcastLB: %s accepts it (QP %d)", dev.Name(), qpb.Num())
		check(t, qpb.Destroy())
	}

	check(t, qp.Destroy())
	wantErrno(t, "destroy QP twice", qp.Destroy(), "ibv_destroy_qp", syscall.EINVAL)
	wantErrno(t, "dealloc PD with MR", pd.Dealloc(), "ibv_dealloc_pd", syscall.EBUSY)
	check(t, cq.Destroy())
	wantErrno(t, "destroy CQ twice", cq.Destroy(), "ibv_destroy_cq", syscall.EINVAL)
	wantErrno(t, "close with PD", ctx.Close(), "ibv_close_device", syscall.EBUSY)
	check(t, mr.Dereg())
	wantErrno(t, "dereg twice", mr.Dereg(), "ibv_dereg_mr", syscall.EINVAL)
	check(t, pd.Dealloc())
	wantErrno(t, "dealloc twice", pd.Dealloc(), "ibv_dealloc_pd", syscall.EINVAL)
	check(t, ctx.Close())
	wantErrno(t, "close twice", ctx.Close(), "ibv_close_device", syscall.EINVAL)
	runtime.KeepAlive(buf)
}

func TestQPStateMachine(t *testing.T) {
	e := newEnv(t)
	cq, err := e.ctx.CreateCQ(8)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { check(t, cq.Destroy()) }()
	qp, err := e.pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTypeUD, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { check(t, qp.Destroy()) }()
	// RESET → RTS directly is not a transition.
	err = qp.Modify(&verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState)
	wantErrno(t, "RESET→RTS", err, "ibv_modify_qp", syscall.EINVAL)
	// INIT without its attributes.
	err = qp.Modify(&verbs.QPAttr{State: verbs.QPSInit}, verbs.QPAttrState)
	wantErrno(t, "RESET→INIT without port and Q_Key", err, "ibv_modify_qp", syscall.EINVAL)
	toRTS(t, qp, e.port)
	a := qp.Query()
	t.Logf("query: %+v", a)
	if a.State != verbs.QPSRTS || a.QKey != testQKey || a.PortNum != e.port || a.SQPSN != 0x1234 || a.Cap.MaxSendWR < 4 || a.Cap.MaxRecvWR < 4 {
		t.Errorf("query after RTS: %+v", a)
	}
	// Any state → ERR → RESET.
	check(t, qp.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState))
	if s := qp.State(); s != verbs.QPSErr {
		t.Errorf("state %v, want ERR", s)
	}
	check(t, qp.Modify(&verbs.QPAttr{State: verbs.QPSReset}, verbs.QPAttrState))
	if s := qp.State(); s != verbs.QPSReset {
		t.Errorf("state %v, want RESET", s)
	}
	toRTS(t, qp, e.port)
}

// selfAH is an address handle to the device's own IPv4 GID.
func (e *env) selfAH(t testing.TB) *verbs.AH {
	t.Helper()
	ah, err := e.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: e.port,
		GRH: verbs.GlobalRoute{DGID: e.gid.GID, SGIDIndex: uint8(e.gid.Index), HopLimit: 64}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ah.Destroy(); err != nil {
			t.Error(err)
		}
	})
	return ah
}

func TestUDLoopback(t *testing.T) {
	e := newEnv(t)
	u := e.newQP(t, 0)
	ah := e.selfAH(t)
	u.postRecv(t, 0)
	payload := []byte("hello from a kernel UD QP to itself")
	off := 4 * slot
	copy(u.buf[off:], payload)
	// Two SGEs: the payload in two pieces.
	wr := verbs.SendWR{WRID: 7, Opcode: verbs.WRSendWithImm, Flags: verbs.SendSignaled, ImmData: 0xdeadbeef,
		SGList: []verbs.SGE{u.mr.SGE(off, 10), u.mr.SGE(off+10, len(payload)-10)},
		UD:     verbs.UDWR{AH: ah, RemoteQPN: u.qp.Num(), RemoteQKey: testQKey}}
	if err := u.qp.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	sc := waitWC(t, u.scq)
	if sc.Status != verbs.WCSuccess || sc.Opcode != verbs.WCOpSend || sc.WRID != 7 {
		t.Errorf("send completion %+v", sc)
	}
	rc := waitWC(t, u.rcq)
	t.Logf("receive completion %+v", rc)
	if rc.Status != verbs.WCSuccess || rc.Opcode != verbs.WCOpRecv || rc.WRID != 100 ||
		rc.ByteLen != uint32(verbs.GRHLen+len(payload)) || rc.Flags&verbs.WCGRH == 0 ||
		rc.Flags&verbs.WCWithImm == 0 || rc.ImmData != 0xdeadbeef || rc.SrcQP != u.qp.Num() || rc.QPNum != u.qp.Num() {
		t.Errorf("receive completion %+v", rc)
	}
	if got := u.buf[verbs.GRHLen : verbs.GRHLen+len(payload)]; !bytes.Equal(got, payload) {
		t.Errorf("payload %q, want %q", got, payload)
	}
	// RoCEv2 over IPv4: the GRH area holds the IPv4 header at 20.
	ip := u.buf[20:40]
	if ip[0]>>4 != 4 || netip.AddrFrom4([4]byte(ip[12:16])) != e.ip || netip.AddrFrom4([4]byte(ip[16:20])) != e.ip {
		t.Errorf("GRH area % x", u.buf[:40])
	}
	// The AH answering the datagram.
	attr, err := verbs.InitAHFromWC(e.ctx, e.port, &rc, u.buf[:40])
	if err != nil || attr.GRH.DGID != e.gid.GID {
		t.Errorf("InitAHFromWC: %+v, %v", attr, err)
	}

	// Bad work requests name their index.
	bad := verbs.SendWR{WRID: 9, Opcode: verbs.WRSend, SGList: []verbs.SGE{u.mr.SGE(0, 1)}, UD: verbs.UDWR{RemoteQPN: 1, RemoteQKey: testQKey}}
	first := verbs.SendWR{WRID: 8, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{u.mr.SGE(off, 1)},
		UD: verbs.UDWR{AH: ah, RemoteQPN: u.qp.Num(), RemoteQKey: testQKey}, Next: &bad}
	u.postRecv(t, 1)
	err = u.qp.PostSend(&first)
	var bw *verbs.BadWRError
	if !errors.As(err, &bw) || bw.Index != 1 || !errors.Is(err, syscall.EINVAL) {
		t.Errorf("send without AH: %v", err)
	}
	if sc := waitWC(t, u.scq); sc.WRID != 8 {
		t.Errorf("the request before the bad one: %+v", sc)
	}
	waitWC(t, u.rcq)
	tooMany := verbs.RecvWR{WRID: 1, SGList: make([]verbs.SGE, 3)}
	err = u.qp.PostRecv(&verbs.RecvWR{WRID: 0, SGList: []verbs.SGE{u.mr.SGE(0, slot)}, Next: &tooMany})
	if !errors.As(err, &bw) || bw.Index != 1 || !errors.Is(err, syscall.EINVAL) {
		t.Errorf("receive with 3 SGEs on a 2-SGE QP: %v", err)
	}
}

func TestMulticastTwoReceivers(t *testing.T) {
	e := newEnv(t)
	group := netip.MustParseAddr("239.1.2.3")
	mgid := verbs.GID(group.As16())
	// ibv_attach_mcast on RoCE only programs the MAC filter; the IP layer
	// must be a member (the RDMA CM joins for its users) or the kernel
	// drops the looped-back datagram before it reaches rxe.
	ifi, err := net.InterfaceByIndex(e.gid.NetdevIdx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.ListenMulticastUDP("udp4", ifi, &net.UDPAddr{IP: group.AsSlice()})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	r1, r2, s := e.newQP(t, 0), e.newQP(t, 0), e.newQP(t, 0)
	for _, r := range []*udqp{r1, r2} {
		if err := r.qp.AttachMcast(mgid, 0); err != nil {
			t.Fatal(err)
		}
		r.postRecv(t, 0)
	}
	ah, err := e.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: e.port,
		GRH: verbs.GlobalRoute{DGID: mgid, SGIDIndex: uint8(e.gid.Index), HopLimit: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { check(t, ah.Destroy()) }()
	payload := []byte("to the group")
	copy(s.buf, payload)
	wr := verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{s.mr.SGE(0, len(payload))},
		UD: verbs.UDWR{AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: testQKey}}
	if err := s.qp.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	if sc := waitWC(t, s.scq); sc.Status != verbs.WCSuccess {
		t.Errorf("send completion %+v", sc)
	}
	for i, r := range []*udqp{r1, r2} {
		wc := waitWC(t, r.rcq)
		if wc.Status != verbs.WCSuccess || wc.ByteLen != uint32(verbs.GRHLen+len(payload)) || wc.Flags&verbs.WCGRH == 0 || wc.SrcQP != s.qp.Num() {
			t.Errorf("receiver %d: completion %+v", i+1, wc)
		}
		if got := r.buf[verbs.GRHLen : verbs.GRHLen+len(payload)]; !bytes.Equal(got, payload) {
			t.Errorf("receiver %d: payload %q", i+1, got)
		}
		ip := r.buf[20:40]
		if ip[0]>>4 != 4 || netip.AddrFrom4([4]byte(ip[12:16])) != e.ip || netip.AddrFrom4([4]byte(ip[16:20])) != group {
			t.Errorf("receiver %d: GRH area % x", i+1, r.buf[:40])
		}
	}
	for _, r := range []*udqp{r1, r2} {
		check(t, r.qp.DetachMcast(mgid, 0))
	}
	wantErrno(t, "detach twice", r1.qp.DetachMcast(mgid, 0), "ibv_detach_mcast", syscall.EINVAL)
}

func TestCQWait(t *testing.T) {
	e := newEnv(t)
	u := e.newQP(t, 0)
	ah := e.selfAH(t)

	// Woken by a completion.
	done := make(chan error, 1)
	go func() { done <- u.rcq.Wait(context.Background()) }()
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v on an empty CQ", err)
	case <-time.After(100 * time.Millisecond):
	}
	u.postRecv(t, 0)
	wr := verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SGList: []verbs.SGE{u.mr.SGE(4*slot, 8)},
		UD: verbs.UDWR{AH: ah, RemoteQPN: u.qp.Num(), RemoteQKey: testQKey}}
	if err := u.qp.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait not woken by a completion")
	}
	// The completion stays for Poll; Len and Wait see it.
	if n := u.rcq.Len(); n != 1 {
		t.Errorf("Len = %d, want 1", n)
	}
	if err := u.rcq.Wait(context.Background()); err != nil {
		t.Errorf("Wait with a completion queued: %v", err)
	}
	var wc [4]verbs.WC
	if n, err := u.rcq.Poll(wc[:]); n != 1 || err != nil || wc[0].WRID != 100 {
		t.Errorf("Poll = %d, %v: %+v", n, err, wc[0])
	}
	if n := u.rcq.Len(); n != 0 {
		t.Errorf("Len = %d after Poll", n)
	}

	// Ended by cancellation, several waiters at once.
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- u.rcq.Wait(ctx) }()
	}
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	cancel()
	for range 3 {
		select {
		case err := <-errs:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled Wait: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Wait not ended by cancel")
		}
	}
	t.Logf("cancelled waits returned in %v", time.Since(start))
	// A deadline.
	dctx, dcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer dcancel()
	if err := u.rcq.Wait(dctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait past its deadline: %v", err)
	}
	// Still woken afterwards.
	go func() { done <- u.rcq.Wait(context.Background()) }()
	u.postRecv(t, 1)
	if err := u.qp.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		check(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Wait not woken after cancelled waits")
	}

	// Destroy ends a waiter with EINVAL.
	cq, err := e.ctx.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- cq.Wait(context.Background()) }()
	time.Sleep(50 * time.Millisecond)
	check(t, cq.Destroy())
	select {
	case err := <-done:
		if !errors.Is(err, syscall.EINVAL) {
			t.Errorf("Wait on a destroyed CQ: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait not ended by Destroy")
	}
}

func TestDataPathAllocs(t *testing.T) {
	e := newEnv(t)
	u := e.newQP(t, 0)
	ah := e.selfAH(t)
	rwr := verbs.RecvWR{WRID: 1, SGList: []verbs.SGE{u.mr.SGE(0, slot)}}
	swr := verbs.SendWR{WRID: 2, Opcode: verbs.WRSendWithImm, Flags: verbs.SendSignaled, ImmData: 5,
		SGList: []verbs.SGE{u.mr.SGE(4*slot, 64)},
		UD:     verbs.UDWR{AH: ah, RemoteQPN: u.qp.Num(), RemoteQKey: testQKey}}
	var wc [4]verbs.WC
	var failed error
	one := func() {
		if err := u.qp.PostRecv(&rwr); err != nil {
			failed = err
			return
		}
		if err := u.qp.PostSend(&swr); err != nil {
			failed = err
			return
		}
		deadline := time.Now().Add(10 * time.Second)
		for got := 0; got < 2; {
			n, err := u.scq.Poll(wc[:])
			if err != nil {
				failed = err
				return
			}
			m, err := u.rcq.Poll(wc[n:])
			if err != nil {
				failed = err
				return
			}
			got += n + m
			if time.Now().After(deadline) {
				failed = errors.New("no completions within 10s")
				return
			}
			if n+m == 0 {
				runtime.Gosched()
			}
		}
	}
	allocs := testing.AllocsPerRun(200, one)
	if failed != nil {
		t.Fatal(failed)
	}
	t.Logf("PostRecv+PostSend+Poll: %v allocations per message", allocs)
	if allocs != 0 {
		t.Errorf("%v allocations per message, want 0", allocs)
	}
}

// TestConcurrentQPs: QPs sharing two CQs post from their own goroutines
// while one goroutine waits on and polls both CQs (run it with -race).
func TestConcurrentQPs(t *testing.T) {
	e := newEnv(t)
	const nqp, rounds = 4, 50
	scq, err := e.ctx.CreateCQ(2 * nqp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, scq.Destroy()) })
	rcq, err := e.ctx.CreateCQ(2 * nqp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, rcq.Destroy()) })
	ah := e.selfAH(t)
	qps := make([]*udqp, nqp)
	done := map[uint32]chan verbs.WC{}
	for i := range qps {
		qps[i] = e.newQPOn(t, 0, scq, rcq)
		done[qps[i].qp.Num()] = make(chan verbs.WC, 2)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	polled := make(chan error, 2)
	for _, cq := range []*verbs.CQ{scq, rcq} {
		go func() {
			var wc [3]verbs.WC
			for {
				n, err := cq.Poll(wc[:])
				if err != nil {
					polled <- err
					return
				}
				for _, w := range wc[:n] {
					done[w.QPNum] <- w
				}
				if n > 0 {
					continue
				}
				if err := cq.Wait(ctx); err != nil {
					polled <- nil
					return
				}
			}
		}()
	}
	errs := make(chan error, nqp)
	for _, u := range qps {
		go func() {
			ch := done[u.qp.Num()]
			for r := range rounds {
				rwr := verbs.RecvWR{WRID: uint64(r), SGList: []verbs.SGE{u.mr.SGE(0, slot)}}
				if err := u.qp.PostRecv(&rwr); err != nil {
					errs <- err
					return
				}
				swr := verbs.SendWR{WRID: uint64(r), Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
					SGList: []verbs.SGE{u.mr.SGE(4*slot, 16)},
					UD:     verbs.UDWR{AH: ah, RemoteQPN: u.qp.Num(), RemoteQKey: testQKey}}
				if err := u.qp.PostSend(&swr); err != nil {
					errs <- err
					return
				}
				for range 2 {
					select {
					case w := <-ch:
						if w.Status != verbs.WCSuccess || w.WRID != uint64(r) {
							errs <- fmt.Errorf("QP %d round %d: completion %+v", u.qp.Num(), r, w)
							return
						}
					case <-time.After(10 * time.Second):
						errs <- fmt.Errorf("QP %d round %d: no completion", u.qp.Num(), r)
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for range nqp {
		check(t, <-errs)
	}
	cancel()
	for range 2 {
		check(t, <-polled)
	}
}

// TestLongChains posts chains longer than one C batch (postBatch): they go
// out in order, and a failure names its index in the whole chain.
func TestLongChains(t *testing.T) {
	e := newEnv(t)
	const n = postBatch + 8
	scq, err := e.ctx.CreateCQ(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, scq.Destroy()) })
	rcq, err := e.ctx.CreateCQ(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, rcq.Destroy()) })
	buf := make([]byte, n*64+4096)
	mr, err := e.pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, mr.Dereg()) })
	qp, err := e.pd.CreateQP(&verbs.QPInitAttr{SendCQ: scq, RecvCQ: rcq, QPType: verbs.QPTypeUD,
		Cap: verbs.QPCap{MaxSendWR: 2 * n, MaxRecvWR: 2 * n, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, qp.Destroy()) })
	toRTS(t, qp, e.port)
	ah := e.selfAH(t)

	recvs := make([]verbs.RecvWR, n)
	sends := make([]verbs.SendWR, n)
	for i := range n {
		recvs[i] = verbs.RecvWR{WRID: uint64(1000 + i), SGList: []verbs.SGE{mr.SGE(i*64, 64)}}
		sends[i] = verbs.SendWR{WRID: uint64(2000 + i), Opcode: verbs.WRSendWithImm, ImmData: uint32(i), Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{mr.SGE(n*64, 8)}, UD: verbs.UDWR{AH: ah, RemoteQPN: qp.Num(), RemoteQKey: testQKey}}
		if i > 0 {
			recvs[i-1].Next = &recvs[i]
			sends[i-1].Next = &sends[i]
		}
	}
	if err := qp.PostRecv(&recvs[0]); err != nil {
		t.Fatal(err)
	}
	if err := qp.PostSend(&sends[0]); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if w := waitWC(t, scq); w.WRID != uint64(2000+i) || w.Status != verbs.WCSuccess {
			t.Fatalf("send completion %d: %+v", i, w)
		}
	}
	for i := range n {
		// UD datagrams to oneself arrive in order.
		if w := waitWC(t, rcq); w.WRID != uint64(1000+i) || w.ImmData != uint32(i) || w.Status != verbs.WCSuccess {
			t.Fatalf("receive completion %d: %+v", i, w)
		}
	}
	// A receive chain longer than the queue fails where the queue is full.
	capRecv := qp.Query().Cap.MaxRecvWR
	long := make([]verbs.RecvWR, capRecv+5)
	for i := range long {
		long[i] = verbs.RecvWR{WRID: uint64(i), SGList: []verbs.SGE{mr.SGE(0, 64)}}
		if i > 0 {
			long[i-1].Next = &long[i]
		}
	}
	err = qp.PostRecv(&long[0])
	var bw *verbs.BadWRError
	if !errors.As(err, &bw) || !errors.Is(err, syscall.ENOMEM) || bw.Index < postBatch || bw.Index > capRecv {
		t.Fatalf("receive chain of %d on a queue of %d: %v", len(long), capRecv, err)
	}
	t.Logf("receive chain of %d on a queue of %d: %v", len(long), capRecv, err)
}
