package rxe

import (
	"syscall"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
)

// GroupCreated starts receiving a verbs multicast group (softverbs.Driver):
// when its MGID is an IP multicast address (IPv4-mapped 224.0.0.0/4 or
// ff00::/8) the group takes a reference on the device's membership of that
// address, so its datagrams reach a socket of the device; the membership
// points back at the group for the receive path. Other MGIDs get no
// traffic (nothing maps them to an IP group).
func (d *Device) GroupCreated(g *softverbs.Group) error {
	if !g.MGID.IsMulticast() || !g.MGID.Addr().IsMulticast() {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return d.errf(syscall.ENODEV, "attach %v: device closed", g.MGID)
	}
	m, err := d.membershipLocked(g.MGID.Addr())
	if err != nil {
		return err
	}
	g.Transport = m
	m.grp.Store(g)
	return nil
}

// GroupDestroyed drops the group's membership reference
// (softverbs.Driver); the kernel leaves the IP group when the RDMA CM
// holds no reference either.
func (d *Device) GroupDestroyed(g *softverbs.Group) {
	m, _ := g.Transport.(*membership)
	if m == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	m.grp.Store(nil)
	d.releaseMembershipLocked(m)
}

// AttachedQPs returns the QPNs attached to gid, in attach order.
func (d *Device) AttachedQPs(gid verbs.GID) []uint32 {
	g := d.core.Group(gid)
	if g == nil {
		return nil
	}
	return g.QPNs()
}
