//go:build rdmacore && cgo

package rdmacore

// #include "shim.h"
import "C"

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"unsafe"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// kernel is the process's view of libibverbs' device list: the device of
// each name as ibv_get_device_list last returned it. A list that brought a
// new device is never freed, so its ibv_device pointers stay valid for the
// life of the process; a list that brought nothing new is freed at once. A
// device removed and added again under its name (rdma link delete/add)
// comes back as another ibv_device: it replaces the old one, whose
// contexts stay open on the device that is gone.
var kernel struct {
	sync.Mutex
	devs map[string]*device
}

// scan lists the kernel's RDMA devices (ibv_get_device_list), in the
// library's order.
func scan() []*device {
	kernel.Lock()
	defer kernel.Unlock()
	if kernel.devs == nil {
		kernel.devs = map[string]*device{}
	}
	var n C.int
	list := C.ibv_get_device_list(&n)
	if list == nil {
		return nil
	}
	keep := false
	out := make([]*device, 0, int(n))
	for _, d := range unsafe.Slice(list, int(n)) {
		name := C.GoString(C.ibv_get_device_name(d))
		kd := kernel.devs[name]
		if kd == nil || kd.c != d {
			kd = &device{c: d, name: name}
			kernel.devs[name] = kd
			keep = true
		}
		out = append(out, kd)
	}
	if !keep {
		C.ibv_free_device_list(list)
	}
	return out
}

// registry is a host's kernel devices, by name.
type registry struct {
	h      *verbs.Host
	mu     sync.Mutex
	devs   map[string]*verbs.Device // nil value: being registered
	hooked bool                     // r.close is among the host's closers
}

type registryKey struct{}

func registryOf(h *verbs.Host) *registry {
	return h.Value(registryKey{}, func() any {
		return &registry{h: h, devs: map[string]*verbs.Device{}}
	}).(*registry)
}

// discover registers the kernel devices the host does not have yet and
// returns the host's kernel devices in libibverbs' order.
func (r *registry) discover() []*verbs.Device {
	found := scan()
	var add []*device
	r.mu.Lock()
	if !r.hooked {
		r.hooked = true
		r.mu.Unlock()
		r.h.OnClose(r.close)
		r.mu.Lock()
	}
	// A device gone from the list, or replaced by a device of its name
	// added again, leaves the host.
	var gone []*verbs.Device
	for name, d := range r.devs {
		if d == nil {
			continue // being registered by a nested discovery
		}
		i := slices.IndexFunc(found, func(kd *device) bool { return kd.name == name })
		if i < 0 || d.Ops() != driver.DeviceOps(found[i]) {
			gone = append(gone, d)
			delete(r.devs, name)
		}
	}
	for _, kd := range found {
		if _, ok := r.devs[kd.name]; !ok {
			r.devs[kd.name] = nil // reserved: a nested discovery skips it
			add = append(add, kd)
		}
	}
	r.mu.Unlock()
	// RegisterDevice and UnregisterDevice run the host's watchers, which
	// may list devices again: no lock of ours is held.
	for _, d := range gone {
		r.h.UnregisterDevice(d)
	}
	for _, kd := range add {
		d := r.h.RegisterDevice(kd)
		r.mu.Lock()
		r.devs[kd.name] = d
		r.mu.Unlock()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*verbs.Device, 0, len(found))
	for _, kd := range found {
		if d := r.devs[kd.name]; d != nil {
			out = append(out, d)
		}
	}
	return out
}

// close unregisters the host's kernel devices (Host.Close); a later
// discovery registers them anew. Contexts opened on them stay open.
func (r *registry) close() {
	r.mu.Lock()
	devs := r.devs
	r.devs = map[string]*verbs.Device{}
	r.hooked = false
	r.mu.Unlock()
	for _, d := range devs {
		if d != nil {
			r.h.UnregisterDevice(d)
		}
	}
}

// provider registers the kernel's RDMA devices in a host's device list.
type provider struct{}

// Discover registers every kernel RDMA device that the host does not list
// yet (driver.Provider).
func (provider) Discover(h driver.Host) { registryOf(h.(*verbs.Host)).discover() }

func init() { driver.Register("rdmacore", provider{}) }

// On makes sure that every kernel RDMA device (every device of
// ibv_get_device_list) is registered in h, once per device name, as
// verbs.Host.DeviceList would, and returns h's kernel devices in
// libibverbs' order. Closing the host unregisters them (contexts opened on
// them stay open); the next discovery registers them again.
func On(h *verbs.Host) []*verbs.Device { return registryOf(h).discover() }

// IsKernelDevice reports whether d is a device of this backend: a kernel
// RDMA device driven through libibverbs (its name, d.Name(), is the
// kernel's, e.g. "rxe0" or "mlx5_0").
func IsKernelDevice(d *verbs.Device) bool {
	if d == nil {
		return false
	}
	_, ok := d.Ops().(*device)
	return ok
}

// OwnerOf returns h's kernel device whose GID table (any port) holds the
// IP address a, or nil: an IPv4 address (or its IPv4-mapped form) matches
// the GID ::ffff:a.b.c.d, an IPv6 address its own GID. A zone, when a has
// one, must name the GID's network interface. Devices that cannot be
// queried are passed over.
func OwnerOf(h *verbs.Host, a netip.Addr) *verbs.Device {
	if !a.IsValid() {
		return nil
	}
	zone := a.Zone()
	want := verbs.GID(a.WithZone("").As16()) // IPv4: ::ffff:a.b.c.d
	zoneIdx := 0
	if zone != "" {
		if ifi, err := net.InterfaceByName(zone); err == nil {
			zoneIdx = ifi.Index
		} else if ifi, err := net.InterfaceByIndex(atoi(zone)); err == nil {
			zoneIdx = ifi.Index
		} else {
			return nil
		}
	}
	for _, d := range On(h) {
		kd := d.Ops().(*device)
		tbl, err := kd.allGIDs()
		if err != nil {
			continue
		}
		for _, e := range tbl {
			if e.GID != want {
				continue
			}
			if zoneIdx != 0 && e.NetdevIdx != 0 && e.NetdevIdx != zoneIdx {
				continue
			}
			return d
		}
	}
	return nil
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// cerr is the errno of a failed C call that returns a pointer: the errno
// cgo caught, EIO when the library set none.
func cerr(err error) syscall.Errno {
	if e, ok := err.(syscall.Errno); ok && e != 0 {
		return e
	}
	return syscall.EIO
}
