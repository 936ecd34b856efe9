package verbs

import "net/netip"

// What operator tools see of a device. They reach devices only through
// the optional interfaces below (and CounterSource), never through a
// backend's concrete types, so any backend can offer them.

// Inspector is an optional interface of a DeviceOps: a read-only view of
// the device, as ibv_devinfo and `rdma` show a kernel device.
type Inspector interface {
	// Inspect returns the device's state at one instant.
	Inspect() DeviceReport
}

// DeviceReport is a read-only view of a device.
type DeviceReport struct {
	// Kind names the backend: "rxe" (softrdma's RoCEv2 device), "ib" (a
	// port of an emulated InfiniBand subnet)…
	Kind string
	// Netdev is the network interface below a RoCE device (zero on IB).
	Netdev NetdevReport
	// Port and GIDs are port 1's attributes and GID table.
	Port PortAttr
	GIDs []GIDEntry
	// Usage counts what the device uses, in display order (e.g. "qps",
	// "mcast_groups", "mcast_attachments", "recv_sockets").
	Usage []UsageCount
	// QPs are the device's QPs, by QPN.
	QPs []QPReport
	// Groups are the multicast groups the device has state for, by MGID:
	// groups with attached QPs, IP memberships, SA memberships.
	Groups []GroupReport
}

// NetdevReport names the network interface of a RoCE device.
type NetdevReport struct {
	Name  string
	Index int
	MAC   string
}

// UsageCount is one usage figure of a device.
type UsageCount struct {
	Name  string
	Value int
}

// QPReport is the view of one QP.
type QPReport struct {
	QPN              uint32
	State            QPState
	QKey             uint32
	Port             uint8
	BlockSelfMcastLB bool
	// SrcPort is the UDP source port of the QP's datagrams (RoCEv2).
	SrcPort uint16
	// Groups are the QP's attachments, in attach order.
	Groups []McastAttachment
	// Counters are the QP's counters in the device's schema order (see
	// CounterSource); nil when the device keeps none per QP.
	Counters []uint64
}

// McastAttachment is one multicast attachment of a QP: an MGID and the
// MLID it was attached with (0 on RoCE).
type McastAttachment struct {
	MGID GID
	MLID uint16
}

// GroupReport is one multicast group of a device.
type GroupReport struct {
	MGID GID
	// QPNs are the attached QPs, in attach (delivery) order.
	QPNs []uint32
	// IPGroup is the IP group a RoCE device joins for the MGID (invalid
	// on IB); IPJoined says the interface holds its membership, CMRefs
	// how many RDMA CM joins reference it.
	IPGroup  netip.Addr
	IPJoined bool
	CMRefs   int
	// MLID and SAJoinState are the port's SA membership on IB (0: none).
	MLID        uint16
	SAJoinState uint8
}

// Inspect returns the device's report, with what the host's clients add
// (ClientInspector); false when its backend offers none.
func (d *Device) Inspect() (DeviceReport, bool) {
	in, ok := d.ops.(Inspector)
	if !ok {
		return DeviceReport{}, false
	}
	r := in.Inspect()
	for _, c := range registeredClients() {
		if ci, ok := c.(ClientInspector); ok {
			ci.InspectDevice(d, &r)
		}
	}
	return r, true
}

// DeviceEvent is a change of a device's network side that tools log.
type DeviceEvent struct {
	// Kind names the change, e.g. "NetdevRemoved", "AddrRemoved",
	// "AddrAdded", "ClientReregister".
	Kind string
	Addr netip.Addr // the address, for address changes
}

// EventSource is an optional interface of a DeviceOps: notifications of
// the device's changes.
type EventSource interface {
	// Subscribe calls fn for every change until cancel is called.
	Subscribe(fn func(DeviceEvent)) (cancel func())
}

// Subscribe calls fn for every change of the device until cancel is
// called; false when its backend reports none.
func (d *Device) Subscribe(fn func(DeviceEvent)) (cancel func(), ok bool) {
	es, ok := d.ops.(EventSource)
	if !ok {
		return nil, false
	}
	return es.Subscribe(fn), true
}
