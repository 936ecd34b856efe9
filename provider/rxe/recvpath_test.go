package rxe

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// TestHotPathAllocations checks that receiving (the whole per-datagram
// path after recvmmsg) and sending allocate nothing.
func TestHotPathAllocations(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	q := newManualQP(t, d, 0, 9)
	if err := q.qp.AttachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	in := &injector{port: 40001}
	frame := in.craft(g, wire.UDHeader{PKey: 0xFFFF, DestQP: wire.MulticastQPN, QKey: 9, SrcQP: 77}, make([]byte, 1000), nil)
	d.mu.Lock()
	s := d.mships[g].sock
	d.mu.Unlock()
	r := newReceiver(d, s, nil)
	name := make([]byte, 16)
	name[0], name[2], name[3] = unix.AF_INET, 40001>>8, 40001&0xff
	copy(name[4:], []byte{127, 0, 0, 1})
	oob := make([]byte, 128)
	k := putOrigDst(oob, g)
	k += putCmsgInt(oob[k:], unix.IPPROTO_IP, unix.IP_TTL, 1)
	if a := testing.AllocsPerRun(100, func() { r.handle(frame, name, oob[:k], false); q.recycle() }); a != 0 {
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
