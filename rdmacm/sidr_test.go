package rdmacm

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/provider/rxe"
	"github.com/softrdma/softrdma/test/nettest"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
	"github.com/softrdma/softrdma/wire"
)

// listener returns an id of ps listening on 127.0.0.1 (a free port) and
// its channel.
func listener(t *testing.T, ps PortSpace) (*EventChannel, *ID, uint16) {
	t.Helper()
	ch, id := newID(t, ps)
	if err := id.Listen(8); err != nil {
		t.Fatal(err)
	}
	return ch, id, id.SrcAddr().(*net.UDPAddr).AddrPort().Port()
}

// activeTo returns an id of ps whose route to 127.0.0.1:port is resolved.
func activeTo(t *testing.T, ps PortSpace, port uint16) (*EventChannel, *ID) {
	t.Helper()
	ch, err := CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	id, err := CreateID(ch, "active", ps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		id.Destroy()
		ch.Close()
	})
	dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port))
	if err := id.ResolveAddr(nil, dst, time.Second); err != nil {
		t.Fatal(err)
	}
	sidrNext(t, ch, EventAddrResolved).Ack()
	if err := id.ResolveRoute(time.Second); err != nil {
		t.Fatal(err)
	}
	sidrNext(t, ch, EventRouteResolved).Ack()
	return ch, id
}

// sidrNext returns the channel's next event, which must be of type want.
func sidrNext(t *testing.T, ch *EventChannel, want EventType) *Event {
	t.Helper()
	ev, err := ch.GetEvent(ctxT(t))
	if err != nil {
		t.Fatalf("waiting for %v: %v", want, err)
	}
	if ev.Event != want {
		t.Fatalf("event %v status %d, want %v", ev.Event, ev.Status, want)
	}
	return ev
}

func privateData(t *testing.T, ev *Event, n int, prefix string) {
	t.Helper()
	pd, ok := ev.Param.PrivateData.([]byte)
	if !ok || len(pd) != n || int(ev.Param.PrivateDataLen) != n || !bytes.HasPrefix(pd, []byte(prefix)) {
		t.Fatalf("%v: private data %q (len %d), want %d bytes starting %q", ev.Event, pd, ev.Param.PrivateDataLen, n, prefix)
	}
}

// TestUDConnectAccept: CONNECT_REQUEST on a new id with the request's
// private data and the active side's address; Accept's answer gives the
// active side ESTABLISHED with the QP number, Q_Key, address handle and
// private data, and a datagram sent with them arrives.
func TestUDConnectAccept(t *testing.T) {
	lch, lid, port := listener(t, PS_UDP)
	ach, aid := activeTo(t, PS_UDP, port)
	amr := withQP(t, aid, 1, 64, 0)
	if err := aid.Connect(&ConnParam{PrivateData: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	req := sidrNext(t, lch, EventConnectRequest)
	child := req.ID
	if req.ListenID != lid || child == lid || child.Context() != lid.Context() {
		t.Fatalf("listen id %p child %p (listener %p)", req.ListenID, child, lid)
	}
	privateData(t, req, UDConnectPrivateDataMax, "hello")
	if got, want := child.DstAddr().String(), aid.SrcAddr().String(); got != want {
		t.Errorf("child's peer %s, want %s", got, want)
	}
	if got, want := child.SrcAddr().String(), lid.SrcAddr().String(); got != want {
		t.Errorf("child's address %s, want %s", got, want)
	}
	t.Cleanup(func() { child.Destroy() })
	cmr := withQP(t, child, 1, 64+verbs.GRHLen, 0)
	if err := child.Accept(&ConnParam{PrivateData: []byte("welcome")}); err != nil {
		t.Fatal(err)
	}
	if err := child.Accept(nil); err == nil {
		t.Error("a second Accept succeeded")
	} else {
		wantErrno(t, err, syscall.EINVAL)
	}
	req.Ack()
	est := sidrNext(t, ach, EventEstablished)
	privateData(t, est, UDAcceptPrivateDataMax, "welcome")
	p := est.Param
	if p.QPNum != child.QP().Num() || p.QKey != UDPQKey || !p.AHAttr.IsGlobal ||
		p.AHAttr.GRH.DGID != wire.GIDFromAddr(netip.MustParseAddr("127.0.0.1")) {
		t.Fatalf("ESTABLISHED param %+v, want QPN %#x Q_Key %#x", p, child.QP().Num(), UDPQKey)
	}
	est.Ack()

	ah, err := aid.PD().CreateAH(&p.AHAttr)
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Destroy()
	copy(amr.Buf(), "datagram")
	if err := aid.PostUDSend(1, amr, 0, 8, verbs.SendSignaled, ah, p.QPNum); err != nil {
		t.Fatal(err)
	}
	wc, err := child.GetRecvComp(ctxT(t))
	if err != nil || wc.Status != verbs.WCSuccess || wc.SrcQP != aid.QP().Num() {
		t.Fatalf("receive: %+v %v", wc, err)
	}
	if got := string(cmr.Buf()[verbs.GRHLen : verbs.GRHLen+8]); got != "datagram" {
		t.Errorf("received %q", got)
	}
}

// TestUDConnectReject: Reject's private data reaches the active side with
// UNREACHABLE status IB_SIDR_REJECT (2), as the kernel reports it.
func TestUDConnectReject(t *testing.T) {
	lch, _, port := listener(t, PS_UDP)
	ach, aid := activeTo(t, PS_UDP, port)
	if err := aid.Connect(nil); err != nil {
		t.Fatal(err)
	}
	req := sidrNext(t, lch, EventConnectRequest)
	t.Cleanup(func() { req.ID.Destroy() })
	if err := req.ID.Reject(bytes.Repeat([]byte{1}, UDAcceptPrivateDataMax+1)); err == nil {
		t.Fatal("Reject took too much private data")
	} else {
		wantErrno(t, err, syscall.EINVAL)
	}
	if err := req.ID.Reject([]byte("go away")); err != nil {
		t.Fatal(err)
	}
	req.Ack()
	ev := sidrNext(t, ach, EventUnreachable)
	if ev.Status != mad.SIDRReject {
		t.Errorf("status %d, want %d", ev.Status, mad.SIDRReject)
	}
	privateData(t, ev, UDAcceptPrivateDataMax, "go away")
	ev.Ack()
}

// TestUDConnectNoListener: a request nobody listens for is answered
// UNSUPPORTED (1), as the kernel's CM answers it.
func TestUDConnectNoListener(t *testing.T) {
	// The answer comes from the RDMA CM of the process that reads the
	// request, and the kernel gives it to any socket of the user's on UDP
	// 4791: beside another test process with a device but no CM (one that
	// only uses verbs), it may be read there and dropped, and this
	// request waits out its resends. In a namespace of its own, only this
	// process reads it.
	if !testenv.InNetns(t) {
		return
	}
	_, lid, port := listener(t, PS_UDP)
	lid.Destroy()
	ach, aid := activeTo(t, PS_UDP, port)
	if err := aid.Connect(nil); err != nil {
		t.Fatal(err)
	}
	ev := sidrNext(t, ach, EventUnreachable)
	if ev.Status != mad.SIDRUnsupported {
		t.Errorf("status %d, want %d", ev.Status, mad.SIDRUnsupported)
	}
	ev.Ack()
}

// shortSIDR shortens the SIDR timing for a test.
func shortSIDR(t *testing.T, timeout time.Duration, retries int) {
	ot, or := sidrTimeout, sidrRetries
	sidrTimeout, sidrRetries = timeout, retries
	t.Cleanup(func() { sidrTimeout, sidrRetries = ot, or })
}

// TestUDConnectTimeout: a request never answered is sent 1+retries times,
// then UNREACHABLE -ETIMEDOUT (IB_CM_SIDR_REQ_ERROR).
func TestUDConnectTimeout(t *testing.T) {
	shortSIDR(t, 20*time.Millisecond, 3)
	lch, _, port := listener(t, PS_UDP)
	ach, aid := activeTo(t, PS_UDP, port)
	if err := aid.Connect(nil); err != nil {
		t.Fatal(err)
	}
	// The listener's application never answers: its request stays
	// unanswered, and the resends are duplicates that make no new id.
	req := sidrNext(t, lch, EventConnectRequest)
	t.Cleanup(func() { req.ID.Destroy() })
	ev := sidrNext(t, ach, EventUnreachable)
	if ev.Status != -int(syscall.ETIMEDOUT) {
		t.Errorf("status %d, want %d", ev.Status, -int(syscall.ETIMEDOUT))
	}
	ev.Ack()
	req.Ack()
	if n := lch.Len(); n != 0 {
		t.Errorf("%d more events for the listener after resent requests", n)
	}
}

// TestUDConnectDuplicate: a request resent after it was answered gets the
// same answer again and no second id.
func TestUDConnectDuplicate(t *testing.T) {
	lch, _, port := listener(t, PS_UDP)
	ach, aid := activeTo(t, PS_UDP, port)
	if err := aid.Connect(nil); err != nil {
		t.Fatal(err)
	}
	aid.mu.Lock()
	o := aid.soft().sidrOut
	aid.mu.Unlock()
	req := sidrNext(t, lch, EventConnectRequest)
	child := req.ID
	t.Cleanup(func() { child.Destroy() })
	s := aid.ch().cm.sidrOf()
	resend := func() {
		s.mu.Lock()
		g := s.gsis[o.cd]
		s.mu.Unlock()
		if g == nil {
			t.Fatal("QP1 closed")
		}
		if err := g.gsi.Send(0, wire.GIDFromAddr(o.dst), 0, 0, o.mad); err != nil {
			t.Fatal(err)
		}
	}
	resend() // unanswered: dropped
	if err := child.Accept(&ConnParam{QPNum: 0x123456}); err != nil {
		t.Fatal(err)
	}
	req.Ack()
	est := sidrNext(t, ach, EventEstablished)
	if est.Param.QPNum != 0x123456 {
		t.Errorf("QPN %#x, want the ConnParam's", est.Param.QPNum)
	}
	est.Ack()
	// Answered: answered again; a second answer the active side ignores.
	s.mu.Lock()
	in := s.passive[child.soft().sidrIn.key]
	s.mu.Unlock()
	resend()
	// Nothing may come of it: both channels are watched for a while.
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if lch.Len() != 0 || ach.Len() != 0 {
			t.Fatalf("a duplicate request made %d listener events, %d active events", lch.Len(), ach.Len())
		}
	}
	s.mu.Lock()
	kept := s.passive[in.key] == in
	s.mu.Unlock()
	if !kept {
		t.Error("the answered request was forgotten")
	}
}

// TestUDConnectForgedReply: a SIDR_REP with the request's ID from another
// address, or with another transaction ID, is dropped; the real answer
// is taken.
func TestUDConnectForgedReply(t *testing.T) {
	lch, _, port := listener(t, PS_UDP)
	ach, aid := activeTo(t, PS_UDP, port)
	if err := aid.Connect(nil); err != nil {
		t.Fatal(err)
	}
	aid.mu.Lock()
	o := aid.soft().sidrOut
	aid.mu.Unlock()
	cm := aid.ch().cm
	forge := func(src netip.Addr, tid uint64) {
		m := mad.NewCM(mad.AttrSIDRRep, tid)
		r := mad.SIDRRep(m)
		r.SetRequestID(o.reqID)
		r.SetServiceID(o.sid)
		r.SetQPN(0xBADBAD)
		r.SetQKey(UDPQKey)
		if !cm.sidrRep(&driver.GSIMAD{Src: src, Dst: o.dst, MAD: m}) {
			t.Fatal("a reply for the process's request ID was not taken (dropped)")
		}
	}
	forge(netip.MustParseAddr("10.9.9.9"), o.tid)
	forge(o.dst, o.tid+1)
	req := sidrNext(t, lch, EventConnectRequest)
	t.Cleanup(func() { req.ID.Destroy() })
	if err := req.ID.Accept(&ConnParam{QPNum: 0x42}); err != nil {
		t.Fatal(err)
	}
	req.Ack()
	est := sidrNext(t, ach, EventEstablished)
	if est.Param.QPNum != 0x42 {
		t.Errorf("QPN %#x: a forged reply was taken", est.Param.QPNum)
	}
	est.Ack()
}

// TestUDConnectErrors: the errnos of the calls on the wrong id.
func TestUDConnectErrors(t *testing.T) {
	_, tcp := newID(t, PS_TCP)
	wantErrno(t, tcp.Listen(1), syscall.EOPNOTSUPP)
	wantErrno(t, tcp.Connect(nil), syscall.EOPNOTSUPP)
	_, ud := newID(t, PS_UDP)
	wantErrno(t, ud.Connect(nil), syscall.EINVAL) // no route
	wantErrno(t, ud.Accept(nil), syscall.EINVAL)  // no request
	wantErrno(t, ud.Reject(nil), syscall.EINVAL)
	_, _, port := listener(t, PS_UDP)
	_, aid := activeTo(t, PS_UDP, port)
	wantErrno(t, aid.Connect(&ConnParam{PrivateData: make([]byte, UDConnectPrivateDataMax+1)}), syscall.EINVAL)
	_, l2 := newID(t, PS_UDP)
	if err := l2.Listen(1); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, l2.Listen(1), syscall.EINVAL) // listening already
}

// TestUDListenerDestroyed: a listener destroyed with a CONNECT_REQUEST
// unread takes the request's new id with it, which rejects the request.
func TestUDListenerDestroyed(t *testing.T) {
	lch, lid, port := listener(t, PS_UDP)
	ach, aid := activeTo(t, PS_UDP, port)
	if err := aid.Connect(nil); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	for lch.Len() == 0 { // poll: the request arrives
		if ctx.Err() != nil {
			t.Fatal("no CONNECT_REQUEST")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := lid.Destroy(); err != nil {
		t.Fatal(err)
	}
	ev := sidrNext(t, ach, EventUnreachable)
	if ev.Status != mad.SIDRReject {
		t.Errorf("status %d, want %d", ev.Status, mad.SIDRReject)
	}
	ev.Ack()
}

// TestUDListenWildcard: an id bound to the wildcard address listens on
// every device, and its request's id takes the address the request was
// sent to.
func TestUDListenWildcard(t *testing.T) {
	lch, err := CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	lid, err := CreateID(lch, nil, PS_UDP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		lid.Destroy()
		lch.Close()
	})
	if err := lid.Listen(1); err != nil { // idle: bound to 0.0.0.0 first
		t.Fatal(err)
	}
	port := lid.SrcAddr().(*net.UDPAddr).AddrPort().Port()
	ach, aid := activeTo(t, PS_UDP, port)
	if err := aid.Connect(nil); err != nil {
		t.Fatal(err)
	}
	req := sidrNext(t, lch, EventConnectRequest)
	t.Cleanup(func() { req.ID.Destroy() })
	if got := req.ID.SrcAddr().String(); got != net.JoinHostPort("127.0.0.1", fmt.Sprint(port)) {
		t.Errorf("the request's id is bound to %s", got)
	}
	if err := req.ID.Accept(&ConnParam{QPNum: 7}); err != nil {
		t.Fatal(err)
	}
	req.Ack()
	sidrNext(t, ach, EventEstablished).Ack()
}

// TestUDConnectVerbsOnlyPeer: a request for a service nobody listens on,
// read by a process with softrdma's device but no RDMA CM (one that only
// uses verbs, as perftest does), is answered UNSUPPORTED by its device,
// as the kernel's CM answers for the whole host; before, it was dropped
// and the requester waited out its resends. The peer is the only process
// of a second network namespace, so it is the one that reads the request.
func TestUDConnectVerbsOnlyPeer(t *testing.T) {
	const mode = "verbs-only-peer"
	if os.Getenv("SOFTRDMA_TEST_NETNS_CHILD") == mode {
		verbsOnlyPeer(t)
		return
	}
	if os.Geteuid() != 0 {
		testenv.Require(t, "needs root to create a network namespace")
	}
	sfx := fmt.Sprintf("%d", rand.IntN(1e6))
	ns, a, b := nettest.Prefix("srm")+"vo"+sfx, "srva"+sfx, "srvb"+sfx
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", args, err, out)
		}
	}
	ip("netns", "add", ns)
	t.Cleanup(func() { nettest.Delete(ns) })
	ip("link", "add", a, "type", "veth", "peer", "name", b, "netns", ns)
	t.Cleanup(func() { exec.Command("ip", "link", "del", a).Run() })
	ip("addr", "add", "10.78.0.1/24", "dev", a)
	ip("link", "set", a, "up")
	ip("-n", ns, "link", "set", "lo", "up")
	ip("-n", ns, "addr", "add", "10.78.0.2/24", "dev", b)
	ip("-n", ns, "link", "set", b, "up")

	peer, stdin := nettest.StartProcStdin(t, ns, "env", time.Minute, testenv.ChildEnv, "SOFTRDMA_TEST_NETNS_CHILD="+mode,
		"SOFTRDMA_TEST_PEER_IF="+b, os.Args[0], "-test.run=^TestUDConnectVerbsOnlyPeer$", "-test.v")
	peer.WaitLine("peer ready", 30*time.Second)
	defer func() {
		stdin.Close()
		peer.Wait(30 * time.Second)
		if !strings.Contains(peer.Output(), "--- PASS: ") {
			t.Errorf("verbs-only peer:\n%s", peer.Output())
		}
	}()

	// One request, no resend: a dropped request would end in -ETIMEDOUT.
	shortSIDR(t, 4*time.Second, 0) // its -ETIMEDOUT before ctxT's 5 s
	ch, err := CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	id, err := CreateID(ch, "active", PS_UDP)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		id.Destroy()
		ch.Close()
	}()
	src := UDPAddr(netip.MustParseAddr("10.78.0.1"))
	dst := net.UDPAddrFromAddrPort(netip.MustParseAddrPort("10.78.0.2:7471"))
	if err := id.ResolveAddr(src, dst, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	sidrNext(t, ch, EventAddrResolved).Ack()
	if err := id.ResolveRoute(time.Second); err != nil {
		t.Fatal(err)
	}
	sidrNext(t, ch, EventRouteResolved).Ack()
	if err := id.Connect(nil); err != nil {
		t.Fatal(err)
	}
	ev := sidrNext(t, ch, EventUnreachable)
	if ev.Status != mad.SIDRUnsupported {
		t.Errorf("status %d, want %d (UNSUPPORTED; %d is the request's timeout)", ev.Status, mad.SIDRUnsupported, -int(syscall.ETIMEDOUT))
	}
	ev.Ack()
}

// verbsOnlyPeer opens the device of the interface SOFTRDMA_TEST_PEER_IF
// through verbs alone, with a UD QP in RTS, says "peer ready" and holds it until
// standard input closes.
func verbsOnlyPeer(t *testing.T) {
	rdev, err := rxe.ForName(os.Getenv("SOFTRDMA_TEST_PEER_IF"))
	if err != nil {
		t.Fatal(err)
	}
	dev := rdev.Verbs()
	vctx, err := dev.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer vctx.Close()
	pd, err := vctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Dealloc()
	cq, err := vctx.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Destroy()
	qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTypeUD,
		Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Destroy()
	for _, m := range []struct {
		a    verbs.QPAttr
		mask verbs.QPAttrMask
	}{
		{verbs.QPAttr{State: verbs.QPSInit, PortNum: 1, QKey: 0x1234}, verbs.QPAttrState | verbs.QPAttrPKeyIdx | verbs.QPAttrPort | verbs.QPAttrQKey},
		{verbs.QPAttr{State: verbs.QPSRTR}, verbs.QPAttrState},
		{verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState | verbs.QPAttrSQPSN},
	} {
		if err := qp.Modify(&m.a, m.mask); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Println("peer ready")
	io.Copy(io.Discard, os.Stdin)
}
