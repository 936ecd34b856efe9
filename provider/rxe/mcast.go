package rxe

import (
	"slices"
	"sync/atomic"
	"syscall"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// group is a multicast group of the device (rxe_mcg): the QPs attached to
// one MGID, in attach order.
type group struct {
	mgid  wire.GID
	list  []*qp                 // Device.mu
	qps   atomic.Pointer[[]*qp] // immutable copy of list for the receive path
	mship *membership           // nil when the MGID is not an IP multicast address
}

func (g *group) publish() {
	l := slices.Clone(g.list)
	g.qps.Store(&l)
}

// AttachMcast attaches the QP to the multicast group gid (softverbs.DriverQP),
// with rxe's rules: attaching an attached QP again returns nil; ENOMEM when
// a new group would exceed max_mcast_grp, when the group would exceed
// max_mcast_qp_attach QPs or the device max_total_mcast_qp_attach
// attachments. The lid is ignored. The first attach of an MGID that is an
// IP multicast address (IPv4-mapped 224.0.0.0/4 or ff00::/8) takes a
// reference on the device's membership of that group, so the QP receives.
func (q *qp) AttachMcast(gid verbs.GID, lid uint16) error {
	d := q.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return d.errf(syscall.ENODEV, "attach %v: device closed", gid)
	}
	if q.dead.Load() {
		return d.errf(syscall.EINVAL, "attach %v: qp %#x destroyed", gid, q.qpn)
	}
	lim := d.limits
	g := d.groups[gid]
	if g != nil && slices.Contains(g.list, q) {
		return nil
	}
	if g == nil && len(d.groups) >= lim.MaxMcastGrp {
		return d.errf(syscall.ENOMEM, "attach %v: %d groups (max_mcast_grp)", gid, len(d.groups))
	}
	if d.nattach >= lim.MaxTotalMcastQP {
		return d.errf(syscall.ENOMEM, "attach %v: %d attachments (max_total_mcast_qp_attach)", gid, d.nattach)
	}
	if g != nil && len(g.list) >= lim.MaxMcastQPAttach {
		return d.errf(syscall.ENOMEM, "attach %v: %d QPs in group (max_mcast_qp_attach)", gid, len(g.list))
	}
	if g == nil {
		g = &group{mgid: gid}
		g.publish()
		if gid.IsMulticast() {
			m, err := d.membershipLocked(gid.Addr())
			if err != nil {
				return err
			}
			g.mship = m
			m.grp.Store(g)
		}
		d.groups[gid] = g
	}
	g.list = append(g.list, q)
	g.publish()
	q.groups = append(q.groups, g)
	d.nattach++
	return nil
}

// DetachMcast detaches the QP from the group gid (softverbs.DriverQP): EINVAL
// when the device has no such group or the QP is not attached to it. The
// last detach removes the group and drops its membership reference.
func (q *qp) DetachMcast(gid verbs.GID, lid uint16) error {
	d := q.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return d.errf(syscall.ENODEV, "detach %v: device closed", gid)
	}
	g := d.groups[gid]
	if g == nil {
		return d.errf(syscall.EINVAL, "detach %v: no such group", gid)
	}
	if !slices.Contains(g.list, q) {
		return d.errf(syscall.EINVAL, "detach %v: qp %#x not attached", gid, q.qpn)
	}
	d.detachLocked(q, g)
	return nil
}

// detachLocked removes q from g (q must be attached).
func (d *Device) detachLocked(q *qp, g *group) {
	g.list = slices.DeleteFunc(g.list, func(x *qp) bool { return x == q })
	g.publish()
	q.groups = slices.DeleteFunc(q.groups, func(x *group) bool { return x == g })
	d.nattach--
	if len(g.list) > 0 {
		return
	}
	delete(d.groups, g.mgid)
	if m := g.mship; m != nil {
		m.grp.Store(nil)
		d.releaseMembershipLocked(m)
	}
}

// AttachedQPs returns the QPNs attached to gid, in attach order.
func (d *Device) AttachedQPs(gid verbs.GID) []uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	g := d.groups[gid]
	if g == nil {
		return nil
	}
	out := make([]uint32, len(g.list))
	for i, q := range g.list {
		out[i] = q.qpn
	}
	return out
}
