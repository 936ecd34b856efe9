package rxe

import (
	"bytes"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

func TestDeviceBasics(t *testing.T) {
	d := loDev(t)
	if d.Name() != "rxe_lo" {
		t.Errorf("name %q", d.Name())
	}
	if d.Verbs() == nil || verbs.DeviceByName("rxe_lo") != d.Verbs() {
		t.Errorf("not registered with verbs")
	}
	pa, err := d.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	if pa.State != verbs.PortActive || pa.LinkLayer != verbs.LinkLayerEthernet || pa.NetdevMTU != 65536 ||
		pa.ActiveMTU != verbs.MTU4096 || pa.MaxMTU != verbs.MTU4096 {
		t.Errorf("port attr %+v", pa)
	}
	if _, err := d.QueryPort(2); !isErrno(err, syscall.EINVAL) {
		t.Errorf("port 2: %v", err)
	}
	tbl, err := d.GIDTable(1)
	if err != nil || len(tbl) == 0 {
		t.Fatalf("gid table %v %v", tbl, err)
	}
	if tbl[0].GID != wire.GIDFromAddr(netip.MustParseAddr("127.0.0.1")) || tbl[0].Type != verbs.GIDTypeRoCEv2 || tbl[0].Index != 0 {
		t.Errorf("gid 0 %+v", tbl[0])
	}
	a := d.Attr()
	if a.MaxMcastGrp != 16384 || a.MaxMcastQPAttach != 56 || a.MaxTotalMcastQP != 0x70000 || a.PhysPortCnt != 1 || a.NodeGUID == 0 {
		t.Errorf("attr %+v", a)
	}
	if d2, err := ForAddr(netip.MustParseAddr("127.0.0.1")); err != nil || d2 != d {
		t.Errorf("ForAddr 127.0.0.1: %v %v", d2, err)
	}
	if d2, err := ForAddr(netip.MustParseAddr("::ffff:127.0.0.5")); err != nil || d2 != d {
		t.Errorf("ForAddr ::ffff:127.0.0.5: %v %v", d2, err)
	}
	if _, err := ForAddr(netip.MustParseAddr("192.0.2.77")); !isErrno(err, syscall.EADDRNOTAVAIL) {
		t.Errorf("ForAddr non-local: %v", err)
	}
	if _, err := ForInterface(1 << 30); !isErrno(err, syscall.ENODEV) {
		t.Errorf("ForInterface unknown: %v", err)
	}
	if _, err := ForName("no-such-if0"); !isErrno(err, syscall.ENODEV) {
		t.Errorf("ForName unknown: %v", err)
	}
	if _, err := d.CreateQP(softverbs.DriverQPInit{Type: verbs.QPTypeRC}); !isErrno(err, syscall.EOPNOTSUPP) {
		t.Errorf("RC QP: %v", err)
	}
}

func TestMulticastExchange(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	const qkey = 0x01234567
	rxA, rxB := newFakeRx(), newFakeRx()
	a := newQP(t, d, rxA, 0, qkey)
	b := newQP(t, d, rxB, 0, qkey)
	if a.QPN() == b.QPN() {
		t.Fatalf("same QPN %#x", a.QPN())
	}
	if err := b.AttachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	ah := mcastAH(g)
	ah.GRH.TrafficClass = 0x20
	payload := []byte("hello, multicast world!") // 23 bytes: pad 1
	if err := a.Send(&softverbs.UDSend{AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: qkey, Imm: 0xdeadbeef, HasImm: true, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	got := rxB.wait(t)
	if !bytes.Equal(got.payload, payload) || got.srcQP != a.QPN() || !got.hasImm || got.imm != 0xdeadbeef {
		t.Errorf("delivery %+v", got)
	}
	grh := got.grh
	if !bytes.Equal(grh[:20], make([]byte, 20)) || grh[20] != 0x45 {
		t.Errorf("grh head % x", grh[:21])
	}
	ip := wire.IPv4(grh[20:40])
	if ip.Src() != netip.MustParseAddr("127.0.0.1") || ip.Dst() != g || ip.TTL() != 64 || ip.TOS() != 0x20 ||
		!ip.DF() || ip.ID() != 0 || ip.Protocol() != 17 || ip.Checksum() != ip.CalculateChecksum() ||
		int(ip.TotalLength()) != 20+8+wire.UDLen(len(payload), true) {
		t.Errorf("grh ip header % x", grh[20:40])
	}
	if !bytes.Equal(grh[32:36], []byte{127, 0, 0, 1}) || !bytes.Equal(grh[36:40], g.AsSlice()) {
		t.Errorf("grh addresses % x", grh[32:40])
	}
	// Exactly one copy (lo must not duplicate), and the sender, not
	// attached, gets nothing.
	rxB.none(t, 150*time.Millisecond)
	rxA.none(t, 0)

	// Without immediate, zero-length payload.
	if err := a.Send(&softverbs.UDSend{AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: qkey}); err != nil {
		t.Fatal(err)
	}
	got = rxB.wait(t)
	if len(got.payload) != 0 || got.hasImm || got.srcQP != a.QPN() {
		t.Errorf("empty delivery %+v", got)
	}
	eventually(t, "two deliveries counted", func() bool { return d.Counters().Get(softverbs.Delivered) == 2 })
	c := d.Counters()
	if c.Get(softverbs.SentPkts) != 2 || c.Get(softverbs.Delivered) != 2 || c.Get(softverbs.RcvdPkts) != 2 || c.Get(softverbs.ICRCErrors) != 0 {
		t.Errorf("counters %+v", c)
	}
	qc, ok := d.QPCounters(a.QPN())
	if !ok || qc.Get(softverbs.SentPkts) != 2 || qc.Get(softverbs.SentBytes) != uint64(wire.UDLen(len(payload), true)+wire.UDLen(0, false)) {
		t.Errorf("qp counters %+v %v", qc, ok)
	}
	if qc, _ := d.QPCounters(b.QPN()); qc.Get(softverbs.Delivered) != 2 {
		t.Errorf("receiver counters %+v", qc)
	}
}

func TestSelfLoopbackBlocking(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	const qkey = 0x11
	rxBlk, rxOther := newFakeRx(), newFakeRx()
	blk := newQP(t, d, rxBlk, verbs.CreateBlockSelfMcastLB, qkey)
	other := newQP(t, d, rxOther, 0, qkey)
	for _, q := range []*tqp{blk, other} {
		if err := q.AttachMcast(mgid(g), 0); err != nil {
			t.Fatal(err)
		}
	}
	send := func(q *tqp, s string) {
		t.Helper()
		if err := q.Send(&softverbs.UDSend{AH: mcastAH(g), RemoteQPN: verbs.MulticastQPN, RemoteQKey: qkey, Payload: []byte(s)}); err != nil {
			t.Fatal(err)
		}
	}
	send(blk, "from blocking qp")
	if got := rxOther.wait(t); string(got.payload) != "from blocking qp" || got.srcQP != blk.QPN() {
		t.Errorf("other got %+v", got)
	}
	eventually(t, "self-loopback drop counted", func() bool { return d.Counters().Get(softverbs.SelfLoopbackDrops) == 1 })
	rxBlk.none(t, 100*time.Millisecond)
	if qc, _ := d.QPCounters(blk.QPN()); qc.Get(softverbs.SelfLoopbackDrops) != 1 {
		t.Errorf("blocking qp counters %+v", qc)
	}

	// The non-blocking QP receives its own datagram (rxe behaviour), and
	// the blocking QP receives other QPs' datagrams.
	send(other, "from other qp")
	for _, rx := range []*fakeRx{rxOther, rxBlk} {
		if got := rx.wait(t); string(got.payload) != "from other qp" || got.srcQP != other.QPN() {
			t.Errorf("got %+v", got)
		}
	}
}

func TestQKeyMismatch(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	rxGood, rxBad := newFakeRx(), newFakeRx()
	sender := newQP(t, d, newFakeRx(), 0, 0x42)
	bad := newQP(t, d, rxBad, 0, 0x43)
	good := newQP(t, d, rxGood, 0, 0x42)
	for _, q := range []*tqp{bad, good} {
		if err := q.AttachMcast(mgid(g), 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := sender.Send(&softverbs.UDSend{AH: mcastAH(g), RemoteQPN: verbs.MulticastQPN, RemoteQKey: 0x42, Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	rxGood.wait(t)
	eventually(t, "q_key violation and delivery counted", func() bool {
		c := d.Counters()
		return c.Get(softverbs.QKeyViolations) == 1 && c.Get(softverbs.Delivered) == 1
	})
	rxBad.none(t, 50*time.Millisecond)
	if qc, _ := d.QPCounters(bad.QPN()); qc.Get(softverbs.QKeyViolations) != 1 || qc.Get(softverbs.Delivered) != 0 {
		t.Errorf("bad qp counters %+v", qc)
	}
	if qc, _ := d.QPCounters(good.QPN()); qc.Get(softverbs.QKeyViolations) != 0 || qc.Get(softverbs.Delivered) != 1 {
		t.Errorf("good qp counters %+v", qc)
	}
}

func TestOversizedSend(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	rx := newFakeRx()
	q := newQP(t, d, rx, 0, 1)
	if err := q.AttachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	pa, _ := d.QueryPort(1)
	mtu := pa.ActiveMTU.Bytes()
	if err := q.Send(&softverbs.UDSend{AH: mcastAH(g), RemoteQPN: verbs.MulticastQPN, RemoteQKey: 1, Payload: make([]byte, mtu+1)}); err != nil {
		t.Fatalf("oversized send must complete: %v", err)
	}
	c := d.Counters()
	if c.Get(softverbs.OversizedSendDrops) != 1 || c.Get(softverbs.SentPkts) != 0 {
		t.Errorf("counters %+v", c)
	}
	rx.none(t, 150*time.Millisecond)
	// Exactly the MTU goes out.
	if err := q.Send(&softverbs.UDSend{AH: mcastAH(g), RemoteQPN: verbs.MulticastQPN, RemoteQKey: 1, Payload: make([]byte, mtu)}); err != nil {
		t.Fatal(err)
	}
	if got := rx.wait(t); len(got.payload) != mtu {
		t.Errorf("payload %d", len(got.payload))
	}
}

func TestSendErrors(t *testing.T) {
	d := loDev(t)
	q := newQP(t, d, newFakeRx(), 0, 1)
	g := randGroup()
	ah := mcastAH(g)
	ah.IsGlobal = false
	if err := q.Send(&softverbs.UDSend{AH: ah, RemoteQPN: verbs.MulticastQPN}); !isErrno(err, syscall.EINVAL) {
		t.Errorf("non-global AH: %v", err)
	}
	ah = mcastAH(g)
	ah.GRH.SGIDIndex = 200
	if err := q.Send(&softverbs.UDSend{AH: ah, RemoteQPN: verbs.MulticastQPN}); !isErrno(err, syscall.EINVAL) {
		t.Errorf("bad sgid index: %v", err)
	}
}

// TestQPNs runs in a network namespace of its own with lo and a dummy
// veth interface, so that the second device's interface is there on any
// host.
func TestQPNs(t *testing.T) {
	if !inNetns(t) {
		return
	}
	ipCmd(t, "link", "set", "lo", "up")
	ipCmd(t, "link", "add", "qpn0", "type", "veth", "peer", "name", "qpn1")
	ipCmd(t, "link", "set", "qpn0", "up")
	ipCmd(t, "addr", "add", "10.78.0.1/24", "dev", "qpn0")
	d := loDev(t)
	seen := map[uint32]bool{}
	ports := map[uint32]bool{}
	for i := 0; i < 300; i++ {
		q, err := d.CreateQP(softverbs.DriverQPInit{Type: verbs.QPTypeUD})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { q.Destroy() })
		n := q.QPN()
		if seen[n] || n&0xFF == 0 || n > 0xFFFFFF || n == verbs.MulticastQPN {
			t.Fatalf("bad or duplicate QPN %#x", n)
		}
		seen[n] = true
		ports[n>>8] = true
	}
	if len(ports) != 2 {
		t.Errorf("300 QPs use %d send sockets, want 2", len(ports))
	}
	// A device of another interface gets other QPNs (its own send socket).
	d2, err := ForName("qpn0")
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	q2, err := d2.CreateQP(softverbs.DriverQPInit{Type: verbs.QPTypeUD})
	if err != nil {
		t.Fatal(err)
	}
	defer q2.Destroy()
	if seen[q2.QPN()] || ports[q2.QPN()>>8] {
		t.Errorf("QPN %#x of %s collides with rxe_lo", q2.QPN(), d2.Name())
	}
}

func TestCloseReleasesEverything(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	q := newQP(t, d, newFakeRx(), 0, 1)
	if err := q.AttachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	if err := d.IncGroup(randGroup()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "receive goroutine running", func() bool { return receiveGoroutines() > 0 })
	d.Close()
	if n := receiveGoroutines(); n != 0 {
		t.Errorf("%d receive goroutines after Close", n)
	}
	if !igmpState(t, "lo", g, false) {
		t.Errorf("lo still in %v after Close", g)
	}
	if verbs.DeviceByName("rxe_lo") != nil && softverbs.CoreOf(verbs.DeviceByName("rxe_lo")) == d.core {
		t.Errorf("still registered with verbs")
	}
	if err := q.AttachMcast(mgid(g), 0); !isErrno(err, syscall.ENODEV) {
		t.Errorf("attach after close: %v", err)
	}
	if err := d.IncGroup(g); !isErrno(err, syscall.ENODEV) {
		t.Errorf("IncGroup after close: %v", err)
	}
	if err := q.Send(&softverbs.UDSend{AH: mcastAH(g), RemoteQPN: verbs.MulticastQPN}); err == nil {
		t.Errorf("send after close succeeded")
	}
	if _, ok := d.QPCounters(q.QPN()); ok {
		t.Errorf("QP still known")
	}
	// A new device for lo can be made again.
	d2, err := ForName("lo")
	if err != nil || d2 == d {
		t.Fatalf("re-create: %v", err)
	}
	d2.Close()
}
