package rdmacm_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/rdmacm"
)

// BenchmarkRoCEJoinLeave times one join on softrdma's RoCEv2 device of the
// loopback interface (the IP membership taken, the MULTICAST_JOIN event
// retrieved) and one leave, on an id holding "held" other groups: the RDMA
// CM's RoCE road (cma_iboe_join_multicast). Loopback only.
func BenchmarkRoCEJoinLeave(b *testing.B) {
	benchJoinLeave(b, netip.MustParseAddr("127.0.0.1"), 78)
}

// BenchmarkIBJoinLeave times one join on an InfiniBand port of an
// in-process subnet (the SA's Set answered, its MULTICAST_JOIN event
// retrieved) and one leave (the SA's Delete answered), on an id holding
// "held" other groups: the RDMA CM's IB road through the host's SA client.
func BenchmarkIBJoinLeave(b *testing.B) {
	s, err := sm.New(sm.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	local := netip.MustParseAddr("127.0.9.31")
	port, err := ib.Open(ib.Config{SM: s.FabricAddr().String(), Local: local})
	if err != nil {
		b.Fatal(err)
	}
	defer port.Close()
	benchJoinLeave(b, local, 77)
}

// benchJoinLeave runs the join/leave benchmark on an id bound to local,
// with 0 and 100 groups held, in groups 239.g.x.y.
func benchJoinLeave(b *testing.B, local netip.Addr, g byte) {
	for _, held := range []int{0, 100} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			ch, err := rdmacm.CreateEventChannel()
			if err != nil {
				b.Fatal(err)
			}
			defer ch.Close()
			id, err := rdmacm.CreateID(ch, nil, rdmacm.PS_UDP)
			if err != nil {
				b.Fatal(err)
			}
			defer id.Destroy()
			if err := id.BindAddr(rdmacm.UDPAddr(local)); err != nil {
				b.Fatal(err)
			}
			join := func(g netip.Addr) {
				if err := id.JoinMulticast(rdmacm.UDPAddr(g), nil); err != nil {
					b.Fatal(err)
				}
				ectx, ecancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer ecancel()
				ev, err := ch.GetEvent(ectx)
				if err != nil {
					b.Fatal(err)
				}
				if ev.Event != rdmacm.EventMulticastJoin {
					b.Fatalf("%v status %d", ev.Event, ev.Status)
				}
				ev.Ack()
			}
			group := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{239, g, byte(i >> 8), byte(i)}) }
			for i := 1; i <= held; i++ {
				join(group(i))
			}
			for b.Loop() {
				join(group(0))
				if err := id.LeaveMulticast(rdmacm.UDPAddr(group(0))); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			for i := 1; i <= held; i++ {
				id.LeaveMulticast(rdmacm.UDPAddr(group(i)))
			}
		})
	}
}
