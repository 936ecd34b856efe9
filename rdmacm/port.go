package rdmacm

import (
	"net/netip"

	"github.com/softrdma/softrdma/verbs"
)

// port is what a kind of device gives the CM: the link-layer specific half
// of the kernel's cma.c (cma_iboe_join_multicast or cma_join_ib_multicast,
// the PS_IPOIB Q_Key, GID lookup, netdev events). Each kind of port lives in
// its own file (port_rxe.go, port_ib.go) and is the only code of rdmacm that
// knows a provider; everything else talks to this interface.
type port interface {
	// device returns the verbs device the port belongs to.
	device() *verbs.Device
	// gidIndex returns the GID table index that stands for a local address.
	gidIndex(ctx *verbs.Context, a netip.Addr) (uint8, error)
	// ipoibQKey returns the Q_Key of the port's IPoIB broadcast group, the
	// default Q_Key of PS_IPOIB ids.
	ipoibQKey() (uint32, error)
	// join starts the join mc of id (id.mu is held, the id checks passed).
	// The port queues the join's event on id, at once or when the join
	// completes; what it holds for the join it records in mc.held.
	join(id *ID, mc *mcJoin) error
	// leave releases what join took (id.mu is held). It returns when the
	// port is done with the join: no callback of the join runs afterwards.
	// What the leave still waits for (an SA Delete) is the returned wait,
	// called once id.mu is released; nil when there is nothing to wait for.
	leave(mc *mcJoin) (wait func() error)
	// subscribe delivers the port's netdev events to fn until cancel is
	// called; ports without netdev events return a nil cancel.
	subscribe(fn func(netEvent)) (cancel func())
}

// netEventKind is a change of a port's network device.
type netEventKind uint8

const (
	netdevRemoved netEventKind = iota // the interface went away
	addrRemoved                       // an address left the interface
)

// netEvent is a netdev change, as the kernel's cma_netdev_callback sees it.
type netEvent struct {
	kind netEventKind
	addr netip.Addr
}

// portFinders are asked in order for the port of a local address; the
// first that owns the address wins: an InfiniBand port whose IPoIB
// address it is, else the RoCEv2 device of the interface that owns it.
// A finder returns a nil port when the address is not its.
var portFinders = []func(*verbs.Host, netip.Addr) (port, error){ibPortFor, rxePortFor}

// portFor returns the port of host h a local address belongs to.
func portFor(h *verbs.Host, a netip.Addr) (port, error) {
	for _, find := range portFinders {
		p, err := find(h, a)
		if err != nil || p != nil {
			return p, err
		}
	}
	return nil, errNoPort(a)
}
