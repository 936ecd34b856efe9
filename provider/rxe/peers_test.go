package rxe

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/wire"
)

// connectedPeers returns the peer addresses d's unicast sockets are connected
// to.
func connectedPeers(d *Device) []netip.AddrPort {
	d.mu.Lock()
	defer d.mu.Unlock()
	var l []netip.AddrPort
	for _, s := range d.usocks {
		_ = control(s.conn, func(fd int) error {
			if sa, err := unix.Getpeername(fd); err == nil {
				if a, ok := sa.(*unix.SockaddrInet4); ok {
					l = append(l, netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)))
				}
			}
			return nil
		})
	}
	return l
}

// TestPeerSocket: a datagram handed over to its owner (the kernel gave it
// to another process's socket) makes the owner open a socket connected to
// its source, which the kernel prefers: the peer's next datagram reaches
// the owner directly, with no hand-over. At most maxPeerSocks per device.
func TestPeerSocket(t *testing.T) {
	a := loDev(t)
	b := loPeer(t)
	const qkey = 0x5150
	rx := newFakeRx()
	q := newQP(t, a, rx, 0, qkey)
	r := peerReceiver(t, b)
	in := newInjector(t)
	name, oob := unicastInput(in.port)
	lo := netip.MustParseAddr("127.0.0.1")
	frame := in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: q.QPN(), QKey: qkey, SrcQP: 0x42}, []byte("first"), nil)

	r.handle(frame, name, oob, false) // as if b's socket had read it
	if got := rx.wait(t); string(got.payload) != "first" {
		t.Fatalf("delivered %q", got.payload)
	}
	want := netip.AddrPortFrom(lo, in.port)
	eventually(t, "the owner's socket connected to the peer", func() bool {
		for _, p := range connectedPeers(a) {
			if p == want {
				return true
			}
		}
		return false
	})

	// The peer's next datagram, sent for real, comes straight to a.
	frame = in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: q.QPN(), QKey: qkey, SrcQP: 0x42}, []byte("direct"), nil)
	in.send(t, lo, frame)
	if got := rx.wait(t); string(got.payload) != "direct" {
		t.Fatalf("delivered %q", got.payload)
	}
	if f, rf := b.Counters().Get(softverbs.Forwarded), a.Counters().Get(softverbs.RcvdForwarded); f != 1 || rf != 1 {
		t.Fatalf("after the peer socket: b forwarded %d, a received %d forwarded (want 1 and 1: the first only)", f, rf)
	}

	// Forwards from many sources: at most maxPeerSocks peer sockets.
	for i := range 3 * maxPeerSocks {
		port := uint16(20000 + i)
		n, o := unicastInput(port)
		f := (&injector{port: port}).craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: q.QPN(), QKey: qkey, SrcQP: 0x42}, []byte("x"), nil)
		r.handle(f, n, o, false)
		rx.wait(t)
	}
	eventually(t, "peer sockets opened", func() bool { return len(connectedPeers(a)) >= maxPeerSocks })
	if n := len(connectedPeers(a)); n != maxPeerSocks {
		t.Fatalf("%d peer sockets, want at most %d", n, maxPeerSocks)
	}
}
