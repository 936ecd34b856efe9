package verbs

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"syscall"

	"github.com/softrdma/softrdma/verbs/driver"
)

// This file is how the RDMA CM finds a device: by local address, asking
// the registered driver.AddrOwners, and by capability (driver.NetdevPort,
// driver.MADPort, driver.GSIPort), never by provider type.

// AddrOwnersRegistered reports whether any kind of device has registered
// a driver.AddrOwner: a program that imports no provider has none, and no
// address is any device's.
func AddrOwnersRegistered() bool {
	return len(driver.AddrOwners()) > 0
}

// DeviceForAddr returns the device local address a belongs to: the
// answer of the first registered driver.AddrOwner, in AddrOrder, that
// claims the address or fails (an owner that cannot open the device it
// would claim the address for stops the search; a device the host does
// not list is ENODEV). (nil, nil) when no owner claims it.
func (h *Host) DeviceForAddr(a netip.Addr) (*Device, error) {
	os := driver.AddrOwners()
	slices.SortStableFunc(os, func(a, b driver.AddrOwner) int { return cmp.Compare(a.AddrOrder(), b.AddrOrder()) })
	for _, o := range os {
		ops, err := o.DeviceForAddr(h, a)
		if err != nil {
			return nil, err
		}
		if ops != nil {
			if d := h.deviceOf(ops); d != nil {
				return d, nil
			}
			return nil, fmt.Errorf("%v: its owner's device is not one of the host's: %w", a, syscall.ENODEV)
		}
	}
	return nil, nil
}

// Capability returns what device d offers as T: its backend's
// driver.DeviceOps when that implements T, else the provider behind a
// backend that unwraps to it (softrdma's software core unwraps to its
// provider's driver). The CM asks for driver.NetdevPort and
// driver.GSIPort this way, the SA client (a Client) for driver.MADPort.
func Capability[T any](d *Device) (T, bool) {
	if c, ok := d.ops.(T); ok {
		return c, true
	}
	if u, ok := d.ops.(interface{ Unwrap() any }); ok {
		c, ok := u.Unwrap().(T)
		return c, ok
	}
	var zero T
	return zero, false
}
