package rxe

import (
	"fmt"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

var benchSizes = []int{64, 256, 1024, 4096}

// BenchmarkReceivePath hands a crafted multicast datagram to the receive
// path after recvmmsg (parse, control messages, ICRC/IP ID check, group
// lookup, per-QP checks, delivery into a posted receive WR, and the poll and
// repost of that WR). One op is one datagram.
func BenchmarkReceivePath(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			f := newRecvFixture(b, benchDev(b), size)
			q, r, frame, name, oob := f.q, f.r, f.frame, f.name, f.oob
			b.SetBytes(int64(size))
			for b.Loop() {
				r.handle(frame, name, oob, false)
				q.recycle()
			}
			if q.n == 0 {
				b.Fatal("nothing delivered")
			}
		})
	}
}

// BenchmarkReceiveBatch is BenchmarkReceivePath the way a receive
// goroutine and a consumer run it: batches of RecvBatch datagrams handled
// with a Burst (counters and wake-ups once a batch), then the consumer
// polls the batch's completions and reposts their WRs as one chain. One op
// is one batch; ns/datagram is the figure to compare. hold=true is the
// Burst holding a QP's locks across the batch, as with GOMAXPROCS=1.
func BenchmarkReceiveBatch(b *testing.B) {
	for _, c := range []struct {
		size int
		hold bool
	}{{64, false}, {64, true}, {256, true}, {1024, false}, {1024, true}, {4096, true}} {
		size := c.size
		b.Run(fmt.Sprintf("size=%d/hold=%v", size, c.hold), func(b *testing.B) {
			f := newRecvFixture(b, benchDev(b), size)
			q, r, frame, name, oob := f.q, f.r, f.frame, f.name, f.oob
			r.batched() // as a batched reader's receiver
			r.burst.HoldLocks = c.hold
			wc := make([]verbs.WC, RecvBatch)
			wrs := make([]verbs.RecvWR, RecvBatch)
			b.SetBytes(int64(size * RecvBatch))
			for b.Loop() {
				r.countReceived(RecvBatch, uint64(RecvBatch*len(frame)))
				for range RecvBatch {
					r.handle(frame, name, oob, false)
				}
				r.burst.Flush()
				n, err := q.rcq.Poll(wc)
				if n != RecvBatch || err != nil {
					b.Fatalf("polled %d of %d: %v", n, RecvBatch, err)
				}
				for i := range n {
					wrs[i] = q.wrs[wc[i].WRID]
					wrs[i].Next = nil
					if i > 0 {
						wrs[i-1].Next = &wrs[i]
					}
				}
				if err := q.qp.PostRecv(&wrs[0]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*RecvBatch), "ns/datagram")
		})
	}
}

// BenchmarkBuild measures what the send path does for one datagram
// before the kernel: the checks, the transport headers, the IP and UDP
// headers of its flow and the ICRC. One op is one datagram.
func BenchmarkBuild(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			q, s := benchSend(b, size)
			qi := q.(*qp)
			var sl sendSlot
			qi.smu.Lock()
			defer qi.smu.Unlock()
			b.SetBytes(int64(size))
			for b.Loop() {
				if _, ok, err := qi.build(&sl, s); !ok || err != nil {
					b.Fatal("not built", err)
				}
			}
		})
	}
}

// BenchmarkSendPath sends single datagrams through the provider (no verbs)
// to a group nobody joined. One op is one datagram.
func BenchmarkSendPath(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			q, s := benchSend(b, size)
			b.SetBytes(int64(size))
			for b.Loop() {
				if err := q.Send(s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchSend returns a UD QP of the device of lo (destroyed at the end of
// the benchmark) and a datagram of size bytes to a group nobody joined.
func benchSend(b *testing.B, size int) (softverbs.DriverQP, *softverbs.UDSend) {
	b.Helper()
	q, err := benchDev(b).CreateQP(softverbs.DriverQPInit{Type: verbs.QPTypeUD})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { q.Destroy() })
	return q, &softverbs.UDSend{AH: mcastAH(randGroup()), RemoteQPN: verbs.MulticastQPN, RemoteQKey: 9, Payload: make([]byte, size)}
}

// benchDev returns the device of lo, closed at the end of the benchmark.
func benchDev(b *testing.B) *Device {
	b.Helper()
	if d := existing("lo"); d != nil {
		d.Close()
	}
	d, err := ForName("lo")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	return d
}

// BenchmarkForwardPath hands a crafted unicast datagram for a QPN of
// another device of lo to the receive path, which checks it and forwards
// it over loopback (one sendmsg); the owner's reading and delivery run on
// its own goroutine and are not part of an op. One op is one datagram.
func BenchmarkForwardPath(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			owner := benchDev(b)
			q, err := owner.CreateQP(softverbs.DriverQPInit{Type: verbs.QPTypeUD})
			if err != nil {
				b.Fatal(err)
			}
			defer q.Destroy()
			h := verbs.NewHost()
			defer h.Close()
			d, err := On(h).ForName("lo")
			if err != nil {
				b.Fatal(err)
			}
			g := randGroup()
			if err := d.IncGroup(g); err != nil {
				b.Fatal(err)
			}
			d.mu.Lock()
			r := newReceiver(d, d.mships[g].sock, nil)
			d.mu.Unlock()
			in := &injector{port: 40007}
			frame := in.craft(netip.MustParseAddr("127.0.0.1"), wire.UDHeader{PKey: 0xFFFF, DestQP: q.QPN(), QKey: 9, SrcQP: 77}, make([]byte, size), nil)
			name := make([]byte, 16)
			name[0], name[2], name[3] = unix.AF_INET, 40007>>8, 40007&0xff
			copy(name[4:], []byte{127, 0, 0, 1})
			oob := make([]byte, 128)
			k := putOrigDst(oob, netip.AddrFrom4([4]byte{127, 0, 0, 1}))
			k += putCmsgInt(oob[k:], unix.IPPROTO_IP, unix.IP_TTL, 1)
			b.SetBytes(int64(size))
			n := 0
			for b.Loop() {
				r.handle(frame, name, oob, false)
				n++
			}
			// A flood faster than the owner reads fills the connection
			// (the sender's buffer): those datagrams are counted dropped,
			// as the kernel counted them in the owner's socket_drops when
			// the hand-over was a UDP datagram.
			c := d.Counters()
			fwd, drops := c.Get(softverbs.Forwarded), c.Get(softverbs.ForwardDrops)
			if fwd == 0 || fwd+drops < uint64(n) {
				b.Fatalf("%d handled: forwarded %d, dropped %d", n, fwd, drops)
			}
			b.ReportMetric(float64(drops)/float64(n), "drops/op")
		})
	}
}
