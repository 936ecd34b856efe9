package rxe

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
)

// registry holds the devices of this process, one per interface index.
var registry struct {
	sync.Mutex
	devs map[int]*Device
}

// ForInterface returns the device of interface ifindex, creating (and
// registering with verbs) it on first use. An unknown interface gives an
// error wrapping ENODEV.
func ForInterface(ifindex int) (*Device, error) {
	return ForInterfaceWithOptions(ifindex, Options{})
}

// ForInterfaceWithOptions is ForInterface with multicast limits. When the
// device already exists and o is not the zero Options, its limits are
// changed as with SetLimits.
func ForInterfaceWithOptions(ifindex int, o Options) (*Device, error) {
	registry.Lock()
	defer registry.Unlock()
	if d := registry.devs[ifindex]; d != nil {
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
	d, err := newDevice(ifindex, o)
	if err != nil {
		return nil, err
	}
	if registry.devs == nil {
		registry.devs = map[int]*Device{}
	}
	registry.devs[ifindex] = d
	return d, nil
}

// ForName returns the device of the interface named ifname (e.g. "lo"),
// creating it on first use; ENODEV when there is no such interface.
func ForName(ifname string) (*Device, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("rxe: interface %q: %v: %w", ifname, err, syscall.ENODEV)
	}
	return ForInterface(ifi.Index)
}

// ForAddr returns the device of the interface that owns the local address
// a (an IPv4-mapped address counts as IPv4; 127.0.0.0/8 and ::1 belong to
// the loopback interface; a zone selects the interface of a link-local
// address). EADDRNOTAVAIL when a is not a local address, ENODEV when the
// interfaces cannot be listed.
func ForAddr(a netip.Addr) (*Device, error) {
	idx, err := ifindexOfAddr(a)
	if err != nil {
		return nil, err
	}
	return ForInterface(idx)
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

// Devices returns the devices that exist in this process.
func Devices() []*Device {
	registry.Lock()
	defer registry.Unlock()
	out := make([]*Device, 0, len(registry.devs))
	for _, d := range registry.devs {
		out = append(out, d)
	}
	return out
}

// CloseAll closes every device of the process (for tests and shutdown).
func CloseAll() {
	for _, d := range Devices() {
		d.Close()
	}
}
