package proto

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"time"
)

// Config is a member's protocol configuration. Zero durations and sizes
// take the defaults of Defaults.
type Config struct {
	// Session identifies the member: its stream as a sender and itself as
	// a receiver. Not 0.
	Session uint32
	// MTU is the largest packet, headers included.
	MTU int
	// Window is the number of packets a sender keeps for repair and may
	// have beyond a receiver's ack, and the packets a receiver holds per
	// sender.
	Window int
	// MaxMessage is the largest message a receiver reassembles.
	MaxMessage int
	// HeartbeatMin and HeartbeatMax bound a sender's heartbeat interval:
	// HeartbeatMin after its last packet, doubling up to HeartbeatMax.
	HeartbeatMin, HeartbeatMax time.Duration
	// NackDelay is the longest random wait before a receiver asks for a
	// missing packet (others' repairs may come meanwhile: suppression).
	NackDelay time.Duration
	// RepairTimeout is how long a receiver waits for a repair before it
	// asks again (doubling, up to 16 times longer). A sender repairs a
	// packet by multicast when a second receiver asks for it within half
	// of it.
	RepairTimeout time.Duration
	// StatusInterval is how often a receiver tells each sender its ack
	// when nothing else made it do so.
	StatusInterval time.Duration
	// PeerTimeout is how long a member stays silent before it counts as
	// gone: a sender for its receivers, a receiver for its senders.
	PeerTimeout time.Duration
	// MaxStall, when not 0, bounds how much a receiver may hold a sender
	// back: one that kept the sender blocked for more than half of a
	// period of MaxStall is evicted at the period's end.
	MaxStall time.Duration
	// Seed seeds the member's random choices (NACK delays).
	Seed uint64
}

// Defaults fills c's zero fields.
func (c *Config) Defaults() {
	if c.MTU == 0 {
		c.MTU = 1024
	}
	if c.Window == 0 {
		c.Window = 1024
	}
	if c.MaxMessage == 0 {
		c.MaxMessage = 1 << 20
	}
	if c.HeartbeatMin == 0 {
		c.HeartbeatMin = time.Millisecond
	}
	if c.HeartbeatMax == 0 {
		c.HeartbeatMax = 100 * time.Millisecond
	}
	if c.NackDelay == 0 {
		c.NackDelay = 300 * time.Microsecond
	}
	if c.RepairTimeout == 0 {
		c.RepairTimeout = 4 * time.Millisecond
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = 50 * time.Millisecond
	}
	if c.PeerTimeout == 0 {
		c.PeerTimeout = 2 * time.Second
	}
}

// Env carries a member's packets. Both calls must copy pkt before they
// return.
type Env interface {
	// Multicast sends pkt to the group.
	Multicast(pkt []byte)
	// Unicast sends pkt to the member whose session is to; a member the
	// transport has no address for is skipped.
	Unicast(to uint32, pkt []byte)
}

// EventKind says what happened to a stream.
type EventKind uint8

// Events a receiver reports, in the stream's order.
const (
	// EventLost: packets of the stream were lost for good (the sender no
	// longer held them, or it died with them unsent).
	EventLost EventKind = iota + 1
	// EventEvicted: the sender dropped this receiver from its window, for
	// holding it back longer than its MaxStall; the stream goes on at the
	// sender's live edge.
	EventEvicted
	// EventGone: the sender fell silent for PeerTimeout (died, or cut
	// off); its stream is over.
	EventGone
)

// Event is something a receiver reports about a stream.
type Event struct {
	Kind    EventKind
	Session uint32
	// Packets is how many of the stream's packets were lost for good.
	Packets uint64
}

// Stats counts a member's protocol work.
type Stats struct {
	DataSent, DataBytes          uint64 // first transmissions
	RepairsUnicast               uint64 // packets repaired to one receiver
	RepairsMulticast             uint64 // packets repaired to the group
	RepairBytes                  uint64
	RepairsSuppressed            uint64 // requests a recent repair answered
	NacksSent, NacksReceived     uint64
	NackedPackets                uint64 // packets asked for
	StatusSent, HeartbeatsSent   uint64
	Duplicates                   uint64 // packets received again
	Overruns                     uint64 // packets beyond this receiver's window
	Delivered                    uint64 // messages read
	LostPackets                  uint64
	Evictions, Evicted           uint64 // receivers this sender evicted; times this receiver was
	ReceiversGone, SendersGone   uint64 // peers that fell silent
	SendersLeft                  uint64 // senders that ended gracefully
	Blocked                      uint64 // times Write stopped for want of window
	BlockedNs                    uint64 // the time spent so, in ns
	BadPackets, TooLargeMessages uint64
}

// ErrShortBuffer is returned by Read when the next message does not fit.
var ErrShortBuffer = errors.New("buffer shorter than the message")

const never = math.MaxInt64

// Member is one member of a group: a sender of its own stream and a
// receiver of every other member's. It is not safe for concurrent use.
type Member struct {
	cfg   Config
	env   Env
	rng   *rand.Rand
	frag  int
	ctl   []byte
	out   *outStream
	in    map[uint32]*inStream
	gone  map[uint32]goneStream
	ready []*inStream
	evs   []Event
	due   int64
	left  bool // Leave ran: the member is done
	Stats Stats
}

// New returns a member.
func New(cfg Config, env Env) *Member {
	cfg.Defaults()
	if cfg.MTU < DataLen+8 {
		cfg.MTU = DataLen + 8
	}
	return &Member{
		cfg:  cfg,
		env:  env,
		rng:  rand.New(rand.NewPCG(cfg.Seed, uint64(cfg.Session))),
		frag: cfg.MTU - DataLen,
		ctl:  make([]byte, cfg.MTU),
		in:   map[uint32]*inStream{},
		gone: map[uint32]goneStream{},
		due:  never,
	}
}

// Config returns the member's configuration, defaults filled in.
func (m *Member) Config() Config { return m.cfg }

// PacketPayload is the most stream bytes one packet carries.
func (m *Member) PacketPayload() int { return m.frag }

// Due returns when Tick must run next (math.MaxInt64: nothing pending).
func (m *Member) Due() int64 { return m.due }

func (m *Member) at(t int64) {
	if t < m.due {
		m.due = t
	}
}

// ---- the sender side ----

type outStream struct {
	next, trail  uint64
	ring         []byte
	lens         []int32
	rep          []repair
	rcv          map[uint32]*rcvState
	evicted      map[uint32]evictMark
	left         map[uint32]int64 // receivers that left, and when: a Status of theirs is ignored
	hbDue        int64
	hbIvl        time.Duration
	blockedSince int64  // when Write was first refused, 0 when not blocked
	open         bool   // the packet at next is being filled
	olen         int    // its length so far, header included
	ofirst       uint16 // where its first record starts, or NoRecord
	lastHeld     int64  // held time is counted up to here
	period       int64  // start of the current MaxStall period
	final        bool
}

type repair struct {
	seq   uint64
	at    int64
	first uint32
	mc    bool
	valid bool
}

type rcvState struct {
	ack    uint64
	window uint64
	heard  int64
	held   int64 // time the sender was blocked on it in this period
	end    bool  // it knows where the stream ends (Finish)
}

type evictMark struct {
	resume uint64
	at     int64
	sent   int64 // the last Evict sent
}

func (m *Member) sender(now int64) *outStream {
	if m.out == nil {
		w := m.cfg.Window
		m.out = &outStream{
			ring:    make([]byte, w*m.cfg.MTU),
			lens:    make([]int32, w),
			rep:     make([]repair, w),
			rcv:     map[uint32]*rcvState{},
			evicted: map[uint32]evictMark{},
			left:    map[uint32]int64{},
			hbIvl:   m.cfg.HeartbeatMin,
			hbDue:   now,
		}
		m.at(now)
	}
	return m.out
}

// Announce makes the member a sender before its first message: it
// heartbeats, so receivers find it and report to it (Receivers).
func (m *Member) Announce(now int64) { m.sender(now) }

// Receivers returns how many receivers the member's stream has.
func (m *Member) Receivers() int {
	if m.out == nil {
		return 0
	}
	return len(m.out.rcv)
}

func (o *outStream) slot(seq uint64, mtu int) []byte {
	w := uint64(len(o.lens))
	i := int(seq % w)
	return o.ring[i*mtu : i*mtu+int(o.lens[i])]
}

// room reports whether the sender's window admits one more packet. The
// sender keeps every packet it can until it needs the room: a receiver
// it does not know yet (a late joiner) may still ask for it.
func (m *Member) room(o *outStream) bool {
	w := uint64(m.cfg.Window)
	if o.next-o.trail >= w {
		low := o.next - w + 1
		for _, r := range o.rcv {
			low = min(low, r.ack)
		}
		if low <= o.trail {
			return false
		}
		o.trail = low
	}
	for _, r := range o.rcv {
		if o.next >= max(r.ack, o.trail)+r.window {
			return false
		}
	}
	return true
}

// hold counts the time the sender has been blocked since it last looked
// to the receivers that block it now.
func (m *Member) hold(now int64, o *outStream) {
	if o.blockedSince == 0 || m.cfg.MaxStall <= 0 {
		return
	}
	d := now - o.lastHeld
	o.lastHeld = now
	for _, r := range o.rcv {
		if o.next >= max(r.ack, o.trail)+r.window {
			r.held += d
		}
	}
}

// Write adds message msg to the stream, from byte off of its record (the
// record is msg's length as a uvarint, then msg; off == 0 starts it), and
// returns how far it got: RecordLen(len(msg)) once all of it is in
// packets. Records are packed into packets back to back and a record
// spans packets as needed; a full packet is sent at once, the last one
// stays open for the next record until Flush. It stops early, and says
// so by returning less, when the window has no room for another packet:
// the caller waits for a packet or Tick to open it (Room) and calls again
// with the offset.
func (m *Member) Write(now int64, msg []byte, off int) int {
	o := m.sender(now)
	if o.final {
		return off
	}
	var h [binary.MaxVarintLen64]byte
	hn := binary.PutUvarint(h[:], uint64(len(msg)))
	total := hn + len(msg)
	mtu := m.cfg.MTU
	for off < total {
		if !o.open {
			m.hold(now, o)
			if !m.room(o) {
				if o.blockedSince == 0 {
					o.blockedSince, o.lastHeld = now, now
					// Ask the receivers where they are, soon.
					o.hbIvl = m.cfg.HeartbeatMin
					o.hbDue = min(o.hbDue, now+int64(m.cfg.HeartbeatMin))
					m.at(o.hbDue)
				}
				m.Stats.Blocked++
				return off
			}
			if o.blockedSince != 0 {
				m.Stats.BlockedNs += uint64(now - o.blockedSince)
				o.blockedSince = 0
			}
			o.open, o.olen, o.ofirst = true, DataLen, NoRecord
		}
		i := int(o.next % uint64(m.cfg.Window))
		b := o.ring[i*mtu : (i+1)*mtu]
		if off == 0 && o.ofirst == NoRecord {
			o.ofirst = uint16(o.olen - DataLen)
		}
		for off < hn && o.olen < mtu {
			b[o.olen] = h[off]
			o.olen++
			off++
		}
		if off >= hn {
			n := copy(b[o.olen:], msg[off-hn:])
			o.olen += n
			off += n
		}
		if o.olen == mtu {
			m.sendOpen(now, o)
		}
	}
	return off
}

// RecordLen returns the length of a message's record in the stream.
func RecordLen(n int) int {
	var h [binary.MaxVarintLen64]byte
	return binary.PutUvarint(h[:], uint64(n)) + n
}

// Flush sends the open packet, if any.
func (m *Member) Flush(now int64) {
	if o := m.out; o != nil && o.open {
		m.sendOpen(now, o)
	}
}

// sendOpen sends the open packet.
func (m *Member) sendOpen(now int64, o *outStream) {
	i := int(o.next % uint64(m.cfg.Window))
	b := o.ring[i*m.cfg.MTU : i*m.cfg.MTU+o.olen]
	PutData(b, m.cfg.Session, o.next, 0, o.ofirst)
	o.lens[i] = int32(o.olen)
	o.rep[i] = repair{}
	o.next++
	o.open = false
	m.env.Multicast(b)
	m.Stats.DataSent++
	m.Stats.DataBytes += uint64(o.olen - DataLen)
	o.hbIvl = m.cfg.HeartbeatMin
	o.hbDue = now + int64(o.hbIvl)
	m.at(o.hbDue)
}

// Room reports whether Write would make progress now.
func (m *Member) Room() bool {
	if m.out == nil {
		return true
	}
	return !m.out.final && (m.out.open || m.room(m.out))
}

// Finish ends the member's stream: no more fragments; heartbeats say
// where it ends.
func (m *Member) Finish(now int64) {
	if m.out == nil || m.out.final {
		return
	}
	m.Flush(now)
	m.out.final = true
	m.heartbeat(now, m.out, 0)
	m.out.hbIvl = m.cfg.HeartbeatMin
	m.out.hbDue = now + int64(m.out.hbIvl)
	m.at(m.out.hbDue)
}

// Drained reports whether every receiver of the member's stream has
// acked all of it and, after Finish, knows it ended.
func (m *Member) Drained() bool {
	o := m.out
	if o == nil {
		return true
	}
	for _, r := range o.rcv {
		if r.ack < o.next || o.final && !r.end {
			return false
		}
	}
	return true
}

func (m *Member) heartbeat(now int64, o *outStream, to uint32) {
	var fl uint8
	if o.trail < o.next || o.blockedSince != 0 || o.final {
		fl |= FlagAckReq
	}
	if o.final {
		fl |= FlagFinal
	}
	n := PutHeartbeat(m.ctl, m.cfg.Session, o.next, o.trail, fl)
	if to != 0 {
		m.env.Unicast(to, m.ctl[:n])
	} else {
		m.env.Multicast(m.ctl[:n])
	}
	m.Stats.HeartbeatsSent++
}

func (m *Member) onStatus(now int64, p Packet) {
	o := m.out
	if o == nil || p.Session() != m.cfg.Session {
		return
	}
	from, ack := p.From(), p.Ack()
	if _, ok := o.left[from]; ok {
		return // sent before its Leave, which overtook it
	}
	if e, ok := o.evicted[from]; ok {
		if ack < e.resume {
			// From before the eviction, or the Evict was lost: again,
			// at most once per RepairTimeout.
			if now-e.sent >= int64(m.cfg.RepairTimeout) {
				e.sent = now
				o.evicted[from] = e
				n := PutEvict(m.ctl, m.cfg.Session, from, e.resume)
				m.env.Unicast(from, m.ctl[:n])
			}
			return
		}
		delete(o.evicted, from)
	}
	if ack > o.next {
		m.Stats.BadPackets++
		return
	}
	r := o.rcv[from]
	if r == nil {
		r = &rcvState{ack: ack}
		o.rcv[from] = r
	}
	if p.Flags()&FlagHello != 0 {
		n := PutHeartbeat(m.ctl, m.cfg.Session, o.next, o.trail, FlagWelcome)
		m.env.Unicast(from, m.ctl[:n])
	}
	if ack > r.ack {
		m.hold(now, o) // what it held up to now
		r.ack = ack
	}
	r.window = max(uint64(p.Window()), 1)
	r.heard = now
	r.end = r.end || p.Flags()&FlagEnd != 0
}

func (m *Member) onNack(now int64, p Packet) {
	o := m.out
	if o == nil || p.Session() != m.cfg.Session {
		return
	}
	m.Stats.NacksReceived++
	from := p.From()
	if r := o.rcv[from]; r != nil {
		r.heard = now
	}
	w := uint64(m.cfg.Window)
	trailHB := false
	budget := w
	for i := range p.NackCount() {
		start, n := p.NackRange(i)
		for k := uint64(0); k < uint64(n) && budget > 0; k++ {
			budget--
			s := start + k
			if s >= o.next || s < start {
				break
			}
			if s < o.trail {
				trailHB = true
				continue
			}
			rs := &o.rep[s%w]
			pkt := o.slot(s, m.cfg.MTU)
			pkt[1] |= FlagRepair
			switch {
			case !rs.valid || rs.seq != s || now-rs.at > int64(m.cfg.RepairTimeout/2):
				*rs = repair{seq: s, at: now, first: from, valid: true}
				m.env.Unicast(from, pkt)
				m.Stats.RepairsUnicast++
				m.Stats.RepairBytes += uint64(len(pkt) - DataLen)
			case !rs.mc && rs.first != from:
				rs.mc, rs.at = true, now
				m.env.Multicast(pkt)
				m.Stats.RepairsMulticast++
				m.Stats.RepairBytes += uint64(len(pkt) - DataLen)
			default:
				m.Stats.RepairsSuppressed++
			}
		}
	}
	if trailHB {
		m.heartbeat(now, o, from)
	}
}

// onLeave drops a receiver that left. Its session is remembered for
// PeerTimeout: a Status it sent before its Leave may arrive after it, and
// must not count it again (a receiver that will never ack the stream's
// end would hold Drained false until PeerTimeout).
func (m *Member) onLeave(now int64, p Packet) {
	o := m.out
	if o == nil || p.Session() != m.cfg.Session {
		return
	}
	delete(o.rcv, p.From())
	delete(o.evicted, p.From())
	if _, ok := o.left[p.From()]; !ok && len(o.left) >= maxLeft {
		return // a flood of Leaves: remember no more
	}
	o.left[p.From()] = now
}

// maxLeft bounds how many left receivers a sender remembers.
const maxLeft = 4096

func (m *Member) tickSender(now int64, o *outStream) {
	for id, r := range o.rcv {
		if now-r.heard > int64(m.cfg.PeerTimeout) {
			delete(o.rcv, id)
			m.Stats.ReceiversGone++
		}
	}
	if m.cfg.MaxStall > 0 {
		m.hold(now, o)
		if now-o.period >= int64(m.cfg.MaxStall) {
			for id, r := range o.rcv {
				if r.held > int64(m.cfg.MaxStall)/2 {
					delete(o.rcv, id)
					o.evicted[id] = evictMark{resume: o.next, at: now, sent: now}
					n := PutEvict(m.ctl, m.cfg.Session, id, o.next)
					m.env.Unicast(id, m.ctl[:n])
					m.Stats.Evictions++
				}
				r.held = 0
			}
			o.period = now
		}
		if o.blockedSince != 0 {
			m.at(o.period + int64(m.cfg.MaxStall))
		}
	}
	for id, e := range o.evicted {
		if now-e.at > int64(m.cfg.PeerTimeout) {
			delete(o.evicted, id)
		}
	}
	for id, at := range o.left {
		if now-at > int64(m.cfg.PeerTimeout) {
			delete(o.left, id)
		}
	}
	if now >= o.hbDue {
		m.heartbeat(now, o, 0)
		o.hbIvl = min(2*o.hbIvl, m.cfg.HeartbeatMax)
		o.hbDue = now + int64(o.hbIvl)
	}
	m.at(o.hbDue)
}

// ---- the receiver side ----

const (
	slotMissing = iota
	slotHave
	slotLost
)

// goneStream is a stream that ended: its packets are ignored for a while.
type goneStream struct {
	at    int64
	ended bool // it ended gracefully, read to its end
}

type inStream struct {
	session       uint32
	deliv, contig uint64 // consumed below deliv; all present or lost below contig
	high          uint64 // one past the highest sequence number known sent
	lostTo        uint64 // missing packets below it are lost for good
	lostWhy       EventKind
	lostRun       uint64
	state         []uint8
	first         []uint16 // each packet's first record (NoRecord: none)
	lens          []int32
	nackAt        []int64
	tries         []uint8
	ring          []byte
	// Reading the stream: packet deliv from byte doff.
	doff               int
	recSync            bool // doff is at a record boundary (or inside asm's record)
	asm                []byte
	asmOn              bool // a record spanning packets is being put together in asm
	need               int  // bytes it still lacks
	asmReady           bool // asm holds a whole record
	hdr                [binary.MaxVarintLen64]byte
	hdrN               int  // bytes of a record's length that a packet's end cut
	wholeOK            bool // a whole record lies in packet deliv at recOff
	recOff             int
	recLen             int
	heard              int64
	statusDue, nackDue int64
	lastAck            uint64
	queued             bool
	synced             bool // the sender welcomed this receiver
	final              bool
	end                uint64
	dead               bool
}

func (m *Member) stream(now int64, session uint32, start uint64) *inStream {
	if st := m.in[session]; st != nil {
		return st
	}
	if _, ok := m.gone[session]; ok {
		return nil
	}
	w := m.cfg.Window
	st := &inStream{
		session: session,
		deliv:   start, contig: start, high: start, lostTo: start,
		state:   make([]uint8, w),
		first:   make([]uint16, w),
		lens:    make([]int32, w),
		nackAt:  make([]int64, w),
		tries:   make([]uint8, w),
		ring:    make([]byte, w*m.frag),
		heard:   now,
		nackDue: never,
	}
	m.in[session] = st
	m.sendStatus(now, st)
	return st
}

func (m *Member) idx(seq uint64) int { return int(seq % uint64(m.cfg.Window)) }

func (m *Member) sendStatus(now int64, st *inStream) {
	var fl uint8
	ivl := m.cfg.StatusInterval
	if !st.synced {
		fl, ivl = FlagHello, m.cfg.RepairTimeout
	}
	if st.final {
		fl |= FlagEnd
	}
	n := PutStatus(m.ctl, st.session, m.cfg.Session, st.deliv, uint32(m.cfg.Window), fl)
	m.env.Unicast(st.session, m.ctl[:n])
	st.lastAck = st.deliv
	st.statusDue = now + int64(ivl)
	m.at(st.statusDue)
	m.Stats.StatusSent++
}

// known raises what the stream knows was sent, to high; packets from the
// old high up to gapEnd were never seen: they are asked for.
func (m *Member) known(now int64, st *inStream, gapEnd, high uint64) {
	if gapEnd > st.high {
		st.nackDue = min(st.nackDue, now)
		m.at(now)
	}
	st.high = max(st.high, high)
}

func (m *Member) onData(now int64, p Packet) {
	seq := p.Seq()
	if p.Flags()&FlagRepair != 0 && m.in[p.Session()] == nil {
		return // a stream starts at its live edge, not at an old repair
	}
	st := m.stream(now, p.Session(), seq)
	if st == nil {
		return
	}
	st.heard = now
	w := uint64(m.cfg.Window)
	pl := p.Payload()
	if seq < st.contig {
		m.Stats.Duplicates++
		return
	}
	if len(pl) > m.frag {
		m.Stats.BadPackets++
		return
	}
	if seq >= st.deliv+w {
		m.Stats.Overruns++
		m.known(now, st, seq, seq+1)
		return
	}
	i := m.idx(seq)
	if st.state[i] != slotMissing {
		m.Stats.Duplicates++
		return
	}
	st.state[i] = slotHave
	st.first[i] = p.FirstRecord()
	st.lens[i] = int32(copy(st.ring[i*m.frag:], pl))
	m.known(now, st, seq, seq+1)
	m.pump(now, st)
}

// advance moves contig over what is present, and over what is lost.
func (m *Member) advance(st *inStream) {
	lim := min(st.high, st.deliv+uint64(m.cfg.Window))
	for st.contig < lim {
		i := m.idx(st.contig)
		if st.state[i] == slotMissing {
			if st.contig >= st.lostTo {
				return
			}
			st.state[i] = slotLost
		}
		st.contig++
	}
}

func (m *Member) free(st *inStream, i int) {
	st.state[i] = slotMissing
	st.nackAt[i] = 0
	st.tries[i] = 0
}

// resync drops a record in progress: reading goes on at the next
// packet's first record.
func (st *inStream) resync() {
	st.recSync, st.asmOn, st.hdrN, st.wholeOK = false, false, 0, false
	if !st.asmReady {
		st.asm = st.asm[:0]
	}
}

// next moves reading to the next packet.
func (m *Member) nextPacket(st *inStream, i int) {
	m.free(st, i)
	st.deliv++
	st.doff = 0
}

// pump reads the stream as far as it can: records spanning packets go
// into asm, what is lost and what precedes the first record boundary
// seen is skipped; it stops at a whole record (Read takes it) and queues
// the stream.
func (m *Member) pump(now int64, st *inStream) {
	if !st.synced {
		return // nothing is delivered before the sender holds the stream for us
	}
	if st.high > st.deliv+uint64(m.cfg.Window) {
		// Packets beyond the window were seen: once it moves, what is
		// missing in it is asked for.
		defer func(d uint64) {
			if st.deliv > d {
				st.nackDue = min(st.nackDue, now)
				m.at(now)
			}
		}(st.deliv)
	}
	for !st.wholeOK && !st.asmReady {
		m.advance(st)
		if st.deliv >= st.contig {
			break
		}
		i := m.idx(st.deliv)
		if st.state[i] == slotLost {
			st.lostRun++
			st.resync()
			m.nextPacket(st, i)
			continue
		}
		if st.lostRun > 0 {
			m.report(st)
		}
		pl := st.ring[i*m.frag : i*m.frag+int(st.lens[i])]
		if !st.recSync {
			f := int(st.first[i])
			if f == NoRecord || f >= len(pl) {
				m.nextPacket(st, i)
				continue
			}
			st.doff, st.recSync = f, true
		}
		if st.doff >= len(pl) {
			m.nextPacket(st, i)
			continue
		}
		switch {
		case st.asmOn:
			n := min(st.need, len(pl)-st.doff)
			st.asm = append(st.asm, pl[st.doff:st.doff+n]...)
			st.doff += n
			st.need -= n
			if st.need == 0 {
				st.asmOn, st.asmReady = false, true
			}
			continue
		case st.hdrN > 0:
			// A length a packet's end cut: its bytes go on here.
			for st.doff < len(pl) && st.hdrN < len(st.hdr) {
				st.hdr[st.hdrN] = pl[st.doff]
				st.hdrN++
				st.doff++
				if pl[st.doff-1] < 0x80 {
					break
				}
			}
			l, hn := binary.Uvarint(st.hdr[:st.hdrN])
			if hn == 0 {
				continue // still cut: the next packet
			}
			st.hdrN = 0
			if hn < 0 || l > uint64(m.cfg.MaxMessage) {
				m.Stats.TooLargeMessages++
				st.resync() // on at the next packet's first record
				m.nextPacket(st, i)
				continue
			}
			st.asm, st.asmOn, st.need = st.asm[:0], true, int(l)
			if l == 0 {
				st.asmOn, st.asmReady = false, true
			}
			continue
		}
		l, hn := binary.Uvarint(pl[st.doff:])
		switch {
		case hn == 0:
			st.hdrN = copy(st.hdr[:], pl[st.doff:])
			st.doff = len(pl)
			continue
		case hn < 0 || l > uint64(m.cfg.MaxMessage):
			m.Stats.TooLargeMessages++
			st.resync() // on at the next packet's first record
			m.nextPacket(st, i)
			continue
		}
		if st.doff+hn+int(l) <= len(pl) {
			st.wholeOK, st.recOff, st.recLen = true, st.doff+hn, int(l)
			break
		}
		st.asm = append(st.asm[:0], pl[st.doff+hn:]...)
		st.need = int(l) - (len(pl) - st.doff - hn)
		st.asmOn = true
		st.doff = len(pl)
	}
	if st.lostRun > 0 && st.deliv == st.contig && st.contig >= st.lostTo {
		m.report(st)
	}
	if (st.asmReady || st.wholeOK) && !st.queued {
		st.queued = true
		m.ready = append(m.ready, st)
	}
	m.ackMaybe(now, st)
	m.retire(st)
}

func (m *Member) report(st *inStream) {
	m.evs = append(m.evs, Event{Kind: st.lostWhy, Session: st.session, Packets: st.lostRun})
	m.Stats.LostPackets += st.lostRun
	st.lostRun = 0
}

// ackMaybe tells the sender when a quarter of the window opened.
func (m *Member) ackMaybe(now int64, st *inStream) {
	if !st.dead && st.deliv-st.lastAck >= uint64(max(m.cfg.Window/4, 1)) {
		m.sendStatus(now, st)
	}
}

// retire ends a stream that is over and read.
func (m *Member) retire(st *inStream) {
	if st.asmReady || st.wholeOK || st.queued || st.deliv < st.contig {
		return
	}
	switch {
	case st.final && st.deliv >= st.end:
		m.Stats.SendersLeft++
	case st.dead && st.deliv >= st.high:
		if st.lostRun > 0 {
			m.report(st)
		}
		m.evs = append(m.evs, Event{Kind: EventGone, Session: st.session})
		m.Stats.SendersGone++
	default:
		return
	}
	delete(m.in, st.session)
	m.gone[st.session] = goneStream{at: st.heard, ended: st.final}
}

// loseTo marks every missing packet below to as lost for good. A point
// beyond the window drops what the window holds too (but a message
// already reassembled).
func (m *Member) loseTo(now int64, st *inStream, to uint64, why EventKind) {
	if to <= st.lostTo {
		return
	}
	if st.lostWhy != EventEvicted || st.deliv >= st.lostTo {
		st.lostWhy = why // an eviction not yet reported stays the reason
	}
	st.lostTo = to
	w := uint64(m.cfg.Window)
	if to > st.deliv+w {
		for k := range w {
			m.free(st, m.idx(st.deliv+k))
		}
		st.lostRun += to - st.deliv
		st.resync()
		st.deliv, st.contig, st.doff = to, to, 0
	}
	st.high = max(st.high, to)
	m.pump(now, st)
}

// restart moves a stream that delivered nothing yet to start at t: what it
// held before t is dropped, and none of it counts as lost.
func (m *Member) restart(now int64, st *inStream, t uint64) {
	st.nackDue = min(st.nackDue, now) // the window moved: what is missing in it is asked for
	m.at(now)
	if t <= st.deliv {
		return
	}
	w := uint64(m.cfg.Window)
	for s := st.deliv; s < t && s < st.deliv+w; s++ {
		m.free(st, m.idx(s))
	}
	st.resync()
	st.deliv, st.lastAck, st.doff = t, t, 0
	st.contig = max(st.contig, t)
	st.high = max(st.high, t)
	st.lostTo = max(st.lostTo, t)
}

func (m *Member) onHeartbeat(now int64, p Packet) {
	if p.Trail() > p.Next() {
		m.Stats.BadPackets++
		return
	}
	if p.Flags()&FlagFinal != 0 && m.in[p.Session()] == nil {
		if g, ok := m.gone[p.Session()]; ok && g.ended {
			// Read to its end already: say so again (the Status that
			// said it may have been lost).
			n := PutStatus(m.ctl, p.Session(), m.cfg.Session, p.Next(), uint32(m.cfg.Window), FlagEnd)
			m.env.Unicast(p.Session(), m.ctl[:n])
			m.Stats.StatusSent++
		}
		return
	}
	st := m.stream(now, p.Session(), p.Next())
	if st == nil {
		return
	}
	st.heard = now
	if p.Flags()&FlagWelcome != 0 && !st.synced {
		m.restart(now, st, p.Trail())
		st.synced = true
	}
	if t := p.Trail(); t > st.contig && st.synced {
		m.loseTo(now, st, t, EventLost)
	}
	m.known(now, st, p.Next(), p.Next())
	if p.Flags()&FlagFinal != 0 {
		st.final, st.end = true, p.Next()
	}
	if p.Flags()&FlagAckReq != 0 {
		m.sendStatus(now, st)
	}
	m.pump(now, st)
}

func (m *Member) onEvict(now int64, p Packet) {
	st := m.in[p.Session()]
	if st == nil || p.To() != m.cfg.Session {
		return
	}
	if p.Resume() <= st.lostTo {
		// The sender's trail told of the loss first: say why.
		if st.lostWhy != EventEvicted {
			st.lostWhy = EventEvicted
			if st.lostRun == 0 {
				m.evs = append(m.evs, Event{Kind: EventEvicted, Session: st.session})
				m.Stats.Evicted++
			}
		}
		return
	}
	st.heard = now
	m.Stats.Evicted++
	m.loseTo(now, st, p.Resume(), EventEvicted)
	m.sendStatus(now, st)
}

func (m *Member) jitter() int64 {
	d := int64(m.cfg.NackDelay)
	if d <= 0 {
		return 0
	}
	return m.rng.Int64N(d + 1)
}

// scanNacks asks for the missing packets whose time has come.
func (m *Member) scanNacks(now int64, st *inStream) {
	lim := min(st.high, st.deliv+uint64(m.cfg.Window))
	maxRanges := min((m.cfg.MTU-NackLen)/NackRangeLen, 64)
	b := m.ctl
	nr := 0
	due := int64(never)
	flush := func() {
		if nr == 0 {
			return
		}
		n := PutNack(b, st.session, m.cfg.Session, nr)
		m.env.Unicast(st.session, b[:n])
		m.Stats.NacksSent++
		nr = 0
	}
	var rs uint64
	var rn uint32
	for s := st.contig; s < lim; s++ {
		i := m.idx(s)
		if st.state[i] != slotMissing {
			continue
		}
		at := st.nackAt[i]
		if at == 0 {
			at = now + m.jitter()
			st.nackAt[i] = at
		}
		if at <= now {
			t := min(st.tries[i], 4)
			st.tries[i]++
			at = now + int64(m.cfg.RepairTimeout)<<t
			st.nackAt[i] = at
			m.Stats.NackedPackets++
			if rn > 0 && rs+uint64(rn) == s {
				rn++
			} else {
				if rn > 0 {
					PutNackRange(b, nr, rs, rn)
					nr++
					if nr == maxRanges {
						flush()
					}
				}
				rs, rn = s, 1
			}
		}
		due = min(due, at)
	}
	if rn > 0 {
		PutNackRange(b, nr, rs, rn)
		nr++
	}
	flush()
	st.nackDue = due
}

func (m *Member) tickStream(now int64, st *inStream) {
	if !st.dead && now-st.heard > int64(m.cfg.PeerTimeout) {
		st.dead = true
		m.loseTo(now, st, st.high, EventLost)
		return
	}
	if st.dead {
		return
	}
	if st.nackDue <= now {
		m.scanNacks(now, st)
	}
	if now >= st.statusDue {
		m.sendStatus(now, st)
	}
	m.at(st.nackDue)
	m.at(st.statusDue)
	m.at(st.heard + int64(m.cfg.PeerTimeout) + 1)
}

// ---- both ----

// Handle takes one received packet. It reports false for a packet it
// cannot parse (counted).
func (m *Member) Handle(now int64, b []byte) bool {
	p := Packet(b)
	if !p.Valid() {
		m.Stats.BadPackets++
		return false
	}
	if p.Author() == m.cfg.Session || m.left {
		return true // our own multicast, looped back; or we left
	}
	switch p.Type() {
	case TypeData:
		m.onData(now, p)
	case TypeHeartbeat:
		m.onHeartbeat(now, p)
	case TypeStatus:
		m.onStatus(now, p)
	case TypeNack:
		m.onNack(now, p)
	case TypeEvict:
		m.onEvict(now, p)
	case TypeLeave:
		m.onLeave(now, p)
	}
	return true
}

// Tick runs the member's timers; Due says when it is next needed.
func (m *Member) Tick(now int64) {
	m.due = never
	if m.left {
		return
	}
	if m.out != nil {
		m.tickSender(now, m.out)
	}
	for _, st := range m.in {
		m.tickStream(now, st)
	}
	for _, st := range m.in {
		if st.dead {
			m.pump(now, st)
		}
	}
	for s, g := range m.gone {
		if now-g.at > 2*int64(m.cfg.PeerTimeout) {
			delete(m.gone, s)
		}
	}
	if len(m.gone) > 0 {
		m.at(now + int64(m.cfg.PeerTimeout))
	}
}

// Leave tells every sender this member receives from that it is gone.
// The member is done then: it handles no more packets and runs no more
// timers, so that nothing it sends follows its Leaves (a Status after a
// Leave would make the sender count it as a receiver again, one that
// never acks the stream's end). A second Leave sends nothing.
func (m *Member) Leave() {
	if m.left {
		return
	}
	m.left = true
	m.due = never
	for s := range m.in {
		n := PutLeave(m.ctl, s, m.cfg.Session)
		m.env.Unicast(s, m.ctl[:n])
	}
}

// NextEvent takes the oldest event not yet taken.
func (m *Member) NextEvent() (Event, bool) {
	if len(m.evs) == 0 {
		return Event{}, false
	}
	ev := m.evs[0]
	m.evs = m.evs[1:]
	if len(m.evs) == 0 {
		m.evs = m.evs[:0:0]
	}
	return ev, true
}

// PeekEvent returns the oldest event not yet taken, and leaves it.
func (m *Member) PeekEvent() (Event, bool) {
	if len(m.evs) == 0 {
		return Event{}, false
	}
	return m.evs[0], true
}

// Pending reports whether Read or NextEvent has something.
func (m *Member) Pending() bool { return len(m.evs) > 0 || len(m.ready) > 0 }

// Read copies the next whole message into buf, in each sender's order,
// and returns its length and sender. ok is false when no message is
// ready. A message longer than buf stays queued: ErrShortBuffer, with its
// length.
func (m *Member) Read(now int64, buf []byte) (n int, from uint32, ok bool, err error) {
	for len(m.ready) > 0 {
		st := m.ready[0]
		if !st.asmReady && !st.wholeOK {
			m.popReady()
			st.queued = false
			m.pump(now, st)
			continue
		}
		if st.asmReady {
			if len(buf) < len(st.asm) {
				return len(st.asm), st.session, false, ErrShortBuffer
			}
			n = copy(buf, st.asm)
			st.asm, st.asmReady = st.asm[:0], false
		} else {
			if len(buf) < st.recLen {
				return st.recLen, st.session, false, ErrShortBuffer
			}
			i := m.idx(st.deliv)
			b := i*m.frag + st.recOff
			n = copy(buf, st.ring[b:b+st.recLen])
			st.doff = st.recOff + st.recLen
			st.wholeOK = false
		}
		m.popReady()
		st.queued = false
		m.Stats.Delivered++
		m.pump(now, st)
		return n, st.session, true, nil
	}
	return 0, 0, false, nil
}

func (m *Member) popReady() {
	copy(m.ready, m.ready[1:])
	m.ready[len(m.ready)-1] = nil
	m.ready = m.ready[:len(m.ready)-1]
}

// Senders returns the sessions of the streams the member receives.
func (m *Member) Senders() []uint32 {
	out := make([]uint32, 0, len(m.in))
	for s := range m.in {
		out = append(out, s)
	}
	return out
}
