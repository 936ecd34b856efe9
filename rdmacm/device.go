package rdmacm

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"syscall"

	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/provider/rxe"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
	"github.com/vishvananda/netlink"
)

// cmDevice is librdmacm's per-device state (struct cma_device): one open
// context and one default PD per device, shared by every id of the process.
// Exactly one of rxe (a RoCEv2 port) and ib (an InfiniBand port) is set.
type cmDevice struct {
	rxe *rxe.Device
	ib  *ib.Device
	ctx *verbs.Context
	pd  *verbs.PD

	mu  sync.Mutex
	ids map[*ID]struct{}
	sub func() // cancels the netdev event subscription
}

var cmDevices struct {
	sync.Mutex
	m map[*verbs.Device]*cmDevice
}

// deviceForAddr returns the device a local address belongs to: the
// InfiniBand port whose IPoIB address it is (an open one, or one opened on
// the subnet that SOFTRDMA_SM names), else the RoCEv2 device of the
// interface that owns it.
func deviceForAddr(a netip.Addr) (*cmDevice, error) {
	p := ib.ForAddr(a)
	if p == nil {
		var err error
		if p, err = ib.OpenFromEnv(a); err != nil {
			return nil, err
		}
	}
	if p != nil {
		return cmDeviceOf(p.Verbs(), func(cd *cmDevice) { cd.ib = p })
	}
	d, err := rxe.ForAddr(a)
	if err != nil {
		return nil, err
	}
	return cmDeviceOf(d.Verbs(), func(cd *cmDevice) { cd.rxe = d })
}

func cmDeviceOf(vd *verbs.Device, set func(*cmDevice)) (*cmDevice, error) {
	cmDevices.Lock()
	defer cmDevices.Unlock()
	if cd := cmDevices.m[vd]; cd != nil {
		return cd, nil
	}
	ctx, err := vd.Open()
	if err != nil {
		return nil, err
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		ctx.Close()
		return nil, err
	}
	cd := &cmDevice{ctx: ctx, pd: pd, ids: map[*ID]struct{}{}}
	set(cd)
	if cmDevices.m == nil {
		cmDevices.m = map[*verbs.Device]*cmDevice{}
	}
	cmDevices.m[vd] = cd
	return cd, nil
}

// name returns the device name.
func (cd *cmDevice) name() string { return cd.ctx.Device().Name() }

// attach registers an id as bound to the device; netdev events of the
// device reach the ids attached to it.
func (cd *cmDevice) attach(id *ID) {
	cd.mu.Lock()
	defer cd.mu.Unlock()
	cd.ids[id] = struct{}{}
	if cd.sub == nil && cd.rxe != nil {
		cd.sub = cd.rxe.Subscribe(cd.netEvent)
	}
}

func (cd *cmDevice) detach(id *ID) {
	cd.mu.Lock()
	delete(cd.ids, id)
	var cancel func()
	if len(cd.ids) == 0 {
		cancel, cd.sub = cd.sub, nil
	}
	cd.mu.Unlock()
	// Outside cd.mu: cancelling waits for the watcher, which may be
	// waiting for cd.mu in netEvent.
	if cancel != nil {
		cancel()
	}
}

// netEvent turns netdev changes into DEVICE_REMOVAL / ADDR_CHANGE events,
// as the kernel's cma_netdev_callback and cma_process_remove do.
func (cd *cmDevice) netEvent(ev rxe.NetEvent) {
	cd.mu.Lock()
	ids := make([]*ID, 0, len(cd.ids))
	for id := range cd.ids {
		ids = append(ids, id)
	}
	cd.mu.Unlock()
	for _, id := range ids {
		switch ev.Kind {
		case rxe.NetdevRemoved:
			id.deviceRemoved()
		case rxe.AddrRemoved:
			id.addrRemoved(ev.Addr)
		}
	}
}

// gidIndex returns the GID table index of a local address. An IB port's
// IPoIB address stands for its port GID, index 0.
func (cd *cmDevice) gidIndex(a netip.Addr) (uint8, error) {
	if cd.ib != nil {
		return 0, nil
	}
	tbl, err := cd.ctx.QueryGIDTable(1)
	if err != nil {
		return 0, err
	}
	g := wire.GIDFromAddr(a.Unmap())
	for _, e := range tbl {
		if e.GID == g {
			return uint8(e.Index), nil
		}
	}
	return 0, fmt.Errorf("rdmacm: %v is not a GID of %s: %w", a, cd.name(), syscall.EADDRNOTAVAIL)
}

// routeSource picks the interface and source address towards dst through
// the routing tables, as rdma_resolve_addr does without a source address.
func routeSource(dst netip.Addr) (netip.Addr, error) {
	routes, err := netlink.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		if err == nil {
			err = syscall.ENETUNREACH
		}
		var errno syscall.Errno
		if !errors.As(err, &errno) {
			err = fmt.Errorf("%v: %w", err, syscall.ENETUNREACH)
		}
		return netip.Addr{}, err
	}
	r := routes[0]
	if src, ok := netip.AddrFromSlice(r.Src); ok && src.IsValid() && !src.IsUnspecified() {
		return src.Unmap(), nil
	}
	link, err := netlink.LinkByIndex(r.LinkIndex)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%v: %w", err, syscall.ENODEV)
	}
	fam := netlink.FAMILY_V4
	if dst.Is6() && !dst.Is4In6() {
		fam = netlink.FAMILY_V6
	}
	addrs, err := netlink.AddrList(link, fam)
	if err != nil || len(addrs) == 0 {
		return netip.Addr{}, fmt.Errorf("no address on %s: %w", link.Attrs().Name, syscall.EADDRNOTAVAIL)
	}
	a, _ := netip.AddrFromSlice(addrs[0].IP)
	return a.Unmap(), nil
}
