package rxe

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
	"github.com/vishvananda/netlink"
)

// Registry is a host's RoCEv2 devices, one per interface index.
type Registry struct {
	host *verbs.Host
	mu   sync.Mutex
	devs map[int]*Device
}

type registryKey struct{}

// On returns the RoCEv2 devices of a host (the package-level functions use
// verbs.DefaultHost). Closing the host closes them.
func On(h *verbs.Host) *Registry {
	return h.Value(registryKey{}, func() any {
		r := &Registry{host: h, devs: map[int]*Device{}}
		h.OnClose(r.CloseAll)
		return r
	}).(*Registry)
}

func defaultRegistry() *Registry { return On(verbs.DefaultHost()) }

// provider makes every interface's device exist for a host's device list.
type provider struct{}

// Discover creates the device of every network interface and closes
// those whose interface is gone (driver.Provider), as the kernel's rxe
// unregisters its device with its netdev: a device list, or a wildcard
// listen that claims every device, never finds a device of an interface
// that no longer exists.
func (provider) Discover(h driver.Host) {
	ifs, err := net.Interfaces()
	if err != nil {
		return
	}
	r := On(h.(*verbs.Host))
	present := make(map[int]bool, len(ifs))
	for _, ifi := range ifs {
		present[ifi.Index] = true
		r.ForInterface(ifi.Index)
	}
	for _, d := range r.Devices() {
		if !present[d.ifindex] && interfaceGone(d.ifindex) {
			d.Close()
		}
	}
}

// interfaceGone reports whether the kernel says interface ifindex does
// not exist (asked again: one made since the list was read has a device
// too, and an error of another kind closes nothing).
func interfaceGone(ifindex int) bool {
	_, err := netlink.LinkByIndex(ifindex)
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

// DeviceForAddr returns the device of the interface that owns local
// address a (driver.AddrOwner); see Registry.ForAddr.
func (provider) DeviceForAddr(h driver.Host, a netip.Addr) (driver.DeviceOps, error) {
	d, err := On(h.(*verbs.Host)).ForAddr(a)
	if err != nil || d == nil {
		return nil, err
	}
	return d.core, nil
}

// AddrOrder puts the RoCEv2 devices after kinds whose devices have
// addresses of their own: a RoCEv2 device claims every address of its
// interface (driver.AddrOwner).
func (provider) AddrOrder() int { return 100 }

// A device is the RDMA CM's RoCE port of its interface.
var _ driver.NetdevPort = (*Device)(nil)

func init() {
	driver.Register("rxe", provider{})
	driver.RegisterAddrOwner("rxe", provider{})
}

// ForInterface returns the device of interface ifindex, creating (and
// registering with verbs) it on first use. An unknown interface gives an
// error wrapping ENODEV.
func ForInterface(ifindex int) (*Device, error) { return defaultRegistry().ForInterface(ifindex) }

// ForInterfaceWithOptions is ForInterface with multicast limits. When the
// device already exists and o is not the zero Options, its limits are
// changed as with SetLimits.
func ForInterfaceWithOptions(ifindex int, o Options) (*Device, error) {
	return defaultRegistry().ForInterfaceWithOptions(ifindex, o)
}

// ForName returns the device of the interface named ifname (e.g. "lo"),
// creating it on first use; ENODEV when there is no such interface.
func ForName(ifname string) (*Device, error) { return defaultRegistry().ForName(ifname) }

// ForAddr returns the device of the interface that owns the local address
// a; see Registry.ForAddr.
func ForAddr(a netip.Addr) (*Device, error) { return defaultRegistry().ForAddr(a) }

// Devices returns the devices of verbs.DefaultHost.
func Devices() []*Device { return defaultRegistry().Devices() }

// CloseAll closes every device of verbs.DefaultHost (for tests and
// shutdown).
func CloseAll() { defaultRegistry().CloseAll() }

// ForInterface returns the host's device of interface ifindex, creating
// it on first use; ENODEV for an unknown interface.
func (r *Registry) ForInterface(ifindex int) (*Device, error) {
	return r.ForInterfaceWithOptions(ifindex, Options{})
}

// ForInterfaceWithOptions is ForInterface with multicast limits.
func (r *Registry) ForInterfaceWithOptions(ifindex int, o Options) (*Device, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d := r.devs[ifindex]; d != nil {
		if o != (Options{}) {
			if err := d.SetLimits(o); err != nil {
				return nil, err
			}
		}
		return d, nil
	}
	if o.MaxMcastGrp < 0 || o.MaxMcastQPAttach < 0 || o.MaxTotalMcastQP < 0 {
		return nil, fmt.Errorf("rxe: limits %+v: %w", o, syscall.EINVAL)
	}
	d, err := newDevice(r, ifindex, o)
	if err != nil {
		return nil, err
	}
	r.devs[ifindex] = d
	return d, nil
}

// ForName returns the host's device of the interface named ifname.
func (r *Registry) ForName(ifname string) (*Device, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("rxe: interface %q: %v: %w", ifname, err, syscall.ENODEV)
	}
	return r.ForInterface(ifi.Index)
}

// ForAddr returns the host's device of the interface that owns the local
// address a (an IPv4-mapped address counts as IPv4; 127.0.0.0/8 and ::1 belong to
// the loopback interface; a zone selects the interface of a link-local
// address). EADDRNOTAVAIL when a is not a local address, ENODEV when the
// interfaces cannot be listed.
func (r *Registry) ForAddr(a netip.Addr) (*Device, error) {
	idx, err := ifindexOfAddr(a)
	if err != nil {
		return nil, err
	}
	return r.ForInterface(idx)
}

// ifindexOfAddr finds the interface holding local address a.
func ifindexOfAddr(a netip.Addr) (int, error) {
	if !a.IsValid() {
		return 0, fmt.Errorf("rxe: invalid address: %w", syscall.EADDRNOTAVAIL)
	}
	zone := a.Zone()
	a = a.Unmap().WithZone("")
	ifs, err := net.Interfaces()
	if err != nil {
		return 0, fmt.Errorf("rxe: list interfaces: %v: %w", err, syscall.ENODEV)
	}
	loIdx := 0
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagLoopback != 0 && loIdx == 0 {
			loIdx = ifi.Index
		}
		if zone != "" && ifi.Name != zone && fmt.Sprint(ifi.Index) != zone {
			continue
		}
		as, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, x := range as {
			ipn, ok := x.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			if ok && ip.Unmap() == a {
				return ifi.Index, nil
			}
		}
	}
	if a.IsLoopback() && loIdx != 0 {
		return loIdx, nil
	}
	return 0, fmt.Errorf("rxe: %v is not a local address: %w", a, syscall.EADDRNOTAVAIL)
}

// Devices returns the host's devices that exist.
func (r *Registry) Devices() []*Device {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Device, 0, len(r.devs))
	for _, d := range r.devs {
		out = append(out, d)
	}
	return out
}

// CloseAll closes every device of the host.
func (r *Registry) CloseAll() {
	for _, d := range r.Devices() {
		d.Close()
	}
}
