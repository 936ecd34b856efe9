package rxe

import (
	"net/netip"
	"testing"
	"time"

	"github.com/softrdma/softrdma/wire"
)

// BenchmarkNoOwnerDrop compares the cost of a unicast datagram for a QPN
// whose port no device holds (no_owner_drops) with that of an ordinary
// drop, one for the device's own QP with a wrong Q_Key (qkey_violations):
// ns/op is the no-owner drop's, and x-qkey-drop the ratio.
func BenchmarkNoOwnerDrop(b *testing.B) {
	port := unownedPort(b)
	if d := existing("lo"); d != nil {
		d.Close()
	}
	d, err := ForName("lo")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	q := newManualQP(b, d, 0, 9)
	g := randGroup()
	if err := d.IncGroup(g); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.DecGroup(g) })
	d.mu.Lock()
	r := newReceiver(d, d.mships[g].sock, nil)
	d.mu.Unlock()
	in := &injector{port: 40012}
	name, oob := unicastInput(in.port)
	lo := netip.MustParseAddr("127.0.0.1")
	bad := in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: q.qp.Num(), QKey: 10, SrcQP: 1}, make([]byte, 64), nil)
	none := in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: uint32(port)<<8 | 1, QKey: 9, SrcQP: 1}, make([]byte, 64), nil)
	run := func(f []byte) time.Duration {
		start := time.Now()
		for range b.N {
			r.handle(f, name, oob, false)
		}
		return time.Since(start)
	}
	run(bad)
	run(none)
	b.ResetTimer()
	tb := run(bad)
	b.ResetTimer()
	tn := run(none)
	b.StopTimer()
	b.ReportMetric(float64(tb.Nanoseconds())/float64(b.N), "qkey-drop-ns/op")
	b.ReportMetric(float64(tn)/float64(tb), "x-qkey-drop")
}
