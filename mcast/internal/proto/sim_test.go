package proto

import (
	"container/heap"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// A simulated network of members: every packet to every destination is
// lost, duplicated and delayed (so reordered) at random, on a virtual
// clock.

type flight struct {
	at  int64
	to  int // member index
	pkt []byte
	n   int // tie breaker
}

type flights []flight

func (f flights) Len() int { return len(f) }
func (f flights) Less(i, j int) bool {
	if f[i].at != f[j].at {
		return f[i].at < f[j].at
	}
	return f[i].n < f[j].n
}
func (f flights) Swap(i, j int) { f[i], f[j] = f[j], f[i] }
func (f *flights) Push(x any)   { *f = append(*f, x.(flight)) }
func (f *flights) Pop() any     { o := *f; x := o[len(o)-1]; *f = o[:len(o)-1]; return x }

type simNet struct {
	rng     *rand.Rand
	now     int64
	q       flights
	n       int
	members []*simMember
	loss    float64 // per packet and destination
	dup     float64
	delay   int64 // base one-way delay
	jitter  int64 // up to this much more: reordering
	sent    int   // packets put on the wire
	lost    int
}

type simMember struct {
	net     *simNet
	idx     int
	m       *Member
	dead    bool
	joined  bool // receives the group's multicast
	got     []uint64
	gotFrom []uint32
	events  []Event
	readBuf []byte
	slow    bool // reads only now and then
	nextRd  int64
}

func (sm *simMember) Multicast(pkt []byte) {
	for _, o := range sm.net.members {
		if o != sm && o.joined {
			sm.net.send(o.idx, pkt)
		}
	}
}

func (sm *simMember) Unicast(to uint32, pkt []byte) {
	for _, o := range sm.net.members {
		if o.m.cfg.Session == to {
			sm.net.send(o.idx, pkt)
		}
	}
}

func (n *simNet) send(to int, pkt []byte) {
	n.sent++
	copies := 1
	if n.rng.Float64() < n.dup {
		copies = 2
	}
	for range copies {
		if n.rng.Float64() < n.loss {
			n.lost++
			continue
		}
		d := n.delay
		if n.jitter > 0 {
			d += n.rng.Int64N(n.jitter)
		}
		n.n++
		heap.Push(&n.q, flight{at: n.now + d, to: to, pkt: append([]byte(nil), pkt...), n: n.n})
	}
}

func (n *simNet) add(cfg Config, joined bool) *simMember {
	sm := &simMember{net: n, idx: len(n.members), joined: joined, readBuf: make([]byte, 1<<16)}
	cfg.Session = uint32(1000 + len(n.members))
	cfg.Seed = n.rng.Uint64()
	sm.m = New(cfg, sm)
	n.members = append(n.members, sm)
	return sm
}

// drain reads every ready message and event of sm.
func (sm *simMember) drain() {
	if sm.dead {
		return
	}
	if sm.slow && sm.net.now < sm.nextRd {
		return
	}
	for {
		if ev, ok := sm.m.NextEvent(); ok {
			sm.events = append(sm.events, ev)
			continue
		}
		n, from, ok, err := sm.m.Read(sm.net.now, sm.readBuf)
		if err != nil {
			panic(err)
		}
		if !ok {
			return
		}
		sm.got = append(sm.got, checkMsg(sm.readBuf[:n]))
		sm.gotFrom = append(sm.gotFrom, from)
		if sm.slow {
			sm.nextRd = sm.net.now + int64(20*time.Millisecond)
			return
		}
	}
}

// step advances the clock to the next packet or timer, up to limit, and
// runs it. It reports false at limit.
func (n *simNet) step(limit int64) bool {
	next := limit
	if len(n.q) > 0 && n.q[0].at < next {
		next = n.q[0].at
	}
	for _, sm := range n.members {
		if !sm.dead {
			next = min(next, sm.m.Due())
			if sm.slow && sm.m.Pending() {
				next = min(next, max(sm.nextRd, n.now))
			}
		}
	}
	if next >= limit {
		n.now = limit
		return false
	}
	n.now = max(n.now, next)
	for len(n.q) > 0 && n.q[0].at <= n.now {
		f := heap.Pop(&n.q).(flight)
		if sm := n.members[f.to]; !sm.dead {
			sm.m.Handle(n.now, f.pkt)
			sm.drain()
		}
	}
	for _, sm := range n.members {
		if !sm.dead && sm.m.Due() <= n.now {
			sm.m.Tick(n.now)
			sm.drain()
		}
		sm.drain()
	}
	return true
}

// A message: its number, then bytes that depend on it.
func makeMsg(seq uint64, size int) []byte {
	b := make([]byte, max(size, 8))
	binary.BigEndian.PutUint64(b, seq)
	for i := 8; i < len(b); i++ {
		b[i] = byte(seq) + byte(i)
	}
	return b
}

func checkMsg(b []byte) uint64 {
	if len(b) < 8 {
		panic(fmt.Sprintf("message of %d bytes", len(b)))
	}
	seq := binary.BigEndian.Uint64(b)
	for i := 8; i < len(b); i++ {
		if b[i] != byte(seq)+byte(i) {
			panic(fmt.Sprintf("message %d corrupted at byte %d", seq, i))
		}
	}
	return seq
}

// sender feeds messages into a member as its window allows.
type simSender struct {
	sm   *simMember
	msgs [][]byte
	i    int // message
	off  int // bytes of it sent
}

func (s *simSender) pump(now int64) {
	m := s.sm.m
	defer m.Flush(now)
	for s.i < len(s.msgs) {
		msg := s.msgs[s.i]
		s.off = m.Write(now, msg, s.off)
		if s.off < RecordLen(len(msg)) {
			return // the window is full
		}
		s.i, s.off = s.i+1, 0
		if s.sm.net.rng.IntN(3) == 0 {
			m.Flush(now) // sometimes a message ends its packet
		}
	}
}

func (s *simSender) done() bool { return s.i == len(s.msgs) }

type simCase struct {
	receivers int
	loss, dup float64
	jitter    time.Duration
	messages  int
	maxSize   int
	mtu       int
	window    int
	kill      int  // receivers killed mid-stream
	late      bool // one more receiver joins mid-stream
	slow      bool // one receiver reads slowly; the sender evicts it
}

func runSim(t *rapid.T, c simCase, seed uint64) {
	n := &simNet{rng: rand.New(rand.NewPCG(seed, 7)), loss: c.loss, dup: c.dup,
		delay: int64(50 * time.Microsecond), jitter: int64(c.jitter)}
	cfg := Config{MTU: c.mtu, Window: c.window}
	if c.slow {
		cfg.MaxStall = 100 * time.Millisecond
	}
	snd := n.add(cfg, true)
	var rcv []*simMember
	for range c.receivers {
		rcv = append(rcv, n.add(cfg, true))
	}
	if c.slow {
		rcv[len(rcv)-1].slow = true
	}
	var late *simMember
	if c.late {
		late = n.add(cfg, false)
	}
	msgs := make([][]byte, c.messages)
	for i := range msgs {
		msgs[i] = makeMsg(uint64(i), n.rng.IntN(c.maxSize+1))
	}
	s := &simSender{sm: snd, msgs: msgs}
	snd.m.Announce(0)
	// The sender waits for its receivers, as mcast's WaitMembers does.
	limit := int64(120 * time.Second)
	for snd.m.Receivers() < c.receivers {
		if !n.step(limit) {
			t.Fatalf("receivers never found: %d of %d", snd.m.Receivers(), c.receivers)
		}
	}
	killAt := make([]int, c.kill)
	for i := range killAt {
		killAt[i] = n.rng.IntN(c.messages + 1)
	}
	lateAt := n.rng.IntN(c.messages + 1)
	allDone := func() bool {
		if !s.done() {
			return false
		}
		for _, r := range rcv {
			if r.dead || r.slow || len(r.got) > 0 && r.got[len(r.got)-1] == uint64(c.messages-1) {
				continue
			}
			// Evicted (possible where the sender evicts): done once its
			// stream caught up with the sender's end.
			if st := r.m.in[snd.m.cfg.Session]; c.slow && st != nil && st.deliv >= snd.m.out.next && !st.queued && !st.asmReady {
				continue
			}
			return false
		}
		return true
	}
	for !allDone() {
		for k, at := range killAt {
			if at >= 0 && s.i >= at {
				rcv[k].dead = true
				killAt[k] = -1
			}
		}
		if late != nil && !late.joined && s.i >= lateAt {
			late.joined = true
		}
		s.pump(n.now)
		if !n.step(limit) {
			var st []string
			for _, r := range rcv {
				st = append(st, fmt.Sprintf("rcv %d dead=%v slow=%v got %d events %v", r.m.cfg.Session, r.dead, r.slow, len(r.got), r.events))
			}
			if late != nil {
				st = append(st, fmt.Sprintf("late joined=%v got %d events %v", late.joined, len(late.got), late.events))
			}
			t.Fatalf("no progress by %v: sent %d of %d messages (stats %+v); %v\n%s", time.Duration(n.now), s.i, c.messages, snd.m.Stats, st, n.dump())
		}
	}
	// A late receiver catches up with the end within a few heartbeats.
	for end := n.now + int64(time.Second); n.step(end); {
	}
	if late != nil && !c.slow && len(late.got) > 0 && late.got[len(late.got)-1] != uint64(c.messages-1) {
		t.Fatalf("late receiver: ends at message %d of %d", late.got[len(late.got)-1], c.messages)
	}
	// Every live, fast receiver got every message exactly once, in order,
	// and no event (unless the sender may evict: under heavy loss a fast
	// receiver may hold it back longer than MaxStall too).
	for _, r := range rcv {
		if r.dead || r.slow || c.slow {
			continue
		}
		if len(r.events) > 0 {
			t.Fatalf("receiver %d: events %v", r.m.cfg.Session, r.events)
		}
		for i, g := range r.got {
			if g != uint64(i) {
				t.Fatalf("receiver %d: message %d is %d", r.m.cfg.Session, i, g)
			}
		}
	}
	// Every receiver's messages are in order; a late receiver's have no
	// gap; where the sender evicts, each gap follows an event.
	for _, r := range append(rcv, late) {
		if r == nil {
			continue
		}
		jumps := 0
		for i := 1; i < len(r.got); i++ {
			if r.got[i] <= r.got[i-1] {
				t.Fatalf("receiver %d: message %d after %d", r.m.cfg.Session, r.got[i], r.got[i-1])
			}
			if r.got[i] != r.got[i-1]+1 {
				jumps++
			}
		}
		if r == late && jumps > 0 && !c.slow {
			t.Fatalf("late receiver: %d gaps after its first message: %v", jumps, r.got)
		}
		if (r.slow || c.slow) && jumps > 0 {
			// Each gap follows an event: the eviction, or the loss the
			// sender's trail showed before the Evict arrived.
			ev := 0
			for _, e := range r.events {
				if e.Kind == EventEvicted || e.Kind == EventLost {
					ev++
				}
			}
			if ev < jumps {
				t.Fatalf("slow receiver: %d gaps, %d loss events: %v", jumps, ev, r.events)
			}
		}
	}
}

func TestMemberProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := simCase{
			receivers: rapid.IntRange(1, 4).Draw(t, "receivers"),
			loss:      rapid.SampledFrom([]float64{0, 0.001, 0.01, 0.05, 0.2}).Draw(t, "loss"),
			dup:       rapid.SampledFrom([]float64{0, 0.01, 0.1}).Draw(t, "dup"),
			jitter:    rapid.SampledFrom([]time.Duration{0, 20 * time.Microsecond, 300 * time.Microsecond, 5 * time.Millisecond}).Draw(t, "jitter"),
			messages:  rapid.IntRange(1, 300).Draw(t, "messages"),
			maxSize:   rapid.SampledFrom([]int{8, 40, 200, 1000}).Draw(t, "maxSize"),
			mtu:       rapid.SampledFrom([]int{48, 64, 256}).Draw(t, "mtu"),
			window:    rapid.SampledFrom([]int{4, 16, 64}).Draw(t, "window"),
		}
		c.kill = rapid.IntRange(0, c.receivers-1).Draw(t, "kill")
		c.late = rapid.Bool().Draw(t, "late")
		if c.receivers-c.kill >= 2 {
			c.slow = rapid.Bool().Draw(t, "slow")
		}
		runSim(t, c, rapid.Uint64().Draw(t, "seed"))
	})
}

func (n *simNet) dump() string {
	var b []byte
	for _, sm := range n.members {
		m := sm.m
		b = fmt.Appendf(b, "member %d dead=%v joined=%v\n", m.cfg.Session, sm.dead, sm.joined)
		if o := m.out; o != nil {
			b = fmt.Appendf(b, "  out next=%d trail=%d blocked=%v final=%v\n", o.next, o.trail, o.blockedSince, o.final)
			for id, r := range o.rcv {
				b = fmt.Appendf(b, "    rcv %d ack=%d window=%d heard=%v\n", id, r.ack, r.window, time.Duration(r.heard))
			}
		}
		for id, st := range m.in {
			b = fmt.Appendf(b, "  in %d deliv=%d contig=%d high=%d lostTo=%d synced=%v asmOn=%v asmReady=%v queued=%v heard=%v\n",
				id, st.deliv, st.contig, st.high, st.lostTo, st.synced, st.asmOn, st.asmReady, st.queued, time.Duration(st.heard))
		}
	}
	return string(b)
}
