package rxe

import (
	"net/netip"

	"golang.org/x/sys/unix"
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

// maxPeerSocks bounds the peer sockets of one device.
const maxPeerSocks = 16

// peerKey is a peer's address and UDP port, and the family of the socket
// that reads it.
type peerKey struct {
	addr netip.Addr
	port uint16
	v6   bool
}

// peerSocks is the goroutine that opens a device's peer sockets.
type peerSocks struct {
	req  chan peerKey
	done chan struct{}
}

// startPeersLocked starts the device's peer goroutine (d.mu held).
func (d *Device) startPeersLocked() {
	if d.peers.Load() != nil {
		return
	}
	p := &peerSocks{req: make(chan peerKey, maxPeerSocks), done: make(chan struct{})}
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
// checked (r.meta), once per new source: it never waits (the request is
// dropped when the goroutine is behind) and takes no lock, for it runs in
// a receive handler.
func (r *receiver) askPeer(v6 bool) {
	k := peerKey{addr: r.meta.src, port: r.meta.srcPort, v6: v6}
	if k == r.asked || k.port == 0 {
		return
	}
	p := r.d.peers.Load()
	if p == nil {
		return
	}
	select {
	case p.req <- k:
		r.asked = k
	default:
	}
}

// peerLoop opens a socket for each new peer asked for, up to maxPeerSocks.
func (d *Device) peerLoop(p *peerSocks) {
	defer d.wg.Done()
	known := map[peerKey]bool{}
	for {
		select {
		case <-p.done:
			return
		case k := <-p.req:
			if known[k] || len(known) >= maxPeerSocks {
				continue
			}
			known[k] = true
			d.openPeerSock(p, k)
		}
	}
}

// openPeerSock opens the socket of peer k (best effort: without it the
// peer's datagrams are handed over as before).
func (d *Device) openPeerSock(p *peerSocks, k peerKey) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.peers.Load() != p {
		return
	}
	conn, err := openRecvConn(k.v6)
	if err != nil {
		return
	}
	var sa unix.Sockaddr
	if k.v6 {
		sa = &unix.SockaddrInet6{Port: int(k.port), Addr: k.addr.As16()}
	} else if k.addr.Unmap().Is4() {
		sa = &unix.SockaddrInet4{Port: int(k.port), Addr: k.addr.Unmap().As4()}
	} else {
		conn.Close()
		return
	}
	if err := control(conn, func(fd int) error { return unix.Connect(fd, sa) }); err != nil {
		conn.Close()
		return
	}
	s := &recvSock{v6: k.v6, conn: conn}
	s.publish()
	br, err := newBatchReader(conn)
	if err != nil {
		conn.Close()
		return
	}
	d.startUnicastLocked(s, br)
}
