package softverbs

import (
	"cmp"
	"fmt"
	"slices"
	"sync/atomic"
	"syscall"

	"github.com/softrdma/softrdma/verbs"
)

// This file is the UD-QP core shared by the software providers: the QP
// table, the multicast group table with the device's limits, and the
// receive checks of the kernel's rxe (rxe_recv.c): QP state, P_Key, Q_Key,
// self-loopback, then the receive queue.

// Group is a multicast group of a device (rxe_mcg): the QPs attached to one
// MGID, in attach order.
type Group struct {
	// MGID is the group's GID.
	MGID verbs.GID
	// Transport is the provider's state for the group, set in
	// Driver.GroupCreated (rxe: the IP membership receiving it).
	Transport any

	list    []member                 // Device.mu
	members atomic.Pointer[[]member] // immutable copy of list for the receive path
}

// member is one attachment: a QP and the LID it attached with (0 on RoCE,
// where the LID is ignored).
type member struct {
	qp  *qpObj
	lid uint16
}

func (g *Group) publish() {
	l := slices.Clone(g.list)
	g.members.Store(&l)
}

// QPNs returns the QPNs attached to the group, in attach order.
func (g *Group) QPNs() []uint32 {
	ms := *g.members.Load()
	out := make([]uint32, len(ms))
	for i, m := range ms {
		out[i] = m.qp.qpn
	}
	return out
}

// attachment is one multicast attachment of a QP.
type attachment struct {
	MGID verbs.GID
	LID  uint16
}

// limitLocked fails with ENOMEM when n objects already exist and the
// device's limit is max (0: no limit), as libibverbs reports an exhausted
// resource.
func limit(what string, n, max int) error {
	if max > 0 && n >= max {
		return fmt.Errorf("%d %s (the device's limit): %w", n, what, syscall.ENOMEM)
	}
	return nil
}

// attach attaches q to gid with the rules of rxe_attach_mcast: attaching
// an attached QP again is a no-op; ENOMEM when a new group would exceed
// max_mcast_grp, the group max_mcast_qp_attach QPs, or the device
// max_total_mcast_qp_attach attachments.
func (d *Device) attach(q *qpObj, gid verbs.GID, lid uint16) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("%s: %w", d.drv.Name(), syscall.ENODEV)
	}
	g := d.groups[gid]
	if g != nil && slices.Contains(g.list, member{q, lid}) {
		return nil
	}
	a := d.drv.Attr()
	if g == nil {
		if err := limit("multicast groups", len(d.groups), a.MaxMcastGrp); err != nil {
			return err
		}
	}
	if err := limit("multicast attachments", d.nattach, a.MaxTotalMcastQP); err != nil {
		return err
	}
	if g != nil {
		if err := limit("QPs in the group", len(g.list), a.MaxMcastQPAttach); err != nil {
			return err
		}
	}
	if g == nil {
		g = &Group{MGID: gid}
		g.publish()
		if err := d.drv.GroupCreated(g); err != nil {
			return err
		}
		d.groups[gid] = g
		d.groupView.store(gid, g)
	}
	g.list = append(g.list, member{q, lid})
	g.publish()
	if q.groups == nil {
		q.groups = map[attachment]uint64{}
	}
	d.attachSeq++
	q.groups[attachment{gid, lid}] = d.attachSeq
	d.nattach++
	return nil
}

// detach removes q's attachment to gid: EINVAL when the device has no such
// group or q is not attached to it. The last detach removes the group.
func (d *Device) detach(q *qpObj, gid verbs.GID, lid uint16) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("%s: %w", d.drv.Name(), syscall.ENODEV)
	}
	g := d.groups[gid]
	if g == nil {
		return fmt.Errorf("no group %v: %w", gid, syscall.EINVAL)
	}
	if !slices.Contains(g.list, member{q, lid}) {
		return fmt.Errorf("qp %#x not attached: %w", q.qpn, syscall.EINVAL)
	}
	d.detachLocked(q, g, lid)
	return nil
}

func (d *Device) detachLocked(q *qpObj, g *Group, lid uint16) {
	g.list = slices.DeleteFunc(g.list, func(m member) bool { return m == member{q, lid} })
	g.publish()
	delete(q.groups, attachment{g.MGID, lid})
	d.nattach--
	if len(g.list) > 0 {
		return
	}
	delete(d.groups, g.MGID)
	d.groupView.delete(g.MGID)
	d.drv.GroupDestroyed(g)
}

// attachments returns q's attachments in attach order (dev.mu held).
func (q *qpObj) attachments() []attachment {
	out := make([]attachment, 0, len(q.groups))
	for a := range q.groups {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b attachment) int { return cmp.Compare(q.groups[a], q.groups[b]) })
	return out
}

// detachAllLocked detaches q from every group.
func (d *Device) detachAllLocked(q *qpObj) {
	as := q.attachments()
	for i := len(as) - 1; i >= 0; i-- { // newest first
		d.detachLocked(q, d.groups[as[i].MGID], as[i].LID)
	}
}

// Close is called by the provider when its device goes away: every QP is
// detached from its groups (GroupDestroyed runs for each), stops receiving
// and leaves the QP table, and later attaches and creations fail with
// ENODEV. The QPs' owners still destroy them.
func (d *Device) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	d.closed = true
	for _, q := range d.qps {
		d.detachAllLocked(q)
		q.rxState.Store(uint32(verbs.QPSErr))
		d.qpView.delete(q.qpn)
	}
	clear(d.qps)
}

// Group returns the device's group of an MGID, or nil. It takes no lock.
func (d *Device) Group(gid verbs.GID) *Group {
	g, _ := d.groupView.load(gid)
	return g
}

// groupInfo is a read-only view of one multicast group.
type groupInfo struct {
	MGID verbs.GID
	// QPNs are the attached QPs in attach order, with the LIDs they
	// attached with (0 on RoCE).
	QPNs []uint32
	LIDs []uint16
	// Transport is the provider's state for the group.
	Transport any
}

// Groups returns the device's multicast groups, by MGID.
func (d *Device) Groups() []groupInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]groupInfo, 0, len(d.groups))
	for _, g := range d.groups {
		gi := groupInfo{MGID: g.MGID, Transport: g.Transport}
		for _, m := range g.list {
			gi.QPNs = append(gi.QPNs, m.qp.qpn)
			gi.LIDs = append(gi.LIDs, m.lid)
		}
		out = append(out, gi)
	}
	slices.SortFunc(out, func(a, b groupInfo) int { return slices.Compare(a.MGID[:], b.MGID[:]) })
	return out
}

// Attachments returns the number of QP attachments over all groups.
func (d *Device) Attachments() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.nattach
}

// Count adds n to a device counter; providers count what their transport
// sees (RcvdPkts, the transport drops).
func (d *Device) Count(c Counter, n uint64) { d.ctr[c].Add(n) }

// count adds one to a counter of the device and, when q is not nil, of q.
func (d *Device) count(q *qpObj, c Counter) {
	d.ctr[c].Add(1)
	if q != nil {
		q.ctr[c].Add(1)
	}
}

// DeliverUnicast hands a datagram to QP qpn (NoQPDrops when the device has
// none).
func (d *Device) DeliverUnicast(qpn uint32, dg *Datagram, b *Burst) {
	q, ok := d.qpView.load(qpn)
	if !ok {
		d.count(nil, NoQPDrops)
		return
	}
	d.deliver(q, dg, b)
}

// DeliverGroup hands a multicast datagram to every QP attached to g with
// LID dlid (0 on RoCE), in attach order; NoGroupDrops when there is none.
func (d *Device) DeliverGroup(g *Group, dlid uint16, dg *Datagram, b *Burst) {
	if g == nil {
		d.count(nil, NoGroupDrops)
		return
	}
	n := 0
	for _, m := range *g.members.Load() {
		if m.lid != dlid {
			continue
		}
		n++
		d.deliver(m.qp, dg, b)
	}
	if n == 0 {
		d.count(nil, NoGroupDrops)
	}
}

// deliver runs the per-QP checks (state, P_Key, Q_Key, self-loopback
// blocking) and hands the datagram to q's receive queue; every outcome is
// counted once (a delivery with a Burst at its Flush).
func (d *Device) deliver(q *qpObj, dg *Datagram, b *Burst) {
	var c Counter
	switch {
	case !q.receives():
		c = NotReadyDrops
	case dg.PKey&0x7FFF != 0x7FFF:
		c = PKeyViolations
	case dg.QKey != q.rxQKey.Load():
		c = QKeyViolations
	case dg.Self && q.blockSelf && dg.SrcQP == q.qpn:
		c = SelfLoopbackDrops
	default:
		c = q.receive(dg, b)
		if c == Delivered && b != nil {
			b.delivered(q)
			return
		}
	}
	d.count(q, c)
}

// receives reports whether the QP's state accepts datagrams: RTR to SQE,
// not RESET, INIT or ERR (rxe's check_type_state).
func (q *qpObj) receives() bool {
	s := verbs.QPState(q.rxState.Load())
	return s >= verbs.QPSRTR && s <= verbs.QPSSQE
}

// DeviceCounters returns the device's counters (driver.CounterSource).
func (d *Device) DeviceCounters() []uint64 { return d.Counters() }

// CounterSchema returns the schema of software devices (driver.CounterSource).
func (d *Device) CounterSchema() []verbs.CounterDesc { return schema }

// QPCounters returns the counters of the device's QP qpn
// (driver.CounterSource); false when it has no such QP.
func (d *Device) QPCounters(qpn uint32) ([]uint64, bool) {
	q, ok := d.qpView.load(qpn)
	if !ok {
		return nil, false
	}
	return q.ctr.values(), true
}

// Counters returns a snapshot of the device's counters.
func (d *Device) Counters() Snapshot {
	if r, ok := d.drv.(CounterRefresher); ok {
		r.RefreshCounters()
	}
	return d.ctr.values()
}

// qpInfo is a read-only view of one QP, for operator tools.
type qpInfo struct {
	QPN              uint32
	State            verbs.QPState
	QKey             uint32
	Port             uint8
	BlockSelfMcastLB bool
	// Groups are the QP's multicast attachments, in attach order.
	Groups []attachment
	// Counters are the QP's counters, indexed by Counter.
	Counters Snapshot
	// Transport is the provider's side of the QP.
	Transport DriverQP
}

// QPs returns the device's QPs, by QPN.
func (d *Device) QPs() []qpInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]qpInfo, 0, len(d.qps))
	for _, q := range d.qps {
		out = append(out, qpInfo{
			QPN: q.qpn, State: verbs.QPState(q.rxState.Load()), QKey: q.rxQKey.Load(),
			Port: uint8(q.rxPort.Load()), BlockSelfMcastLB: q.blockSelf,
			Groups: q.attachments(), Counters: q.ctr.values(), Transport: q.drv,
		})
	}
	slices.SortFunc(out, func(a, b qpInfo) int { return int(a.QPN) - int(b.QPN) })
	return out
}
