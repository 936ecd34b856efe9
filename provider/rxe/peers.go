package rxe

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/wire"
)

// Peer sockets: a unicast datagram handed over to a device (forward.go)
// came from a peer whose datagrams the kernel gives to another process's
// socket (a hash over the reuseport group of UDP 4791), and so will its
// next ones. The device then opens a socket of its own on 4791 connected
// to that peer's address and port: the kernel prefers a connected socket
// whose four-tuple matches to the whole group, so the peer's next
// datagrams come straight to the device, and a ping-pong between two
// processes takes no hand-over after its first datagram each way. A peer
// socket is one more unicast receive socket (a datagram on it for
// another device's QPN is handed over as on any), at most maxPeerSocks
// per device, closed with the unicast sockets. Only a datagram that passed
// the owner's checks (ICRC, its send block's QPN) asks for one.
//
// One four-tuple, one socket: a peer that talks to two devices of the
// host from one port can be steered to one of them only, and a second
// socket with the same four-tuple would only take a slot (the kernel
// gives every datagram to one of the two, which one depending on its
// hash chains). So a device opens a peer socket only while no socket of
// the network namespace has that four-tuple (/proc/net/udp), and the
// devices of the user open them one at a time (a lock, lockPeerSocks), so two cannot both find the four-tuple free.
// The other device's datagrams from that peer are handed over; it asks
// again after peerRetry, and gets the socket once the holder's is gone.

// maxPeerSocks bounds the peer sockets of one device.
const maxPeerSocks = 16

// peerKey is a peer's address and UDP port, and the family of the socket
// that reads it.
type peerKey struct {
	addr netip.Addr
	port uint16
	v6   bool
}

// peerRetry is how long a device waits before it asks again for a peer
// socket it could not open (another device had the four-tuple).
const peerRetry = time.Second

// peerSocks is the goroutine that opens a device's peer sockets.
type peerSocks struct {
	req  chan peerKey
	gone chan peerKey // a peer socket closed early (sockerr.go): its slot is free
	done chan struct{}
}

// startPeersLocked starts the device's peer goroutine (d.mu held).
func (d *Device) startPeersLocked() {
	if d.peers.Load() != nil {
		return
	}
	p := &peerSocks{req: make(chan peerKey, maxPeerSocks), gone: make(chan peerKey, maxPeerSocks), done: make(chan struct{})}
	d.peers.Store(p)
	d.wg.Add(1)
	go d.peerLoop(p)
}

// stopPeersLocked stops it (d.mu held); the peer sockets are among the
// unicast sockets, which the caller closes.
func (d *Device) stopPeersLocked() {
	if p := d.peers.Swap(nil); p != nil {
		close(p.done)
	}
}

// askPeer asks for a socket connected to the source of the datagram just
// checked (r.meta), once per new source, and again after peerRetry: it
// never waits (the request is dropped when the goroutine is behind) and
// takes no lock, for it runs in a receive handler.
func (r *receiver) askPeer(v6 bool) {
	k := peerKey{addr: r.meta.src, port: r.meta.srcPort, v6: v6}
	if k.port == 0 {
		return
	}
	now := clock()
	if k == r.asked && now-r.askedAt < int64(peerRetry) {
		return
	}
	p := r.d.peers.Load()
	if p == nil {
		return
	}
	select {
	case p.req <- k:
		r.asked, r.askedAt = k, now
	default:
	}
}

// peerLoop opens a socket for each new peer asked for, up to maxPeerSocks.
func (d *Device) peerLoop(p *peerSocks) {
	defer d.wg.Done()
	open := map[peerKey]bool{}
	failed := map[peerKey]time.Time{} // when a peer's socket could not be opened
	for {
		select {
		case <-p.done:
			return
		case k := <-p.gone:
			delete(open, k)
		case k := <-p.req:
			// Ends signalled before this request count first (select
			// picks among ready cases at random): a peer whose socket
			// just ended gets a new one.
		drain:
			for {
				select {
				case g := <-p.gone:
					delete(open, g)
				default:
					break drain
				}
			}
			if open[k] || len(open) >= maxPeerSocks {
				continue
			}
			if t, ok := failed[k]; ok && time.Since(t) < peerRetry {
				continue
			}
			if d.openPeerSock(p, k) {
				open[k] = true
				delete(failed, k)
				continue
			}
			if len(failed) >= 4*maxPeerSocks {
				clear(failed)
			}
			failed[k] = time.Now()
		}
	}
}

// openPeerSock opens the socket of peer k and reports whether it did (best
// effort: without it the peer's datagrams are handed over as before). It
// does not while a socket of the network namespace has the four-tuple
// (another device's), checked and connected under the user's peer-socket
// lock (lockPeerSocks).
func (d *Device) openPeerSock(p *peerSocks, k peerKey) bool {
	unlock := d.lockPeerSocks()
	defer unlock()
	if taken, _ := fourTupleTaken(k); taken {
		return false // unknown (no list to read): opened, as before the check
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.peers.Load() != p {
		return false
	}
	conn, err := openRecvConn(k.v6)
	if err != nil {
		return false
	}
	var sa unix.Sockaddr
	if k.v6 {
		sa = &unix.SockaddrInet6{Port: int(k.port), Addr: k.addr.As16()}
	} else if k.addr.Unmap().Is4() {
		sa = &unix.SockaddrInet4{Port: int(k.port), Addr: k.addr.Unmap().As4()}
	} else {
		conn.Close()
		return false
	}
	if err := control(conn, func(fd int) error { return unix.Connect(fd, sa) }); err != nil {
		conn.Close()
		return false
	}
	s := &recvSock{v6: k.v6, conn: conn, peer: k}
	s.publish()
	br, err := newBatchReader(conn)
	if err != nil {
		conn.Close()
		return false
	}
	d.startUnicastLocked(s, br)
	return true
}

// peerLockWait bounds how long a device waits for the peer-socket lock
// (held for a read of /proc/net/udp and a socket's opening); past it, or
// when another user holds the lock's name, it goes on without.
const peerLockWait = 500 * time.Millisecond

// lockPeerSocks takes the lock under which the user's devices in the
// network namespace open peer sockets, and returns its release. The lock
// is the abstract unix socket peerLockName listening: one holder at a
// time, freed when it closes (or its process dies). A name held by a
// socket of another user, or held longer than peerLockWait, is no lock.
func (d *Device) lockPeerSocks() (unlock func()) {
	name := &unix.SockaddrUnix{Name: peerLockName()}
	uid := uint32(os.Geteuid())
	deadline := time.Now().Add(peerLockWait)
	for {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			return func() {}
		}
		if err = unix.Bind(fd, name); err == nil {
			if unix.Listen(fd, 1) == nil {
				return func() { unix.Close(fd) }
			}
			unix.Close(fd)
			return func() {}
		}
		unix.Close(fd)
		if err != unix.EADDRINUSE || time.Now().After(deadline) || lockHolder(name) != uid {
			return func() {}
		}
		time.Sleep(time.Millisecond)
	}
}

// lockHolder returns the uid of the process listening on name, or this
// process's uid when it cannot tell (a holder between its bind and its
// listen, a full backlog): then the caller waits.
func lockHolder(name *unix.SockaddrUnix) uint32 {
	uid := uint32(os.Geteuid())
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return uid
	}
	defer unix.Close(fd)
	if unix.Connect(fd, name) != nil {
		return uid
	}
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return uid
	}
	return cred.Uid
}

// fourTupleTaken reports whether a UDP socket of the network namespace on
// port 4791 is connected to k (one of another device of the user: only
// the user's sockets share the port), as /proc/net/udp or udp6 lists
// them; an error when the list cannot be read.
func fourTupleTaken(k peerKey) (bool, error) {
	f := "/proc/thread-self/net/udp"
	var want []byte
	if k.v6 {
		f += "6"
		a := k.addr.As16()
		for i := 0; i < 16; i += 4 {
			want = fmt.Appendf(want, "%08X", binary.NativeEndian.Uint32(a[i:i+4]))
		}
	} else {
		a := k.addr.Unmap().As4()
		want = fmt.Appendf(want, "%08X", binary.NativeEndian.Uint32(a[:]))
	}
	want = fmt.Appendf(want, ":%04X", k.port)
	local := fmt.Sprintf(":%04X", wire.UDPPort)
	b, err := os.ReadFile(f)
	if err != nil {
		return false, err
	}
	// "sl local_address rem_address st ...", addresses as the kernel
	// prints them (%08X of each 32-bit word, in host order), 01 the
	// connected state (TCP_ESTABLISHED).
	for _, l := range bytes.Split(b, []byte("\n"))[1:] {
		fs := bytes.Fields(l)
		if len(fs) >= 4 && bytes.HasSuffix(fs[1], []byte(local)) && bytes.Equal(fs[2], want) && string(fs[3]) == "01" {
			return true, nil
		}
	}
	return false, nil
}
