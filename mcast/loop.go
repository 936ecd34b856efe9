package mcast

import (
	"crypto/rand"
	"errors"
	"math"
	"net/netip"
	"runtime"
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

// waker is what the loop's CQ wait watches besides the CQ: a wake-up
// token, not a cancellation. Its Done channel holds one token; kick puts
// it there (a kick while the loop runs makes its next wait return at once:
// one more look, harmless). Nothing allocates, and only the loop waits on
// it, so that one token wakes it.
type waker struct{ ch chan struct{} }

func newWaker() *waker { return &waker{ch: make(chan struct{}, 1)} }

func (w *waker) kick() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// Deadline reports none (context.Context).
func (w *waker) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done yields the token (context.Context).
func (w *waker) Done() <-chan struct{} { return w.ch }

// Err is nil: a wake-up ends nothing (context.Context).
func (w *waker) Err() error { return nil }

// Value has no values (context.Context).
func (w *waker) Value(any) any { return nil }
