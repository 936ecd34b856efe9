package rxe

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/logging"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// peerSockOf returns d's unicast receive socket connected to peer, nil
// when there is none.
func peerSockOf(d *Device, peer netip.AddrPort) *recvSock {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.usocks {
		var got netip.AddrPort
		_ = control(s.conn, func(fd int) error {
			sa, err := unix.Getpeername(fd)
			if err != nil {
				return nil
			}
			switch a := sa.(type) {
			case *unix.SockaddrInet4:
				got = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
			case *unix.SockaddrInet6:
				got = netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
			}
			return nil
		})
		if got == peer {
			return s
		}
	}
	return nil
}

// waitFor returns the next delivery to rx within timeout; false when none
// came.
func (f *fakeRx) waitFor(timeout time.Duration) (delivery, bool) {
	select {
	case d := <-f.ch:
		return d, true
	case <-time.After(timeout):
		return delivery{}, false
	}
}

// pingPong sends n requests from qb to qa, each answered by qa, and
// returns how many replies qb received. A request or reply not delivered
// within a second is lost; after three losses in a row the rest wait a
// tenth of that.
func pingPong(t *testing.T, ah *verbs.AHAttr, qa, qb *tqp, rxA, rxB *fakeRx, qkey uint32, n int, tag string) int {
	t.Helper()
	replies, lost := 0, 0
	for i := range n {
		timeout := time.Second
		if lost >= 3 {
			timeout = 100 * time.Millisecond
		}
		req := fmt.Sprintf("%s request %d", tag, i)
		if err := qb.Send(&softverbs.UDSend{AH: ah, RemoteQPN: qa.QPN(), RemoteQKey: qkey, Payload: []byte(req)}); err != nil {
			t.Fatal(err)
		}
		got, ok := rxA.waitFor(timeout)
		if !ok || string(got.payload) != req {
			lost++
			continue
		}
		rep := fmt.Sprintf("%s reply %d", tag, i)
		if err := qa.Send(&softverbs.UDSend{AH: ah, RemoteQPN: qb.QPN(), RemoteQKey: qkey, Payload: []byte(rep)}); err != nil {
			t.Fatal(err)
		}
		got, ok = rxB.waitFor(timeout)
		if !ok || string(got.payload) != rep {
			lost++
			continue
		}
		replies++
		lost = 0
	}
	return replies
}

// icmpPortUnreachable returns an ICMP (IPv4) or ICMPv6 destination
// unreachable, port unreachable, quoting a UDP datagram from local:lport
// to remote:rport, as the remote host's stack would send it: the message
// that makes the kernel report ECONNREFUSED on a socket connected from
// local:lport to remote:rport. The ICMPv6 checksum is the kernel's to
// fill in (raw ICMPv6 sockets); the ICMP one is computed here.
func icmpPortUnreachable(local netip.Addr, lport uint16, remote netip.Addr, rport uint16) []byte {
	var udp [8]byte
	wire.UDP(udp[:]).Encode(lport, rport, 8+20)
	if local.Is4() {
		b := make([]byte, 8, 8+wire.IPv4HeaderLen+8)
		b[0], b[1] = 3, 3 // destination unreachable, port unreachable
		var iph [wire.IPv4HeaderLen]byte
		ip := wire.IPv4(iph[:])
		ip.Encode(wire.IPv4Fields{TotalLength: wire.IPv4HeaderLen + 8 + 20, DF: true, TTL: 64, Protocol: 17, Src: local, Dst: remote})
		ip.SetChecksum(ip.CalculateChecksum())
		b = append(append(b, iph[:]...), udp[:]...)
		binary.BigEndian.PutUint16(b[2:], inetChecksum(b))
		return b
	}
	b := make([]byte, 8, 8+wire.IPv6HeaderLen+8)
	b[0], b[1] = 1, 4 // destination unreachable, port unreachable
	var iph [wire.IPv6HeaderLen]byte
	wire.IPv6(iph[:]).Encode(wire.IPv6Fields{PayloadLength: 8 + 20, NextHeader: 17, HopLimit: 64, Src: local, Dst: remote})
	return append(append(b, iph[:]...), udp[:]...)
}

// inetChecksum is the Internet checksum of b.
func inetChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xFFFF {
		sum = sum&0xFFFF + sum>>16
	}
	return ^uint16(sum)
}

// sendICMP sends msg to dst from a raw ICMP or ICMPv6 socket (root).
func sendICMP(t *testing.T, dst netip.Addr, msg []byte) {
	t.Helper()
	fam, proto := unix.AF_INET6, unix.IPPROTO_ICMPV6
	var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: dst.As16()}
	if dst.Is4() {
		fam, proto = unix.AF_INET, unix.IPPROTO_ICMP
		sa = &unix.SockaddrInet4{Addr: dst.As4()}
	}
	fd, err := unix.Socket(fam, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		testenv.Require(t, "raw ICMP socket: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.Sendto(fd, msg, 0, sa); err != nil {
		t.Fatalf("sendto: %v", err)
	}
}

// logRecords captures softrdma's log records for the rest of the test.
type logRecords struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func captureLogs(t *testing.T) *logRecords {
	l := &logRecords{}
	logging.SetLogger(slog.New(slog.NewTextHandler(lockedWriter{l}, nil)))
	t.Cleanup(func() { logging.SetLogger(nil) })
	return l
}

type lockedWriter struct{ l *logRecords }

func (w lockedWriter) Write(b []byte) (int, error) {
	w.l.mu.Lock()
	defer w.l.mu.Unlock()
	return w.l.buf.Write(b)
}

// count returns how many records contain s.
func (l *logRecords) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), s)
}

// TestPeerSocketICMP: an ICMP port unreachable quoting a peer socket's
// four-tuple (anyone can send one; the ephemeral ports are quickly swept)
// makes the kernel report ECONNREFUSED on that socket's next read. It is
// an error about a datagram the socket never sent, not the socket's end:
// the socket reads on, the error is counted, and the ping-pong between
// two devices on lo whose requests come through the peer socket goes on
// (40 of 40 replies after the attack). IPv4 (ICMP) and IPv6 (ICMPv6), in
// a network namespace of its own.
func TestPeerSocketICMP(t *testing.T) {
	if !inNetns(t) {
		return
	}
	for _, addr := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")} {
		t.Run(map[bool]string{true: "IPv4", false: "IPv6"}[addr.Is4()], func(t *testing.T) { peerSocketICMP(t, addr) })
	}
}

func peerSocketICMP(t *testing.T, addr netip.Addr) {
	logs := captureLogs(t)
	a := loDev(t)
	b := loPeer(t)
	const qkey = 0x1C3
	const rounds = 40
	rxA, rxB := newFakeRx(), newFakeRx()
	qa := newQP(t, a, rxA, 0, qkey)
	qb := newQP(t, b, rxB, 0, qkey)
	tbl, _ := a.GIDTable(1)
	idx := -1
	for _, e := range tbl {
		if e.GID == wire.GIDFromAddr(addr) {
			idx = e.Index
		}
	}
	if idx < 0 {
		testenv.Require(t, "no GID for %v on lo: %+v", addr, tbl)
	}
	ah := &verbs.AHAttr{IsGlobal: true, PortNum: 1, GRH: verbs.GlobalRoute{DGID: wire.GIDFromAddr(addr), SGIDIndex: uint8(idx), HopLimit: 64}}
	v6 := !addr.Is4()
	b.mu.Lock()
	port := b.blocks[0].port4
	if v6 {
		port = b.blocks[0].port6
	}
	b.mu.Unlock()
	peer := netip.AddrPortFrom(addr, port)

	// a opens a socket connected to b's send socket, as a hand-over from
	// b would make it (TestPeerSocket): b's requests then come straight
	// to it.
	a.peers.Load().req <- peerKey{addr: addr, port: port, v6: v6}
	eventually(t, "a's peer socket", func() bool { return peerSockOf(a, peer) != nil })
	fwd0 := a.Counters().Get(softverbs.RcvdForwarded)
	if n := pingPong(t, ah, qa, qb, rxA, rxB, qkey, rounds, "before"); n != rounds {
		t.Fatalf("before the attack: %d/%d replies", n, rounds)
	}
	if f := a.Counters().Get(softverbs.RcvdForwarded); f != fwd0 {
		t.Errorf("before the attack: %d requests handed over to a, want none (the peer socket reads them)", f-fwd0)
	}

	// The attack: port unreachable for the peer socket's four-tuple,
	// three times (the kernel keeps one error per socket: one to three
	// are read).
	for range 3 {
		sendICMP(t, addr, icmpPortUnreachable(addr, wire.UDPPort, addr, port))
	}
	eventually(t, "the error counted", func() bool { return a.Counters().Get(softverbs.SocketErrors) >= 1 })
	fwd0 = a.Counters().Get(softverbs.RcvdForwarded)
	n := pingPong(t, ah, qa, qb, rxA, rxB, qkey, rounds, "after")
	t.Logf("%v: %d/%d replies after the attack", addr, n, rounds)
	if n != rounds {
		t.Errorf("after the attack: %d/%d replies", n, rounds)
	}
	// The peer socket read on: the same socket, still taking b's requests.
	if peerSockOf(a, peer) == nil {
		t.Errorf("the peer socket is gone")
	}
	c := a.Counters()
	if f := c.Get(softverbs.RcvdForwarded); f != fwd0 {
		t.Errorf("after the attack: %d requests handed over to a, want none (the peer socket reads them)", f-fwd0)
	}
	if e := c.Get(softverbs.SocketErrors); e < 1 || e > 3 || c.Get(softverbs.RecvLoopEnds) != 0 {
		t.Errorf("socket_errors %d (want 1 to 3), recv_loop_ends %d (want 0)", e, c.Get(softverbs.RecvLoopEnds))
	}
	if n := logs.count("reported an ICMP error"); n != 1 {
		t.Errorf("%d log records of the error, want 1:\n%s", n, logs.buf.String())
	}
}

// TestPeerSocketOneFourTuple: a peer that talks to two devices of the
// user from one port gets one peer socket on the host, not one per
// device (the second would never read a datagram: the kernel picks one
// socket per four-tuple); the other device's datagrams from it are handed
// over, and that device gets the socket once the holder's is gone.
func TestPeerSocketOneFourTuple(t *testing.T) {
	if !inNetns(t) {
		return
	}
	a := loDev(t)
	b := loPeer(t)
	const qkey = 0x4711
	rxA, rxB := newFakeRx(), newFakeRx()
	newQP(t, a, rxA, 0, qkey)
	qb := newQP(t, b, rxB, 0, qkey)
	in := newInjector(t)
	lo := netip.MustParseAddr("127.0.0.1")
	peer := netip.AddrPortFrom(lo, in.port)
	k := peerKey{addr: lo, port: in.port}
	if !a.openPeerSock(a.peers.Load(), k) {
		t.Fatal("a: no peer socket")
	}
	if b.openPeerSock(b.peers.Load(), k) || peerSockOf(b, peer) != nil {
		t.Fatal("b opened a second socket with a's four-tuple")
	}
	// b's datagrams from the peer reach b through a.
	send := func(msg string) {
		in.send(t, lo, in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: qb.QPN(), QKey: qkey, SrcQP: 0x42}, []byte(msg), nil))
		if got := rxB.wait(t); string(got.payload) != msg {
			t.Fatalf("b got %q, want %q", got.payload, msg)
		}
	}
	send("through a")
	// a counts the hand-over once its write returned, which may be after
	// b delivered it.
	eventually(t, "a's forwarded counter at 1", func() bool { return a.Counters().Get(softverbs.Forwarded) == 1 })
	// a's socket goes (as when its goroutine ends): b may have one now.
	s := peerSockOf(a, peer)
	a.unicastEnded(s)
	// b's own peer goroutine asks too (the hand-over above asked for it),
	// and may have the socket first.
	eventually(t, "b's peer socket once a's is gone", func() bool {
		return peerSockOf(b, peer) != nil || b.openPeerSock(b.peers.Load(), k) && peerSockOf(b, peer) != nil
	})
	fwd := b.Counters().Get(softverbs.RcvdForwarded)
	send("straight to b")
	if f := b.Counters().Get(softverbs.RcvdForwarded); f != fwd {
		t.Errorf("b received %d hand-overs, want none", f-fwd)
	}
}

// TestReceiveLoopEnd: a receive goroutine that ends on an error while its
// socket is open says so (a log record, recv_loop_ends) and, on a unicast
// socket, closes it, so that the kernel no longer queues datagrams for
// nobody; a peer socket's peer may have a socket again. The error is made
// by putting a listening TCP socket under the peer socket's descriptor
// (recvmmsg: ENOTCONN), the socket itself kept open beside it.
func TestReceiveLoopEnd(t *testing.T) {
	if !inNetns(t) {
		return
	}
	logs := captureLogs(t)
	a := loDev(t)
	rx := newFakeRx()
	q := newQP(t, a, rx, 0, 0x99)
	in := newInjector(t)
	lo := netip.MustParseAddr("127.0.0.1")
	peer := netip.AddrPortFrom(lo, in.port)
	k := peerKey{addr: lo, port: in.port}
	a.peers.Load().req <- k
	eventually(t, "a's peer socket", func() bool { return peerSockOf(a, peer) != nil })
	s := peerSockOf(a, peer)
	kept := -1
	err := control(s.conn, func(fd int) error {
		var err error
		if kept, err = unix.Dup(fd); err != nil {
			return err
		}
		l, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(l)
		if err := unix.Listen(l, 1); err != nil {
			return err
		}
		return unix.Dup3(l, fd, unix.O_CLOEXEC)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if kept >= 0 {
			unix.Close(kept)
		}
	}()
	frame := in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: q.QPN(), QKey: 0x99, SrcQP: 0x42}, []byte("x"), nil)
	in.send(t, lo, frame) // queued on the socket under kept: its readiness wakes the reader
	eventually(t, "the end counted", func() bool { return a.Counters().Get(softverbs.RecvLoopEnds) == 1 })
	eventually(t, "the socket closed", func() bool { return peerSockOf(a, peer) == nil })
	eventually(t, "the end's log record", func() bool { return logs.count("receive goroutine ended") >= 1 })
	if n := logs.count("receive goroutine ended"); n != 1 {
		t.Errorf("%d log records of the end, want 1:\n%s", n, logs.buf.String())
	}
	unix.Close(kept)
	kept = -1
	// The peer may have a socket again, which reads what it sends.
	a.peers.Load().req <- k
	eventually(t, "a's peer socket again", func() bool { return peerSockOf(a, peer) != nil })
	in.send(t, lo, in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: q.QPN(), QKey: 0x99, SrcQP: 0x42}, []byte("again"), nil))
	for {
		if got := rx.wait(t); string(got.payload) == "again" {
			break
		}
	}
}
