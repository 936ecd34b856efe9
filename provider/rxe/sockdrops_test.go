package rxe

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/ipv4"

	"github.com/softrdma/softrdma/internal/sys/rawudp"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/wire"
)

// TestSocketDrops: datagrams the kernel drops because a receive socket's
// buffer is full are counted (SO_MEMINFO when the counters are read), so
// every datagram sent to the device is either read (rcvd_pkts) or a
// socket_drops, with nothing sent after the burst. The test shrinks the group's socket buffer to the kernel's minimum
// and sends a burst that cannot fit while the device reads.
func TestSocketDrops(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	q := newQP(t, d, newFakeRx(), 0, 0x1234)
	if err := q.AttachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	var conn *rawudp.Conn
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
	// Every datagram is read or counted when the counters are read, the
	// burst's tail too (dropped after the last datagram queued, which the
	// kernel reports with no datagram: the device asks the socket). Wait
	// for the device to read what is queued; never send more.
	var rcvd, drops uint64
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := d.Counters()
		rcvd = c.Get(softverbs.RcvdPkts) - before.Get(softverbs.RcvdPkts)
		drops = c.Get(softverbs.SocketDrops) - before.Get(softverbs.SocketDrops)
		if rcvd+drops > n {
			t.Fatalf("read %d + socket drops %d > %d sent: a drop counted twice", rcvd, drops, n)
		}
		if rcvd+drops == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("read %d, socket drops %d, of %d sent", rcvd, drops, n)
		}
		time.Sleep(time.Millisecond)
	}
	if drops == 0 {
		t.Errorf("no socket drops: read %d of %d sent", rcvd, n)
	}
	t.Logf("read %d, socket drops %d, of %d sent", rcvd, drops, n)
}
