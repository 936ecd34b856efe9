package rdmacm

import (
	"fmt"
	"net/netip"
	"sync"
	"syscall"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// cmDevice is librdmacm's per-device state (struct cma_device): one open
// context and one default PD per device, shared by every id of the process,
// and the port that does the link-layer specific work.
type cmDevice struct {
	port port
	ctx  *verbs.Context
	pd   *verbs.PD
	ib   bool // port 1's link layer is InfiniBand

	mu  sync.Mutex
	ids map[*ID]struct{}
	sub func() // cancels the netdev event subscription
}

// deviceForAddr returns the CM device of the device a local address
// belongs to (see deviceOfAddr).
func (cm *cmState) deviceForAddr(a netip.Addr) (*cmDevice, error) {
	vd, err := deviceOfAddr(cm.host, a)
	if err != nil {
		return nil, err
	}
	return cm.deviceFor(vd)
}

// deviceFor returns the CM device of verbs device vd, opening it (and
// picking its port, see portOf) on first use.
func (cm *cmState) deviceFor(vd *verbs.Device) (*cmDevice, error) {
	cm.devMu.Lock()
	defer cm.devMu.Unlock()
	if cd := cm.devs[vd]; cd != nil {
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
	cd := &cmDevice{port: portOf(ctx), ctx: ctx, pd: pd, ids: map[*ID]struct{}{}}
	if pa, err := ctx.QueryPort(1); err == nil {
		cd.ib = pa.LinkLayer == verbs.LinkLayerInfiniBand
	}
	cm.devs[vd] = cd
	return cd, nil
}

// errNoPort is the error for an address no port owns; it names the
// likely cause when the program registered no kind of device.
func errNoPort(a netip.Addr) error {
	if !verbs.AddrOwnersRegistered() {
		return fmt.Errorf("no device owns %v: the program imports no kind of device (import _ \"github.com/softrdma/softrdma/provider/all\"): %w", a, syscall.EADDRNOTAVAIL)
	}
	return fmt.Errorf("no device owns %v: %w", a, syscall.EADDRNOTAVAIL)
}

// name returns the device name.
func (cd *cmDevice) name() string { return cd.ctx.Device().Name() }

// attach registers an id as bound to the device; netdev events of the
// device reach the ids attached to it.
func (cd *cmDevice) attach(id *ID) {
	cd.mu.Lock()
	defer cd.mu.Unlock()
	cd.ids[id] = struct{}{}
	if cd.sub == nil {
		cd.sub = cd.port.subscribe(cd.netEvent)
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
func (cd *cmDevice) netEvent(ev driver.NetdevEvent) {
	cd.mu.Lock()
	ids := make([]*ID, 0, len(cd.ids))
	for id := range cd.ids {
		ids = append(ids, id)
	}
	cd.mu.Unlock()
	for _, id := range ids {
		id.mu.Lock()
		e := id.soft()
		id.mu.Unlock()
		if e == nil {
			continue // a kernel id: the kernel's CM reports its device's changes
		}
		switch ev.Kind {
		case driver.NetdevRemoved:
			e.deviceRemoved()
		case driver.AddrRemoved:
			e.addrRemoved(ev.Addr)
		}
	}
}

// gidIndex returns the GID table index of a local address.
func (cd *cmDevice) gidIndex(a netip.Addr) (uint8, error) {
	return cd.port.gidIndex(cd.ctx, a)
}
