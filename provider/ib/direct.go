package ib

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/logging"
	"github.com/softrdma/softrdma/provider/softverbs"
)

// Direct forwarding (ib/fabric's direct.go): when the SM forwards
// directly (port_info's Direct), the port asks it for the destination
// ports of a DLID after its first packet to it (which goes through the
// switch), and once it has them sends to them itself, each with a link
// of its own (each end grants the other a window of its receive buffer:
// fabric.DirectWindow). The port takes an
// answer only when it sent nothing to the DLID through the switch since
// the query, so its packets to a DLID stay in order; it takes packets and
// flow control from the peers the SM gave it only. A packet waiting for a
// peer's credit keeps the switch's head-of-queue rules (the route's
// HOQLife and VLStallCount): discarded for that peer after the lifetime,
// counted in DirectDiscards, and every packet for a peer stalled so is
// discarded at once for 8 × HOQLife. Before a lifetime ends the sender
// makes sure the receive goroutine read everything that reached the
// socket meanwhile (a marker datagram to itself, as the switch does), so
// that a process the OS did not run for a while does not discard a
// packet whose credit had come in time.

// Direct forwarding limits of a port.
const (
	// queryEvery is how often a port asks again for a DLID's route while
	// it sends to it through the switch; queryGap how often it asks for
	// any route (the SM's budget for a port is 1024 a second).
	queryEvery = 5 * time.Millisecond
	queryGap   = time.Millisecond
	// switchBackoff is how long a port sends a DLID through the switch
	// after the SM answered that it is to.
	switchBackoff = time.Second
	// holdMax is how long a send waits for the answer to its DLID's query
	// instead of going through the switch (which would make the answer
	// stale); holdBackoff how long after a wait in vain sends do not wait.
	holdMax     = time.Millisecond
	holdBackoff = 100 * time.Millisecond
	// maxDLIDs is the most DLIDs a port keeps direct forwarding state of.
	maxDLIDs = 4096
	// markerLen is the length of the port's markers: a token and a
	// sequence number.
	markerLen = 16 + 8
)

// peerLink is the port's link to a peer port. The link's transmit side
// and the head-of-queue state are guarded by Device.lmu; its receive
// side belongs to the receive goroutine (as the switch link's).
type peerLink struct {
	guid uint64
	lid  uint16
	addr netip.AddrPort // as the SM gave it: the receive side's key
	dst  netip.AddrPort // as the socket sends to it
	gone atomic.Bool
	// probing: the port asks the peer for credit until it answers (the
	// pairing's proof that the two reach each other); probes counts the
	// requests (the probe's timer goroutine only).
	probing atomic.Bool
	probes  int

	link       fabric.Link
	win        int // the window the port grants the peer
	stallCount int
	dropUntil  time.Time
	lastReq    time.Time
	// Discards not logged yet, and when the last line went out (at most
	// one a second per peer, as softsm's switch logs its discards).
	unlogged uint64
	loggedAt time.Time
}

// directRoute is a DLID's destination ports and the switch's
// head-of-queue rules.
type directRoute struct {
	peers   []*peerLink
	hoq     time.Duration
	vlStall int
}

// dlidState is the port's direct forwarding state of one DLID.
type dlidState struct {
	seq       uint32    // the query waiting for its answer (0: none)
	queriedAt time.Time // when it went
	sentSince bool      // a packet went through the switch since
	inflight  int       // sends through the switch under way
	route     *directRoute
	// noDirectUntil: the SM said "through the switch"; noHoldUntil: a
	// send waited for an answer in vain.
	noDirectUntil, noHoldUntil time.Time
}

// directState is the port's direct forwarding state. Guarded by
// Device.dmu.
type directState struct {
	on        bool   // the SM forwards directly
	session   []byte // the SM's Session token for the port
	smLID     uint16 // SA MADs never go directly
	dlids     map[uint16]*dlidState
	byGUID    map[uint64]*peerLink
	seq       uint32
	lastQuery time.Time
	routeCh   chan struct{} // closed and renewed when a route comes
	budget    int           // what the peers' windows may take (fabric.DirectBudget)
	used      int           // what they take
	msg       fabric.Direct
}

// initDirect sets up the port's direct forwarding for a receive buffer of
// rcvbuf bytes.
func (d *Device) initDirect(rcvbuf int) {
	d.dir.budget = fabric.DirectBudget(rcvbuf)
	d.dir.dlids = make(map[uint16]*dlidState)
	d.dir.routeCh = make(chan struct{})
	d.dir.byGUID = make(map[uint64]*peerLink)
	rand.Read(d.markToken[:])
	d.markCh = make(chan struct{})
}

// directConfig takes what a port_info says of direct forwarding; reset
// forgets every route and peer (the SM registered the port anew).
// Receive goroutine.
func (d *Device) directConfig(on bool, session []byte, smLID uint16, reset bool) {
	d.dmu.Lock()
	defer d.dmu.Unlock()
	if reset || on != d.dir.on {
		for _, pl := range d.dir.byGUID {
			pl.gone.Store(true)
		}
		clear(d.dir.byGUID)
		clear(d.dir.dlids)
		d.dir.used = 0
		d.publishPeersLocked()
	}
	d.dir.on, d.dir.session, d.dir.smLID = on, append([]byte(nil), session...), smLID
	d.directOn.Store(on)
}

// publishPeersLocked makes the peers visible to the receive goroutine.
// dmu is held.
func (d *Device) publishPeersLocked() {
	m := make(map[netip.AddrPort]*peerLink, len(d.dir.byGUID))
	for _, pl := range d.dir.byGUID {
		m[pl.addr] = pl
	}
	d.peers.Store(&m)
}

// peerAt returns the peer at address from, or nil.
func (d *Device) peerAt(from netip.AddrPort) *peerLink {
	m := d.peers.Load()
	if m == nil || len(*m) == 0 {
		return nil
	}
	return (*m)[netip.AddrPortFrom(from.Addr().Unmap(), from.Port())]
}

// routeFor returns dlid's direct route, or nil: the packet goes through
// the switch and the caller reports it with switchSent. While the
// DLID's query waits for its answer a send waits for it (at most
// holdMax after the query), so that a stream of sends does not make
// every answer stale.
func (d *Device) routeFor(dlid uint16) *directRoute {
	d.dmu.Lock()
	defer d.dmu.Unlock()
	if !d.dir.on {
		return nil
	}
	st := d.dir.dlids[dlid]
	if st == nil {
		if len(d.dir.dlids) >= maxDLIDs {
			return nil
		}
		st = &dlidState{}
		d.dir.dlids[dlid] = st
	}
	var t *time.Timer
	for st.route == nil && st.seq != 0 && !st.sentSince && st.inflight == 0 {
		now := time.Now()
		left := st.queriedAt.Add(holdMax).Sub(now)
		if now.Before(st.noHoldUntil) {
			break
		}
		if left <= 0 {
			st.noHoldUntil = now.Add(holdBackoff)
			break
		}
		if t == nil {
			t = time.NewTimer(left)
			defer t.Stop()
		} else {
			t.Reset(left)
		}
		ch := d.dir.routeCh
		d.dmu.Unlock()
		select {
		case <-ch:
		case <-t.C:
		case <-d.done:
		}
		d.dmu.Lock()
		if st = d.dir.dlids[dlid]; st == nil || !d.dir.on {
			return nil // forgotten meanwhile (the SM registered the port anew)
		}
	}
	if st.route != nil {
		return st.route
	}
	st.inflight++
	return nil
}

// switchSent notes a send to dlid through the switch that routeFor
// allowed, and asks the SM for the route when it is time: after the
// packet, so that the query reaches the switch behind it.
func (d *Device) switchSent(dlid uint16) {
	d.dmu.Lock()
	defer d.dmu.Unlock()
	st := d.dir.dlids[dlid]
	if st == nil || !d.dir.on {
		return
	}
	st.inflight--
	if st.seq != 0 {
		st.sentSince = true
	}
	d.queryLocked(dlid, st, time.Now())
}

// queryLocked asks the SM for dlid's route when it is time. dmu is held.
func (d *Device) queryLocked(dlid uint16, st *dlidState, now time.Time) {
	if now.Before(st.noDirectUntil) || now.Sub(st.queriedAt) < queryEvery || now.Sub(d.dir.lastQuery) < queryGap ||
		dlid == 0 || dlid == d.dir.smLID || st.route != nil {
		return
	}
	d.dir.seq++
	if d.dir.seq == 0 {
		d.dir.seq = 1
	}
	st.seq, st.queriedAt, st.sentSince = d.dir.seq, now, false
	d.dir.lastQuery = now
	d.sendDirect(&fabric.Direct{Type: fabric.DirectRouteQuery, Seq: st.seq, DLID: dlid})
}

// sendDirect sends a direct forwarding message to the SM.
func (d *Device) sendDirect(m *fabric.Direct) {
	var b [128]byte
	d.conn.WriteToUDPAddrPort(fabric.AppendDirect(b[:0], m), d.smDst)
}

// directIn handles a direct forwarding message of the SM (authenticated
// already). Receive goroutine.
func (d *Device) directIn(b []byte) {
	d.dmu.Lock()
	defer d.dmu.Unlock()
	m := &d.dir.msg
	if err := fabric.DecodeDirect(b, m); err != nil || !d.dir.on {
		d.core.Count(softverbs.ControlDrops, 1)
		return
	}
	if len(d.dir.session) == 0 || !hmac.Equal(m.Session, d.dir.session) {
		d.core.Count(softverbs.UntrustedDrops, 1)
		return
	}
	switch m.Type {
	case fabric.DirectRoute:
		d.routeIn(m)
	case fabric.DirectPeer:
		d.peerIn(m)
	case fabric.DirectPeerGone:
		if pl := d.dir.byGUID[m.PeerGUID]; pl != nil {
			d.dropPeerLocked(pl)
			d.publishPeersLocked()
		}
	default:
		d.core.Count(softverbs.ControlDrops, 1)
	}
}

// routeIn takes a route: an answer only to the DLID's last query and only
// when nothing went to the DLID through the switch since; an update only
// for a DLID sent directly already, or one that goes back to the switch.
// dmu is held.
func (d *Device) routeIn(m *fabric.Direct) {
	close(d.dir.routeCh) // sends waiting for an answer look
	d.dir.routeCh = make(chan struct{})
	st := d.dir.dlids[m.DLID]
	if st == nil {
		return
	}
	if m.Seq != 0 {
		if m.Seq != st.seq {
			return // an earlier query's
		}
		if st.sentSince || st.inflight > 0 {
			// Stale: packets went through the switch since. Asked again
			// at once (the pairings are done by now, the answer comes
			// sooner), or at the next send.
			st.seq, st.queriedAt = 0, time.Time{}
			if st.inflight == 0 {
				d.queryLocked(m.DLID, st, time.Now())
			}
			return
		}
		st.seq = 0
	} else if st.route == nil && len(m.Peers) > 0 {
		return // through the switch now: directly only on a query's answer
	}
	if len(m.Peers) == 0 {
		st.route = nil
		if m.Seq != 0 {
			st.noDirectUntil = time.Now().Add(switchBackoff)
		}
		return
	}
	if m.HOQLife <= 0 || m.VLStallCount <= 0 {
		d.core.Count(softverbs.ControlDrops, 1)
		st.route = nil
		return
	}
	r := &directRoute{hoq: m.HOQLife, vlStall: m.VLStallCount}
	for _, p := range m.Peers {
		pl := d.dir.byGUID[p.GUID]
		if pl == nil || pl.addr != p.Addr {
			st.route = nil // not a peer (any more): the switch
			return
		}
		r.peers = append(r.peers, pl)
	}
	st.route = r
}

// peerIn takes a peer message: the port takes the peer when its buffer
// has room for a window of it. The port the message asks to probe (OK)
// proves that the two reach each other directly first: it asks the peer
// for credit (FlowOpRequest) every FlowRefresh until the peer's answer
// comes (then it says yes to the SM, and has the peer's window) or
// probeTries went unanswered (a firewall or route between the two ports
// that the SM's paths do not have: no, and the route stays with the
// switch). The other port says yes at once; it learns its window for the
// peer from the answer to its own first request. dmu is held.
func (d *Device) peerIn(m *fabric.Direct) {
	if len(m.Peers) != 1 || !m.Peers[0].Addr.IsValid() {
		d.core.Count(softverbs.ControlDrops, 1)
		return
	}
	p := m.Peers[0]
	pl := d.dir.byGUID[p.GUID]
	if pl != nil && pl.addr == p.Addr {
		// Asked again (an answer was lost): the link stands; a probe
		// still under way answers when it ends.
		if !pl.probing.Load() {
			d.sendDirect(&fabric.Direct{Type: fabric.DirectPeerOK, PeerGUID: p.GUID, OK: true})
		}
		return
	}
	if pl != nil {
		d.dropPeerLocked(pl)
	}
	w := fabric.DirectWindow(d.dir.budget, d.dir.used)
	if w == 0 {
		d.sendDirect(&fabric.Direct{Type: fabric.DirectPeerOK, PeerGUID: p.GUID})
		return
	}
	pl = &peerLink{guid: p.GUID, lid: p.LID, addr: p.Addr, dst: d.sendAddr(p.Addr), win: w}
	// Both ends count from 0; the peer's credit comes with its answer to
	// a request.
	pl.link = fabric.Link{On: true, Granted: uint16(w)}
	d.dir.byGUID[p.GUID] = pl
	d.dir.used += w
	d.publishPeersLocked()
	if !m.OK {
		d.sendDirect(&fabric.Direct{Type: fabric.DirectPeerOK, PeerGUID: p.GUID, OK: true})
		return
	}
	pl.probing.Store(true)
	d.probe(pl)
}

// probeTries is how many requests a probe sends, FlowRefresh apart,
// before it gives up on a peer.
const probeTries = 50

// probe asks pl for credit, and again every FlowRefresh while no answer
// came (peerDatagram ends the probe), probeTries times; then the port
// tells the SM it does not take the peer.
func (d *Device) probe(pl *peerLink) {
	select {
	case <-d.done:
		return
	default:
	}
	if !pl.probing.Load() || pl.gone.Load() {
		return
	}
	if pl.probes++; pl.probes > probeTries {
		d.dmu.Lock()
		if pl.probing.CompareAndSwap(true, false) && d.dir.byGUID[pl.guid] == pl {
			d.dropPeerLocked(pl)
			d.publishPeersLocked()
			d.sendDirect(&fabric.Direct{Type: fabric.DirectPeerOK, PeerGUID: pl.guid})
		}
		d.dmu.Unlock()
		return
	}
	d.lmu.Lock()
	var fb [fabric.FlowLen]byte
	d.conn.WriteToUDPAddrPort(fabric.EncodeFlow(fb[:], pl.link.Flow(fabric.FlowOpRequest)), pl.dst)
	d.lmu.Unlock()
	time.AfterFunc(fabric.FlowRefresh, func() { d.probe(pl) })
}

// dropPeerLocked forgets a peer; its window is free again. dmu is held
// (the caller publishes the peers).
func (d *Device) dropPeerLocked(pl *peerLink) {
	pl.gone.Store(true)
	delete(d.dir.byGUID, pl.guid)
	d.dir.used -= pl.win
}

// sendAddr is a as the port's socket sends to it (an IPv6 socket sends
// to IPv4 as mapped).
func (d *Device) sendAddr(a netip.AddrPort) netip.AddrPort {
	if !d.cfg.Local.Is4() && a.Addr().Is4() {
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr().As16()), a.Port())
	}
	return a
}

// peerDatagram handles a datagram of a peer: flow control or an IB
// packet. Receive goroutine.
func (d *Device) peerDatagram(b []byte, pl *peerLink, trunc bool, rx *receiveScratch) {
	switch {
	case fabric.IsFlow(b):
		f, err := fabric.DecodeFlow(b)
		if err != nil {
			d.core.Count(softverbs.ControlDrops, 1)
			return
		}
		d.lmu.Lock()
		if pl.link.Receive(f) {
			d.creditMoved()
		}
		if pl.probing.CompareAndSwap(true, false) {
			// The peer answered: the two reach each other.
			d.sendDirect(&fabric.Direct{Type: fabric.DirectPeerOK, PeerGUID: pl.guid, OK: true})
		}
		if f.Op == fabric.FlowOpRequest {
			var fb [fabric.FlowLen]byte
			d.conn.WriteToUDPAddrPort(fabric.EncodeFlow(fb[:], pl.link.Answer(pl.win)), pl.dst)
		}
		d.lmu.Unlock()
	case fabric.IsControl(b), fabric.IsDirect(b):
		d.core.Count(softverbs.UntrustedDrops, 1) // only the SM sends those
	default:
		d.dataIn(b, trunc, rx)
		pl.link.Took(1)
		if pl.link.Due(pl.win, pl.win/4) {
			d.lmu.Lock()
			if pl.link.Grant(pl.win, pl.win/4) {
				var fb [fabric.FlowLen]byte
				d.conn.WriteToUDPAddrPort(fabric.EncodeFlow(fb[:], pl.link.Flow(fabric.FlowOpNormal)), pl.dst)
			}
			d.lmu.Unlock()
		}
	}
}

// xmitDirect sends n packets to the route's peers, each with the peer's
// credit: send(i, to) sends packet i, or stages it for flush (nil: send
// sends), which goes before every wait and at the end. A packet waits
// for a peer at most the route's head-of-queue lifetime, then is
// discarded for it.
func (d *Device) xmitDirect(n int, r *directRoute, send func(i int, to netip.AddrPort) error, flush func()) {
	d.lmu.Lock()
	defer d.lmu.Unlock()
	if flush != nil {
		defer flush()
	}
	// Peer by peer, each peer's packets in order: a run of packets to one
	// peer goes as one GSO send.
	for _, pl := range r.peers {
		for i := range n {
			if pl.gone.Load() || !d.peerCredit(pl, r, flush) {
				continue
			}
			if err := send(i, pl.dst); err != nil {
				// Lost on the way, as on a link error.
				d.core.Count(softverbs.DirectDiscards, 1)
				continue
			}
			pl.link.Sent(1)
			d.core.Count(softverbs.DirectSends, 1)
		}
	}
}

// peerCredit waits until pl has credit and reports whether the packet
// goes (false: discarded for pl, counted); flush (if any) sends what is
// staged before it waits. lmu is held; it is let go while waiting.
func (d *Device) peerCredit(pl *peerLink, r *directRoute, flush func()) bool {
	if !pl.dropUntil.IsZero() {
		if now := time.Now(); now.Before(pl.dropUntil) {
			d.discarded(pl, now)
			return false
		}
		pl.dropUntil = time.Time{}
	}
	if pl.link.Credits() > 0 {
		pl.stallCount = 0
		return true
	}
	now := time.Now()
	d.core.Count(softverbs.LinkWaits, 1)
	if flush != nil {
		flush() // what has credit goes before the wait
	}
	deadline := now.Add(r.hoq)
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	var marker uint64
	for {
		if pl.link.Credits() > 0 {
			pl.stallCount = 0
			return true
		}
		if pl.gone.Load() {
			return false
		}
		now = time.Now()
		if !now.Before(deadline) {
			// The lifetime passed by the clock; it passed by the input
			// once the receive goroutine read what reached the socket
			// until now (the marker's return).
			if marker == 0 {
				marker = d.sendMarker()
			}
			if marker == 0 || d.markSeen.Load() >= marker {
				if pl.link.Credits() > 0 {
					pl.stallCount = 0
					return true
				}
				d.discarded(pl, now)
				if pl.stallCount++; pl.stallCount >= r.vlStall {
					pl.stallCount = 0
					pl.dropUntil = now.Add(8 * r.hoq)
				}
				return false
			}
		}
		if now.Sub(pl.lastReq) >= fabric.FlowRefresh {
			pl.lastReq = now
			var fb [fabric.FlowLen]byte
			d.conn.WriteToUDPAddrPort(fabric.EncodeFlow(fb[:], pl.link.Flow(fabric.FlowOpRequest)), pl.dst)
		}
		wait := max(min(deadline.Sub(now), pl.lastReq.Add(fabric.FlowRefresh).Sub(now)), time.Millisecond)
		if t == nil {
			t = time.NewTimer(wait)
		} else {
			t.Reset(wait)
		}
		ch, mch := d.linkCh, d.markCh
		d.lmu.Unlock()
		select {
		case <-ch:
		case <-mch:
		case <-t.C:
		case <-d.done:
		}
		d.lmu.Lock()
		select {
		case <-d.done:
			return false
		default:
		}
	}
}

// discarded counts a packet discarded for pl and logs the discards (with
// a logger: SOFTRDMA_LOG) at most once a second per peer, with the count
// since the last line. lmu is held.
func (d *Device) discarded(pl *peerLink, now time.Time) {
	d.core.Count(softverbs.DirectDiscards, 1)
	pl.unlogged++
	if logging.Logger() == nil || now.Sub(pl.loggedAt) < time.Second {
		return
	}
	d.logf(false, "%d packets for port %#x (LID %d) discarded: no credit from it for the head-of-queue lifetime, or it was stalled (direct_discards %d)",
		pl.unlogged, pl.guid, pl.lid, d.core.Counters().Get(softverbs.DirectDiscards))
	pl.unlogged, pl.loggedAt = 0, now
}

// sendMarker sends a marker to the port's own socket and returns its
// number (0: it could not be sent). lmu is held.
func (d *Device) sendMarker() uint64 {
	d.markSeq++
	var b [markerLen]byte
	copy(b[:], d.markToken[:])
	binary.BigEndian.PutUint64(b[16:], d.markSeq)
	if _, err := d.conn.WriteToUDPAddrPort(b[:], d.selfDst); err != nil {
		return 0
	}
	return d.markSeq
}

// markerIn reports whether a datagram is one of the port's markers, and
// notes it read. Receive goroutine.
func (d *Device) markerIn(b []byte, from netip.AddrPort) bool {
	if len(b) != markerLen || netip.AddrPortFrom(from.Addr().Unmap(), from.Port()) != d.self || !hmac.Equal(b[:16], d.markToken[:]) {
		return false
	}
	d.markSeen.Store(binary.BigEndian.Uint64(b[16:]))
	d.lmu.Lock()
	close(d.markCh)
	d.markCh = make(chan struct{})
	d.lmu.Unlock()
	return true
}
