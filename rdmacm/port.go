package rdmacm

import (
	"fmt"
	"net/netip"
	"syscall"

	"github.com/softrdma/softrdma/rdmacm/saclient"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// port is the link-layer specific half of the kernel's cma.c for one
// device (cma_iboe_join_multicast or cma_join_ib_multicast, the PS_IPOIB
// Q_Key, GID lookup, netdev events). portOf picks it from the device's
// link layer and capabilities (port_roce.go, port_ib.go); the CM never
// knows which provider is behind a device.
type port interface {
	// gidIndex returns the GID table index that stands for a local address.
	gidIndex(ctx *verbs.Context, a netip.Addr) (uint8, error)
	// ipoibQKey returns the Q_Key of the port's IPoIB broadcast group, the
	// default Q_Key of PS_IPOIB ids.
	ipoibQKey() (uint32, error)
	// join starts the join mc of the soft engine's id (id.mu is held, the
	// id checks passed).
	// The port queues the join's event on id, at once or when the join
	// completes; what it holds for the join it records in mc.held.
	join(e *softEngine, mc *mcJoin) error
	// leave releases what join took (id.mu is held). It returns when the
	// port is done with the join: no callback of the join runs afterwards.
	// What the leave still waits for (an SA Delete) is the returned wait,
	// called once id.mu is released; nil when there is nothing to wait for.
	leave(mc *mcJoin) (wait func() error)
	// subscribe delivers the port's netdev events to fn until cancel is
	// called; ports without netdev events return a nil cancel.
	subscribe(fn func(driver.NetdevEvent)) (cancel func())
	// route returns the id's route (id.mu is held, the id's address is
	// resolved): its paths at once, or a query to run without the lock
	// whose paths, or negative errno status, end the route resolution
	// (route.go).
	route(e *softEngine) (paths []PathRecord, query func() ([]PathRecord, int))
}

// portOf returns the port of an open device, as cma.c asks
// rdma_protocol_roce and rdma_cap_ib_mcast: a RoCE port on a network
// interface joins IP groups, an InfiniBand port that the host's SA client
// serves (a driver.MADPort) joins through the SA; any other device (a kernel device, whose ids the
// kernel's CM serves) gets a port that refuses.
func portOf(ctx *verbs.Context) port {
	dev := ctx.Device()
	pa, err := ctx.QueryPort(1)
	if err != nil {
		return noPort{dev.Name()}
	}
	switch pa.LinkLayer {
	case verbs.LinkLayerEthernet:
		if nd, ok := verbs.Capability[driver.NetdevPort](dev); ok {
			return rocePort{name: dev.Name(), nd: nd}
		}
	case verbs.LinkLayerInfiniBand:
		if sa, ok := saclient.For(dev); ok {
			return ibPort{name: dev.Name(), sa: sa}
		}
	}
	return noPort{dev.Name()}
}

// noPort is the port of a device that offers the CM no join of its own:
// a kernel device (the kernel's CM does the port's work for kernel ids:
// GID lookup, joins, netdev events), or a device whose provider offers
// neither capability. Everything but subscribe refuses.
type noPort struct{ name string }

func (p noPort) err(errno syscall.Errno) error {
	return fmt.Errorf("device %s offers the CM no multicast join (neither an IP interface nor an SA): %w", p.name, errno)
}
func (p noPort) gidIndex(*verbs.Context, netip.Addr) (uint8, error) { return 0, p.err(syscall.EINVAL) }
func (p noPort) ipoibQKey() (uint32, error)                         { return 0, p.err(syscall.ENODEV) }
func (p noPort) join(*softEngine, *mcJoin) error                    { return p.err(syscall.EINVAL) }
func (noPort) leave(*mcJoin) func() error                           { return nil }
func (noPort) subscribe(func(driver.NetdevEvent)) func()            { return nil }

// deviceOfAddr returns host h's device a local address belongs to (the
// first kind of device that claims it, see verbs.Host.DeviceForAddr).
func deviceOfAddr(h *verbs.Host, a netip.Addr) (*verbs.Device, error) {
	d, err := h.DeviceForAddr(a)
	if err != nil {
		return nil, err
	}
	if d == nil {
		return nil, errNoPort(a)
	}
	return d, nil
}
