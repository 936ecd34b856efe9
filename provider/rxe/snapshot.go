package rxe

import (
	"net"
	"net/netip"
	"slices"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
)

// DeviceSnapshot is a read-only view of a device at one instant, for
// operator tools (the introspection endpoint). The control-plane parts
// (QPs, groups, memberships) are taken under one lock and are consistent
// with each other; counters are read atomically, one by one, right after.
type DeviceSnapshot struct {
	Name    string
	Ifname  string
	Ifindex int
	MAC     net.HardwareAddr
	// Up reports whether the interface is up and running (port ACTIVE).
	Up bool
	// Addrs holds the interface's addresses, IPv4 first.
	Addrs []netip.Addr

	Attr verbs.DeviceAttr
	Port verbs.PortAttr // port 1
	GIDs []verbs.GIDEntry

	QPs []QPSnapshot // by QPN
	// Groups are the verbs multicast groups (MGIDs with attached QPs), by MGID.
	Groups []GroupSnapshot
	// Memberships are the device's IP multicast memberships on its
	// interface, by address.
	Memberships []MembershipSnapshot
	// Attachments is the number of QP attachments over all groups
	// (compared with max_total_mcast_qp_attach).
	Attachments int
	// RecvSockets and SendSockets count the device's UDP 4791 receive
	// sockets and its send sockets (IPv4 and IPv6 counted separately).
	RecvSockets int
	SendSockets int

	Counters softverbs.Snapshot
}

// QPSnapshot is the view of one QP of a device.
type QPSnapshot struct {
	QPN   uint32
	State verbs.QPState
	QKey  uint32
	Port  uint8
	// BlockSelfMcastLB reports a QP created with CreateBlockSelfMcastLB.
	BlockSelfMcastLB bool
	// Groups are the MGIDs the QP is attached to, in attach order.
	Groups []verbs.GID
	// SrcPort is the UDP source port of the QP's IPv4 datagrams.
	SrcPort  uint16
	Counters softverbs.Snapshot
}

// GroupSnapshot is a verbs multicast group of a device: an MGID and the
// QPs attached to it, in attach order (the order of delivery).
type GroupSnapshot struct {
	MGID verbs.GID
	QPNs []uint32
	// Membership is the IP group whose membership the group holds (the
	// MGID's address), invalid when the MGID is not an IP multicast
	// address.
	Membership netip.Addr
}

// MembershipSnapshot is one IP multicast membership of a device.
type MembershipSnapshot struct {
	Group netip.Addr
	// CMRefs counts the references the RDMA CM holds (IncGroup: one per
	// full-member join).
	CMRefs int
	// Attached reports that QPs are attached to the group's MGID, which
	// holds the membership too.
	Attached bool
	// Joined reports that the kernel membership is held on a socket (the
	// interface sent its IGMP/MLD report).
	Joined bool
}

// Snapshot returns a read-only view of the device: interface, attributes,
// port 1, GID table, QPs, multicast groups, memberships and counters.
func (d *Device) Snapshot() DeviceSnapshot {
	attr := d.Attr()
	port, _ := d.QueryPort(1) // refreshes the interface snapshot
	info := d.info.Load()
	s := DeviceSnapshot{
		Name:    d.name,
		Ifname:  info.name,
		Ifindex: d.ifindex,
		MAC:     slices.Clone(info.mac),
		Up:      info.up,
		Addrs:   slices.Clone(info.addrs),
		Attr:    attr,
		Port:    port,
		GIDs:    slices.Clone(info.gids),
	}

	for _, q := range d.core.QPs() {
		qs := QPSnapshot{
			QPN: q.QPN, State: q.State, QKey: q.QKey, Port: q.Port,
			BlockSelfMcastLB: q.BlockSelfMcastLB, Counters: q.Counters,
		}
		if tq, ok := q.Transport.(*qp); ok {
			qs.SrcPort = tq.SrcPort()
		}
		for _, a := range q.Groups {
			qs.Groups = append(qs.Groups, a.MGID)
		}
		s.QPs = append(s.QPs, qs)
	}
	for _, g := range d.core.Groups() {
		gs := GroupSnapshot{MGID: g.MGID, QPNs: g.QPNs}
		if m, ok := g.Transport.(*membership); ok {
			gs.Membership = m.addr
		}
		s.Groups = append(s.Groups, gs)
	}
	s.Attachments = d.core.Attachments()

	d.mu.Lock()
	for _, m := range d.mships {
		s.Memberships = append(s.Memberships, MembershipSnapshot{
			Group:    m.addr,
			CMRefs:   m.cmRefs,
			Attached: m.grp.Load() != nil,
			Joined:   m.sock != nil,
		})
	}
	s.RecvSockets = len(d.rsocks)
	for _, b := range d.blocks {
		s.SendSockets++
		if b.conn6 != nil {
			s.SendSockets++
		}
	}
	d.mu.Unlock()

	slices.SortFunc(s.Memberships, func(a, b MembershipSnapshot) int { return a.Group.Compare(b.Group) })
	s.Counters = d.Counters()
	return s
}
