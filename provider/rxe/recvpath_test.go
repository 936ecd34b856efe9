package rxe

import (
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// TestHotPathAllocations checks that receiving (the whole per-datagram
// path after recvmmsg) and sending allocate nothing.
func TestHotPathAllocations(t *testing.T) {
	d := loDev(t)
	f := newRecvFixture(t, d, 1000)
	q := f.q
	if a := testing.AllocsPerRun(100, func() { f.r.handle(f.frame, f.name, f.oob, false); q.recycle() }); a != 0 {
		t.Errorf("receive path: %v allocations per datagram", a)
	}
	if q.n < 100 {
		t.Fatalf("delivered %d", q.n)
	}
	s2 := &softverbs.UDSend{AH: mcastAH(netip.MustParseAddr("239.255.0.1")), RemoteQPN: verbs.MulticastQPN, RemoteQKey: 9, Payload: make([]byte, 1000)}
	s2.AH.GRH.DGID = mgid(randGroup())
	drv := transportQP(t, d, q.qp.Num())
	if a := testing.AllocsPerRun(100, func() { drv.Send(s2) }); a != 0 {
		t.Errorf("send path: %v allocations per datagram", a)
	}
}

// TestUnicastDispatch hands a datagram with a QPN as DestQP to the receive
// path: it reaches that QP (whatever the destination address), and an
// unknown QPN is counted.
func TestUnicastDispatch(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	if err := d.IncGroup(g); err != nil {
		t.Fatal(err)
	}
	defer d.DecGroup(g)
	rx := newFakeRx()
	q := newQP(t, d, rx, verbs.CreateBlockSelfMcastLB, 3)
	d.mu.Lock()
	s := d.mships[g].sock
	d.mu.Unlock()
	r := newReceiver(d, s, nil)
	lo := netip.MustParseAddr("127.0.0.1")
	in := &injector{port: 40002}
	name := make([]byte, 16)
	name[0], name[2], name[3] = unix.AF_INET, 40002>>8, 40002&0xff
	copy(name[4:], lo.AsSlice())
	oob := make([]byte, 128)
	k := putOrigDst(oob, lo)
	// craft computes the ICRC for a destination; use 127.0.0.1.
	frame := in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: q.QPN(), QKey: 3, SrcQP: q.QPN()}, []byte("unicast"), nil)
	r.handle(frame, name, oob[:k], false)
	if got := rx.wait(t); string(got.payload) != "unicast" || got.srcQP != q.QPN() {
		t.Errorf("got %+v", got)
	}
	frame = in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: q.QPN() ^ 0x80, QKey: 3, SrcQP: 1}, []byte("unicast"), nil)
	r.handle(frame, name, oob[:k], false)
	if c := d.Counters(); c.Get(softverbs.NoQPDrops) != 1 || c.Get(softverbs.Delivered) != 1 {
		t.Errorf("counters %+v", c)
	}
}

// TestFlowChanges checks the receiver's per-flow headers: datagrams of
// flows that differ in one field each (source port, length, TTL, TOS,
// group) and in their IP IDs, interleaved, each get the GRH of their own
// IP header, and a corrupt one in the middle of a flow is an ICRC error
// that leaves the datagrams after it intact.
func TestFlowChanges(t *testing.T) {
	d := loDev(t)
	g1, g2 := randGroup(), randGroup()
	q := newManualQP(t, d, 0, 9)
	for _, g := range []netip.Addr{g1, g2} {
		if err := q.qp.AttachMcast(mgid(g), 0); err != nil {
			t.Fatal(err)
		}
	}
	d.mu.Lock()
	s := d.mships[g1].sock
	d.mu.Unlock()
	r := newReceiver(d, s, nil)
	hdr := wire.UDHeader{PKey: 0xFFFF, DestQP: wire.MulticastQPN, QKey: 9, SrcQP: 77}

	type flow struct {
		g        netip.Addr
		port     uint16
		size     int
		ttl, tos uint8
		id       uint16
		corrupt  bool
	}
	flows := []flow{
		{g: g1, port: 40001, size: 64, ttl: 1},
		{g: g1, port: 40002, size: 64, ttl: 1},
		{g: g1, port: 40001, size: 64, ttl: 1, id: 0x1234},
		{g: g1, port: 40001, size: 64, ttl: 1},
		{g: g1, port: 40001, size: 100, ttl: 1},
		{g: g1, port: 40001, size: 100, ttl: 7},
		{g: g1, port: 40001, size: 100, ttl: 7, tos: 0x28},
		{g: g1, port: 40001, size: 100, ttl: 7, tos: 0x28, corrupt: true},
		{g: g1, port: 40001, size: 100, ttl: 7, tos: 0x28, id: 0xbeef},
		{g: g2, port: 40001, size: 100, ttl: 7, tos: 0x28},
		{g: g1, port: 40001, size: 64, ttl: 1},
	}
	for i, f := range flows {
		payload := make([]byte, f.size)
		payload[0] = byte(i)
		b := make([]byte, wire.UDLen(f.size, false))
		n := wire.EncodeUD(b, &hdr, payload)
		var iph [wire.IPv4HeaderLen]byte
		ip := wire.IPv4(iph[:])
		ip.Encode(wire.IPv4Fields{TOS: f.tos, TotalLength: uint16(28 + len(b)), ID: f.id, DF: true, TTL: f.ttl,
			Protocol: wire.IPProtocolUDP, Src: netip.MustParseAddr("127.0.0.1"), Dst: f.g})
		var udph [wire.UDPHeaderLen]byte
		udp := wire.UDP(udph[:])
		udp.Encode(f.port, wire.UDPPort, uint16(8+len(b)))
		wire.PutICRC(b[n:], wire.ICRCv4(ip, udp, b[:n]))
		if f.corrupt {
			b[n] ^= 1
		}
		name := make([]byte, 16)
		name[0], name[2], name[3] = unix.AF_INET, byte(f.port>>8), byte(f.port)
		copy(name[4:], []byte{127, 0, 0, 1})
		oob := make([]byte, 128)
		k := putOrigDst(oob, f.g)
		k += putCmsgInt(oob[k:], unix.IPPROTO_IP, unix.IP_TTL, int(f.ttl))
		k += putCmsgInt(oob[k:], unix.IPPROTO_IP, unix.IP_TOS, int(f.tos))
		before := d.Counters()
		r.receiveOne(b, name, oob[:k])
		c := d.Counters()
		if f.corrupt {
			if c.Get(softverbs.ICRCErrors) != before.Get(softverbs.ICRCErrors)+1 {
				t.Fatalf("datagram %d (corrupt ICRC): not counted as an ICRC error", i)
			}
			continue
		}
		var wc [1]verbs.WC
		if n, err := q.rcq.Poll(wc[:]); n != 1 || err != nil || wc[0].Status != verbs.WCSuccess {
			t.Fatalf("datagram %d: polled %d %v %+v; counters %v", i, n, err, wc[0], c)
		}
		buf := q.mr.Buf()[int(wc[0].WRID)*q.size:]
		if got := buf[wire.GRHIPv4Offset:wire.GRHAreaLen]; string(got) != string(iph[:]) {
			t.Errorf("datagram %d: GRH % x, want the IP header % x", i, got, iph[:])
		}
		if buf[wire.GRHAreaLen] != byte(i) || int(wc[0].ByteLen) != wire.GRHAreaLen+f.size {
			t.Errorf("datagram %d: payload byte %d, length %d", i, buf[wire.GRHAreaLen], wc[0].ByteLen)
		}
		q.qp.PostRecv(&q.wrs[wc[0].WRID])
	}
}

// TestTapSeesNoHeldLocks: a batched receiver keeps a QP's locks from one
// delivery to the next, and releases them before a tap runs: a tap that
// polls the CQ in the middle of a batch gets the completion delivered
// before it instead of waiting for the batch's end forever.
func TestTapSeesNoHeldLocks(t *testing.T) {
	d := loDev(t)
	f := newRecvFixture(t, d, 64)
	q, r, frame, name, oob := f.q, f.r, f.frame, f.name, f.oob
	r.batched()
	r.burst.HoldLocks = true // as handleBatch sets it with GOMAXPROCS=1

	done := make(chan int, 1)
	go func() {
		r.countReceived(2, uint64(2*len(frame)))
		r.handle(frame, name, oob, false) // delivered: the QP's locks stay held
		polled := -1
		cancel := d.core.Tap(func(verbs.Frame) {
			var wc [4]verbs.WC
			polled, _ = q.rcq.Poll(wc[:])
		})
		r.handle(frame, name, oob, false)
		r.burst.Flush()
		cancel()
		done <- polled
	}()
	select {
	case polled := <-done:
		if polled != 1 {
			t.Errorf("the tap polled %d completions, want the 1 delivered before it", polled)
		}
	case <-time.After(20 * time.Second):
		// Let the stuck goroutine finish (the QP's cleanup needs the
		// lock), then fail.
		r.burst.Release()
		<-done
		t.Fatal("the tap waits for a lock the receiver holds")
	}
	if n := q.rcq.Len(); n != 1 {
		t.Errorf("%d completions left, want 1", n)
	}
}
