package rxe

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/internal/sys/rawudp"
	"github.com/softrdma/softrdma/logging"
	"github.com/softrdma/softrdma/provider/softverbs"
)

// The hand-over's transport. A unicast datagram that the kernel gave to a
// device other than its QPN's owner goes to the owner over a unix
// SOCK_SEQPACKET connection, never over UDP: each send block listens on
// the abstract unix socket handoverName(<IPv4 send port>), and accepts a
// connection only from a process of the same user (SO_PEERCRED); a
// forwarder hands over only to a socket that a process of the same user
// listens on (SO_PEERCRED of the connection: the listener's credentials).
// A remote host's crafted QPN can therefore reach only softrdma devices of
// the user whose sockets read it, never another UDP service of the host
// (on 127.0.0.1 or elsewhere), no other local user can inject a forwarded
// datagram, and no other local user can receive one. SOCK_SEQPACKET keeps
// datagram boundaries; unlike SOCK_DGRAM its queue is bounded by the
// sender's buffer (recvBufSize), not by net.unix.max_dgram_qlen (10 on
// some hosts).
//
// Why the abstract namespace: it is per network namespace, as QPNs are
// unique per network namespace, and every process of the user finds it
// whatever its environment ($TMPDIR, $XDG_RUNTIME_DIR, sudo, cron); there
// is no file another user can create in its place (a directory in the
// sticky /tmp can be pre-created by anyone and then not be removed by its
// victim), and a socket vanishes with its last descriptor, so a process
// killed without closing leaves nothing stale. Anyone may bind any
// abstract name: another user holding a name makes that one hand-over
// fail (the listen, or the forwarder's check of the listener), which is
// counted in handover_errors and logged once; the QP works, its unicast
// datagrams read by other processes of the user are lost.

// handoverName returns the abstract unix socket name of the hand-over
// socket of the send block whose IPv4 send port is port (a variable: tests
// point it elsewhere).
var handoverName = func(port uint16) string {
	return "@softrdma/" + strconv.Itoa(os.Geteuid()) + "/handover/" + strconv.Itoa(int(port))
}

// peerLockName returns the abstract unix socket name whose holder may open
// a peer socket (peers.go).
var peerLockName = func() string {
	return "@softrdma/" + strconv.Itoa(os.Geteuid()) + "/peer-lock"
}

// maxHandoverConns bounds a device's cache of connections to other
// devices' send blocks; past it the cache starts again empty.
const maxHandoverConns = 1024

// errForeignOwner is the error of a hand-over socket another user holds.
var errForeignOwner = fmt.Errorf("held by a socket of another user: %w", syscall.EPERM)

// handover is a device's side of the hand-over: its connections to other
// devices' send blocks, and the ports found to have no owner.
type handover struct {
	mu     sync.Mutex
	closed bool
	conns  map[uint16]*handoverConn // by the owner's IPv4 send port

	// none remembers the ports no device of this user held when a
	// connection was last tried (noOwnerCache); dials counts the
	// connection attempts.
	none  noOwnerCache
	dials atomic.Uint64

	logged atomic.Bool // a hand-over error was logged
}

// handoverConn is a connection to a send block's hand-over socket, out
// of the netpoller: the owner's reads make it writable, which would wake
// the netpoller's thread of the forwarding process once a datagram.
type handoverConn struct {
	c   *rawudp.Conn
	raw syscall.RawConn
}

// conn returns the connection to the owner of port, connecting if there
// is none. The error is ECONNREFUSED (or ENOENT) when no device holds the
// port (the port is then remembered in h.none), errForeignOwner when a
// socket of another user has its name, errDialBudget when the period's
// failed connection attempts are used up (maxNoOwnerDials).
func (h *handover) conn(port uint16) (*handoverConn, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, syscall.ESHUTDOWN
	}
	if hc := h.conns[port]; hc != nil {
		return hc, nil
	}
	none := &h.none
	none.syncLocked()
	if none.failed >= maxNoOwnerDials {
		return nil, errDialBudget
	}
	h.dials.Add(1)
	hc, err := dialHandover(handoverName(port))
	if err != nil {
		if noOwner(err) {
			none.failed++
			none.markLocked(port)
		}
		return nil, err
	}
	if h.conns == nil || len(h.conns) >= maxHandoverConns {
		h.closeConnsLocked()
		h.conns = map[uint16]*handoverConn{}
	}
	h.conns[port] = hc
	return hc, nil
}

// dialHandover connects to the hand-over socket name, which a process of
// this user must hold (else errForeignOwner).
func dialHandover(name string) (*handoverConn, error) {
	nc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Net: "unixpacket", Name: name})
	if err != nil {
		return nil, err
	}
	// The connection's queue is the sender's buffer: as large as the
	// receive sockets' where the process may (SO_SNDBUFFORCE), else up
	// to net.core.wmem_max.
	_ = control(nc, func(fd int) error {
		return setOpts(fd, []sockopt{
			{unix.SOL_SOCKET, unix.SO_SNDBUF, recvBufSize, true},
			{unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, recvBufSize, true},
		})
	})
	fd, cred, err := takeConn(nc)
	if err != nil {
		return nil, err
	}
	if cred.Uid != uint32(os.Geteuid()) {
		unix.Close(fd)
		return nil, fmt.Errorf("hand-over socket %s: uid %d: %w", name, cred.Uid, errForeignOwner)
	}
	c, err := rawudp.NewConn(fd)
	if err != nil {
		return nil, err
	}
	raw, _ := c.SyscallConn()
	return &handoverConn{c: c, raw: raw}, nil
}

// drop forgets hc, a connection whose owner went away.
func (h *handover) drop(port uint16, hc *handoverConn) {
	h.mu.Lock()
	if h.conns[port] == hc {
		delete(h.conns, port)
	}
	h.mu.Unlock()
	hc.c.Close()
}

// close closes every connection; later forwards are dropped.
func (h *handover) close() {
	h.mu.Lock()
	h.closed = true
	h.closeConnsLocked()
	h.mu.Unlock()
}

func (h *handover) closeConnsLocked() {
	for _, hc := range h.conns {
		hc.c.Close()
	}
	h.conns = nil
}

// noOwner reports whether err, of a connection or a send, means that no
// device of this user holds the port (any more).
func noOwner(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}

// handoverListener is a send block's hand-over socket and the connections
// it accepted, closed with the block.
type handoverListener struct {
	ln *net.UnixListener

	mu       sync.Mutex
	closed   bool
	conns    []*rawudp.Conn
	gsiConns []*net.UnixConn // a QP1 claim's (gsi.go)
}

// listenHandoverLocked opens blk's hand-over socket and starts its accept
// goroutine; d.mu is held. The name is free unless another user holds it:
// the port is blk's (UDP ports are exclusive), so no live device holds it,
// and an abstract socket goes with its process.
func (d *Device) listenHandoverLocked(blk *sendBlock) error {
	addr := &net.UnixAddr{Net: "unixpacket", Name: handoverName(blk.port4)}
	ln, err := net.ListenUnix("unixpacket", addr)
	if err != nil {
		return err
	}
	l := &handoverListener{ln: ln}
	blk.ho = l
	d.wg.Add(1)
	go d.acceptHandovers(blk, l)
	return nil
}

// handoverFailed counts a hand-over that could not be set up or was
// refused, and logs the first of the device.
func (d *Device) handoverFailed(what string, err error) {
	d.core.Count(softverbs.HandoverErrors, 1)
	if d.ho.logged.Swap(true) {
		return
	}
	if l := logging.Logger(); l != nil {
		l.Warn("rxe: no unicast hand-over between this user's processes; counted in handover_errors (logged once)",
			"device", d.name, "what", what, "error", err.Error())
	}
}

// close closes the socket (which frees its name) and every accepted
// connection: their goroutines exit, and the forwarders find the
// connection closed.
func (l *handoverListener) close() {
	l.mu.Lock()
	l.closed = true
	conns, gconns := l.conns, l.gsiConns
	l.conns, l.gsiConns = nil, nil
	l.mu.Unlock()
	l.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	for _, c := range gconns {
		c.Close()
	}
}

// acceptHandovers accepts the connections of other devices of this user
// to blk's hand-over socket; a connection from another user is closed at
// once and counted in untrusted_drops.
func (d *Device) acceptHandovers(blk *sendBlock, l *handoverListener) {
	defer d.wg.Done()
	uid := uint32(os.Geteuid())
	for {
		nc, err := l.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // a connection that went away before it was accepted
		}
		fd, cred, err := takeConn(nc)
		if err != nil || cred.Uid != uid {
			d.core.Count(softverbs.UntrustedDrops, 1)
			if fd >= 0 {
				unix.Close(fd)
			}
			continue
		}
		// Its reads can leave the netpoller, as a receive socket's: a
		// consumer polling in a loop reads it, and no thread wakes.
		c, err := rawudp.NewConn(fd)
		if err != nil {
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return
		}
		l.conns = append(l.conns, c)
		l.mu.Unlock()
		d.wg.Add(1)
		go d.readHandovers(blk, c)
	}
}

// takeConn takes an accepted connection out of package net: it returns a
// descriptor of its own (a duplicate, non-blocking as the original; -1 on
// an error), the peer's credentials (SO_PEERCRED), and closes nc.
func takeConn(nc *net.UnixConn) (int, *unix.Ucred, error) {
	defer nc.Close()
	fd := -1
	var cred *unix.Ucred
	var cerr error
	if err := control(nc, func(f int) error {
		if cred, cerr = unix.GetsockoptUcred(f, unix.SOL_SOCKET, unix.SO_PEERCRED); cerr != nil {
			return nil
		}
		fd, cerr = unix.FcntlInt(uintptr(f), unix.F_DUPFD_CLOEXEC, 0)
		return nil
	}); err != nil {
		return -1, nil, err
	}
	if cerr != nil {
		return -1, nil, cerr
	}
	return fd, cred, nil
}

// readHandovers reads the datagrams one device hands over on c until
// either end closes it. The connection is one of the device's unicast
// inputs, which a polling consumer reads too (progress.go).
func (d *Device) readHandovers(blk *sendBlock, c *rawudp.Conn) {
	defer d.wg.Done()
	defer c.Close()
	br, err := mmsg.NewPooledReader(c, handoverPool)
	if err != nil {
		return
	}
	br.EndOnEmpty()
	r := newBlockReceiver(d, blk, br)
	r.in = &uinput{br: br}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.addInputLocked(r.in)
	d.mu.Unlock()
	if err := r.run(); !closedErr(err) && !connEnded(err) {
		d.loopEnded(nil, err)
	}
	d.mu.Lock()
	d.removeInputLocked(r.in)
	d.mu.Unlock()
}

// handoverBatch is the number of hand-overs one read takes.
const handoverBatch = 16

// handoverBufs are the buffers of one batch of hand-overs, in one
// allocation: a forwarding header and a datagram each, with no address
// or control messages (the header carries them).
type handoverBufs struct {
	mmsg.Batch
	hs   [handoverBatch]unix.Mmsghdr
	iovs [handoverBatch]unix.Iovec
	data [handoverBatch * (fwdHdrLen + readBufLen)]byte
}

// handoverPool holds the buffers of hand-over reads: an idle connection
// holds none.
var handoverPool = mmsg.NewPool(func() *mmsg.Batch {
	b := &handoverBufs{}
	b.Init(b.hs[:], b.iovs[:], b.data[:], nil, nil)
	return &b.Batch
})
