package ib

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// saClient is the port's SA client and multicast join engine, with the
// kernel's ib_sa multicast semantics (drivers/infiniband/core/multicast.c):
// one SA membership per MGID shared by every local member, local members
// counted per JoinState bit, a Set only for bits the port does not hold
// yet, a Delete only for bits no local member needs any more, and
// -ENETRESET to every member when the port is re-registered.
type saClient struct {
	d       *Device
	tidBase uint64
	tidSeq  atomic.Uint32

	mu       sync.Mutex
	pending  map[uint64]chan []byte
	groups   map[verbs.GID]*saGroup
	zeroSeq  int
	cpiValid bool
	sendOnly bool
	bcast    *GroupRecord
	closed   bool
	wg       sync.WaitGroup
}

// saGroup is the port's membership of one multicast group.
type saGroup struct {
	key verbs.GID // MGID, or a private key while an SA-assigned MGID is pending

	mu        sync.Mutex // serializes the group's SA transactions and callbacks
	rec       GroupRecord
	joinState uint8 // bits the port holds at the SA
	count     [4]int
	members   map[*Member]struct{}
}

// Member is one local join (struct ib_sa_multicast).
type Member struct {
	g      *saGroup
	req    GroupRecord
	mask   uint64
	cb     func(status int, rec *GroupRecord)
	active bool // counted in g.count, reported joined
	gone   bool
}

func newSAClient(d *Device) *saClient {
	return &saClient{
		d: d, tidBase: rand.Uint64() &^ 0xffffffff,
		pending: map[uint64]chan []byte{}, groups: map[verbs.GID]*saGroup{},
	}
}

// SendOnlyFullMemberSupported reports whether the SA's ClassPortInfo, as
// cached at port activation, has CapabilityMask2 bit 12.
func (d *Device) SendOnlyFullMemberSupported() bool {
	d.sa.mu.Lock()
	defer d.sa.mu.Unlock()
	return d.sa.cpiValid && d.sa.sendOnly
}

// BroadcastGroup returns the cached record of the IPoIB broadcast group the
// port joined at activation; false when the port has none (IPoIB down).
func (d *Device) BroadcastGroup() (GroupRecord, bool) {
	d.sa.mu.Lock()
	defer d.sa.mu.Unlock()
	if d.sa.bcast == nil {
		return GroupRecord{}, false
	}
	return *d.sa.bcast, true
}

// refresh reads the SA's ClassPortInfo and joins the IPoIB broadcast group,
// as the port's activation (and a client reregister) does.
func (sa *saClient) refresh() {
	cpi, err := sa.classPortInfo()
	sa.mu.Lock()
	sa.cpiValid = err == nil
	sa.sendOnly = err == nil && cpi
	sa.mu.Unlock()
	req := GroupRecord{MGID: IPoIBBroadcastMGID, PortGID: sa.d.PortGID(), PKey: 0xffff, JoinState: mad.JoinFullMember}
	rec, status := sa.transact(mad.MethodSet, &req, mad.CompMGID|mad.CompPortGID|mad.CompPKey|mad.CompJoinState)
	sa.mu.Lock()
	if status == 0 {
		sa.bcast = rec
	} else {
		sa.bcast = nil
	}
	sa.mu.Unlock()
}

// JoinMulticast starts a join (ib_sa_join_multicast). cb runs once with
// status 0 and the group's record (JoinState = this member's), or with a
// negative errno (-EINVAL for an SA rejection or a record mismatch,
// -ETIMEDOUT when the SA does not answer); later it may run again with
// -ENETRESET when the port loses the group. cb must not call back into the
// device's multicast functions.
func (d *Device) JoinMulticast(req GroupRecord, mask uint64, cb func(status int, rec *GroupRecord)) (*Member, error) {
	sa := d.sa
	sa.mu.Lock()
	if sa.closed {
		sa.mu.Unlock()
		return nil, errClosed
	}
	key := req.MGID
	if key.IsZero() {
		// The SA assigns the MGID: never merged with another join.
		sa.zeroSeq++
		key = verbs.GID{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, byte(sa.zeroSeq >> 24), byte(sa.zeroSeq >> 16), byte(sa.zeroSeq >> 8), byte(sa.zeroSeq)}
		key[0] = 0x01 // not a valid MGID: cannot collide
	}
	g := sa.groups[key]
	if g == nil {
		g = &saGroup{key: key, members: map[*Member]struct{}{}}
		sa.groups[key] = g
	}
	m := &Member{g: g, req: req, mask: mask, cb: cb}
	g.mu.Lock()
	g.members[m] = struct{}{}
	g.mu.Unlock()
	sa.wg.Add(1)
	sa.mu.Unlock()
	go func() {
		defer sa.wg.Done()
		sa.join(m)
	}()
	return m, nil
}

func (sa *saClient) join(m *Member) {
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if m.gone {
		return
	}
	var rec GroupRecord
	if g.joinState != 0 && m.req.JoinState&^g.joinState == 0 {
		// Already held at the SA: compare with the cached record, no MAD.
		if !recordMatches(&m.req, &g.rec, m.mask) {
			m.cb(-int(syscall.EINVAL), nil)
			return
		}
		rec = g.rec
	} else {
		r, status := sa.transact(mad.MethodSet, &m.req, m.mask)
		if status != 0 {
			m.cb(status, nil)
			return
		}
		g.rec = *r
		g.joinState |= r.JoinState | m.req.JoinState
		rec = *r
		if g.key != r.MGID {
			sa.mu.Lock()
			if sa.groups[g.key] == g {
				delete(sa.groups, g.key)
			}
			if sa.groups[r.MGID] == nil {
				sa.groups[r.MGID] = g
			}
			g.key = r.MGID
			sa.mu.Unlock()
		}
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

// LeaveMulticast ends a join (ib_sa_free_multicast): it waits for a running
// callback of the group and drops the member's counts. The SA Delete for
// the bits no local member still needs goes out in the background, still
// serialized with the group's later requests; the caller does not wait
// for the SA, as in the kernel.
func (d *Device) LeaveMulticast(m *Member) {
	sa := d.sa
	g := m.g
	g.mu.Lock()
	m.gone = true
	delete(g.members, m)
	var leave uint8
	if m.active {
		m.active = false
		for i := range 4 {
			if m.req.JoinState&(1<<i) != 0 {
				g.count[i]--
			}
		}
		for i := range 4 {
			if g.joinState&(1<<i) != 0 && g.count[i] == 0 {
				leave |= 1 << i
			}
		}
		g.joinState &^= leave
	}
	sa.forgetIfUnused(g)
	if leave == 0 {
		g.mu.Unlock()
		return
	}
	req := GroupRecord{MGID: g.rec.MGID, PortGID: d.PortGID(), JoinState: leave}
	sa.wg.Add(1)
	go func() {
		// Holds g.mu, taken above, until the Delete is answered.
		defer sa.wg.Done()
		defer g.mu.Unlock()
		for try := 0; try < 3; try++ {
			if _, status := sa.transact(mad.MethodDelete, &req, mad.CompJoinRequired); status != -int(syscall.ETIMEDOUT) {
				return
			}
		}
	}()
}

// forgetIfUnused drops a group without members or memberships (g.mu held).
func (sa *saClient) forgetIfUnused(g *saGroup) {
	if len(g.members) == 0 && g.joinState == 0 {
		sa.mu.Lock()
		if sa.groups[g.key] == g {
			delete(sa.groups, g.key)
		}
		sa.mu.Unlock()
	}
}

// portEvent handles a client reregister, LID change or port error: every
// active member gets -ENETRESET and the port's memberships are forgotten
// (mcast_event_handler); a reregister also refreshes the cached SA data.
func (sa *saClient) portEvent(kind PortEventKind) {
	if kind == PortActive {
		return
	}
	sa.mu.Lock()
	groups := make([]*saGroup, 0, len(sa.groups))
	for _, g := range sa.groups {
		groups = append(groups, g)
	}
	sa.cpiValid = false
	sa.mu.Unlock()
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
		g.mu.Unlock()
	}
	if kind != PortError {
		sa.wg.Add(1)
		go func() {
			defer sa.wg.Done()
			sa.refresh()
		}()
	}
}

// transact sends one SA request and waits for its answer; the status is 0,
// -EINVAL for any non-zero MAD status, or -ETIMEDOUT.
func (sa *saClient) transact(method uint8, req *GroupRecord, mask uint64) (*GroupRecord, int) {
	tid := sa.tidBase | uint64(sa.tidSeq.Add(1))
	resp, err := sa.roundTrip(tid, encodeMCMemberMAD(method, tid, req, mask))
	if err != nil {
		return nil, -int(verbs.ErrnoOf(err))
	}
	rec, status, err := decodeMCMemberMAD(resp)
	if err != nil || status != 0 {
		return nil, -int(syscall.EINVAL)
	}
	return rec, 0
}

func (sa *saClient) classPortInfo() (sendOnly bool, err error) {
	tid := sa.tidBase | uint64(sa.tidSeq.Add(1))
	resp, err := sa.roundTrip(tid, encodeClassPortInfoGet(tid))
	if err != nil {
		return false, err
	}
	return decodeClassPortInfoSendOnly(resp)
}

// roundTrip sends a MAD to the SA (SM LID, QP1) and waits for the answer
// with the same TID, resending after each timeout up to SARetries times.
func (sa *saClient) roundTrip(tid uint64, req []byte) ([]byte, error) {
	ch := make(chan []byte, 1)
	sa.mu.Lock()
	if sa.closed {
		sa.mu.Unlock()
		return nil, syscall.ENODEV
	}
	sa.pending[tid] = ch
	sa.mu.Unlock()
	defer func() {
		sa.mu.Lock()
		delete(sa.pending, tid)
		sa.mu.Unlock()
	}()
	for try := 0; try <= sa.d.cfg.SARetries; try++ {
		if err := sa.d.sendMAD(req); err != nil {
			return nil, err
		}
		t := time.NewTimer(sa.d.cfg.SATimeout)
		select {
		case resp := <-ch:
			t.Stop()
			return resp, nil
		case <-sa.d.done:
			t.Stop()
			return nil, syscall.ENODEV
		case <-t.C:
		}
	}
	return nil, syscall.ETIMEDOUT
}

// receive takes a MAD that arrived on QP1.
func (sa *saClient) receive(b []byte) {
	tid, ok := madTID(b)
	if !ok {
		return
	}
	sa.mu.Lock()
	ch := sa.pending[tid]
	sa.mu.Unlock()
	if ch != nil {
		select {
		case ch <- append([]byte(nil), b...):
		default:
		}
	}
}

func (sa *saClient) close() {
	sa.mu.Lock()
	sa.closed = true
	sa.mu.Unlock()
	sa.wg.Wait()
}

// sendMAD sends a MAD to the SA as a UD packet to the SM LID, QP1.
func (d *Device) sendMAD(m []byte) error {
	d.mu.Lock()
	lid, smLID := d.lid, d.smLID
	d.mu.Unlock()
	p := fabric.UDPacket{
		DLID: smLID, SLID: lid,
		UD: wire.UDHeader{PKey: 0xffff, DestQP: gsiQPN, QKey: gsiQKey, SrcQP: gsiQPN},
	}
	b := make([]byte, fabric.PacketLen(len(m), false, false))
	n := fabric.EncodeUD(b, &p, m)
	_, err := d.conn.WriteToUDP(b[:n], d.sm)
	return err
}
