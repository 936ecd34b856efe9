package rxe

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/ipv4"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/wire"
)

// TestSocketDrops: datagrams the kernel drops because a receive socket's
// buffer is full are counted (SO_RXQ_OVFL), so every datagram sent to the
// device is either read (rcvd_pkts) or a socket_drops. The test shrinks
// the group's socket buffer to the kernel's minimum and sends a burst that
// cannot fit while the device reads.
func TestSocketDrops(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	q := newQP(t, d, newFakeRx(), 0, 0x1234)
	if err := q.AttachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	var conn *net.UDPConn
	for _, s := range d.rsocks {
		for _, m := range s.list {
			if m.addr == g {
				conn = s.conn
			}
		}
	}
	d.mu.Unlock()
	if conn == nil {
		t.Fatalf("no receive socket holds %v", g)
	}
	if err := conn.SetReadBuffer(1); err != nil { // the kernel's minimum
		t.Fatal(err)
	}
	before := d.Counters()
	const n = 600
	// Not RoCEv2: the device reads and drops them as malformed, which is
	// beside the point; what counts is that each one is read or dropped.
	// Only on lo: bound to 127.0.0.1, multicast interface lo.
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	tx, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")),
		net.UDPAddrFromAddrPort(netip.AddrPortFrom(g, wire.UDPPort)))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	pc := ipv4.NewPacketConn(tx)
	if err := pc.SetMulticastInterface(lo); err != nil {
		t.Fatal(err)
	}
	if err := pc.SetMulticastLoopback(true); err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 1024)
	for range n {
		if _, err := tx.Write(payload); err != nil {
			t.Fatal(err)
		}
	}
	// The kernel reports a socket's drop count with the next datagram it
	// queues: probes, one at a time, carry the count of the burst's tail.
	var rcvd, drops uint64
	read := func() {
		c := d.Counters()
		rcvd = c.Get(softverbs.RcvdPkts) - before.Get(softverbs.RcvdPkts)
		drops = c.Get(softverbs.SocketDrops) - before.Get(softverbs.SocketDrops)
	}
	sent := uint64(n)
	for probe := 0; ; probe++ {
		if probe == 50 {
			t.Fatalf("after %d probes: read %d, socket drops %d, of %d sent", probe, rcvd, drops, sent)
		}
		read()
		if rcvd+drops == sent {
			break
		}
		// A probe the full buffer drops shows only with a later one: wait
		// a little for this one, then send the next.
		seen := rcvd + drops
		if _, err := tx.Write(payload); err != nil {
			t.Fatal(err)
		}
		sent++
		for deadline := time.Now().Add(500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if read(); rcvd+drops > seen {
				break
			}
		}
	}
	if drops == 0 {
		t.Errorf("no socket drops: read %d of %d sent", rcvd, sent)
	}
	t.Logf("read %d, socket drops %d, of %d sent", rcvd, drops, sent)
}
