package rxe

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"syscall"

	"github.com/softrdma/softrdma/logging"
	"github.com/softrdma/softrdma/provider/softverbs"
)

// Errors of the receive sockets.
//
// A UDP socket that is connected (a peer socket, peers.go) gets from the
// kernel an error for each ICMP or ICMPv6 error message whose quoted
// datagram matches its addresses and ports: a port unreachable makes its
// next read fail with ECONNREFUSED, then the reads go on as before
// (mmsg.AsyncError). The socket never sends, so such a message is never
// about a datagram of its own: anyone who can send ICMP to the host and
// knows a peer's address can make one, blind, by sweeping the peer's
// ephemeral ports. A receive goroutine therefore counts it
// (socket_errors), logs the first of each socket, and reads on; the
// socket stays, as do the datagrams queued behind the error (closing it
// would lose them, and hand the attacker a way to push the peer's
// datagrams back through the hand-over). A goroutine that still ends
// while its socket is open (an error that is not of that kind) says so
// (logged, recv_loop_ends), and a unicast socket is closed with it.

// closedErr reports whether err, the end of a receive goroutine's Serve,
// is its socket's close (the one planned end).
func closedErr(err error) bool { return err == nil || errors.Is(err, net.ErrClosed) }

// connEnded reports whether err ends a hand-over connection that the
// forwarder closed.
func connEnded(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.EPIPE)
}

// socketError counts an error the kernel reported on receive socket s for
// an ICMP message, which its reader read past, and logs the first of the
// socket. It runs in the socket's reader (no lock held).
func (d *Device) socketError(s *recvSock, errno syscall.Errno) {
	d.core.Count(softverbs.SocketErrors, 1)
	if s.errSaid.Swap(true) {
		return
	}
	if l := logging.Logger(); l != nil {
		l.Warn("rxe: receive socket reported an ICMP error; counted in socket_errors, the socket reads on (further errors of this socket are counted only)",
			"device", d.name, "socket", s.describe(), "error", errno.Error())
	}
}

// loopEnded counts and logs the end of the goroutine of receive socket s
// (nil: a hand-over connection) on err while the socket is open.
func (d *Device) loopEnded(s *recvSock, err error) {
	d.core.Count(softverbs.RecvLoopEnds, 1)
	if l := logging.Logger(); l != nil {
		what := "hand-over connection"
		if s != nil {
			what = s.describe()
		}
		l.Error("rxe: a receive goroutine ended on an error; counted in recv_loop_ends",
			"device", d.name, "socket", what, "error", err.Error())
	}
}

// unicastEnded closes unicast socket s, whose goroutine ended, unless the
// device closed it meanwhile; a peer socket's peer may then have a socket
// again (peers.go).
func (d *Device) unicastEnded(s *recvSock) {
	d.mu.Lock()
	defer d.mu.Unlock()
	i := slices.Index(d.usocks, s)
	if i < 0 {
		return
	}
	d.usocks = slices.Delete(d.usocks, i, i+1)
	d.removeInputLocked(s.uin)
	d.closeSock(s)
	d.closeGuardIdleLocked()
	if s.peer.port != 0 {
		if p := d.peers.Load(); p != nil {
			select {
			case p.gone <- s.peer:
			default:
			}
		}
	}
}

// describe names the socket for a log: its family and, for a peer socket,
// its peer.
func (s *recvSock) describe() string {
	fam := "udp4"
	if s.v6 {
		fam = "udp6"
	}
	if s.peer.port != 0 {
		return fam + " peer socket of " + netip.AddrPortFrom(s.peer.addr, s.peer.port).String()
	}
	return fam + " socket on 4791"
}
