package mcast

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/mcast/internal/proto"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
)

var errShortBuffer = io.ErrShortBuffer

// Conn is a member of a multicast group: it sends messages to the group
// and receives every other member's. Its methods may be called from
// several goroutines.
type Conn struct {
	opts  Options
	group netip.Addr
	base  time.Time

	ch   *rdmacm.EventChannel
	id   *rdmacm.ID
	pd   *verbs.PD
	qp   *verbs.QP
	scq  *verbs.CQ
	rcq  *verbs.CQ
	mcAH *verbs.AH
	qkey uint32
	tmpl verbs.AHAttr // the group's route: unicast AHs copy it
	mtu  int
	self Addr

	rbuf  []byte
	rmr   *verbs.MR
	rslot int // bytes per receive slot (GRH area + MTU)
	rwr   []verbs.RecvWR
	rsge  []verbs.SGE
	wcs   []verbs.WC
	swcs  []verbs.WC

	mu      sync.Mutex // everything below
	m       *proto.Member
	sbuf    []byte
	smr     *verbs.MR
	shead   uint64 // send slots are a ring: taken at shead, freed up to stail
	stail   uint64
	swrs    [sendChain]verbs.SendWR // the chain being filled
	ssge    [sendChain]verbs.SGE
	nchain  int
	cork    bool // posts wait in the chain until flush
	peers   map[uint32]*peer
	raw     map[rawKey]*Addr // Unreliable: senders by address
	rq      []rawMsg         // Unreliable: received datagrams not yet read
	err     error            // fatal: the group is gone
	stats   Stats
	closing bool
	armed   int64 // when the loop's wait ends by itself; 0 while it runs

	readable chan struct{}
	writable chan struct{}
	done     chan struct{} // closed by Close
	loopDone chan struct{}
	evDone   chan struct{}
	evCancel context.CancelFunc
	wake     *waker
	closeMu  sync.Mutex
	closeErr error
	closed   bool

	rdl, wdl atomic.Pointer[time.Time]

	tmu    sync.Mutex
	timers []*time.Timer
}

type peer struct {
	addr Addr
	ah   *verbs.AH
}

type rawKey struct {
	ip  netip.Addr
	qpn uint32
}

type rawMsg struct {
	slot int
	n    int
	from *Addr
}

// Stats counts a Conn's work.
type Stats struct {
	// MessagesSent and MessagesReceived count whole messages.
	MessagesSent, MessagesReceived uint64
	// Protocol is the reliable protocol's own count (zero when
	// Unreliable).
	Protocol proto.Stats
	// SendDrops counts packets not sent for want of a send slot (the
	// protocol repairs them like any loss).
	SendDrops uint64
	// SourceMismatches counts packets whose session belongs to another
	// member's address (dropped).
	SourceMismatches uint64
	// RecvErrors counts receive completions in error.
	RecvErrors uint64
	// Peers is the number of members the Conn has an address for.
	Peers int
}

const (
	sendSlots   = 512
	sendChain   = 64 // packets posted in one chain at most (one sendmmsg)
	signalEvery = 32 // a send completion for every this many packets
	maxPeers    = 4096
)

// Join joins the multicast group and returns a Conn that sends to it and
// receives from it. ctx bounds the join (address resolution and, on
// InfiniBand, the SA's answer). The group is an IPv4 or IPv6 multicast
// address (an IPv4 one on InfiniBand maps to the IPoIB MGID).
func Join(ctx context.Context, group netip.Addr, opts *Options) (_ *Conn, err error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, &OpError{Op: "join", Group: group, Err: err}
	}
	if !group.IsValid() || !group.IsMulticast() {
		return nil, &OpError{Op: "join", Group: group, Err: fmt.Errorf("not a multicast address: %w", syscall.EINVAL)}
	}
	c := &Conn{opts: o, group: group, base: time.Now(),
		readable: make(chan struct{}, 1), writable: make(chan struct{}, 1),
		done: make(chan struct{}), loopDone: make(chan struct{}), evDone: make(chan struct{}),
		peers: map[uint32]*peer{}, raw: map[rawKey]*Addr{}}
	defer func() {
		if err != nil {
			c.teardown()
			err = &OpError{Op: "join", Group: group, Err: err}
		}
	}()
	if err := c.setup(ctx); err != nil {
		return nil, err
	}
	if !o.Unreliable {
		var b [4]byte
		if _, err := cryptoRead(b[:]); err != nil {
			return nil, err
		}
		session := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
		if session == 0 {
			session = 1
		}
		c.m = proto.New(proto.Config{
			Session:     session,
			MTU:         c.mtu,
			Window:      o.Window,
			MaxMessage:  o.MaxMessageSize,
			PeerTimeout: o.PeerTimeout,
			MaxStall:    o.MaxStall,
			Seed:        uint64(time.Now().UnixNano()),
		}, (*env)(c))
	}
	c.wake = newWaker()
	evCtx, cancel := context.WithCancel(context.Background())
	c.evCancel = cancel
	go c.events(evCtx)
	go c.loop()
	return c, nil
}

// setup makes the id, its QP and buffers, and joins.
func (c *Conn) setup(ctx context.Context) error {
	var err error
	if c.opts.Host != nil {
		c.ch, err = rdmacm.CreateEventChannelOn(c.opts.Host)
	} else {
		c.ch, err = rdmacm.CreateEventChannel()
	}
	if err != nil {
		return err
	}
	if c.id, err = rdmacm.CreateID(c.ch, nil, rdmacm.PS_UDP); err != nil {
		return err
	}
	if c.opts.Local.IsValid() {
		if err := c.id.BindAddr(rdmacm.UDPAddr(c.opts.Local)); err != nil {
			return err
		}
	} else {
		d := 2 * time.Second
		if dl, ok := ctx.Deadline(); ok {
			d = max(time.Until(dl), time.Millisecond)
		}
		if err := c.id.ResolveAddr(nil, rdmacm.UDPAddr(c.group), d); err != nil {
			return err
		}
		if _, err := c.event(ctx, rdmacm.EventAddrResolved); err != nil {
			return err
		}
	}
	vctx := c.id.Verbs()
	c.pd = c.id.PD()
	port := c.id.PortNum()
	pa, err := vctx.QueryPort(port)
	if err != nil {
		return err
	}
	c.mtu = pa.ActiveMTU.Bytes()
	if c.mtu <= proto.DataLen+8 {
		return fmt.Errorf("active MTU %d: %w", c.mtu, syscall.EINVAL)
	}
	nrecv := min(max(c.opts.Window, 256), 1024)
	if c.scq, err = vctx.CreateCQ(sendSlots); err != nil {
		return err
	}
	if c.rcq, err = vctx.CreateCQ(nrecv); err != nil {
		return err
	}
	attr := verbs.QPInitAttr{SendCQ: c.scq, RecvCQ: c.rcq,
		Cap:         verbs.QPCap{MaxSendWR: sendSlots, MaxRecvWR: nrecv, MaxSendSGE: 1, MaxRecvSGE: 1},
		CreateFlags: verbs.CreateBlockSelfMcastLB}
	if err := c.id.CreateQP(c.pd, &attr); err != nil {
		// The kernel's rxe refuses the flag; the protocol knows its own
		// packets anyway, and Unreliable filters by QPN.
		attr.CreateFlags = 0
		if err := c.id.CreateQP(c.pd, &attr); err != nil {
			return err
		}
	}
	c.qp = c.id.QP()
	c.rslot = verbs.GRHLen + c.mtu
	c.rbuf = make([]byte, nrecv*c.rslot)
	if c.rmr, err = c.pd.RegMR(c.rbuf, verbs.AccessLocalWrite); err != nil {
		return err
	}
	c.sbuf = make([]byte, sendSlots*c.mtu)
	if c.smr, err = c.pd.RegMR(c.sbuf, verbs.AccessLocalWrite); err != nil {
		return err
	}
	c.rwr = make([]verbs.RecvWR, nrecv)
	c.rsge = make([]verbs.SGE, nrecv)
	for i := range c.rwr {
		c.rsge[i] = c.rmr.SGE(i*c.rslot, c.rslot)
		c.rwr[i] = verbs.RecvWR{WRID: uint64(i), SGList: c.rsge[i : i+1]}
		if i > 0 {
			c.rwr[i-1].Next = &c.rwr[i]
		}
	}
	if err := c.qp.PostRecv(&c.rwr[0]); err != nil {
		return err
	}
	for i := range c.rwr {
		c.rwr[i].Next = nil
	}
	c.wcs = make([]verbs.WC, 32)
	c.swcs = make([]verbs.WC, 64)

	if err := c.id.JoinMulticastEx(&rdmacm.JoinMCAttrEx{
		CompMask:  rdmacm.JoinMCAttrAddress | rdmacm.JoinMCAttrJoinFlags,
		JoinFlags: rdmacm.MCJoinFlagFullMember,
		Addr:      rdmacm.UDPAddr(c.group),
	}, nil); err != nil {
		return err
	}
	ev, err := c.event(ctx, rdmacm.EventMulticastJoin)
	if err != nil {
		return err
	}
	c.tmpl, c.qkey = ev.AHAttr, ev.QKey
	if c.mcAH, err = c.pd.CreateAH(&c.tmpl); err != nil {
		return err
	}
	c.self = Addr{QPN: c.qp.Num(), LID: pa.LID}
	if g, err := vctx.QueryGID(port, int(c.tmpl.GRH.SGIDIndex)); err == nil {
		c.self.IP = gidAddr(g)
	}
	return nil
}

// event waits for the id's next event, which must be want.
func (c *Conn) event(ctx context.Context, want rdmacm.EventType) (rdmacm.UDParam, error) {
	ev, err := c.ch.GetEvent(ctx)
	if err != nil {
		return rdmacm.UDParam{}, err
	}
	t, status, p := ev.Event, ev.Status, ev.Param
	ev.Ack()
	if t != want {
		if status < 0 {
			return p, fmt.Errorf("%v: %w", t, syscall.Errno(-status))
		}
		return p, fmt.Errorf("%v instead of %v: %w", t, want, syscall.EPROTO)
	}
	return p, nil
}

// events watches the id for the group's loss (an SM restart, the device
// gone) and makes it the Conn's error.
func (c *Conn) events(ctx context.Context) {
	defer close(c.evDone)
	for {
		ev, err := c.ch.GetEvent(ctx)
		if err != nil {
			return
		}
		t, status := ev.Event, ev.Status
		ev.Ack()
		var e error
		switch t {
		case rdmacm.EventMulticastError:
			e = fmt.Errorf("%v: %w", t, syscall.Errno(-status))
		case rdmacm.EventDeviceRemoval, rdmacm.EventAddrChange:
			e = fmt.Errorf("%v: %w", t, syscall.ENODEV)
		default:
			continue
		}
		c.mu.Lock()
		if c.err == nil {
			c.err = e
		}
		c.mu.Unlock()
		c.signal(c.readable)
		c.signal(c.writable)
	}
}

func (c *Conn) now() int64 { return int64(time.Since(c.base)) }

func (c *Conn) signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// gidAddr is a GID as an IP address (IPv4-mapped GIDs as IPv4).
func gidAddr(g verbs.GID) netip.Addr { return netip.AddrFrom16(g).Unmap() }

// MTU returns the largest datagram of the group's path: an Unreliable
// Conn's largest message.
func (c *Conn) MTU() int { return c.mtu }

// MaxMessageSize returns the largest message Send takes.
func (c *Conn) MaxMessageSize() int {
	if c.opts.Unreliable {
		return c.mtu
	}
	return c.opts.MaxMessageSize
}

// Group returns the group's address.
func (c *Conn) Group() netip.Addr { return c.group }

// LocalAddr returns the Conn's own member address (net.PacketConn).
func (c *Conn) LocalAddr() net.Addr { a := c.self; return &a }

// DeviceName returns the name of the device that carries the group.
func (c *Conn) DeviceName() string { return c.id.DeviceName() }

// Stats returns the Conn's counts.
func (c *Conn) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	if c.m != nil {
		s.Protocol = c.m.Stats
	}
	s.Peers = len(c.peers) + len(c.raw)
	return s
}

// Receivers returns how many receivers the Conn's stream has: the members
// that told it their position (0 when Unreliable).
func (c *Conn) Receivers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		return 0
	}
	return c.m.Receivers()
}

// WaitReceivers announces the Conn as a sender and waits until n members
// receive its stream, or ctx ends. A sender that must not lose its first
// messages to members still joining calls it before its first Send: a
// member receives a stream from the point where it found it (the live
// edge), not from its beginning.
func (c *Conn) WaitReceivers(ctx context.Context, n int) error {
	if c.opts.Unreliable {
		return &OpError{Op: "wait receivers", Group: c.group, Err: fmt.Errorf("an unreliable group has no receivers to count: %w", syscall.EINVAL)}
	}
	c.mu.Lock()
	c.m.Announce(c.now())
	c.mu.Unlock()
	c.kick()
	for {
		c.mu.Lock()
		got, err := c.m.Receivers(), c.errLocked()
		c.mu.Unlock()
		if err != nil {
			return &OpError{Op: "wait receivers", Group: c.group, Err: err}
		}
		if got >= n {
			return nil
		}
		if err := c.waitFor(ctx, c.writable, nil); err != nil {
			return &OpError{Op: "wait receivers", Group: c.group, Err: err}
		}
	}
}

// dueMovedLocked reports whether the protocol's timers now fall before the
// end of the loop's wait: then the loop must be woken (c.mu held).
func (c *Conn) dueMovedLocked() bool {
	if d := c.m.Due(); c.armed != 0 && d < c.armed {
		c.armed = d
		return true
	}
	return false
}

func (c *Conn) errLocked() error {
	if c.closing {
		return net.ErrClosed
	}
	return c.err
}

// waitFor waits for a signal on ch, ctx, a deadline, or Close. A wait with
// no signal wakes every 10 ms to look again (the loop's signals are
// edge-triggered).
func (c *Conn) waitFor(ctx context.Context, ch chan struct{}, dl *time.Time) error {
	d := 10 * time.Millisecond
	if dl != nil && !dl.IsZero() {
		left := time.Until(*dl)
		if left <= 0 {
			return os.ErrDeadlineExceeded
		}
		d = min(d, left)
	}
	t := c.timer()
	t.Reset(d)
	defer func() {
		t.Stop()
		c.tmu.Lock()
		c.timers = append(c.timers, t)
		c.tmu.Unlock()
	}()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return net.ErrClosed
	}
	return nil
}

// timer returns a stopped timer for a wait: the Conn's waits reuse
// theirs, so that a wait allocates nothing.
func (c *Conn) timer() *time.Timer {
	c.tmu.Lock()
	defer c.tmu.Unlock()
	if n := len(c.timers); n > 0 {
		t := c.timers[n-1]
		c.timers = c.timers[:n-1]
		return t
	}
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// Send sends msg to the group: every member receives it whole, once, in
// this Conn's order (Unreliable: one datagram, as the fabric delivers it).
// It waits while the window is full (the slowest receiver sets the pace)
// and returns once msg is handed to the device, which keeps it for repair.
// A Send that ctx cancels halfway leaves a partial message the receivers
// drop.
func (c *Conn) Send(ctx context.Context, msg []byte) error {
	if err := c.send(ctx, msg, c.wdl.Load()); err != nil {
		return &OpError{Op: "send", Group: c.group, Err: err}
	}
	return nil
}

func (c *Conn) send(ctx context.Context, msg []byte, dl *time.Time) error {
	if len(msg) > c.MaxMessageSize() {
		return fmt.Errorf("message of %d bytes, at most %d: %w", len(msg), c.MaxMessageSize(), syscall.EMSGSIZE)
	}
	c.mu.Lock()
	if err := c.errLocked(); err != nil {
		c.mu.Unlock()
		return err
	}
	if err := c.sendLocked(ctx, msg, dl); err != nil {
		return err
	}
	if c.m != nil {
		c.m.Flush(c.now())
	}
	c.flush()
	kick := c.m != nil && c.dueMovedLocked()
	c.mu.Unlock()
	if kick {
		c.kick()
	}
	return nil
}

// sendLocked sends one message, its packets corked into chains (c.mu
// held; it is released while the window is full, and held again on
// return, but after an error).
func (c *Conn) sendLocked(ctx context.Context, msg []byte, dl *time.Time) error {
	c.cork = true
	if c.m == nil {
		c.post(msg, c.mcAH, verbs.MulticastQPN)
		c.cork = false
		c.stats.MessagesSent++
		return nil
	}
	total := proto.RecordLen(len(msg))
	off := 0
	for {
		off = c.m.Write(c.now(), msg, off)
		if off == total {
			break
		}
		c.m.Flush(c.now())
		c.cork = false
		c.flush()
		c.mu.Unlock()
		c.kick()
		if err := c.waitFor(ctx, c.writable, dl); err != nil {
			return err
		}
		c.mu.Lock()
		if err := c.errLocked(); err != nil {
			c.mu.Unlock()
			return err
		}
		c.cork = true
	}
	c.cork = false
	c.stats.MessagesSent++
	return nil
}

// SendBatch sends msgs in order, as Send does each, but packed: small
// messages share packets (Send sends its message's last packet at once;
// SendBatch only the batch's), and the packets go in chains (one system
// call per chain on the RoCEv2 device): the way to send many small
// messages fast. It returns how many were sent.
func (c *Conn) SendBatch(ctx context.Context, msgs [][]byte) (int, error) {
	dl := c.wdl.Load()
	for _, m := range msgs {
		if len(m) > c.MaxMessageSize() {
			return 0, &OpError{Op: "send", Group: c.group, Err: fmt.Errorf("message of %d bytes, at most %d: %w", len(m), c.MaxMessageSize(), syscall.EMSGSIZE)}
		}
	}
	c.mu.Lock()
	if err := c.errLocked(); err != nil {
		c.mu.Unlock()
		return 0, &OpError{Op: "send", Group: c.group, Err: err}
	}
	for i, m := range msgs {
		if err := c.sendLocked(ctx, m, dl); err != nil {
			return i, &OpError{Op: "send", Group: c.group, Err: err}
		}
	}
	if c.m != nil {
		c.m.Flush(c.now())
	}
	c.flush()
	kick := c.m != nil && c.dueMovedLocked()
	c.mu.Unlock()
	if kick {
		c.kick()
	}
	return len(msgs), nil
}

// Receive waits for the next message of any sender and copies it into buf;
// it returns its length and sender. Messages of one sender come in its
// order, each once. A *PeerError (ErrPeerGone, ErrLost, ErrEvicted) is an
// event about one sender, in its order; the Conn goes on. A message longer
// than buf stays queued (*ShortBufferError). Receive ends with ctx, the
// read deadline, or Close (net.ErrClosed).
func (c *Conn) Receive(ctx context.Context, buf []byte) (int, *Addr, error) {
	n, from, err := c.receive(ctx, buf, c.rdl.Load())
	if err != nil {
		var pe *PeerError
		var sb *ShortBufferError
		if errors.As(err, &pe) || errors.As(err, &sb) {
			return n, from, err
		}
		return n, from, &OpError{Op: "receive", Group: c.group, Err: err}
	}
	return n, from, nil
}

func (c *Conn) receive(ctx context.Context, buf []byte, dl *time.Time) (int, *Addr, error) {
	var one [1]Message
	one[0].Buf = buf
	_, err := c.receiveBatch(ctx, one[:], dl)
	return one[0].N, one[0].From, err
}

// Message is one message of ReceiveBatch.
type Message struct {
	// Buf is where the message goes.
	Buf []byte
	// N is the message's length in Buf.
	N int
	// From is the message's sender.
	From *Addr
}

// ReceiveBatch waits for the next message, as Receive does, then takes as
// many more as are ready without waiting, up to len(msgs), each into its
// Message's Buf; it returns how many it filled. A *PeerError or a message
// that does not fit its Buf ends the batch before it (and is the error of
// a batch of none: the next call's).
func (c *Conn) ReceiveBatch(ctx context.Context, msgs []Message) (int, error) {
	n, err := c.receiveBatch(ctx, msgs, c.rdl.Load())
	if err != nil {
		var pe *PeerError
		var sb *ShortBufferError
		if !errors.As(err, &pe) && !errors.As(err, &sb) {
			err = &OpError{Op: "receive", Group: c.group, Err: err}
		}
	}
	return n, err
}

func (c *Conn) receiveBatch(ctx context.Context, msgs []Message, dl *time.Time) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	for {
		c.mu.Lock()
		if c.closing {
			c.mu.Unlock()
			return 0, net.ErrClosed
		}
		n, err := c.takeLocked(msgs)
		if n > 0 || err != nil {
			c.stats.MessagesReceived += uint64(n)
			kick := false
			if c.m != nil {
				if c.m.Pending() {
					c.signal(c.readable)
				}
				kick = c.dueMovedLocked()
			} else if len(c.rq) > 0 {
				c.signal(c.readable)
			}
			c.mu.Unlock()
			if kick {
				c.kick()
			}
			return n, err
		}
		err = c.err
		c.mu.Unlock()
		if err != nil {
			return 0, err
		}
		if err := c.waitFor(ctx, c.readable, dl); err != nil {
			return 0, err
		}
	}
}

// takeLocked fills msgs with what is ready (c.mu held).
func (c *Conn) takeLocked(msgs []Message) (int, error) {
	n := 0
	if c.m == nil {
		for n < len(msgs) && len(c.rq) > 0 {
			r := c.rq[0]
			if len(msgs[n].Buf) < r.n {
				if n > 0 {
					break
				}
				msgs[n].From = r.from
				return 0, &ShortBufferError{Need: r.n}
			}
			off := r.slot*c.rslot + verbs.GRHLen
			msgs[n].N = copy(msgs[n].Buf, c.rbuf[off:off+r.n])
			msgs[n].From = r.from
			copy(c.rq, c.rq[1:])
			c.rq = c.rq[:len(c.rq)-1]
			c.repost(r.slot)
			n++
		}
		return n, nil
	}
	now := c.now()
	for n < len(msgs) {
		if ev, ok := c.m.PeekEvent(); ok {
			if n > 0 {
				break
			}
			c.m.NextEvent()
			var a *Addr
			if p := c.peers[ev.Session]; p != nil {
				a = &p.addr
			}
			var e error
			switch ev.Kind {
			case proto.EventGone:
				e = ErrPeerGone
			case proto.EventEvicted:
				e = ErrEvicted
			default:
				e = ErrLost
			}
			msgs[0].From = a
			return 0, &PeerError{Peer: a, Packets: ev.Packets, Err: e}
		}
		k, from, ok, err := c.m.Read(now, msgs[n].Buf)
		if err != nil {
			if n > 0 {
				break
			}
			if p := c.peers[from]; p != nil {
				msgs[0].From = &p.addr
			}
			return 0, &ShortBufferError{Need: k}
		}
		if !ok {
			break
		}
		msgs[n].N, msgs[n].From = k, nil
		if p := c.peers[from]; p != nil {
			msgs[n].From = &p.addr
		}
		n++
	}
	return n, nil
}

// ReadFrom receives the next message (net.PacketConn): Receive with the
// read deadline. A *PeerError comes as an error with n = 0.
func (c *Conn) ReadFrom(p []byte) (int, net.Addr, error) {
	n, a, err := c.Receive(context.Background(), p)
	if a == nil {
		return n, nil, err
	}
	return n, a, err
}

// WriteTo sends p to the group (net.PacketConn); addr must be nil, the
// group's GroupAddr, or a *net.UDPAddr or *net.IPAddr of the group.
func (c *Conn) WriteTo(p []byte, addr net.Addr) (int, error) {
	if addr != nil {
		var ip netip.Addr
		switch a := addr.(type) {
		case GroupAddr:
			ip = a.IP
		case *GroupAddr:
			ip = a.IP
		case *net.UDPAddr:
			ip = a.AddrPort().Addr()
		case *net.IPAddr:
			ip, _ = netip.AddrFromSlice(a.IP)
		}
		if ip.Unmap() != c.group.Unmap() {
			return 0, &OpError{Op: "write", Group: c.group, Err: fmt.Errorf("%v is not the group: %w", addr, syscall.EINVAL)}
		}
	}
	if err := c.Send(context.Background(), p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// SetDeadline sets the read and write deadlines (net.PacketConn).
func (c *Conn) SetDeadline(t time.Time) error {
	c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

// SetReadDeadline sets the deadline of Receive and ReadFrom.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.rdl.Store(&t)
	c.signal(c.readable)
	return nil
}

// SetWriteDeadline sets the deadline of Send and WriteTo.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.wdl.Store(&t)
	c.signal(c.writable)
	return nil
}

var _ net.PacketConn = (*Conn)(nil)

// Close leaves the group. A sender first waits, up to Linger, until its
// receivers acknowledged everything it sent; then it tells its senders it
// leaves. Close never waits longer than Linger plus the leave itself.
func (c *Conn) Close() error {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	if c.closed {
		return c.closeErr
	}
	c.closed = true
	if c.m != nil {
		c.mu.Lock()
		c.m.Finish(c.now())
		c.mu.Unlock()
		c.kick()
		end := time.Now().Add(c.opts.Linger)
		for {
			c.mu.Lock()
			drained := c.m.Drained() || c.err != nil
			c.mu.Unlock()
			if drained || !time.Now().Before(end) {
				break
			}
			c.waitFor(context.Background(), c.writable, &end)
		}
		c.mu.Lock()
		c.m.Leave()
		c.mu.Unlock()
	}
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	close(c.done)
	c.kick()
	<-c.loopDone
	c.closeErr = c.teardown()
	return c.closeErr
}

// teardown leaves the group and frees everything setup made.
func (c *Conn) teardown() error {
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if c.id != nil && c.mcAH != nil {
		keep(c.id.LeaveMulticast(rdmacm.UDPAddr(c.group)))
	}
	if c.evCancel != nil {
		c.evCancel()
		<-c.evDone
	}
	for _, p := range c.peers {
		keep(p.ah.Destroy())
	}
	if c.mcAH != nil {
		keep(c.mcAH.Destroy())
	}
	if c.qp != nil {
		keep(c.id.DestroyQP())
	}
	if c.rmr != nil {
		keep(c.rmr.Dereg())
	}
	if c.smr != nil {
		keep(c.smr.Dereg())
	}
	if c.scq != nil {
		keep(c.scq.Destroy())
	}
	if c.rcq != nil {
		keep(c.rcq.Destroy())
	}
	if c.id != nil {
		keep(c.id.Destroy())
	}
	if c.ch != nil {
		keep(c.ch.Close())
	}
	if len(errs) > 0 {
		return &OpError{Op: "close", Group: c.group, Err: errors.Join(errs...)}
	}
	return nil
}
