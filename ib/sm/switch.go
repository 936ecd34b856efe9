package sm

import (
	"crypto/hmac"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/sma"
	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/internal/sys/rawudp"
	"github.com/softrdma/softrdma/wire"
)

// The switch is lossless as an IB switch is (see fabric's flow control):
//
//   - Input: a reader goroutine moves every datagram out of the fabric
//     socket. A port's IB packets go to the port's input queue, which
//     holds at most the port's window (plus room for a few management
//     packets, which are sent without waiting for credit); the switch
//     grants the port credit for the free part of that window. A packet
//     beyond it (a port that ignores its credits) is dropped and counted
//     (RcvOverruns). Windows are the socket buffer shared among the
//     attached ports (fabric.Window), so that the kernel's buffer also
//     holds every packet granted.
//   - Output: the forwarder goroutine takes the head packet of each input
//     queue and sends it to each destination port that has credit (a
//     multicast packet waits until every member port had credit). A head
//     blocked on a port without credit blocks its input queue (and so,
//     through the credits, its sender) — never the other queues — for at
//     most Config.HOQLife (IB's head-of-queue lifetime); then it is
//     discarded for the ports still without credit (XmitDiscards). The
//     lifetime counts what reached the switch, not the switch's own
//     delays: a head is discarded only when the switch has read every
//     datagram that reached its socket within the lifetime and no credit
//     was among them (see marker). A port
//     on which VLStallCount packets in a row were discarded so is stalled:
//     for 8 × HOQLife every packet for it is discarded at once (IB's
//     Time_Drop state), then it gets packets again.
//
// SA answers are management packets: they are counted on the link but do
// not wait for credit.
//
// The switch is a process that the OS may deschedule or stop. A credit
// that reached its socket while it did not run is read only afterwards;
// if a timer decided the head-of-queue lifetime first, the packet that
// waited for that credit was discarded although the port had given it in
// time (after a stall of the switch longer than HOQLife the forwarder's
// timer runs before the reader: one lost datagram in TestIBBurstLossless
// under load). So the forwarder decides no discard itself: when a
// lifetime may have passed it sends a marker, a datagram to the fabric
// socket itself, and records when it sent it; the socket's queue is in
// order, so once the reader handles the marker every datagram that
// reached the socket before it has been handled, and a head still
// without credit then waited the lifetime by the switch's input (caught).

// Defaults of the switch's head-of-queue handling (OpenSM's defaults for
// switch ports to channel adapters: leaf_head_of_queue_lifetime 0x10,
// leaf_vl_stall_count 7).
const (
	// DefaultHOQLife is how long a packet may wait at the head of an input
	// queue for a port without credit: 4.096 µs × 2^16.
	DefaultHOQLife = 268 * time.Millisecond
	// DefaultVLStallCount is how many packets in a row a port may make
	// wait in vain before it is stalled.
	DefaultVLStallCount = 7
)

// Switch sizes.
const (
	// mgmtSlack is the room an input queue keeps beyond the window for
	// management packets (SA MADs), which go without credit.
	mgmtSlack = 16
	// queueCap is the most packets an input queue holds.
	queueCap = fabric.DefaultWindow + mgmtSlack
	// maxDatagram is the largest datagram the switch reads: an IB packet
	// of a 4096-byte MTU, or a control message.
	maxDatagram = 8192
	// ioBatch is the number of datagrams per recvmmsg and sendmmsg.
	ioBatch = 64
	// perRound is the most packets the forwarder takes from one input
	// queue before it looks at the next.
	perRound = 16
)

// Markers: the forwarder's datagrams to its own fabric socket (see above).
const (
	// markerLen is a marker's length: the SM's marker token and a
	// sequence number. It is neither a flow control packet (6 bytes), nor
	// a control message (Magic), nor an IB packet the switch would take
	// (from no port's address).
	markerLen = markerTokenLen + 8
	// markerTokenLen is the length of the random token that proves a
	// marker the SM's own.
	markerTokenLen = 16
	// markerRing is how many markers' send times are kept; a marker
	// handled after markerRing newer ones were sent is ignored.
	markerRing = 8
)

// sendMarker sends a marker to the fabric socket and records its send
// time, when a head's lifetime has passed (expiryAt) and no marker is on
// its way (or the last one has not come back within FlowRefresh: the
// kernel may have dropped it). It is the forwarder's.
func (s *SM) sendMarker() {
	var b [markerLen]byte
	s.mu.Lock()
	now := time.Now()
	due := !s.expiryAt.IsZero() && !now.Before(s.expiryAt)
	onItsWay := s.markDone < s.markSeq && now.Sub(s.markSent[s.markSeq%markerRing]) < fabric.FlowRefresh
	if !due || onItsWay {
		s.mu.Unlock()
		return
	}
	s.expiryAt = time.Time{}
	s.markSeq++
	seq := s.markSeq
	s.markSent[seq%markerRing] = now
	s.mu.Unlock()
	copy(b[:], s.markToken[:])
	binary.BigEndian.PutUint64(b[markerTokenLen:], seq)
	if _, err := s.fabric.WriteToUDPAddrPort(b[:], s.markAddr); err != nil {
		// No way to itself (loopback down): the clock decides, as if
		// the switch never stalled, rather than no lifetime ever ending.
		s.sendErrors.Add(1)
		s.mu.Lock()
		if now.After(s.caught) {
			s.caught = now
		}
		s.markDone = max(s.markDone, seq)
		s.mu.Unlock()
	}
}

// markerIn handles a datagram that may be a marker and reports whether
// it was one: everything that reached the socket before the marker has
// been handled, so the switch has caught up to the marker's send time.
// Caller holds mu.
func (s *SM) markerIn(b []byte, from netip.AddrPort) bool {
	if len(b) != markerLen || from.Port() != s.markAddr.Port() || from.Addr().Unmap() != s.markAddr.Addr().Unmap() || !hmac.Equal(b[:markerTokenLen], s.markToken[:]) {
		return false
	}
	seq := binary.BigEndian.Uint64(b[markerTokenLen:])
	if seq <= s.markSeq && s.markSeq-seq < markerRing {
		if t := s.markSent[seq%markerRing]; t.After(s.caught) {
			s.caught = t
		}
		s.markDone = max(s.markDone, seq)
	}
	return true
}

// markerAddr is where the fabric socket sends its markers: its own
// address, on loopback when it listens on every address.
func markerAddr(local netip.AddrPort) netip.AddrPort {
	a := local.Addr()
	switch {
	case !a.IsUnspecified():
	case a.Is4():
		a = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	default:
		a = netip.IPv6Loopback()
	}
	return netip.AddrPortFrom(a, local.Port())
}

// inQueue is a port's input queue: a ring of packets, and with OpenSM in
// charge the forwarding tables in force when each arrived (tabs).
type inQueue struct {
	pkts []*[]byte
	tabs []*sma.Tables
	head int
	n    int
}

// push queues b, which arrived while t were the switch's tables (nil:
// softsm's own SM, whose tables the forwarder reads at the head).
func (q *inQueue) push(b *[]byte, t *sma.Tables) bool {
	if q.n == queueCap {
		return false
	}
	if q.pkts == nil {
		q.pkts = make([]*[]byte, queueCap)
	}
	i := (q.head + q.n) % queueCap
	q.pkts[i] = b
	if t != nil {
		if q.tabs == nil {
			q.tabs = make([]*sma.Tables, queueCap)
		}
		q.tabs[i] = t
	}
	q.n++
	return true
}

func (q *inQueue) front() []byte { return *q.pkts[q.head] }

// frontTables returns the tables the head packet arrived under (nil: none
// kept).
func (q *inQueue) frontTables() *sma.Tables {
	if q.tabs == nil {
		return nil
	}
	return q.tabs[q.head]
}

func (q *inQueue) pop() *[]byte {
	b := q.pkts[q.head]
	q.pkts[q.head] = nil
	if q.tabs != nil {
		q.tabs[q.head] = nil
	}
	q.head = (q.head + 1) % queueCap
	q.n--
	return b
}

// linkState is the switch's end of a port's link and the port's input
// queue. Guarded by SM.mu.
type linkState struct {
	link fabric.Link
	in   inQueue
	// active: the port is on SM.visit (the forwarder visits it).
	active bool
	// The head packet of in, while it is being forwarded: the ports it
	// still has to go to and since when it waits for each one's credit
	// (zero: not yet).
	headActive bool
	pend       []*port
	pendSince  []time.Time
	// Output side: packets in a row discarded at the head of a queue, the
	// end of the Time_Drop state, and the last credit request sent.
	stallCount int
	dropUntil  time.Time
	lastReq    time.Time
	// Discards not logged yet, and when the last log line went out: a
	// port's discards are logged at most once a second (SM.discarded).
	unlogged uint64
	loggedAt time.Time
	wantFlow bool // the port asked for our flow control packet
	// flowAt is when the port's last flow control packet was handled
	// (the discard log says how long before the discard).
	flowAt time.Time
}

// packetPool holds the switch's packet buffers.
var packetPool = sync.Pool{New: func() any { b := make([]byte, maxDatagram); return &b }}

// outBatch is what the forwarder sends at once: staged in order, sent
// grouped by destination (in order for each) with sendmmsg, a run of
// packets of one length to one port as one GSO send when the kernel can.
type outBatch struct {
	bufs  [ioBatch][]byte
	to    [ioBatch]netip.AddrPort
	flow  [ioBatch]bool
	flows [ioBatch][fabric.FlowLen]byte
	done  [ioBatch]bool
	n     int
	free  []*[]byte // buffers to return to the pool after the send
	g     *mmsg.GSOBatch
}

func (s *SM) newOutBatch() *outBatch {
	o := &outBatch{g: mmsg.NewGSOBatch(ioBatch)}
	o.g.GSO = s.gso
	return o
}

func (o *outBatch) full() bool { return o.n == ioBatch }

// add stages b for to.
func (o *outBatch) add(b []byte, to netip.AddrPort) {
	o.bufs[o.n], o.to[o.n], o.flow[o.n] = b, to, false
	o.n++
}

// addFlow stages a flow control packet for to.
func (o *outBatch) addFlow(f fabric.Flow, to netip.AddrPort) {
	i := o.n
	o.add(fabric.EncodeFlow(o.flows[i][:], f), to)
	o.flow[i] = true
}

// flush sends the staged datagrams, each port's in the order staged (a
// datagram the kernel refuses is lost, as on a link error, and counted),
// and returns the freed buffers to the pool.
func (s *SM) flush(o *outBatch, raw syscall.RawConn) {
	for i := range o.n {
		if o.done[i] {
			continue
		}
		for j := i; j < o.n; j++ {
			if !o.done[j] && o.to[j] == o.to[i] {
				o.g.Add(o.bufs[j], o.to[j], o.flow[j])
				o.done[j] = true
			}
		}
	}
	if refused, _ := o.g.Send(raw); refused > 0 {
		s.sendErrors.Add(uint64(refused))
	}
	clear(o.bufs[:o.n])
	clear(o.done[:o.n])
	o.n = 0
	for _, b := range o.free {
		packetPool.Put(b)
	}
	o.free = o.free[:0]
}

// floodHeadroom is the receive buffer the SM asks for beyond the one its
// windows share, where the kernel lets it (SO_RCVBUFFORCE: CAP_NET_ADMIN):
// room for a burst of control messages (a flood of attaches, tens of
// thousands of keepalives at once) beside the packets the windows grant.
const floodHeadroom = 64 << 20

// socketBuffer asks for a large receive buffer and returns what the
// kernel gave (SO_RCVBUF as getsockopt reports it): the buffer the
// ports' windows share. Then, where it may, it raises the buffer to
// floodHeadroom beyond the windows' share; the windows stay as they were.
func socketBuffer(c *rawudp.Conn) int {
	c.SetReadBuffer(fabric.SocketBuffer)
	raw, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var v int
	raw.Control(func(fd uintptr) {
		v, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, (v+floodHeadroom)/2) // the kernel doubles it
	})
	return v
}

// fabricLoop is the reader: control messages go to the control goroutine
// (controlIn), flow control packets update the links, IB packets go to
// input queues; then
// it forwards what the credits allow (pump) and leaves the waits for
// credit to forwardLoop.
func (s *SM) fabricLoop() error {
	b := mmsg.NewBatch(ioBatch, maxDatagram, unix.SizeofSockaddrInet6, 0)
	r, err := mmsg.NewReader(s.fabric, b)
	if err != nil {
		return err
	}
	raw, err := s.fabric.SyscallConn()
	if err != nil {
		return err
	}
	o := s.newOutBatch()
	handle := func(n int) {
		s.mu.Lock()
		now := time.Now()
		for i := range n {
			data, name, _, trunc := r.Datagram(i)
			from := mmsg.AddrPort(name)
			switch {
			case s.markerIn(data, from):
			case fabric.IsDirect(data):
				s.directIn(data, from, now)
			case fabric.IsControl(data):
				s.controlIn(data, from, now)
			case fabric.IsFlow(data):
				s.flowIn(data, from, now)
			default:
				s.packetIn(data, from, trunc)
			}
		}
		s.directChanged(now)
		s.mu.Unlock()
		if next := s.pump(o, raw); !next.IsZero() {
			s.kick()
		}
	}
	// Serve reads batches without the recvmmsg that would find the socket
	// empty, as the ports' receive loops do.
	if err := r.Serve(handle); !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// pump forwards until nothing moves and returns when to look again (zero:
// when something arrives). Staging and sending are serialized (fmu), so
// that a flow control packet never overtakes a packet counted in its
// FCTBS.
func (s *SM) pump(o *outBatch, raw syscall.RawConn) (next time.Time) {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return time.Time{}
		}
		progress, deadline := s.forwardLocked(time.Now(), o)
		direct := len(s.dready) > 0 || len(s.dlate) > 0 || len(s.dchanged) > 0
		s.mu.Unlock()
		s.flush(o, raw)
		if direct {
			s.directAfterFlush()
		}
		if !progress {
			return deadline
		}
	}
}

// kick wakes the forwarder.
func (s *SM) kick() {
	select {
	case s.work <- struct{}{}:
	default:
	}
}

// flowIn applies a port's flow control packet. Caller holds mu.
func (s *SM) flowIn(b []byte, from netip.AddrPort, now time.Time) {
	p := s.byAddr[from]
	if p == nil {
		s.unknownSrc.Add(1)
		return
	}
	f, err := fabric.DecodeFlow(b)
	if err != nil || !p.ls.link.On {
		p.c.drops.Add(1)
		return
	}
	p.ls.link.Receive(f)
	p.ls.flowAt = now
	if f.Op == fabric.FlowOpRequest {
		p.ls.wantFlow = true
		s.activate(p)
	}
}

// activate puts p on the forwarder's list of ports to visit. Caller
// holds mu.
func (s *SM) activate(p *port) {
	if !p.ls.active {
		p.ls.active = true
		s.visit = append(s.visit, p)
	}
}

// portWindow is the switch's receive window for p (0 while detached).
// Caller holds mu.
func (s *SM) portWindow(p *port) int {
	if !p.attached() {
		return 0
	}
	return s.win
}

// packetIn queues an IB packet of a port. Caller holds mu.
func (s *SM) packetIn(b []byte, from netip.AddrPort, trunc bool) {
	p := s.byAddr[from]
	if p == nil {
		s.unknownSrc.Add(1)
		return
	}
	p.c.rx.Add(1)
	// Beyond the grant: more packets than the port was granted (a window
	// that shrank since counts as granted until used), past the room kept
	// for management packets. Such a packet is dropped and, as the IBA
	// has it, not counted in ABR: it took no buffer.
	beyond := int((p.ls.link.ABR + 1 - p.ls.link.Granted) & (fabric.FlowMod - 1))
	if p.ls.in.n == queueCap || (p.ls.link.On && beyond > mgmtSlack && beyond <= fabric.MaxWindow) {
		p.c.overruns.Add(1)
		return
	}
	p.ls.link.Took(1)
	if trunc {
		p.c.drops.Add(1)
		return
	}
	// A packet for the SM is a management packet (VL15 on IB): it does
	// not wait in the input queue behind data packets that wait for
	// credit (a leave behind a head blocked on a stalled port timed out).
	if l, err := fabric.CheckLink(b); err == nil && s.toSM(l.DLID()) {
		s.saFromFabric(b, p)
		// It took a credit: the forwarder's visit grants it back (a port
		// whose data never queues would otherwise run out of credit after
		// a window of SA MADs, and the next ones would be overruns).
		s.activate(p)
		return
	}
	bp := packetPool.Get().(*[]byte)
	*bp = append((*bp)[:0], b...)
	var t *sma.Tables
	if s.ext != nil {
		// A switch routes a packet when it arrives: with OpenSM in
		// charge, the tables in force now decide where it goes, however
		// OpenSM changes them while it waits for credit (OpenSM clears a
		// group's entry when one member is left, and a burst still queued
		// from the sender that just left would be lost).
		t = s.ext.fab.Tables()
	}
	p.ls.in.push(bp, t)
	s.activate(p)
}

// forwardLoop forwards when credit may have come or a head-of-queue
// wait ends: when the reader found a queue blocked (kick), and at the
// deadlines forwardLocked reports.
func (s *SM) forwardLoop() {
	raw, err := s.fabric.SyscallConn()
	if err != nil {
		return
	}
	o := s.newOutBatch()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-s.work:
		case <-timer.C:
			// A deadline: a head-of-queue lifetime may have passed. The
			// reader decides once it has read what came before the marker.
			s.sendMarker()
		case <-s.quit:
			return
		}
		next := s.pump(o, raw)
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), 0))
		}
	}
}

// forwardLocked forwards what credits allow, staging datagrams into o. It
// reports whether anything moved and when it has to look again (zero:
// when woken). It visits only the ports on the active list (queued
// packets, or flow control to send), not every port; a port leaves the
// list when it has nothing left to do, and the ports a full batch left
// unvisited come first next time. Caller holds mu.
func (s *SM) forwardLocked(now time.Time, o *outBatch) (progress bool, next time.Time) {
	s.forwarding = true
	defer func() { s.forwarding = false }()
	later := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	ports := s.visit // nothing activates a port while this runs (mu)
	kept, i := 0, 0
	defer func() {
		s.spare = append(append(s.spare[:0], ports[i:]...), ports[:kept]...)
		clear(ports)
		s.visit, s.spare = s.spare, ports[:0]
	}()
	for ; i < len(ports); i++ {
		if o.n > ioBatch-4 {
			return true, next
		}
		p := ports[i]
		if !p.attached() {
			p.ls.active = false
			continue
		}
		ls := &p.ls
		if ls.wantFlow {
			ls.wantFlow = false
			if ls.link.On {
				o.addFlow(ls.link.Answer(s.win-ls.in.n), p.addr)
			}
		}
		for k := 0; k < perRound && ls.in.n > 0 && o.n <= ioBatch-4; k++ {
			done, retry := s.forwardHead(p, now, o)
			if !done {
				if !retry.IsZero() {
					later(retry)
				}
				break
			}
			progress = true
			o.free = append(o.free, ls.in.pop())
		}
		if ls.link.On && !o.full() && ls.link.Grant(s.win-ls.in.n, max(s.win/4, 1)) {
			o.addFlow(ls.link.Flow(fabric.FlowOpNormal), p.addr)
		}
		if p.dir.due && ls.in.n == 0 {
			// The switch holds none of p's packets once o went out:
			// its routes may go then (direct.go).
			p.dir.due = false
			s.dready = append(s.dready, p)
		}
		if ls.in.n > 0 || ls.wantFlow || p.dir.due || (ls.link.On && ls.link.Due(s.win-ls.in.n, max(s.win/4, 1))) {
			ports[kept] = p
			kept++
		} else {
			ls.active = false
		}
	}
	return progress, next
}

// forwardHead forwards the head packet of p's input queue to the ports
// with credit. done: the packet is finished with (sent everywhere,
// discarded, or for the SA); otherwise retry is when to look again (zero:
// when credit comes). Caller holds mu.
func (s *SM) forwardHead(p *port, now time.Time, o *outBatch) (done bool, retry time.Time) {
	ls := &p.ls
	b := ls.in.front()
	if !ls.headActive {
		l, err := fabric.CheckLink(b)
		if err != nil {
			p.c.drops.Add(1)
			s.logf("drop from %#x: %v", p.guid, err)
			return true, time.Time{}
		}
		dlid := l.DLID()
		ls.pend = ls.pend[:0]
		switch {
		case s.toSM(dlid):
			s.saFromFabric(b, p)
			return true, time.Time{}
		case s.ext != nil:
			s.extDestinations(p, dlid, ls.in.frontTables())
		case wire.IsMulticastLID(dlid):
			s.rebuildMFT()
			for _, d := range s.mft[dlid] {
				if d != p && d.attached() {
					ls.pend = append(ls.pend, d)
				}
			}
		default:
			if d := s.byLID[dlid]; d != nil && d.attached() && dlid < wire.MulticastLIDBase {
				ls.pend = append(ls.pend, d)
			}
		}
		if len(ls.pend) == 0 {
			p.c.drops.Add(1)
			if s.ext != nil {
				// Real: a join OpenSM answered before it set the
				// switch's tables, a port that left.
				s.limitedf(&s.ext.logNoRoute, now, "packet of port %#x to DLID %#x: dropped, no port for it in OpenSM's forwarding tables", p.guid, dlid)
			}
			return true, time.Time{}
		}
		ls.pendSince = append(ls.pendSince[:0], make([]time.Time, len(ls.pend))...)
		ls.headActive = true
	}
	// Each destination port's copy waits for that port's credit on its
	// own clock (pendSince: when it found the port without credit), as
	// each output port of an IB switch has its own head-of-queue timer.
	k := 0
	retry = time.Time{}
	for i, d := range ls.pend {
		since := ls.pendSince[i]
		switch {
		case !d.attached():
			d.c.discards.Add(1) // the port went down while the packet waited
			continue
		case now.Before(d.ls.dropUntil):
			d.c.discards.Add(1)
			s.discarded(d, now)
			continue
		case d.ls.link.Credits() > 0:
			if o.full() {
				break // stays pending until the batch went out
			}
			o.add(b, d.addr)
			d.ls.link.Sent(1)
			d.ls.stallCount = 0
			d.c.tx.Add(1)
			p.c.fwd.Add(1)
			continue
		case since.IsZero():
			since = now
			d.c.waits.Add(1)
		case s.caught.Sub(since) >= s.cfg.HOQLife:
			// No credit reached the switch within the lifetime (caught:
			// everything that arrived until then has been read).
			d.c.discards.Add(1)
			s.discarded(d, now)
			d.ls.stallCount++
			if d.ls.stallCount >= s.cfg.VLStallCount {
				d.ls.stallCount = 0
				d.ls.dropUntil = now.Add(8 * s.cfg.HOQLife)
				s.logf("port %#x (LID %d): %d packets in a row found no credit: stalled for %v", d.guid, d.lid, s.cfg.VLStallCount, 8*s.cfg.HOQLife)
			}
			continue
		}
		ls.pend[k], ls.pendSince[k] = d, since
		k++
		next := now // the batch was full: at once
		if d.ls.link.Credits() == 0 {
			if now.Sub(d.ls.lastReq) >= fabric.FlowRefresh && !o.full() {
				d.ls.lastReq = now
				o.addFlow(d.ls.link.Flow(fabric.FlowOpRequest), d.addr)
			}
			next = d.ls.lastReq.Add(fabric.FlowRefresh)
			// The lifetime's end: the forwarder then sends a marker, and
			// the reader discards once it has handled it (a lifetime
			// already over waits for that, not for the forwarder).
			exp := since.Add(s.cfg.HOQLife)
			if s.expiryAt.IsZero() || exp.Before(s.expiryAt) {
				s.expiryAt = exp
			}
			if exp.After(now) {
				next = minTime(next, exp)
			}
		}
		if retry.IsZero() || next.Before(retry) {
			retry = next
		}
	}
	ls.pend, ls.pendSince = ls.pend[:k], ls.pendSince[:k]
	if k == 0 {
		ls.headActive = false
		return true, time.Time{}
	}
	return false, retry
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// dropQueue empties a port's input queue (the port detached) and returns
// how many packets it dropped. Caller holds mu.
func (ls *linkState) dropQueue() int {
	n := ls.in.n
	for ls.in.n > 0 {
		packetPool.Put(ls.in.pop())
	}
	ls.headActive = false
	ls.pend, ls.pendSince = ls.pend[:0], ls.pendSince[:0]
	return n
}

// socketDrops is the kernel's count of datagrams dropped on the fabric
// socket because its buffer was full (SO_MEMINFO), 0 when it cannot say.
func (s *SM) socketDrops() uint32 {
	raw, err := s.fabric.SyscallConn()
	if err != nil {
		return 0
	}
	var v uint32
	raw.Control(func(fd uintptr) {
		var mi [unix.SK_MEMINFO_VARS]uint32
		l := uint32(unsafe.Sizeof(mi))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_MEMINFO,
			uintptr(unsafe.Pointer(&mi[0])), uintptr(unsafe.Pointer(&l)), 0)
		if e == 0 && l > unix.SK_MEMINFO_DROPS*4 {
			v = mi[unix.SK_MEMINFO_DROPS]
		}
	})
	return v
}

// logSocketDrops logs the fabric socket's kernel drops that grew since
// the last look (expiryLoop's tick): datagrams lost before the switch saw
// them are counted nowhere else.
func (s *SM) logSocketDrops() {
	n := s.socketDrops()
	if last := s.sockDropsSeen.Swap(n); n != last {
		s.logf("fabric socket: the kernel dropped %d datagrams (buffer full) since the last look (%d in all)", n-last, n)
	}
}

// discarded logs a port's discards (packets for it that found no credit
// for HOQLife, or came while it was stalled), at most one line a second
// per port with the count since the last: a lossless fabric that lost a
// packet says where. Discards not logged yet are logged by
// flushDiscards. SM.mu is held.
func (s *SM) discarded(d *port, now time.Time) {
	if d.ls.unlogged == 0 {
		s.unlogged = append(s.unlogged, d)
	}
	d.ls.unlogged++
	if s.cfg.Logf == nil || now.Sub(d.ls.loggedAt) < time.Second {
		return
	}
	s.logDiscards(d, now)
}

// logDiscards logs d's discards not logged yet. SM.mu is held.
func (s *SM) logDiscards(d *port, now time.Time) {
	last := "none yet"
	if !d.ls.flowAt.IsZero() {
		last = now.Sub(d.ls.flowAt).Round(time.Millisecond).String() + " ago"
	}
	s.logf("port %#x (LID %d): %d packets for it discarded: no credit for the head-of-queue lifetime %v (PortXmitDiscards %d; its last flow control packet %s)",
		d.guid, d.lid, d.ls.unlogged, s.cfg.HOQLife, d.c.discards.Load(), last)
	d.ls.unlogged, d.ls.loggedAt = 0, now
}

// flushDiscards logs the discards that discarded left unlogged, once a
// second has passed since the port's last line (expiryLoop's tick), so
// that the lines of a port add up to its PortXmitDiscards.
func (s *SM) flushDiscards(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.unlogged[:0]
	for _, d := range s.unlogged {
		switch {
		case d.ls.unlogged == 0:
		case s.cfg.Logf == nil:
			d.ls.unlogged = 0
		case now.Sub(d.ls.loggedAt) < time.Second:
			kept = append(kept, d)
		default:
			s.logDiscards(d, now)
		}
	}
	clear(s.unlogged[len(kept):])
	s.unlogged = kept
}
