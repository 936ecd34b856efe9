package mcast

import (
	"crypto/rand"
	"errors"
	"math"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrdma/softrdma/mcast/internal/proto"
	"github.com/softrdma/softrdma/verbs"
)

func cryptoRead(b []byte) (int, error) { return rand.Read(b) }

// env is the Conn as the protocol's carrier (c.mu held).
type env Conn

// Multicast sends a protocol packet to the group.
func (e *env) Multicast(pkt []byte) {
	c := (*Conn)(e)
	c.post(pkt, c.mcAH, verbs.MulticastQPN)
}

// Unicast sends a protocol packet to one member.
func (e *env) Unicast(to uint32, pkt []byte) {
	c := (*Conn)(e)
	if p := c.peers[to]; p != nil {
		c.post(pkt, p.ah, p.addr.QPN)
	}
}

// post copies pkt into a send slot and adds it to the chain, which goes
// to the QP at once unless the Conn is corked (c.mu held). With no slot
// free it reaps send completions; a packet that still finds none is
// dropped and counted: the protocol repairs it as any loss.
func (c *Conn) post(pkt []byte, ah *verbs.AH, qpn uint32) {
	if c.shead-c.stail == sendSlots {
		c.flush()
		for spin := 0; c.shead-c.stail == sendSlots && spin < 1000; spin++ {
			if c.reapSends() == 0 {
				runtime.Gosched()
			}
		}
		if c.shead-c.stail == sendSlots {
			c.stats.SendDrops++
			return
		}
	}
	slot := int(c.shead % sendSlots)
	c.shead++
	n := copy(c.sbuf[slot*c.mtu:(slot+1)*c.mtu], pkt)
	i := c.nchain
	c.ssge[i] = c.smr.SGE(slot*c.mtu, n)
	c.swrs[i] = verbs.SendWR{WRID: c.shead, SGList: c.ssge[i : i+1], Opcode: verbs.WRSend,
		UD: verbs.UDWR{AH: ah, RemoteQPN: qpn, RemoteQKey: c.qkey}}
	if i > 0 {
		c.swrs[i-1].Next = &c.swrs[i]
	}
	c.nchain++
	if !c.cork || c.nchain == sendChain {
		c.flush()
	}
}

// flush posts the chain (c.mu held). Every signalEvery-th packet and the
// chain's last ask for a completion, whose WRID (the ring position after
// it) frees every slot before it.
func (c *Conn) flush() {
	n := c.nchain
	if n == 0 {
		return
	}
	c.nchain = 0
	for i := range n {
		if c.swrs[i].WRID%signalEvery == 0 || i == n-1 {
			c.swrs[i].Flags = verbs.SendSignaled
		}
	}
	err := c.qp.PostSend(&c.swrs[0])
	if err != nil {
		// What the chain did not send is dropped (the protocol repairs
		// it); its slots are freed once the packets before it complete.
		var bad *verbs.BadWRError
		sent := 0
		if errors.As(err, &bad) {
			sent = bad.Index
		}
		// The slots of the packets sent are freed by their completion,
		// or the next signaled one's.
		c.stats.SendDrops += uint64(n - sent)
		c.shead -= uint64(n - sent)
	}
}

// reapSends takes send completions and frees their slots (c.mu held).
func (c *Conn) reapSends() int {
	n, _ := c.scq.Poll(c.swcs)
	for _, wc := range c.swcs[:n] {
		if wc.WRID > c.stail {
			c.stail = wc.WRID
		}
	}
	return n
}

// repost gives a receive slot back to the QP (c.mu held).
func (c *Conn) repost(slot int) {
	c.rwr[slot].Next = nil
	if err := c.qp.PostRecv(&c.rwr[slot]); err != nil {
		c.stats.RecvErrors++
	}
}

// srcOf reads a datagram's source from its GRH area and completion.
func srcOf(grh []byte, wc *verbs.WC) (netip.Addr, verbs.GID) {
	var g verbs.GID
	if grh[0]>>4 == 6 {
		copy(g[:], grh[8:24])
	} else {
		// RoCEv2 over IPv4: 20 reserved bytes, then the IPv4 header.
		a := netip.AddrFrom4([4]byte(grh[32:36]))
		g = a.As16()
	}
	return netip.AddrFrom16(g).Unmap(), g
}

// learn returns the member the packet came from, making its address
// handle on first sight. A session seen from another address is refused
// (nil): a member's session is bound to the first address it used.
func (c *Conn) learn(session uint32, grh []byte, wc *verbs.WC) *peer {
	ip, gid := srcOf(grh, wc)
	if p := c.peers[session]; p != nil {
		if p.addr.IP != ip || p.addr.QPN != wc.SrcQP {
			c.stats.SourceMismatches++
			return nil
		}
		return p
	}
	if len(c.peers) >= maxPeers {
		c.stats.SourceMismatches++
		return nil
	}
	attr := c.tmpl
	attr.GRH.DGID = gid
	attr.DLID = wc.SLID
	attr.SL = wc.SL
	ah, err := c.pd.CreateAH(&attr)
	if err != nil {
		c.stats.RecvErrors++
		return nil
	}
	p := &peer{addr: Addr{IP: ip, QPN: wc.SrcQP, LID: wc.SLID}, ah: ah}
	c.peers[session] = p
	return p
}

// handle takes one receive completion (c.mu held); it reports whether the
// slot may be posted again at once.
func (c *Conn) handle(now int64, wc *verbs.WC) bool {
	slot := int(wc.WRID)
	if wc.Status != verbs.WCSuccess || int(wc.ByteLen) < verbs.GRHLen {
		c.stats.RecvErrors++
		return true
	}
	b := c.rbuf[slot*c.rslot : slot*c.rslot+int(wc.ByteLen)]
	grh, pkt := b[:verbs.GRHLen], b[verbs.GRHLen:]
	if c.m == nil {
		if wc.SrcQP == c.self.QPN {
			if ip, _ := srcOf(grh, wc); ip == c.self.IP {
				return true // our own, looped back
			}
		}
		ip, _ := srcOf(grh, wc)
		k := rawKey{ip, wc.SrcQP}
		a := c.raw[k]
		if a == nil {
			if len(c.raw) >= maxPeers {
				clear(c.raw)
			}
			a = &Addr{IP: ip, QPN: wc.SrcQP, LID: wc.SLID}
			c.raw[k] = a
		}
		c.rq = append(c.rq, rawMsg{slot: slot, n: len(pkt), from: a})
		return false
	}
	p := proto.Packet(pkt)
	if !p.Valid() {
		c.m.Handle(now, pkt) // counts it
		return true
	}
	if c.learn(p.Author(), grh, wc) == nil {
		return true
	}
	c.m.Handle(now, pkt)
	return true
}

// loop is the Conn's progress: receive completions, send completions and
// the protocol's timers.
func (c *Conn) loop() {
	defer close(c.loopDone)
	timer := time.AfterFunc(time.Hour, c.wake.kick)
	defer timer.Stop()
	for {
		select {
		case <-c.done:
			return
		default:
		}
		n, err := c.rcq.Poll(c.wcs)
		c.mu.Lock()
		now := c.now()
		if err != nil {
			c.stats.RecvErrors++
		}
		c.cork = true // what the packets and timers make goes in chains
		for i := range c.wcs[:n] {
			if c.handle(now, &c.wcs[i]) {
				c.repost(int(c.wcs[i].WRID))
			}
		}
		c.reapSends()
		due := int64(math.MaxInt64)
		readable, writable := n > 0 && c.m == nil && len(c.rq) > 0, false
		if c.m != nil {
			if c.m.Due() <= now {
				c.m.Tick(now)
			}
			due = c.m.Due()
			readable = c.m.Pending()
			writable = c.m.Room() || c.m.Drained()
		}
		c.cork = false
		c.flush()
		if n == 0 {
			c.armed = due // a Send or Receive that moves it earlier kicks
		}
		c.mu.Unlock()
		if readable {
			c.signal(c.readable)
		}
		if writable {
			c.signal(c.writable)
		}
		if n > 0 {
			continue
		}
		d := time.Duration(due - c.now())
		if d > 0 {
			timer.Reset(d)
			c.rcq.Ops().Wait(c.wake) // its error is the kick's, or the CQ's seen by Poll
			timer.Stop()
			c.wake.reset() // what follows looks at everything a kick stands for
		}
		c.mu.Lock()
		c.armed = 0
		c.mu.Unlock()
	}
}

// kick wakes the loop from its wait.
func (c *Conn) kick() {
	if c.wake != nil {
		c.wake.kick()
	}
}

// waker is what the loop's CQ wait watches besides the CQ: a wake-up, not
// a cancellation, yet a context.Context by its rules, because a provider
// may hand it to the context package (provider/rdmacore's Wait calls
// context.AfterFunc on it). Once kicked, its Done channel holds one token
// and Err reports errWoken, until the loop takes the wake-up (reset,
// after each wait): Err is never nil for whoever received from Done
// meanwhile, and its AfterFunc method runs the context package's callbacks
// itself, so that no goroutine of that package reads Done and steals the
// token. A kick while the loop runs makes its next wait return at once
// (one more look, harmless). On a provider that only selects on Done
// (softrdma's), nothing allocates.
type waker struct {
	ch    chan struct{}
	woken atomic.Bool

	mu      sync.Mutex
	fns     []wakeFn // AfterFunc's callbacks, run by the next kick
	next    uint64
	running sync.WaitGroup // callbacks of AfterFunc started in goroutines
}

type wakeFn struct {
	id uint64
	f  func()
}

// errWoken is a kicked waker's Err.
var errWoken = errors.New("mcast: loop woken")

func newWaker() *waker { return &waker{ch: make(chan struct{}, 1)} }

func (w *waker) kick() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.woken.Store(true)
	select {
	case w.ch <- struct{}{}:
	default:
	}
	// Under w.mu, as a cancelCtx cancels its children under its own: the
	// callbacks read Err, which reset cannot clear meanwhile.
	for _, fn := range w.fns {
		fn.f()
	}
	clear(w.fns)
	w.fns = w.fns[:0]
}

// reset takes the wake-up after a wait: the token and Err's errWoken (the
// loop only, outside its wait).
func (w *waker) reset() {
	w.running.Wait() // late callbacks read Err: not yet
	w.mu.Lock()
	defer w.mu.Unlock()
	w.woken.Store(false)
	select {
	case <-w.ch:
	default:
	}
}

// Deadline reports none (context.Context).
func (w *waker) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done yields the token (context.Context).
func (w *waker) Done() <-chan struct{} { return w.ch }

// Err is errWoken from a kick until the loop takes it, else nil
// (context.Context).
func (w *waker) Err() error {
	if w.woken.Load() {
		return errWoken
	}
	return nil
}

// Value has no values (context.Context).
func (w *waker) Value(any) any { return nil }

// AfterFunc arranges for f to run at the next kick, or at once in a
// goroutine of its own when the waker is kicked already; stop cancels
// that and reports whether it did (the context package uses it for
// AfterFunc and WithCancel on the waker, in place of a goroutine that
// would wait on Done).
func (w *waker) AfterFunc(f func()) (stop func() bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.woken.Load() {
		w.running.Add(1)
		go func() {
			defer w.running.Done()
			f()
		}()
		return func() bool { return false }
	}
	w.next++
	id := w.next
	w.fns = append(w.fns, wakeFn{id: id, f: f})
	return func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		for i, fn := range w.fns {
			if fn.id == id {
				last := len(w.fns) - 1
				copy(w.fns[i:], w.fns[i+1:])
				w.fns[last] = wakeFn{}
				w.fns = w.fns[:last]
				return true
			}
		}
		return false
	}
}
