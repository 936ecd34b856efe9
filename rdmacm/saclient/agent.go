// Package saclient is the host's InfiniBand SA client and multicast join
// agent: what Linux's ib_core does in sa_query.c and multicast.c, and the
// IPoIB broadcast membership IPoIB keeps, for every IB port of a host that
// can send a MAD to its SA and hand back the MADs it receives
// (driver.MADPort). It registers itself as a verbs.Client: a program that
// imports rdmacm has it, and For gives a device's agent. Providers do not
// import it: an IB port offers only the MAD transport.
//
// The agent keeps one SA membership per MGID, shared by every local
// member: local members are counted per JoinState bit, a Set goes out only
// for bits the port does not hold yet, a Delete only for bits no local
// member needs any more, and every member gets -ENETRESET when the port is
// re-registered, changes its LID or loses the SM. Requests of one group
// are serialized in order by a per-group worker; no lock is held while a
// request waits for the SA, so a silent SA delays only that group's
// requests, never the port's receive path, its events or other groups.
package saclient

import (
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/verbs"
)

// Port is what the agent needs from an IB port (a subset of
// driver.MADPort).
type Port interface {
	// SendSA sends one 256-byte SA MAD to the SA (the SM's LID, QP1).
	SendSA(mad []byte) error
	// PortGID returns the port's GID 0 (subnet prefix and port GUID).
	PortGID() verbs.GID
	// SMLID returns the LID of the subnet manager, the only source of SA
	// answers the agent takes.
	SMLID() uint16
}

// Config tunes the SA client.
type Config struct {
	// Timeout is how long one SA request waits for an answer (default 3 s,
	// as the kernel's join and leave MADs).
	Timeout time.Duration
	// Retries is how often a request is resent after a timeout (default 1).
	Retries int
}

// EventKind is a port event the agent reacts to.
type EventKind int

// Port events (enum ib_event_type subset).
const (
	// PortActive: the port became active again after PortError.
	PortActive EventKind = iota + 1
	// ClientReregister: the SM asks clients to re-register (an SM restart).
	ClientReregister
	// LIDChange: the port's LID changed.
	LIDChange
	// PortError: the port lost the subnet manager.
	PortError
)

// Agent is a port's SA client and multicast join agent.
type Agent struct {
	port Port
	sa   *saClient

	mu       sync.Mutex
	groups   map[verbs.GID]*group
	gen      uint64 // bumped by every event that resets the memberships
	zeroSeq  int
	cpiValid bool
	sendOnly bool
	bcast    *GroupRecord
	closed   bool
	wg       sync.WaitGroup
}

// group is the port's membership of one multicast group (struct
// mcast_group). mu guards the fields and is held while a member's callback
// runs, never while a request waits for the SA.
type group struct {
	key verbs.GID // MGID, or a private key while an SA-assigned MGID is pending

	mu        sync.Mutex
	rec       GroupRecord
	joinState uint8  // bits the port holds at the SA
	count     [4]int // active local members per JoinState bit
	members   map[*Member]struct{}
	queue     []op // requests waiting for the worker, in order
	busy      bool // a worker runs
	dead      bool // removed from Agent.groups
}

// op is one queued request of a group: a member's join, or a leave that
// deletes the bits no member needs any more and reports to done.
type op struct {
	join *Member
	done chan error
}

// Member is one local join (struct ib_sa_multicast).
type Member struct {
	g      *group
	req    GroupRecord
	mask   uint64
	cb     func(status int, rec *GroupRecord)
	active bool // counted in g.count, reported joined
	gone   bool // left: no callback runs any more
}

// Membership is a read-only view of the port's SA membership of a group.
type Membership struct {
	MGID      verbs.GID
	MLID      uint16
	JoinState uint8  // the join-state bits the port holds at the SA
	Members   [4]int // local members per JoinState bit (Full, Non, SendOnlyNon, SendOnlyFull)
}

// Stats counts the SA answers the agent took and the MADs it dropped
// because they matched no pending request (wrong TID, method, attribute
// or source).
type Stats struct{ Answers, Stray uint64 }

// New returns the agent of a port. Its owner (the host's client, Add)
// hands it the MADs the port receives on QP1 (Receive) and the port's
// events (Event), and calls Refresh when the port becomes active.
func New(p Port, cfg Config) *Agent {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 3 * time.Second
	}
	if cfg.Retries <= 0 {
		cfg.Retries = 1
	}
	return &Agent{port: p, sa: newSAClient(p, cfg.Timeout, cfg.Retries), groups: map[verbs.GID]*group{}}
}

// Receive offers a MAD that arrived on the port's QP1 from source LID slid
// and source QP srcQP. It reports whether the MAD was the answer to a
// pending SA request; anything else is dropped and counted in Stats.Stray.
// It never blocks.
func (e *Agent) Receive(slid uint16, srcQP uint32, b []byte) bool {
	return e.sa.receive(slid, srcQP, b)
}

// Stats returns the agent's counters.
func (e *Agent) Stats() Stats {
	return Stats{Answers: e.sa.answers.Load(), Stray: e.sa.stray.Load()}
}

// SendOnlyFullMemberSupported reports whether the SA's ClassPortInfo, as
// cached at port activation, has CapabilityMask2 bit 12.
func (e *Agent) SendOnlyFullMemberSupported() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cpiValid && e.sendOnly
}

// BroadcastGroup returns the cached record of the IPoIB broadcast group the
// port joined at activation; false when the port has none (IPoIB down).
func (e *Agent) BroadcastGroup() (GroupRecord, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.bcast == nil {
		return GroupRecord{}, false
	}
	return *e.bcast, true
}

// GetTable sends SubnAdmGetTable(MCMemberRecord) with the record req and
// component mask and returns the records of the answer (none for an empty
// table), reassembled from its RMPP segments, whose receipt it
// acknowledges to the SA as the kernel's RMPP receiver does. It waits for
// the SA: Config.Timeout per try, Config.Retries resends. A non-zero SA
// status other than ERR_NO_RECORDS gives an error wrapping EINVAL; a
// silent SA ETIMEDOUT; a closed agent ENODEV.
func (e *Agent) GetTable(req GroupRecord, mask uint64) ([]GroupRecord, error) {
	return e.sa.getTable(&req, mask)
}

// Refresh reads the SA's ClassPortInfo and joins the IPoIB broadcast
// group, as the port's activation (and a client reregister) does. It
// waits for the SA.
func (e *Agent) Refresh() {
	cpi, err := e.sa.classPortInfo()
	e.mu.Lock()
	e.cpiValid = err == nil
	e.sendOnly = err == nil && cpi
	e.mu.Unlock()
	req := GroupRecord{MGID: IPoIBBroadcastMGID, PortGID: e.port.PortGID(), PKey: 0xffff, JoinState: mad.JoinFullMember}
	rec, status := e.sa.transact(mad.MethodSet, &req, mad.CompMGID|mad.CompPortGID|mad.CompPKey|mad.CompJoinState)
	e.mu.Lock()
	if status == 0 {
		e.bcast = rec
	} else {
		e.bcast = nil
	}
	e.mu.Unlock()
}

// Join starts a join (ib_sa_join_multicast). cb runs once with status 0
// and the group's record (JoinState = this member's), or with a negative
// errno (-EINVAL for an SA rejection or a record mismatch, -ETIMEDOUT when
// the SA does not answer); later it may run again with -ENETRESET when
// the port loses the group. cb runs with the group's lock held: it must
// not call back into the agent.
func (e *Agent) Join(req GroupRecord, mask uint64, cb func(status int, rec *GroupRecord)) (*Member, error) {
	for {
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			return nil, fmt.Errorf("mcast: join %v: port closed: %w", req.MGID, syscall.ENODEV)
		}
		key := req.MGID
		if key.IsZero() {
			// The SA assigns the MGID: never merged with another join.
			e.zeroSeq++
			key = verbs.GID{0x01, 12: byte(e.zeroSeq >> 24), 13: byte(e.zeroSeq >> 16), 14: byte(e.zeroSeq >> 8), 15: byte(e.zeroSeq)}
		}
		g := e.groups[key]
		if g == nil {
			g = &group{key: key, members: map[*Member]struct{}{}}
			e.groups[key] = g
		}
		e.mu.Unlock()
		g.mu.Lock()
		if g.dead { // forgotten between the two locks: look again
			g.mu.Unlock()
			continue
		}
		m := &Member{g: g, req: req, mask: mask, cb: cb}
		g.members[m] = struct{}{}
		g.queue = append(g.queue, op{join: m})
		e.kick(g)
		g.mu.Unlock()
		return m, nil
	}
}

// Leave ends a join (ib_sa_free_multicast) and waits until the SA Delete
// for the bits no local member still needs was answered; see StartLeave.
func (e *Agent) Leave(m *Member) error { return e.StartLeave(m).Wait() }

// Leaving is a leave in progress.
type Leaving struct {
	mgid verbs.GID
	done chan error // nil: nothing to wait for
}

// StartLeave ends a join: it waits for a running callback of the group,
// after which the member's callback never runs again, drops the member's
// counts, and queues the SA Delete for the bits no local member still
// needs behind the group's earlier requests. Wait waits for that Delete.
func (e *Agent) StartLeave(m *Member) *Leaving {
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if m.gone {
		return &Leaving{}
	}
	m.gone = true
	delete(g.members, m)
	if m.active {
		m.active = false
		for i := range 4 {
			if m.req.JoinState&(1<<i) != 0 {
				g.count[i]--
			}
		}
	}
	if !g.busy && unneeded(g) == 0 {
		e.forgetIfUnused(g)
		return &Leaving{}
	}
	l := &Leaving{mgid: g.rec.MGID, done: make(chan error, 1)}
	g.queue = append(g.queue, op{done: l.done})
	e.kick(g)
	return l
}

// Wait returns once the leave's SA Delete was answered (nil), refused or
// timed out (an error with the errno: EINVAL, ETIMEDOUT), or the port
// closed (ENODEV).
func (l *Leaving) Wait() error {
	if l.done == nil {
		return nil
	}
	if err := <-l.done; err != nil {
		return fmt.Errorf("mcast: leave %v: SA delete: %w", l.mgid, err)
	}
	return nil
}

// unneeded returns the bits the port holds that no active member needs.
func unneeded(g *group) uint8 {
	var bits uint8
	for i := range 4 {
		if g.joinState&(1<<i) != 0 && g.count[i] == 0 {
			bits |= 1 << i
		}
	}
	return bits
}

// kick starts the group's worker unless it runs (g.mu held). On a closed
// agent the queue is dropped: leaves fail with ENODEV.
func (e *Agent) kick(g *group) {
	if g.busy {
		return
	}
	e.mu.Lock()
	closed := e.closed
	if !closed {
		e.wg.Add(1)
	}
	e.mu.Unlock()
	if closed {
		for _, o := range g.queue {
			if o.done != nil {
				o.done <- syscall.ENODEV
			}
		}
		g.queue = nil
		return
	}
	g.busy = true
	go e.run(g)
}

// run is a group's worker: it takes the queued requests in order.
func (e *Agent) run(g *group) {
	defer e.wg.Done()
	g.mu.Lock()
	defer g.mu.Unlock()
	for len(g.queue) > 0 {
		o := g.queue[0]
		g.queue = g.queue[1:]
		if o.join != nil {
			e.doJoin(g, o.join)
		} else {
			o.done <- e.doLeave(g)
		}
	}
	g.busy = false
	e.forgetIfUnused(g)
}

func (e *Agent) generation() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.gen
}

// doJoin runs one member's join (g.mu held; released while the SA is
// asked).
func (e *Agent) doJoin(g *group, m *Member) {
	var rec GroupRecord
	for {
		if m.gone {
			return
		}
		if g.joinState != 0 && m.req.JoinState&^g.joinState == 0 {
			// Already held at the SA: compare with the cached record, no MAD.
			if !recordMatches(&m.req, &g.rec, m.mask) {
				m.cb(-int(syscall.EINVAL), nil)
				return
			}
			rec = g.rec
			break
		}
		gen := e.generation()
		g.mu.Unlock()
		r, status := e.sa.transact(mad.MethodSet, &m.req, m.mask)
		g.mu.Lock()
		if gen != e.generation() {
			continue // the port re-registered meanwhile: join again
		}
		if status != 0 {
			if !m.gone {
				m.cb(status, nil)
			}
			return
		}
		// Held now even if the member left meanwhile: its leave, queued
		// behind this join, deletes what no one needs.
		g.rec = *r
		g.joinState |= r.JoinState | m.req.JoinState
		rec = *r
		if g.key != r.MGID {
			e.rekey(g, r.MGID)
		}
		break
	}
	if m.gone {
		return
	}
	for i := range 4 {
		if m.req.JoinState&(1<<i) != 0 {
			g.count[i]++
		}
	}
	m.active = true
	rec.JoinState = m.req.JoinState
	m.cb(0, &rec)
}

// rekey files a group whose MGID the SA assigned under that MGID (g.mu held).
func (e *Agent) rekey(g *group, mgid verbs.GID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.groups[g.key] == g {
		delete(e.groups, g.key)
	}
	if e.groups[mgid] == nil {
		e.groups[mgid] = g
	}
	g.key = mgid
}

// doLeave sends the Delete for the bits no active member needs (g.mu
// held; released while the SA is asked).
func (e *Agent) doLeave(g *group) error {
	bits := unneeded(g)
	if bits == 0 {
		return nil
	}
	g.joinState &^= bits
	req := GroupRecord{MGID: g.rec.MGID, PortGID: e.port.PortGID(), JoinState: bits}
	gen := e.generation()
	g.mu.Unlock()
	_, status := e.sa.transact(mad.MethodDelete, &req, mad.CompJoinRequired)
	g.mu.Lock()
	if status == 0 || gen != e.generation() {
		return nil // a re-registration dropped every membership anyway
	}
	return syscall.Errno(-status)
}

// forgetIfUnused drops a group without members, memberships or queued
// requests (g.mu held).
func (e *Agent) forgetIfUnused(g *group) {
	if len(g.members) != 0 || g.joinState != 0 || len(g.queue) != 0 || g.busy {
		return
	}
	g.dead = true
	e.mu.Lock()
	if e.groups[g.key] == g {
		delete(e.groups, g.key)
	}
	e.mu.Unlock()
}

// Event handles a port event: after a client reregister, LID change or
// port error every active member gets -ENETRESET and the port's
// memberships are forgotten (mcast_event_handler); a reregister or LID
// change also refreshes the cached SA data in the background. Joins in
// flight are sent again. Event never waits for the SA.
func (e *Agent) Event(kind EventKind) {
	if kind == PortActive {
		return
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.gen++
	e.cpiValid = false
	groups := make([]*group, 0, len(e.groups))
	for _, g := range e.groups {
		groups = append(groups, g)
	}
	refresh := kind != PortError
	if refresh {
		e.wg.Add(1)
	}
	e.mu.Unlock()
	for _, g := range groups {
		g.mu.Lock()
		for m := range g.members {
			if m.active {
				m.active = false
				m.cb(-int(syscall.ENETRESET), nil)
			}
		}
		g.count = [4]int{}
		g.joinState = 0
		e.forgetIfUnused(g)
		g.mu.Unlock()
	}
	if refresh {
		go func() {
			defer e.wg.Done()
			e.Refresh()
		}()
	}
}

// Memberships returns the port's SA memberships, by MLID.
func (e *Agent) Memberships() []Membership {
	e.mu.Lock()
	groups := make([]*group, 0, len(e.groups))
	for _, g := range e.groups {
		groups = append(groups, g)
	}
	e.mu.Unlock()
	out := make([]Membership, 0, len(groups))
	for _, g := range groups {
		g.mu.Lock()
		if g.joinState != 0 {
			out = append(out, Membership{MGID: g.rec.MGID, MLID: g.rec.MLID, JoinState: g.joinState, Members: g.count})
		}
		g.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b Membership) int { return int(a.MLID) - int(b.MLID) })
	return out
}

// PortGID returns the GID of the agent's port (index 0 of its GID
// table).
func (e *Agent) PortGID() verbs.GID { return e.port.PortGID() }

// Close fails every pending SA request with ENODEV and waits for the
// agent's goroutines; later joins fail with ENODEV.
func (e *Agent) Close() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.sa.close()
	e.wg.Wait()
}
