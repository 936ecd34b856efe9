package driver

import (
	"net/netip"
	"time"
)

// This file is what the RDMA CM and the host's SA client ask of a device
// beyond the verbs, found by capability (verbs.Capability), never by
// provider type, as the kernel's cma.c asks rdma_protocol_roce and
// rdma_cap_ib_mcast of a port and ib_device_get_netdev of a RoCE port.
// A backend's DeviceOps offers them, or the value it unwraps to
// (Unwrap() any).

// NetdevPort is the capability of a RoCE port that sits on a network
// interface (the kernel's ib_device_get_netdev): the interface's IP
// multicast memberships, which the RDMA CM takes for full-member joins
// (the kernel's ip_mc_inc_group and ip_mc_dec_group), and its changes.
type NetdevPort interface {
	// IncGroup takes a reference on the interface's membership of an IP
	// multicast group; the first one joins (IGMP/MLD report).
	IncGroup(group netip.Addr) error
	// DecGroup drops a reference taken with IncGroup; the last one leaves.
	DecGroup(group netip.Addr) error
	// WatchNetdev delivers the interface's changes to fn until cancel is
	// called; cancel waits for a running fn (unless called from it).
	WatchNetdev(fn func(NetdevEvent)) (cancel func())
}

// NetdevEventKind says what happened to a port's network interface.
type NetdevEventKind int

// Netdev event kinds.
const (
	// NetdevRemoved: the interface was deleted.
	NetdevRemoved NetdevEventKind = iota + 1
	// AddrRemoved: an address was removed from the interface.
	AddrRemoved
	// AddrAdded: an address was added to the interface.
	AddrAdded
)

// String returns the kind's name.
func (k NetdevEventKind) String() string {
	switch k {
	case NetdevRemoved:
		return "NetdevRemoved"
	case AddrRemoved:
		return "AddrRemoved"
	case AddrAdded:
		return "AddrAdded"
	}
	return "unknown"
}

// NetdevEvent is a change of a port's network interface, for the RDMA CM
// (RDMA_CM_EVENT_ADDR_CHANGE / DEVICE_REMOVAL).
type NetdevEvent struct {
	Kind NetdevEventKind
	Addr netip.Addr // the address for AddrAdded / AddrRemoved
}

// MADPort is the capability of an InfiniBand port that carries the host's
// management datagrams to the subnet's SA and back on QP1 (what the
// kernel's ib_mad layer gives sa_query.c): the host's SA client, which
// joins multicast groups and asks for paths, finds the ports it serves by
// it. The port's events reach the client as the device's asynchronous
// events (AsyncEventSource).
type MADPort interface {
	// SendSA sends one 256-byte SA MAD to the SA (the SM's LID, QP1).
	SendSA(mad []byte) error
	// PortGID returns the port's GID 0 (subnet prefix and port GUID).
	PortGID() GID
	// SMLID returns the LID of the subnet manager, the only source of SA
	// answers the client takes.
	SMLID() uint16
	// SATimeout returns how long the SA client waits for one answer of
	// the port's SA and how often it resends a request (the port's
	// configuration).
	SATimeout() (timeout time.Duration, retries int)
	// RegisterMADAgent hands every MAD that arrives on the port's QP1
	// (with its source LID and QP) to fn, until unregister is called. fn
	// reports whether it took the MAD (an answer to one of its requests);
	// a MAD no agent takes is dropped and counted by the port. fn runs on
	// the port's receive path and must not block.
	RegisterMADAgent(fn func(slid uint16, srcQP uint32, mad []byte) bool) (unregister func())
}
