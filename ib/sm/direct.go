package sm

import (
	"net/netip"
	"slices"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/wire"
)

// Direct forwarding (the default; Config.ViaSwitch turns it off, and
// OpenSM in charge has none; see ib/fabric's direct.go): the SM
// gives a port, on its query, the destination ports of a DLID, and the
// port sends to them itself. The SM pairs the port with each destination
// first (both take the other, or the route stays with the switch), and
// answers only when the switch holds none of the querying port's packets:
// the query came in after the packets sent before it, and they have all
// left the switch by then. The SM keeps the routes it gave: a change of a
// DLID's destinations (a join, a leave, a port that attaches or goes) is
// sent to every port holding the DLID's route, the same way.

// Direct forwarding limits.
const (
	// directBurst and directRate bound a port's direct forwarding
	// messages (queries, peer answers), apart from its control messages.
	directBurst = 256
	directRate  = 1024
	// maxRoutesPerPort is the most DLIDs a port holds routes of; a query
	// beyond is answered "through the switch".
	maxRoutesPerPort = 4096
	// pairResend is how long a pairing waits for both answers before the
	// SM asks again (when a query needs it); pairRefused how long a
	// refused pairing stays refused.
	pairResend  = time.Second
	pairRefused = 10 * time.Second
)

// directPort is the SM's direct forwarding state of a port. Guarded by
// SM.mu.
type directPort struct {
	// routes are the DLIDs the port asked routes of.
	routes map[uint16]*directRoute
	// peers are the ports paired (or being paired) with it, by GUID;
	// refused those a pairing with failed, and when (pairRefused).
	peers   map[uint64]bool
	refused map[uint64]time.Time
	// due: a route waits to be sent once the switch holds none of the
	// port's packets.
	due    bool
	budget bucket
}

// directRoute is what the port holds, or is to be told, of one DLID.
type directRoute struct {
	seq     uint32 // the query to answer (0: an update)
	want    bool   // to be sent (next)
	waiting bool   // waits for pairings
	// fallback: sent back to the switch while pairings are on their way.
	fallback bool
	next     []uint64 // the destinations to tell (nil: the switch)
	sent     []uint64 // the destinations last told
	told     bool     // something was sent
}

// pairKey names the pairing of two ports, the smaller GUID first.
type pairKey struct{ a, b uint64 }

func keyOf(x, y uint64) pairKey {
	if x > y {
		x, y = y, x
	}
	return pairKey{x, y}
}

// pairing is the state of a pair: each end's answer.
type pairing struct {
	ok [2]bool
	at time.Time
}

func (pr *pairing) done() bool { return pr.ok[0] && pr.ok[1] }

// directIn handles a port's direct forwarding message. Reader; caller
// holds mu.
func (s *SM) directIn(b []byte, from netip.AddrPort, now time.Time) {
	p := s.byAddr[from]
	if p == nil {
		s.unknownSrc.Add(1)
		return
	}
	var m fabric.Direct
	if err := fabric.DecodeDirect(b, &m); err != nil || !p.dir.budget.allow(now, directBurst, directRate) {
		s.dDrops.Add(1)
		return
	}
	switch m.Type {
	case fabric.DirectRouteQuery:
		s.routeQuery(p, m.Seq, m.DLID, now)
	case fabric.DirectPeerOK:
		s.peerAnswer(p, m.PeerGUID, m.OK, now)
	default:
		s.dDrops.Add(1)
	}
}

// direct reports whether the SM forwards directly.
func (s *SM) direct() bool { return !s.cfg.ViaSwitch && s.ext == nil }

// directSession is the Session token the SM's messages to p carry.
func (s *SM) directSession(p *port) []byte { return s.session(p.addr, p.guid) }

// sendDirect sends m to p. Caller holds mu.
func (s *SM) sendDirect(p *port, m *fabric.Direct) {
	m.Session = s.directSession(p)
	if _, err := s.fabric.WriteToUDPAddrPort(fabric.AppendDirect(nil, m), p.addr); err != nil {
		s.sendErrors.Add(1)
	}
}

// routeQuery takes p's query for dlid. Caller holds mu.
func (s *SM) routeQuery(p *port, seq uint32, dlid uint16, now time.Time) {
	if !s.direct() || dlid == 0 || s.toSM(dlid) || dlid == wire.PermissiveLID ||
		(p.dir.routes[dlid] == nil && len(p.dir.routes) >= maxRoutesPerPort) {
		// Through the switch: at once, nothing to keep in order.
		s.dRoutes.Add(1)
		s.sendDirect(p, &fabric.Direct{Type: fabric.DirectRoute, Seq: seq, DLID: dlid})
		return
	}
	if p.dir.routes == nil {
		p.dir.routes = make(map[uint16]*directRoute)
	}
	r := p.dir.routes[dlid]
	if r == nil {
		r = &directRoute{}
		p.dir.routes[dlid] = r
		subs := s.dsubs[dlid]
		if subs == nil {
			subs = make(map[*port]struct{})
			s.dsubs[dlid] = subs
		}
		subs[p] = struct{}{}
	}
	r.seq, r.want = seq, true
	s.refreshRoute(p, dlid, r, now)
}

// destinations returns the ports a packet of p to dlid goes to, as the
// switch forwards it. Caller holds mu.
func (s *SM) destinations(p *port, dlid uint16) []*port {
	var ds []*port
	if wire.IsMulticastLID(dlid) {
		s.rebuildMFT()
		for _, d := range s.mft[dlid] {
			if d != p && d.attached() {
				ds = append(ds, d)
			}
		}
	} else if d := s.byLID[dlid]; d != nil && d.attached() && d != p {
		ds = append(ds, d)
	}
	return ds
}

// refreshRoute works out what p is to hold for dlid: its destinations
// once every pairing is done, the switch when one was refused or there
// are none or too many. A route that changed (or answers a query) is sent
// when the switch holds none of p's packets. While new pairings are on
// their way a port that sends directly goes back to the switch (whose
// tables are new already): its old destinations are not all of them.
// Caller holds mu.
func (s *SM) refreshRoute(p *port, dlid uint16, r *directRoute, now time.Time) {
	next, waiting := s.pairedRoute(p, s.destinations(p, dlid), now)
	r.waiting = waiting
	if waiting {
		if r.told && r.sent != nil && !r.fallback {
			r.next, r.want, r.fallback = nil, true, true
			s.routeDue(p)
		}
		return // answered when the pairings are done
	}
	r.fallback = false
	if !r.want && r.told && slices.Equal(next, r.sent) {
		return
	}
	r.next, r.want = next, true
	s.routeDue(p)
}

// pairedRoute returns the GUIDs of destinations ds once p is paired with
// each (nil: through the switch), or waiting while pairings are on their
// way (it starts the missing ones). Caller holds mu.
func (s *SM) pairedRoute(p *port, ds []*port, now time.Time) (next []uint64, waiting bool) {
	if len(ds) == 0 || len(ds) > fabric.MaxRoutePeers {
		return nil, false // none: the switch drops and counts
	}
	next = make([]uint64, 0, len(ds))
	for _, d := range ds {
		if at, ok := p.dir.refused[d.guid]; ok {
			if now.Sub(at) < pairRefused {
				return nil, false
			}
			delete(p.dir.refused, d.guid)
			delete(d.dir.refused, p.guid)
		}
		pr := s.dpairs[keyOf(p.guid, d.guid)]
		switch {
		case pr == nil:
			s.pair(p, d, now)
			waiting = true
		case !pr.done():
			if now.Sub(pr.at) >= pairResend {
				s.pair(p, d, now)
			}
			waiting = true
		}
		next = append(next, d.guid)
	}
	return next, waiting
}

// routeDue marks p's routes to be sent when the switch holds none of its
// packets (the forwarder's visit). Caller holds mu.
func (s *SM) routeDue(p *port) {
	p.dir.due = true
	if s.forwarding {
		s.dlate = append(s.dlate, p) // visit lists are in use
	} else {
		s.activate(p)
	}
	s.kick()
}

// pair asks p and d to take each other as peers. Caller holds mu.
func (s *SM) pair(p, d *port, now time.Time) {
	s.dpairs[keyOf(p.guid, d.guid)] = &pairing{at: now}
	if p.dir.peers == nil {
		p.dir.peers = make(map[uint64]bool)
	}
	if d.dir.peers == nil {
		d.dir.peers = make(map[uint64]bool)
	}
	p.dir.peers[d.guid], d.dir.peers[p.guid] = true, true
	// d first: p probes d (OK), whose answer proves the two reach each
	// other, and d takes p's probe only once it took p.
	s.sendDirect(d, &fabric.Direct{Type: fabric.DirectPeer, Peers: []fabric.Peer{{GUID: p.guid, LID: p.lid, Addr: p.addr}}})
	s.sendDirect(p, &fabric.Direct{Type: fabric.DirectPeer, OK: true, Peers: []fabric.Peer{{GUID: d.guid, LID: d.lid, Addr: d.addr}}})
}

// peerAnswer takes p's answer to a peer message about guid. Caller
// holds mu.
func (s *SM) peerAnswer(p *port, guid uint64, ok bool, now time.Time) {
	k := keyOf(p.guid, guid)
	pr := s.dpairs[k]
	q := s.byGUID[guid]
	if pr == nil || q == nil || !q.attached() {
		return
	}
	if !ok {
		// Refused: kept by both ports for pairRefused.
		s.dRefused.Add(1)
		s.unpair(p, q)
		for _, x := range [][2]*port{{p, q}, {q, p}} {
			if x[0].dir.refused == nil {
				x[0].dir.refused = make(map[uint64]time.Time)
			}
			x[0].dir.refused[x[1].guid] = now
		}
	} else {
		if p.guid == k.a {
			pr.ok[0] = true
		} else {
			pr.ok[1] = true
		}
		if !pr.done() {
			return
		}
		s.dPairs.Add(1)
	}
	for _, x := range []*port{p, q} {
		for dlid, r := range x.dir.routes {
			if r.waiting {
				s.refreshRoute(x, dlid, r, now)
			}
		}
	}
}

// unpair ends the pairing of p and q: both are told. Caller holds mu.
func (s *SM) unpair(p, q *port) {
	delete(s.dpairs, keyOf(p.guid, q.guid))
	for _, x := range [][2]*port{{p, q}, {q, p}} {
		a, b := x[0], x[1]
		if a.dir.peers[b.guid] {
			delete(a.dir.peers, b.guid)
			if a.attached() {
				s.sendDirect(a, &fabric.Direct{Type: fabric.DirectPeerGone, PeerGUID: b.guid})
			}
		}
	}
}

// directGone forgets what p held and was: its peers are told, and the
// routes that led to it change. Caller holds mu, p is still attached.
func (s *SM) directGone(p *port, now time.Time) {
	for guid := range p.dir.peers {
		if q := s.byGUID[guid]; q != nil {
			s.unpair(p, q)
		} else {
			delete(s.dpairs, keyOf(p.guid, guid))
		}
	}
	for guid := range p.dir.refused {
		if q := s.byGUID[guid]; q != nil {
			delete(q.dir.refused, p.guid)
		}
	}
	for dlid := range p.dir.routes {
		if subs := s.dsubs[dlid]; subs != nil {
			delete(subs, p)
			if len(subs) == 0 {
				delete(s.dsubs, dlid)
			}
		}
	}
	p.dir = directPort{}
	s.dchanged = append(s.dchanged, p.lid)
}

// directChanged sends the routes of the DLIDs whose destinations may
// have changed anew. Caller holds mu; not while forwardLocked runs.
func (s *SM) directChanged(now time.Time) {
	if s.forwarding {
		return
	}
	for len(s.dchanged) > 0 {
		dlid := s.dchanged[len(s.dchanged)-1]
		s.dchanged = s.dchanged[:len(s.dchanged)-1]
		for p := range s.dsubs[dlid] {
			if r := p.dir.routes[dlid]; r != nil && p.attached() {
				s.refreshRoute(p, dlid, r, now)
			}
		}
	}
	for _, p := range s.dlate {
		s.activate(p)
	}
	clear(s.dlate)
	s.dlate = s.dlate[:0]
}

// routeMessages builds the route messages of the ports whose routes are
// ready (s.dready), for sending once the batch they waited for went out.
// Caller holds mu.
func (s *SM) routeMessages(out []routeMsg) []routeMsg {
	for _, p := range s.dready {
		if !p.attached() {
			continue
		}
		for dlid, r := range p.dir.routes {
			if !r.want || (r.waiting && !r.fallback) {
				continue
			}
			seq := r.seq
			if r.waiting {
				seq = 0 // the query is answered when the pairings are done
			} else {
				r.seq = 0
			}
			m := fabric.Direct{Type: fabric.DirectRoute, Seq: seq, DLID: dlid, Session: s.directSession(p),
				HOQLife: s.cfg.HOQLife, VLStallCount: s.cfg.VLStallCount}
			for _, g := range r.next {
				if d := s.byGUID[g]; d != nil && d.attached() {
					m.Peers = append(m.Peers, fabric.Peer{GUID: d.guid, LID: d.lid, Addr: d.addr})
				}
			}
			r.sent, r.told, r.want = r.next, true, false
			out = append(out, routeMsg{to: p.addr, b: fabric.AppendDirect(nil, &m)})
			s.dRoutes.Add(1)
		}
	}
	clear(s.dready)
	s.dready = s.dready[:0]
	return out
}

// routeMsg is a route message waiting to be sent.
type routeMsg struct {
	to netip.AddrPort
	b  []byte
}

// directAfterFlush does what forwardLocked left for after its batch went
// out: the routes it found ready go now, then the DLIDs whose
// destinations changed are looked at and the ports to visit put on the
// list.
func (s *SM) directAfterFlush() {
	s.mu.Lock()
	msgs := s.routeMessages(nil)
	s.directChanged(time.Now())
	s.mu.Unlock()
	for _, m := range msgs {
		if _, err := s.fabric.WriteToUDPAddrPort(m.b, m.to); err != nil {
			s.sendErrors.Add(1)
		}
	}
}
