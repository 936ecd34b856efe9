package bench

import (
	"net/netip"
	"testing"
)

// BenchmarkPingPongInProcess is the latency part's ping-pong in one
// goroutine: both peers in this process, each message sent and then
// received by the other peer at once (loopback delivers inside the send),
// busy-polling — no wake-up, no other thread, no scheduler: the time of
// the code and the system calls on the path of a round trip, softrdma's
// (rdma: PostSend, the send completion, the receive's poll, rdma_post_recv)
// against plain UDP sockets with raw system calls (udp). Both make two
// sends and two receives a round trip. Compare the two sub-benchmarks:
//
//	go test -run '^$' -bench PingPongInProcess ./cmd/softrdma/internal/bench
//
// (One difference is this benchmark's own: the two rdma peers share the
// device's receive socket, so its ICRC prefix cache misses on every
// datagram, as it never does between two processes.)
func BenchmarkPingPongInProcess(b *testing.B) {
	g1, g2 := netip.MustParseAddr("239.9.8.1"), netip.MustParseAddr("239.9.8.2")
	for _, c := range []struct {
		name string
		peer func(in, out netip.Addr) (pingPeer, error)
	}{
		{"udp", func(in, out netip.Addr) (pingPeer, error) { return newUDPPeer(lo, in, out, 4797, 64, true) }},
		{"rdma", func(in, out netip.Addr) (pingPeer, error) { return newCMPeer(lo, in, out, 64, true) }},
		{"udp-block", func(in, out netip.Addr) (pingPeer, error) { return newUDPPeer(lo, in, out, 4796, 64, false) }},
		{"rdma-block", func(in, out netip.Addr) (pingPeer, error) { return newCMPeer(lo, in, out, 64, false) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			p, err := c.peer(g1, g2)
			if err != nil {
				b.Fatal(err)
			}
			defer p.close()
			q, err := c.peer(g2, g1)
			if err != nil {
				b.Fatal(err)
			}
			defer q.close()
			hop := func(from, to pingPeer, seq uint64) {
				if err := from.send(seq); err != nil {
					b.Fatal(err)
				}
				if got, ok, err := to.recv(); err != nil || !ok || got != seq {
					b.Fatalf("received %d (ok %v, %v), want %d", got, ok, err, seq)
				}
			}
			var seq uint64
			for range 100 {
				seq++
				hop(p, q, seq)
				hop(q, p, seq)
			}
			b.ReportAllocs()
			for b.Loop() {
				seq++
				hop(p, q, seq)
				hop(q, p, seq)
			}
		})
	}
}
