package rxe

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// loPeer returns a second device of lo, on a host of its own (as another
// process would have), closed at the end of the test.
func loPeer(t *testing.T) *Device {
	t.Helper()
	h := verbs.NewHost()
	t.Cleanup(h.Close)
	d, err := On(h).ForName("lo")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// unicastInput returns a sockaddr and control messages of a unicast
// datagram from 127.0.0.1:port to 127.0.0.1 with TTL 1.
func unicastInput(port uint16) (name, oob []byte) {
	name = make([]byte, 16)
	name[0], name[2], name[3] = unix.AF_INET, byte(port>>8), byte(port)
	copy(name[4:], []byte{127, 0, 0, 1})
	oob = make([]byte, 128)
	k := putOrigDst(oob, netip.AddrFrom4([4]byte{127, 0, 0, 1}))
	k += putCmsgInt(oob[k:], unix.IPPROTO_IP, unix.IP_TTL, 1)
	return name, oob[:k]
}

// peerReceiver returns a receiver of a UDP 4791 socket of d (one holding
// a membership), to hand it datagrams directly.
func peerReceiver(t *testing.T, d *Device) *receiver {
	t.Helper()
	g := randGroup()
	if err := d.IncGroup(g); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.DecGroup(g) })
	d.mu.Lock()
	s := d.mships[g].sock
	d.mu.Unlock()
	return newReceiver(d, s, nil)
}

// TestForwardToOwner hands a unicast datagram for a QPN of device a to a
// receive socket of device b (another "process" on lo): b forwards it to
// a, which delivers it once, with the original source in the GRH area; a
// QPN whose port nobody holds is counted as refused.
func TestForwardToOwner(t *testing.T) {
	// The forwarder's counters are the device's: in a namespace of its
	// own, no other test process's datagram lands in b's sockets (the
	// user's reuseport group) and is forwarded and counted beside these.
	// TestSquattedHandover's victim runs it in that test's namespace.
	if os.Getenv(victimEnv) == "" && !testenv.InNetns(t) {
		return
	}
	a := loDev(t)
	b := loPeer(t)
	const qkey = 0x77
	rx := newFakeRx()
	q := newQP(t, a, rx, 0, qkey)
	r := peerReceiver(t, b)
	in := &injector{port: 40003}
	name, oob := unicastInput(in.port)
	lo := netip.MustParseAddr("127.0.0.1")

	frame := in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: q.QPN(), QKey: qkey, SrcQP: 0x123456}, []byte("reply"), nil)
	r.handle(frame, name, oob, false)
	got := rx.wait(t)
	if string(got.payload) != "reply" || got.srcQP != 0x123456 {
		t.Errorf("delivered %+v", got)
	}
	// The GRH area holds the original IPv4 header: source 127.0.0.1, TTL 1.
	if ip := wire.IPv4(got.grh[20:]); ip.Src() != lo || ip.Dst() != lo || ip.TTL() != 1 {
		t.Errorf("GRH area % x", got.grh)
	}
	rx.none(t, 50*time.Millisecond)
	cb, ca := b.Counters(), a.Counters()
	if cb.Get(softverbs.Forwarded) != 1 || cb.Get(softverbs.Delivered) != 0 || cb.Get(softverbs.NoQPDrops) != 0 {
		t.Errorf("forwarder counters: forwarded %d delivered %d no_qp %d", cb.Get(softverbs.Forwarded), cb.Get(softverbs.Delivered), cb.Get(softverbs.NoQPDrops))
	}
	if ca.Get(softverbs.RcvdForwarded) != 1 || ca.Get(softverbs.Delivered) != 1 || ca.Get(softverbs.Forwarded) != 0 {
		t.Errorf("owner counters: rcvd_forwarded %d delivered %d forwarded %d", ca.Get(softverbs.RcvdForwarded), ca.Get(softverbs.Delivered), ca.Get(softverbs.Forwarded))
	}

	// A QPN of a's port that a does not have: forwarded, then a's drop.
	frame = in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: q.QPN() ^ 0x80, QKey: qkey, SrcQP: 1}, []byte("x"), nil)
	r.handle(frame, name, oob, false)
	eventually(t, "owner's no-QP drop", func() bool { return a.Counters().Get(softverbs.NoQPDrops) == 1 })

	// A port nobody holds, even one a UDP service of the host listens on
	// (a remote host's crafted QPN): never sent there, counted as having
	// no owner at once.
	svc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	svcPort := uint16(svc.LocalAddr().(*net.UDPAddr).Port)
	// More than the 1,000 that once filled an unread error queue and
	// stopped the count: every one is counted.
	const flood = 1500
	frame = in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: uint32(svcPort)<<8 | 1, QKey: qkey, SrcQP: 1}, []byte("x"), nil)
	for i := range flood {
		r.handle(frame, name, oob, false)
		if got := b.Counters().Get(softverbs.NoOwnerDrops); got != uint64(i+1) {
			t.Fatalf("no_owner_drops %d after %d datagrams for a service's port", got, i+1)
		}
	}
	svc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, from, err := svc.ReadFromUDP(make([]byte, 2048)); err == nil {
		t.Errorf("the UDP service on 127.0.0.1:%d received %d bytes from %v", svcPort, n, from)
	}
	// The next forward is not hurt: it is delivered.
	frame = in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: q.QPN(), QKey: qkey, SrcQP: 2}, []byte("after"), nil)
	r.handle(frame, name, oob, false)
	if got := rx.wait(t); string(got.payload) != "after" {
		t.Errorf("delivered %q", got.payload)
	}
	if cb := b.Counters(); cb.Get(softverbs.Forwarded) != 3 || cb.Get(softverbs.ForwardDrops) != 0 {
		t.Errorf("forwarded %d, forward drops %d", cb.Get(softverbs.Forwarded), cb.Get(softverbs.ForwardDrops))
	}

	// A multicast destination is never forwarded (every member reads it).
	g := randGroup()
	frame = in.craft(g, wire.UDHeader{PKey: 0xFFFF, DestQP: q.QPN(), QKey: qkey, SrcQP: 1}, []byte("x"), nil)
	moob := make([]byte, 64)
	k := putOrigDst(moob, g)
	before := b.Counters().Get(softverbs.NoQPDrops)
	r.handle(frame, name, moob[:k], false)
	if cb := b.Counters(); cb.Get(softverbs.NoQPDrops) != before+1 || cb.Get(softverbs.Forwarded) != 3 {
		t.Errorf("multicast-addressed unicast: no_qp %d forwarded %d", cb.Get(softverbs.NoQPDrops), cb.Get(softverbs.Forwarded))
	}
}

// TestForwardedChecks hands crafted forwards to a send socket's receiver:
// only a well-formed header from a loopback source for a QPN of that
// socket is delivered; the ICRC is checked over the original headers.
func TestForwardedChecks(t *testing.T) {
	d := loDev(t)
	const qkey = 0x99
	rx := newFakeRx()
	q := newQP(t, d, rx, 0, qkey)
	d.mu.Lock()
	blk := d.blocks[0]
	d.mu.Unlock()
	r := newBlockReceiver(d, blk, nil)
	in := &injector{port: 40004}
	lo := netip.MustParseAddr("127.0.0.1")
	src := make([]byte, 16)
	src[0], src[2], src[3] = unix.AF_INET, 0x12, 0x34
	copy(src[4:], []byte{127, 0, 0, 1})
	meta := rxMeta{src: lo, srcPort: in.port, dst: lo, ttl: 1}
	fwd := func(m rxMeta, v6 bool, h wire.UDHeader, mutate func([]byte)) []byte {
		var hdr [fwdHdrLen]byte
		putFwdHdr(&hdr, &m, v6)
		b := append(hdr[:], in.craft(lo, h, []byte("fwd"), nil)...)
		if mutate != nil {
			mutate(b)
		}
		return b
	}
	good := wire.UDHeader{PKey: 0xFFFF, DestQP: q.QPN(), QKey: qkey, SrcQP: 5}
	r.handleForwarded(fwd(meta, false, good, nil), false)
	if got := rx.wait(t); string(got.payload) != "fwd" || got.srcQP != 5 {
		t.Errorf("delivered %+v", got)
	}
	other := good
	other.DestQP = (uint32(blk.port4)+1)<<8 | 1
	mc := good
	mc.DestQP = wire.MulticastQPN
	for _, c := range []struct {
		what string
		b    []byte
		name []byte
		ctr  softverbs.Counter
	}{
		{"bad magic", fwd(meta, false, good, func(b []byte) { b[0] ^= 1 }), src, softverbs.MalformedDrops},
		{"bad version", fwd(meta, false, good, func(b []byte) { b[4] = 9 }), src, softverbs.MalformedDrops},
		{"unknown flag", fwd(meta, false, good, func(b []byte) { b[5] = 2 }), src, softverbs.MalformedDrops},
		{"IPv6 flag with IPv4 addresses", fwd(meta, true, good, nil), src, softverbs.MalformedDrops},
		{"short", fwd(meta, false, good, nil)[:fwdHdrLen-1], src, softverbs.MalformedDrops},
		{"multicast destination", fwd(rxMeta{src: lo, srcPort: in.port, dst: randGroup(), ttl: 1}, false, good, nil), src, softverbs.MalformedDrops},
		{"wrong source port (ICRC)", fwd(rxMeta{src: lo, srcPort: in.port + 1, dst: lo, ttl: 1}, false, good, nil), src, softverbs.ICRCErrors},
		{"wrong source address (ICRC)", fwd(rxMeta{src: netip.MustParseAddr("127.0.0.2"), srcPort: in.port, dst: lo, ttl: 1}, false, good, nil), src, softverbs.ICRCErrors},
		{"QPN of another send socket", fwd(meta, false, other, nil), src, softverbs.NoQPDrops},
		{"multicast QPN", fwd(meta, false, mc, nil), src, softverbs.MalformedDrops},
	} {
		before := d.Counters()
		r.handleForwarded(c.b, false)
		after := d.Counters()
		if after.Get(c.ctr) != before.Get(c.ctr)+1 || after.Get(softverbs.Delivered) != before.Get(softverbs.Delivered) ||
			after.Get(softverbs.Forwarded) != before.Get(softverbs.Forwarded) {
			t.Errorf("%s: %s %d → %d, delivered %d → %d", c.what, c.ctr, before.Get(c.ctr), after.Get(c.ctr),
				before.Get(softverbs.Delivered), after.Get(softverbs.Delivered))
		}
	}
	rx.none(t, 50*time.Millisecond)
}

// TestForwardAllocations checks that forwarding a datagram allocates
// nothing.
func TestForwardAllocations(t *testing.T) {
	a := loDev(t)
	b := loPeer(t)
	q := newManualQP(t, a, 0, 9)
	r := peerReceiver(t, b)
	in := &injector{port: 40005}
	name, oob := unicastInput(in.port)
	frame := in.craft(netip.MustParseAddr("127.0.0.1"), wire.UDHeader{PKey: 0xFFFF, DestQP: q.qp.Num(), QKey: 9, SrcQP: 77}, make([]byte, 1000), nil)
	if n := testing.AllocsPerRun(50, func() { r.handle(frame, name, oob, false) }); n != 0 {
		t.Errorf("forward: %v allocations per datagram", n)
	}
	eventually(t, "forwards delivered", func() bool { return a.Counters().Get(softverbs.RcvdForwarded) == 51 })
}

// TestUnicastNoMembership exchanges unicast datagrams (IPv4 and IPv6)
// between two devices of lo, in a private network namespace, while neither
// holds a membership: each has unicast receive sockets while it has QPs,
// and whichever socket the kernel picks, the owner receives each datagram
// once.
func TestUnicastNoMembership(t *testing.T) {
	if !inNetns(t) {
		return
	}
	ipCmd(t, "link", "set", "lo", "up")
	a, err := ForName("lo")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b := loPeer(t)
	const qkey = 0x31
	rxA, rxB := newFakeRx(), newFakeRx()
	qa := newQP(t, a, rxA, 0, qkey)
	qb := newQP(t, b, rxB, 0, qkey)
	tbl, _ := a.GIDTable(1)
	sent := 0
	for _, addr := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")} {
		idx := -1
		for _, e := range tbl {
			if e.GID == wire.GIDFromAddr(addr) {
				idx = e.Index
			}
		}
		if idx < 0 {
			t.Logf("no GID for %v on lo: %+v", addr, tbl)
			continue
		}
		ah := &verbs.AHAttr{IsGlobal: true, PortNum: 1, GRH: verbs.GlobalRoute{DGID: wire.GIDFromAddr(addr), SGIDIndex: uint8(idx), HopLimit: 64}}
		for _, c := range []struct {
			from, to *tqp
			rx       *fakeRx
		}{{qb, qa, rxA}, {qa, qb, rxB}} {
			msg := fmt.Sprintf("%v to %#x", addr, c.to.QPN())
			if err := c.from.Send(&softverbs.UDSend{AH: ah, RemoteQPN: c.to.QPN(), RemoteQKey: qkey, Payload: []byte(msg)}); err != nil {
				t.Fatal(err)
			}
			if got := c.rx.wait(t); string(got.payload) != msg || got.srcQP != c.from.QPN() {
				t.Errorf("%s: delivered %q from %#x", msg, got.payload, got.srcQP)
			}
		}
		sent++
	}
	if sent == 0 {
		t.Fatal("no address to send to")
	}
	eventually(t, "every forward read", func() bool {
		ca, cb := a.Counters(), b.Counters()
		return ca.Get(softverbs.Forwarded)+cb.Get(softverbs.Forwarded) == ca.Get(softverbs.RcvdForwarded)+cb.Get(softverbs.RcvdForwarded)
	})
	rxA.none(t, 50*time.Millisecond)
	rxB.none(t, 0)
	for _, d := range []*Device{a, b} {
		c := d.Counters()
		t.Logf("%s: forwarded %d rcvd_forwarded %d", d.Name(), c.Get(softverbs.Forwarded), c.Get(softverbs.RcvdForwarded))
		if c.Get(softverbs.Delivered) != uint64(sent) || c.Get(softverbs.NoQPDrops)+c.Get(softverbs.ForwardDrops)+c.Get(softverbs.NoOwnerDrops) != 0 {
			t.Errorf("%s: counters %v", d.Name(), c)
		}
	}
	// The unicast sockets live while the device has QPs.
	a.mu.Lock()
	n := len(a.usocks)
	a.mu.Unlock()
	if n == 0 {
		t.Errorf("no unicast socket")
	}
	qa.Destroy()
	a.mu.Lock()
	n = len(a.usocks)
	a.mu.Unlock()
	if n != 0 {
		t.Errorf("%d unicast sockets without QPs", n)
	}
}

// FuzzForwarded hands arbitrary forwards to a send socket's receiver: it
// never panics, and every input is read once and lands in exactly one
// outcome.
func FuzzForwarded(f *testing.F) {
	in := &injector{port: 40006}
	lo := netip.MustParseAddr("127.0.0.1")
	if d := existing("lo"); d != nil {
		d.Close()
	}
	d, err := ForName("lo")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { d.Close() })
	q := newManualQP(f, d, 0, 1)
	var hdr [fwdHdrLen]byte
	putFwdHdr(&hdr, &rxMeta{src: lo, srcPort: in.port, dst: lo, ttl: 64}, false)
	f.Add(append(hdr[:], in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: q.qp.Num(), QKey: 1, SrcQP: 2}, []byte("abc"), nil)...))
	f.Add(hdr[:])
	f.Add([]byte{})
	d.mu.Lock()
	blk := d.blocks[0]
	d.mu.Unlock()
	name := make([]byte, 16)
	name[0], name[2], name[3] = unix.AF_INET, 0x12, 0x34
	copy(name[4:], lo.AsSlice())
	f.Fuzz(func(t *testing.T, b []byte) {
		r := newBlockReceiver(d, blk, nil)
		before := d.Counters()
		r.receiveOne(b, name, nil)
		q.recycle()
		after := d.Counters()
		if after.Get(softverbs.RcvdPkts) != before.Get(softverbs.RcvdPkts)+1 || after.Get(softverbs.RcvdForwarded) != before.Get(softverbs.RcvdForwarded)+1 {
			t.Fatalf("counters %v → %v", before, after)
		}
		var outcomes uint64
		for c := range softverbs.Schema() {
			switch softverbs.Counter(c) {
			case softverbs.RcvdPkts, softverbs.RcvdBytes, softverbs.SentPkts, softverbs.SentBytes, softverbs.RcvdForwarded:
				continue
			}
			outcomes += after[c] - before[c]
		}
		if outcomes != 1 {
			t.Fatalf("%d outcomes for one forward: %v → %v", outcomes, before, after)
		}
	})
}
