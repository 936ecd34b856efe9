package rxe

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/wire"
)

// countDials makes handoverName count the connection attempts to the
// hand-over socket of port (a dial names its socket once).
func countDials(t *testing.T, port uint16) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	saved := handoverName
	handoverName = func(p uint16) string {
		if p == port {
			n.Add(1)
		}
		return saved(p)
	}
	t.Cleanup(func() { handoverName = saved })
	return &n
}

// unownedPort returns a UDP port of 127.0.0.1 that no send block can
// have while the test runs: the test holds it.
func unownedPort(t testing.TB) uint16 {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return uint16(c.LocalAddr().(*net.UDPAddr).Port)
}

// TestNoOwnerFloodDials: 10,000 unicast datagrams for a QPN whose port no
// device holds are each counted in no_owner_drops, and make at most one
// connection attempt to the port's hand-over socket a period of the
// no-owner cache (before: one each). A datagram for an owner's QPN is
// still handed over.
func TestNoOwnerFloodDials(t *testing.T) {
	port := unownedPort(t)
	dials := countDials(t, port)
	a := loDev(t)
	b := loPeer(t)
	const qkey = 0x3C
	rx := newFakeRx()
	q := newQP(t, a, rx, 0, qkey)
	r := peerReceiver(t, b)
	in := &injector{port: 40007}
	name, oob := unicastInput(in.port)
	lo := netip.MustParseAddr("127.0.0.1")
	frame := in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: uint32(port)<<8 | 1, QKey: qkey, SrcQP: 1}, []byte("x"), nil)
	const flood = 10000
	start := time.Now()
	for range flood {
		r.handle(frame, name, oob, false)
	}
	el := time.Since(start)
	c := b.Counters()
	if got := c.Get(softverbs.NoOwnerDrops); got != flood || c.Get(softverbs.ForwardDrops) != 0 || c.Get(softverbs.Forwarded) != 0 {
		t.Errorf("no_owner_drops %d forward_drops %d forwarded %d, want %d, 0, 0",
			got, c.Get(softverbs.ForwardDrops), c.Get(softverbs.Forwarded), flood)
	}
	// One attempt, and one more each time a period ends (it may end
	// during the first).
	most := 2 + int64(el/noOwnerPeriod)
	if n := dials.Load(); n < 1 || n > most {
		t.Errorf("%d connection attempts for %d datagrams in %v, want 1 to %d", n, flood, el, most)
	}
	t.Logf("%d datagrams in %v (%v each), %d connection attempts", flood, el, el/flood, dials.Load())

	frame = in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: q.QPN(), QKey: qkey, SrcQP: 2}, []byte("owned"), nil)
	r.handle(frame, name, oob, false)
	if got := rx.wait(t); string(got.payload) != "owned" {
		t.Errorf("delivered %q", got.payload)
	}
}

// fakeClock is a no-owner cache's clock that moves only when told.
type fakeClock struct{ t atomic.Int64 }

func (c *fakeClock) now() time.Duration      { return time.Duration(c.t.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.t.Add(int64(d)) }

// ownerListener listens on a port's hand-over socket (name), as a device of
// another process of this user that opened the port would, and counts the
// datagrams handed over to it.
type ownerListener struct {
	ln   *net.UnixListener
	got  atomic.Int64
	done chan struct{}

	mu     sync.Mutex
	closed bool
	conn   *net.UnixConn
}

func listenOwner(t *testing.T, name string) *ownerListener {
	t.Helper()
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Net: "unixpacket", Name: name})
	if err != nil {
		t.Fatal(err)
	}
	o := &ownerListener{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		o.mu.Lock()
		closed := o.closed
		o.conn = c
		o.mu.Unlock()
		if closed {
			return
		}
		buf := make([]byte, fwdHdrLen+readBufLen)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			if _, _, ok := parseFwdHdr(&rxMeta{}, buf[:n]); ok {
				o.got.Add(1)
			}
		}
	}()
	t.Cleanup(o.close)
	return o
}

// close stops the listener and its connection and waits for its
// goroutine.
func (o *ownerListener) close() {
	o.mu.Lock()
	o.closed = true
	if o.conn != nil {
		o.conn.Close()
	}
	o.mu.Unlock()
	o.ln.Close()
	<-o.done
}

// TestNoOwnerThenOwner: a port found without an owner is not tried again
// for a while; an owner that then appears in another process (nothing
// tells this one) gets the datagrams this device reads for it within
// 2 × noOwnerPeriod of the attempt, on the cache's clock; and on the real
// clock, it gets them soon, without anyone waiting for it.
func TestNoOwnerThenOwner(t *testing.T) {
	port := unownedPort(t)
	owner := handoverName(port)
	dials := countDials(t, port)
	b := loPeer(t)
	var clk fakeClock
	clk.advance(time.Hour)
	b.ho.none.now = clk.now
	r := peerReceiver(t, b)
	in := &injector{port: 40008}
	name, oob := unicastInput(in.port)
	lo := netip.MustParseAddr("127.0.0.1")
	frame := in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: uint32(port)<<8 | 1, QKey: 1, SrcQP: 1}, []byte("x"), nil)
	r.handle(frame, name, oob, false)
	if n := dials.Load(); n != 1 || b.Counters().Get(softverbs.NoOwnerDrops) != 1 {
		t.Fatalf("%d attempts, no_owner_drops %d, want 1, 1", n, b.Counters().Get(softverbs.NoOwnerDrops))
	}
	o := listenOwner(t, owner)
	// Remembered: dropped without an attempt, through the next period.
	clk.advance(noOwnerPeriod)
	for range 100 {
		r.handle(frame, name, oob, false)
	}
	if n, c := dials.Load(), b.Counters(); n != 1 || c.Get(softverbs.NoOwnerDrops) != 101 || c.Get(softverbs.Forwarded) != 0 {
		t.Fatalf("%d attempts, no_owner_drops %d, forwarded %d; want 1, 101, 0", n, c.Get(softverbs.NoOwnerDrops), c.Get(softverbs.Forwarded))
	}
	// The documented worst case has passed: the next datagram goes to
	// the owner.
	clk.advance(noOwnerPeriod)
	r.handle(frame, name, oob, false)
	if n, c := dials.Load(), b.Counters(); n != 2 || c.Get(softverbs.Forwarded) != 1 {
		t.Fatalf("after 2 × %v: %d attempts, forwarded %d; want 2, 1", noOwnerPeriod, n, c.Get(softverbs.Forwarded))
	}
	eventually(t, "the owner reads the datagram", func() bool { return o.got.Load() == 1 })
	o.close()

	// The real clock: a second device finds no owner, then one appears;
	// its datagrams arrive once the entry goes, as they are sent.
	port2 := unownedPort(t)
	c := loPeer(t)
	rc := peerReceiver(t, c)
	frame = in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: uint32(port2)<<8 | 1, QKey: 1, SrcQP: 1}, []byte("y"), nil)
	rc.handle(frame, name, oob, false)
	if c.Counters().Get(softverbs.NoOwnerDrops) != 1 {
		t.Fatalf("no_owner_drops %d, want 1", c.Counters().Get(softverbs.NoOwnerDrops))
	}
	o2 := listenOwner(t, handoverName(port2))
	start := time.Now()
	eventually(t, "the new owner gets a datagram", func() bool {
		rc.handle(frame, name, oob, false)
		return o2.got.Load() > 0
	})
	t.Logf("the owner got its first datagram %v after it appeared (at most %v but for scheduling)", time.Since(start), 2*noOwnerPeriod)
	o2.close()
}

// TestNoOwnerSameProcessOwner: a send block opening in this process
// clears every device's no-owner cache: an owner in the process gets the
// next datagram, with no wait.
func TestNoOwnerSameProcessOwner(t *testing.T) {
	port := unownedPort(t)
	b := loPeer(t)
	var clk fakeClock
	b.ho.none.now = clk.now // frozen: only the block's opening clears
	r := peerReceiver(t, b)
	in := &injector{port: 40009}
	name, oob := unicastInput(in.port)
	lo := netip.MustParseAddr("127.0.0.1")
	frame := in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: uint32(port)<<8 | 1, QKey: 1, SrcQP: 1}, []byte("x"), nil)
	r.handle(frame, name, oob, false)
	r.handle(frame, name, oob, false)
	if c := b.Counters(); c.Get(softverbs.NoOwnerDrops) != 2 {
		t.Fatalf("no_owner_drops %d, want 2", c.Get(softverbs.NoOwnerDrops))
	}
	// The port's owner (its hand-over socket) appears, and a device of
	// this process opens a send block.
	o := listenOwner(t, handoverName(port))
	a := loDev(t)
	newManualQP(t, a, 0, 1)
	r.handle(frame, name, oob, false)
	if c := b.Counters(); c.Get(softverbs.Forwarded) != 1 {
		t.Fatalf("forwarded %d after a block opened in the process, want 1", c.Get(softverbs.Forwarded))
	}
	eventually(t, "the owner reads the datagram", func() bool { return o.got.Load() == 1 })
	o.close()
}

// TestNoOwnerPortCycling: datagrams for 10,000 different ports no device
// holds (a flood no cache of entries could hold) make at most
// maxNoOwnerDials connection attempts a period; each datagram is counted
// once, in no_owner_drops or forward_drops.
func TestNoOwnerPortCycling(t *testing.T) {
	if !inNetns(t) {
		return
	}
	var dials atomic.Int64
	saved := handoverName
	handoverName = func(p uint16) string { dials.Add(1); return saved(p) }
	t.Cleanup(func() { handoverName = saved })
	b := loPeer(t)
	var clk fakeClock
	b.ho.none.now = clk.now
	r := peerReceiver(t, b)
	in := &injector{port: 40010}
	name, oob := unicastInput(in.port)
	lo := netip.MustParseAddr("127.0.0.1")
	const ports = 10000
	frames := make([][]byte, 0, ports)
	for p := uint16(50000); len(frames) < ports; p++ {
		if !b.ownsPort4(p) {
			frames = append(frames, in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: uint32(p)<<8 | 1, QKey: 1, SrcQP: 1}, []byte("x"), nil))
		}
	}
	for period := range 3 {
		before := dials.Load()
		for _, f := range frames {
			r.handle(f, name, oob, false)
		}
		if n := dials.Load() - before; n != maxNoOwnerDials {
			t.Errorf("period %d: %d connection attempts for %d ports, want %d", period, n, ports, maxNoOwnerDials)
		}
		clk.advance(noOwnerPeriod)
	}
	c := b.Counters()
	if n := c.Get(softverbs.NoOwnerDrops) + c.Get(softverbs.ForwardDrops); n != 3*ports || c.Get(softverbs.Forwarded) != 0 {
		t.Errorf("no_owner_drops %d + forward_drops %d = %d, forwarded %d; want %d, 0",
			c.Get(softverbs.NoOwnerDrops), c.Get(softverbs.ForwardDrops), n, c.Get(softverbs.Forwarded), 3*ports)
	}
}

// TestNoOwnerAllocations: a datagram for a port remembered without an
// owner allocates nothing.
func TestNoOwnerAllocations(t *testing.T) {
	port := unownedPort(t)
	b := loPeer(t)
	var clk fakeClock
	b.ho.none.now = clk.now
	r := peerReceiver(t, b)
	in := &injector{port: 40011}
	name, oob := unicastInput(in.port)
	frame := in.craft(netip.MustParseAddr("127.0.0.1"), wire.UDHeader{PKey: 0xFFFF, DestQP: uint32(port)<<8 | 1, QKey: 1, SrcQP: 1}, []byte("x"), nil)
	r.handle(frame, name, oob, false)
	if n := testing.AllocsPerRun(1000, func() { r.handle(frame, name, oob, false) }); n != 0 {
		t.Errorf("%v allocations per datagram", n)
	}
}
