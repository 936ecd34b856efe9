package mcast

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/verbs"
)

// Options configure a Conn. The zero value works: reliable, windows of
// 1,024 packets, messages up to 1 MiB, the device the route to the group
// picks.
type Options struct {
	// Local is the local address whose device carries the group: an
	// address of the interface of a RoCEv2 device, or the IPoIB address
	// of an InfiniBand port. Zero: the route to the group picks it, as
	// rdma_resolve_addr does with no source (prefer naming it).
	Local netip.Addr
	// Unreliable makes the Conn carry raw datagrams: one message is one
	// UD datagram of at most MTU bytes with no header of this package,
	// lost, duplicated or reordered as the fabric does it. Such a Conn
	// talks to any UD multicast program on the group (mckey, say).
	Unreliable bool
	// Window is the number of packets a sender keeps for repair and may
	// send beyond the slowest receiver's position, and the packets a
	// receiver holds for each sender (default 1,024). A smaller window
	// bounds the latency a fast sender's queue adds (see softrdma bench's
	// reliable part, which uses 256).
	Window int
	// MaxMessageSize is the largest message, in bytes (default 1 MiB,
	// at most 64 MiB). Reliable messages are fragmented over the path
	// MTU; members of a group should agree on it.
	MaxMessageSize int
	// PeerTimeout is how long a member may be silent before it counts as
	// gone: a sender for its receivers (Receive reports ErrPeerGone), a
	// receiver for its senders (they stop waiting for it). Default 2 s.
	PeerTimeout time.Duration
	// MaxStall, when not 0, bounds how much a receiver may hold the
	// sender back: one that kept the sender blocked for more than half of
	// a period of MaxStall (too slow, or stopped) is dropped from its
	// window at the period's end; the receiver's Receive reports
	// ErrEvicted and it goes on at the sender's live edge. 0: the sender
	// waits for every live receiver, however slow (the flow control of
	// TCP).
	MaxStall time.Duration
	// Linger is how long Close waits for the receivers to acknowledge
	// everything sent (default 1 s).
	Linger time.Duration
	// Host is the verbs host whose devices the Conn uses (nil: the
	// default host).
	Host *verbs.Host
}

const maxMessageLimit = 64 << 20

func (o *Options) withDefaults() (Options, error) {
	var v Options
	if o != nil {
		v = *o
	}
	if v.Window == 0 {
		v.Window = 1024
	}
	if v.MaxMessageSize == 0 {
		v.MaxMessageSize = 1 << 20
	}
	if v.PeerTimeout == 0 {
		v.PeerTimeout = 2 * time.Second
	}
	if v.Linger == 0 {
		v.Linger = time.Second
	}
	switch {
	case v.Window < 4 || v.Window > 1<<16:
		return v, fmt.Errorf("window %d outside [4, 65536]: %w", v.Window, syscall.EINVAL)
	case v.MaxMessageSize < 0 || v.MaxMessageSize > maxMessageLimit:
		return v, fmt.Errorf("max message size %d outside [1, %d]: %w", v.MaxMessageSize, maxMessageLimit, syscall.EINVAL)
	case v.PeerTimeout < 0 || v.MaxStall < 0 || v.Linger < 0:
		return v, fmt.Errorf("negative duration: %w", syscall.EINVAL)
	}
	return v, nil
}

// Addr is a member of a group: the address of its device (its GID as an
// IP address) and its QP number. It is a net.Addr.
type Addr struct {
	// IP is the member's device address (a RoCEv2 GID's IP address; on
	// InfiniBand the port's GID).
	IP netip.Addr
	// QPN is the member's queue pair number.
	QPN uint32
	// LID is the member's port LID on InfiniBand (0 on RoCEv2).
	LID uint16
}

// Network returns "rdma-ud".
func (a *Addr) Network() string { return "rdma-ud" }

// String returns the address as IP/QPN, QPN in hex.
func (a *Addr) String() string {
	if a == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%v/%#x", a.IP, a.QPN)
}

// GroupAddr is the address of a group, as WriteTo takes it.
type GroupAddr struct{ IP netip.Addr }

// Network returns "rdma-ud".
func (g GroupAddr) Network() string { return "rdma-ud" }

// String returns the group's IP address.
func (g GroupAddr) String() string { return g.IP.String() }

// Errors a Conn reports; test them with errors.Is. Each comes wrapped in a
// *PeerError when it is about one peer, and the Conn goes on.
var (
	// ErrPeerGone: a sender fell silent for PeerTimeout (died or cut
	// off); what it sent before is delivered, its stream is over.
	ErrPeerGone = errors.New("sender gone silent")
	// ErrLost: messages of a sender were lost for good (its window no
	// longer held them when this receiver asked).
	ErrLost = errors.New("messages lost")
	// ErrEvicted: the sender dropped this receiver from its window for
	// holding it back longer than its MaxStall; messages were skipped and
	// the stream goes on at the sender's live edge.
	ErrEvicted = errors.New("evicted by the sender for falling behind")
)

// PeerError is an event about one peer that Receive reports in that
// peer's order: what it sent before was delivered before the error; the
// Conn goes on.
type PeerError struct {
	// Peer is the sender concerned.
	Peer *Addr
	// Packets is how many of its packets were lost for good (0 for
	// ErrPeerGone).
	Packets uint64
	// Err is ErrPeerGone, ErrLost or ErrEvicted.
	Err error
}

func (e *PeerError) Error() string {
	if e.Packets > 0 {
		return fmt.Sprintf("mcast: %v: %v (%d packets)", e.Peer, e.Err, e.Packets)
	}
	return fmt.Sprintf("mcast: %v: %v", e.Peer, e.Err)
}

// Unwrap returns Err.
func (e *PeerError) Unwrap() error { return e.Err }

// ShortBufferError is Receive's answer when the next message does not fit
// the buffer: the message stays queued; receive it with a buffer of Need
// bytes. errors.Is(err, io.ErrShortBuffer) holds.
type ShortBufferError struct{ Need int }

func (e *ShortBufferError) Error() string {
	return fmt.Sprintf("mcast: the next message has %d bytes: buffer too short", e.Need)
}

// Is reports io.ErrShortBuffer.
func (e *ShortBufferError) Is(target error) bool { return target == errShortBuffer }

// OpError is a failure of an operation of a Conn: the operation, the
// group, and the cause, which keeps its errno (errors.Is(err,
// syscall.EMSGSIZE)); net.ErrClosed after Close.
type OpError struct {
	Op    string
	Group netip.Addr
	Err   error
}

func (e *OpError) Error() string { return fmt.Sprintf("mcast %s %v: %v", e.Op, e.Group, e.Err) }

// Unwrap returns Err.
func (e *OpError) Unwrap() error { return e.Err }

// Timeout reports whether the operation's deadline passed.
func (e *OpError) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}

var _ net.Error = (*OpError)(nil)

// Temporary reports false (net.Error).
func (e *OpError) Temporary() bool { return false }
