package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/provider/rxe"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	testenv.OwnNetns() // lo to this package alone
	testenv.ClearSoftRDMA()
	code := m.Run()
	rxe.CloseAll()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var lo = UDPAddr(netip.MustParseAddr("127.0.0.1"))

// randGroup returns a random group in 239.0.0.0/8 so tests sharing the
// host do not collide.
func randGroup() *net.UDPAddr {
	return UDPAddr(netip.AddrFrom4([4]byte{239, byte(1 + rand.IntN(250)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))}))
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantErrno(t *testing.T, err error, want syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("error %v, want errno %d (%v)", err, int(want), want)
	}
}

// newID creates an async id on a fresh channel, bound to 127.0.0.1.
func newID(t *testing.T, ps PortSpace) (*EventChannel, *ID) {
	t.Helper()
	ch, err := CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	id, err := CreateID(ch, "ctx", ps)
	if err != nil {
		t.Fatal(err)
	}
	if err := id.BindAddr(lo); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		id.Destroy()
		ch.Close()
	})
	return ch, id
}

// withQP gives the id a UD QP with n receives posted on a buffer of size bytes each.
func withQP(t *testing.T, id *ID, n, size int, flags verbs.CreateFlags) *verbs.MR {
	t.Helper()
	attr := verbs.QPInitAttr{Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: max(n, 1), MaxSendSGE: 1, MaxRecvSGE: 1}, QPType: verbs.QPTypeUD, CreateFlags: flags}
	if err := id.CreateQP(nil, &attr); err != nil {
		t.Fatal(err)
	}
	mr, err := id.RegMsgs(make([]byte, max(n, 1)*size))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { id.DestroyQP(); mr.Dereg() })
	for i := 0; i < n; i++ {
		if err := id.PostRecv(uint64(i), mr, i*size, size); err != nil {
			t.Fatal(err)
		}
	}
	return mr
}

func join(t *testing.T, id *ID, g net.Addr, flags uint32, ctx any) *Event {
	t.Helper()
	err := id.JoinMulticastEx(&JoinMCAttrEx{CompMask: JoinMCAttrAddress | JoinMCAttrJoinFlags, JoinFlags: flags, Addr: g}, ctx)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := id.Channel().GetEvent(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if ev.Event != EventMulticastJoin {
		t.Fatalf("event %v status %d (%v), want MULTICAST_JOIN", ev.Event, ev.Status, ev.Err)
	}
	return ev
}

func TestEventTypeString(t *testing.T) {
	for i, want := range eventNames {
		if got := EventType(i).String(); got != want {
			t.Errorf("%d: %q, want %q", i, got, want)
		}
	}
	if EventMulticastJoin.String() != "RDMA_CM_EVENT_MULTICAST_JOIN" || EventMulticastError != 13 || EventAddrChange != 14 {
		t.Errorf("multicast event names/values wrong")
	}
	for _, e := range []EventType{EventUser, EventInternal, 20, 1000, -1} {
		if got := e.String(); got != "UNKNOWN EVENT" {
			t.Errorf("%d: %q, want UNKNOWN EVENT", int(e), got)
		}
	}
}

func TestConstants(t *testing.T) {
	if PS_IPOIB != 0x2 || PS_TCP != 0x106 || PS_UDP != 0x111 || PS_IB != 0x13f {
		t.Error("port space values")
	}
	if JoinMCAttrAddress != 1 || JoinMCAttrJoinFlags != 2 || JoinMCAttrReserved != 4 ||
		MCJoinFlagFullMember != 0 || MCJoinFlagSendOnlyFullMember != 1 || MCJoinFlagReserved != 2 {
		t.Error("join attribute values")
	}
	if _, err := CreateID(nil, nil, PortSpace(0x999)); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("bad port space: %v", err)
	}
}

// TestJoinValidationOrder pins DESIGN §3's checks and their order.
func TestJoinValidationOrder(t *testing.T) {
	_, bound := newID(t, PS_UDP)
	ch, err := CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	unbound, _ := CreateID(ch, nil, PS_UDP)
	wild, _ := CreateID(ch, nil, PS_UDP)
	if err := wild.BindAddr(UDPAddr(netip.IPv4Unspecified())); err != nil {
		t.Fatal(err)
	}
	tcp, _ := CreateID(ch, nil, PS_TCP)
	if err := tcp.BindAddr(lo); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unbound.Destroy(); wild.Destroy(); tcp.Destroy(); ch.Close() })

	g := randGroup()
	const A, F = JoinMCAttrAddress, JoinMCAttrJoinFlags
	cases := []struct {
		name  string
		id    *ID
		attr  *JoinMCAttrEx
		errno syscall.Errno
		says  string // in the error's text, when set: the cause in words
	}{
		{"nil attr", bound, nil, syscall.EINVAL, ""},
		{"reserved bit, everything else wrong", unbound, &JoinMCAttrEx{CompMask: 4, JoinFlags: 7}, syscall.EOPNOTSUPP, ""},
		{"mask 7", bound, &JoinMCAttrEx{CompMask: 7, Addr: g}, syscall.EOPNOTSUPP, ""},
		{"mask 0xfffffff8", bound, &JoinMCAttrEx{CompMask: 0xfffffff8, Addr: g}, syscall.EOPNOTSUPP, ""},
		{"no address bit", bound, &JoinMCAttrEx{CompMask: F, Addr: g}, syscall.EINVAL, "lacks JoinMCAttrAddress, so Addr"},
		{"no address bit, no address", bound, &JoinMCAttrEx{CompMask: F}, syscall.EINVAL, "no address (comp_mask 0x2 lacks JoinMCAttrAddress)"},
		{"no join flags bit", bound, &JoinMCAttrEx{CompMask: A, Addr: g}, syscall.EINVAL, "lacks JoinMCAttrJoinFlags"},
		{"flags 2", bound, &JoinMCAttrEx{CompMask: A | F, JoinFlags: 2, Addr: g}, syscall.EINVAL, "join flags 2: want MCJoinFlagFullMember or MCJoinFlagSendOnlyFullMember"},
		{"flags max", bound, &JoinMCAttrEx{CompMask: A | F, JoinFlags: 0xffffffff, Addr: g}, syscall.EINVAL, ""},
		{"nil address", bound, &JoinMCAttrEx{CompMask: A | F}, syscall.EINVAL, ""},
		{"typed nil address", bound, &JoinMCAttrEx{CompMask: A | F, Addr: (*net.UDPAddr)(nil)}, syscall.EINVAL, ""},
		{"unix address", bound, &JoinMCAttrEx{CompMask: A | F, Addr: &net.UnixAddr{Name: "x", Net: "unix"}}, syscall.EINVAL, ""},
		{"unbound id", unbound, &JoinMCAttrEx{CompMask: A | F, Addr: g}, syscall.EINVAL, ""},
		{"wildcard-bound id (no device)", wild, &JoinMCAttrEx{CompMask: A | F, Addr: g}, syscall.EINVAL, ""},
		{"PS_TCP id", tcp, &JoinMCAttrEx{CompMask: A | F, Addr: g}, syscall.EINVAL, ""},
		{"zero group", bound, &JoinMCAttrEx{CompMask: A | F, Addr: UDPAddr(netip.IPv4Unspecified())}, syscall.EINVAL, ""},
		{"zero IPv6 group", bound, &JoinMCAttrEx{CompMask: A | F, Addr: UDPAddr(netip.IPv6Unspecified())}, syscall.EINVAL, ""},
		{"loopback group", bound, &JoinMCAttrEx{CompMask: A | F, Addr: lo}, syscall.EINVAL, ""},
		{"AF_IB on RoCE", bound, &JoinMCAttrEx{CompMask: A | F, Addr: &IBAddr{PKey: 0xffff}}, ENOTSUPP, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.id.JoinMulticastEx(c.attr, nil)
			wantErrno(t, err, c.errno)
			if c.says != "" && (err == nil || !strings.Contains(err.Error(), c.says)) {
				t.Errorf("error %q does not say %q", err, c.says)
			}
		})
	}
	wantErrno(t, bound.JoinMulticast(nil, nil), syscall.EINVAL)
	wantErrno(t, unbound.JoinMulticast(g, nil), syscall.EINVAL)
	// Nothing was queued and nothing can be left.
	if n := bound.Channel().Len(); n != 0 {
		t.Errorf("%d events queued by failed joins", n)
	}
	wantErrno(t, bound.LeaveMulticast(g), syscall.EADDRNOTAVAIL)
}

func TestJoinEventContents(t *testing.T) {
	ch, id := newID(t, PS_UDP)
	g := randGroup()
	type key struct{ n int }
	ctx := &key{7}
	ev := join(t, id, g, MCJoinFlagFullMember, ctx)
	defer id.LeaveMulticast(g)
	defer ev.Ack()
	if ev.ID != id || ev.Status != 0 || ev.Param.PrivateData != ctx {
		t.Errorf("event id/status/context: %v %d %v", ev.ID == id, ev.Status, ev.Param.PrivateData)
	}
	p := ev.Param
	wantGID := netip.AddrFrom16(g.AddrPort().Addr().As16()).As16()
	if p.QPNum != 0xffffff || p.QKey != 0x01234567 || !p.AHAttr.IsGlobal || p.AHAttr.GRH.DGID != wantGID ||
		p.AHAttr.DLID != 0 || p.AHAttr.SL != 0 || p.AHAttr.GRH.HopLimit != 64 || p.AHAttr.GRH.TrafficClass != 0 ||
		p.AHAttr.GRH.FlowLabel != 0 || p.AHAttr.PortNum != 1 || p.AHAttr.StaticRate != 0 {
		t.Errorf("ud param %+v", p)
	}
	if s := p.AHAttr.GRH.DGID.String(); s != "::ffff:"+g.IP.String() {
		t.Errorf("dgid %s", s)
	}
	if ch.Len() != 0 {
		t.Errorf("more than one event per join")
	}
}

// TestAttachOnRetrieval: the QP is attached when the JOIN event is
// retrieved, unless the join is send-only; the leave detaches it.
func TestAttachOnRetrieval(t *testing.T) {
	for _, sendOnly := range []bool{false, true} {
		t.Run(fmt.Sprint("sendOnly=", sendOnly), func(t *testing.T) {
			_, id := newID(t, PS_UDP)
			withQP(t, id, 1, 64, 0)
			g := randGroup()
			flags := MCJoinFlagFullMember
			if sendOnly {
				flags = MCJoinFlagSendOnlyFullMember
			}
			ev := join(t, id, g, flags, nil)
			ev.Ack()
			mgid := ev.Param.AHAttr.GRH.DGID
			// Attaching again is idempotent; detaching a group the QP is
			// not attached to is EINVAL: that tells whether it was attached.
			err := id.QP().DetachMcast(mgid, 0)
			if sendOnly {
				wantErrno(t, err, syscall.EINVAL)
			} else {
				if err != nil {
					t.Fatalf("full member QP not attached: %v", err)
				}
				if err := id.QP().AttachMcast(mgid, 0); err != nil {
					t.Fatal(err)
				}
			}
			if err := id.LeaveMulticast(g); err != nil {
				t.Fatal(err)
			}
			wantErrno(t, id.QP().DetachMcast(mgid, 0), syscall.EINVAL)
		})
	}
}

// TestAttachFailureBecomesError: a failed attach turns the JOIN event into
// MULTICAST_ERROR with status -1 and its UD parameters; the join can still
// be left.
func TestAttachFailureBecomesError(t *testing.T) {
	_, id := newID(t, PS_UDP)
	withQP(t, id, 1, 64, 0)
	// Linux accepts a unicast "group"; its MGID is not multicast, so the
	// attach fails with EINVAL.
	g := UDPAddr(netip.MustParseAddr("10.200.1.2"))
	err := id.JoinMulticastEx(&JoinMCAttrEx{CompMask: 3, Addr: g}, "c")
	if err != nil {
		t.Fatal(err)
	}
	ev, err := id.Channel().GetEvent(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if ev.Event != EventMulticastError || ev.Status != -1 || !errors.Is(ev.Err, syscall.EINVAL) || ev.Param.PrivateData != "c" {
		t.Errorf("got %v status %d err %v ctx %v", ev.Event, ev.Status, ev.Err, ev.Param.PrivateData)
	}
	// librdmacm keeps the UD parameters of the failed JOIN event.
	if p := ev.Param; p.QPNum != MulticastQPN || p.QKey != UDPQKey || p.AHAttr.GRH.DGID != verbs.GID(netip.MustParseAddr("::ffff:10.200.1.2").As16()) {
		t.Errorf("UD params of the MULTICAST_ERROR: qpn %#x qkey %#x dgid %v, want the JOIN's", p.QPNum, p.QKey, p.AHAttr.GRH.DGID)
	}
	ev.Ack()
	if err := id.LeaveMulticast(g); err != nil {
		t.Errorf("leave after MULTICAST_ERROR: %v", err)
	}
}

func TestLeaveRules(t *testing.T) {
	_, id := newID(t, PS_UDP)
	g := randGroup()
	wantErrno(t, id.LeaveMulticast(g), syscall.EADDRNOTAVAIL)
	wantErrno(t, id.LeaveMulticast(nil), syscall.EINVAL)
	join(t, id, g, MCJoinFlagFullMember, 1).Ack()
	join(t, id, g, MCJoinFlagFullMember, 2).Ack()
	// The port is part of the address.
	withPort := &net.UDPAddr{IP: g.IP, Port: 9}
	wantErrno(t, id.LeaveMulticast(withPort), syscall.EADDRNOTAVAIL)
	if err := id.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
	if err := id.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, id.LeaveMulticast(g), syscall.EADDRNOTAVAIL)
	// A join on another port is its own record.
	join(t, id, withPort, MCJoinFlagFullMember, 3).Ack()
	wantErrno(t, id.LeaveMulticast(g), syscall.EADDRNOTAVAIL)
	if err := id.LeaveMulticast(withPort); err != nil {
		t.Fatal(err)
	}
}

// TestLeaveBeforeEvent: an unread JOIN event of a left join is never delivered.
func TestLeaveBeforeEvent(t *testing.T) {
	ch, id := newID(t, PS_UDP)
	g := randGroup()
	if err := id.JoinMulticast(g, nil); err != nil {
		t.Fatal(err)
	}
	if ch.Len() != 1 {
		t.Fatalf("%d events queued", ch.Len())
	}
	if err := id.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
	_, err := ch.TryGetEvent()
	wantErrno(t, err, syscall.EAGAIN)
}

// TestLeaveWaitsForAck: Leave blocks until the retrieved event is acked.
func TestLeaveWaitsForAck(t *testing.T) {
	_, id := newID(t, PS_UDP)
	g := randGroup()
	ev := join(t, id, g, MCJoinFlagFullMember, nil)
	var acked atomic.Bool
	go func() {
		time.Sleep(150 * time.Millisecond)
		acked.Store(true)
		ev.Ack()
	}()
	if err := id.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
	if !acked.Load() {
		t.Fatal("leave returned before the event was acked")
	}
	wantErrno(t, ev.Ack(), syscall.EINVAL) // second ack
}

// TestDestroyWaitsForAck: Destroy blocks until every retrieved event is acked.
func TestDestroyWaitsForAck(t *testing.T) {
	ch, _ := CreateEventChannel()
	id, _ := CreateID(ch, nil, PS_UDP)
	if err := id.BindAddr(lo); err != nil {
		t.Fatal(err)
	}
	ev := join(t, id, randGroup(), MCJoinFlagFullMember, nil)
	if err := id.JoinMulticast(randGroup(), nil); err != nil { // left unread: purged by Destroy
		t.Fatal(err)
	}
	wantErrno(t, ch.Close(), syscall.EBUSY)
	var acked atomic.Bool
	go func() {
		time.Sleep(150 * time.Millisecond)
		acked.Store(true)
		ev.Ack()
	}()
	if err := id.Destroy(); err != nil {
		t.Fatal(err)
	}
	if !acked.Load() {
		t.Fatal("destroy returned before the event was acked")
	}
	if ch.Len() != 0 {
		t.Errorf("unread events of a destroyed id remain: %d", ch.Len())
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestChannelErrors(t *testing.T) {
	ch, _ := CreateEventChannel()
	ch.SetNonblocking(true)
	_, err := ch.GetEvent(context.Background())
	wantErrno(t, err, syscall.EAGAIN)
	ch.SetNonblocking(false)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := ch.GetEvent(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("blocking get on empty channel: %v", err)
	}
	var nilEv *Event
	wantErrno(t, nilEv.Ack(), syscall.EINVAL)
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSyncID: with a nil channel, calls wait for their event.
func TestSyncID(t *testing.T) {
	id, err := CreateID(nil, nil, PS_UDP)
	if err != nil {
		t.Fatal(err)
	}
	defer id.Destroy()
	g := randGroup()
	if err := id.ResolveAddr(lo, g, time.Second); err != nil {
		t.Fatal(err)
	}
	if ev := id.Event(); ev == nil || ev.Event != EventAddrResolved {
		t.Fatalf("parked event %v", ev)
	}
	if err := id.JoinMulticast(g, "sync"); err != nil {
		t.Fatal(err)
	}
	ev := id.Event()
	if ev == nil || ev.Event != EventMulticastJoin || ev.Param.PrivateData != "sync" {
		t.Fatalf("parked event %v", ev)
	}
	// Leave acks the parked JOIN event instead of waiting forever.
	done := make(chan error, 1)
	go func() { done <- id.LeaveMulticast(g) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("leave after a synchronous join hangs")
	}
	// A failing join on a sync id returns the event's errno.
	u := UDPAddr(netip.MustParseAddr("10.201.0.1"))
	if err := id.CreateQP(nil, &verbs.QPInitAttr{Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}}); err != nil {
		t.Fatal(err)
	}
	defer id.DestroyQP()
	wantErrno(t, id.JoinMulticast(u, nil), syscall.EPERM) // status -1 → errno 1, as librdmacm
	id.LeaveMulticast(u)
}

func TestResolveAndBindErrors(t *testing.T) {
	ch, _ := CreateEventChannel()
	defer ch.Close()
	id, _ := CreateID(ch, nil, PS_UDP)
	defer id.Destroy()
	wantErrno(t, id.ResolveAddr(nil, nil, time.Second), syscall.EINVAL)
	wantErrno(t, id.BindAddr(nil), syscall.EINVAL)
	// An address no interface owns.
	wantErrno(t, id.BindAddr(UDPAddr(netip.MustParseAddr("198.51.100.77"))), syscall.EADDRNOTAVAIL)
	if err := id.BindAddr(lo); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, id.BindAddr(lo), syscall.EINVAL) // already bound
	if id.DeviceName() != "rxe_lo" {
		t.Errorf("device %q", id.DeviceName())
	}
}

// TestCreateQP: the QP is UD, in RTS, with the id's Q_Key; flags pass through.
func TestCreateQP(t *testing.T) {
	_, id := newID(t, PS_UDP)
	wantErrno(t, id.CreateQP(nil, nil), syscall.EINVAL)
	withQP(t, id, 0, 64, verbs.CreateBlockSelfMcastLB)
	qp := id.QP()
	a := qp.Query()
	if qp.Type() != verbs.QPTypeUD || a.State != verbs.QPSRTS || a.QKey != UDPQKey || a.PortNum != 1 {
		t.Errorf("qp %v %+v", qp.Type(), a)
	}
	if qp.CreateFlags() != verbs.CreateBlockSelfMcastLB {
		t.Errorf("create flags %v", qp.CreateFlags())
	}
	wantErrno(t, id.CreateQP(nil, &verbs.QPInitAttr{}), syscall.EINVAL) // second QP
	// An IPoIB id binds only an InfiniBand device's address (the kernel's
	// cma_acquire_dev_by_src_ip); lo's device is RoCE.
	ch, err := CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ipoib, err := CreateID(ch, nil, PS_IPOIB)
	if err != nil {
		t.Fatal(err)
	}
	defer ipoib.Destroy()
	wantErrno(t, ipoib.BindAddr(lo), syscall.EINVAL)
}

// TestDataPath: a full member receives what a send-only member sends over
// real RoCEv2 on lo; the send-only member receives nothing.
func TestDataPath(t *testing.T) {
	g := randGroup()
	_, rx := newID(t, PS_UDP)
	_, tx := newID(t, PS_UDP)
	rmr := withQP(t, rx, 4, 40+128, 0)
	tmr := withQP(t, tx, 4, 40+128, 0)
	rev := join(t, rx, g, MCJoinFlagFullMember, nil)
	rev.Ack()
	tev := join(t, tx, g, MCJoinFlagSendOnlyFullMember, nil)
	ah, err := tx.PD().CreateAH(&tev.Param.AHAttr)
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Destroy()
	tev.Ack()
	msg := []byte("softrdma says hello over RoCEv2")
	copy(tmr.Buf()[:len(msg)], msg)
	qp := tx.QP()
	for i := 0; i < 3; i++ {
		wr := verbs.SendWR{WRID: 9, SGList: []verbs.SGE{tmr.SGE(0, len(msg))}, Opcode: verbs.WRSendWithImm,
			ImmData: qp.Num(), Flags: verbs.SendSignaled,
			UD: verbs.UDWR{AH: ah, RemoteQPN: MulticastQPN, RemoteQKey: UDPQKey}}
		if err := qp.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		wc, err := tx.GetSendComp(ctxT(t))
		if err != nil || wc.Status != verbs.WCSuccess || wc.WRID != 9 {
			t.Fatalf("send completion %+v %v", wc, err)
		}
	}
	for i := 0; i < 3; i++ {
		wc, err := rx.GetRecvComp(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if wc.Status != verbs.WCSuccess || wc.ByteLen != uint32(40+len(msg)) || wc.SrcQP != qp.Num() ||
			wc.Flags != verbs.WCGRH|verbs.WCWithImm || wc.ImmData != qp.Num() || wc.QPNum != rx.QP().Num() {
			t.Fatalf("wc %+v", wc)
		}
		b := rmr.Buf()[int(wc.WRID)*(40+128):]
		if string(b[40:40+len(msg)]) != string(msg) {
			t.Errorf("payload %q", b[40:40+len(msg)])
		}
		if b[20] != 0x45 || netip.AddrFrom4([4]byte(b[32:36])) != netip.MustParseAddr("127.0.0.1") ||
			netip.AddrFrom4([4]byte(b[36:40])) != g.AddrPort().Addr() {
			t.Errorf("GRH area % x", b[:40])
		}
	}
	// The send-only member is not attached: nothing arrives there.
	time.Sleep(100 * time.Millisecond)
	if n := tx.RecvCQ().Len(); n != 0 {
		t.Errorf("send-only member received %d datagrams", n)
	}
	if err := rx.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
	if err := tx.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentJoinLeave hammers join/leave/get/ack/destroy from many
// goroutines (run with -race).
func TestConcurrentJoinLeave(t *testing.T) {
	ch, _ := CreateEventChannel()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var acks atomic.Int64
	go func() {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			ev, err := ch.GetEvent(ctx)
			cancel()
			if err == nil {
				ev.Ack()
				acks.Add(1)
				continue
			}
			select {
			case <-stop:
				close(stop)
				return
			default:
			}
		}
	}()
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := CreateID(ch, nil, PS_UDP)
			if err != nil {
				t.Error(err)
				return
			}
			if err := id.BindAddr(lo); err != nil {
				t.Error(err)
				return
			}
			for i := 0; i < 20; i++ {
				g := randGroup()
				if err := id.JoinMulticast(g, i); err != nil {
					t.Error(err)
					return
				}
				if i%3 == 0 {
					continue // left to Destroy
				}
				if err := id.LeaveMulticast(g); err != nil {
					t.Error(err)
					return
				}
			}
			if err := id.Destroy(); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	stop <- struct{}{}
	<-stop
	// Every id is gone: its unread events were purged, its read ones acked
	// (Destroy waited for them), so the channel is empty and closes.
	if n := ch.Len(); n != 0 {
		t.Errorf("%d events left after every id was destroyed (%d were read and acked)", n, acks.Load())
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestIDCQChannels: the CQs CreateQP makes have completion channels of
// their own with the id as their context (librdmacm's ucma_create_cqs),
// and GetRecvComp waits through the receive channel; CQs the program
// gives have none from the id.
func TestIDCQChannels(t *testing.T) {
	_, id := newID(t, PS_UDP)
	withQP(t, id, 1, 64, 0)
	sch, rch := id.SendCQChannel(), id.RecvCQChannel()
	if sch == nil || rch == nil || sch == rch {
		t.Fatalf("channels %p %p, want two", sch, rch)
	}
	if id.SendCQ().Channel() != sch || id.RecvCQ().Channel() != rch || id.RecvCQ().UserContext() != id {
		t.Errorf("CQs %v %v, context %v", id.SendCQ().Channel(), id.RecvCQ().Channel(), id.RecvCQ().UserContext())
	}
	_, other := newID(t, PS_UDP)
	ctx := other.Verbs()
	cq, err := ctx.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.CreateQP(nil, &verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}}); err != nil {
		t.Fatal(err)
	}
	if other.SendCQChannel() != nil || other.RecvCQChannel() != nil {
		t.Error("channels for CQs the program gave")
	}
	other.DestroyQP()
	cq.Destroy()
}
