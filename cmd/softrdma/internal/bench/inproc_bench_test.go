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
// datagram, as it never does between two processes.) ib and ib-switch are
// the same ping-pong between two IB ports of this process on a softsm
// subnet in this process, with direct forwarding (softsm's default) and
// with every packet through the switch (-via-switch).
func BenchmarkPingPongInProcess(b *testing.B) {
	g1, g2 := netip.MustParseAddr("239.9.8.1"), netip.MustParseAddr("239.9.8.2")
	ibPeer := func(viaSwitch bool) func(in, out netip.Addr) (pingPeer, error) {
		return func(in, out netip.Addr) (pingPeer, error) {
			// Ports of their own for each subnet (ibPort reuses a port
			// of its address).
			a := [4]byte{127, 0, 9, 1}
			if viaSwitch {
				a[2] = 10
			}
			if in == g2 {
				a[3] = 2
			}
			bind := netip.AddrFrom4(a)
			sub, err := inprocSubnet(b, viaSwitch)
			if err != nil {
				return nil, err
			}
			d, err := ibPort(sub.addr, bind)
			if err != nil {
				return nil, err
			}
			b.Cleanup(func() { d.Close() })
			return newCMPeer(bind, in, out, 64, true)
		}
	}
	for _, c := range []struct {
		name string
		peer func(in, out netip.Addr) (pingPeer, error)
	}{
		{"ib", ibPeer(false)},
		{"ib-switch", ibPeer(true)},
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

// inprocSubnets are the benchmark's subnets, one each way, started on
// first use and stopped when the benchmark ends.
var inprocSubnets = map[bool]*subnet{}

func inprocSubnet(b *testing.B, viaSwitch bool) (*subnet, error) {
	if s := inprocSubnets[viaSwitch]; s != nil {
		return s, nil
	}
	s, err := startSubnet("", viaSwitch)
	if err != nil {
		return nil, err
	}
	inprocSubnets[viaSwitch] = s
	b.Cleanup(func() { s.stop(); delete(inprocSubnets, viaSwitch) })
	return s, nil
}
