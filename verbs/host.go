package verbs

import (
	"slices"
	"sync"

	"github.com/softrdma/softrdma/internal/envvars"
	"github.com/softrdma/softrdma/verbs/driver"
)

// Host is one program's RDMA world: its device list (what
// ibv_get_device_list returns) and the state that providers and the RDMA
// CM keep for it (the driver.Host its providers get). The package-level
// functions (DeviceList, RegisterDevice…) use DefaultHost; a test builds
// an isolated Host with NewHost and closes it, and nothing it did
// outlives it.
type Host struct {
	mu        sync.Mutex // devs, closers, watchers
	devs      []*Device
	closers   []func()
	watchers  map[int]func(*Device)
	nextWatch int

	valMu sync.Mutex // vals
	vals  map[any]any
}

// NewHost returns an empty host.
func NewHost() *Host { return &Host{vals: map[any]any{}} }

var defaultHost = NewHost()

var _ driver.Host = (*Host)(nil)

// DefaultHost returns the host behind the package-level functions.
func DefaultHost() *Host { return defaultHost }

// RegisterDevice adds a backend's device to the host's device list and
// returns it (a provider's side, the kernel's ib_register_device).
func (h *Host) RegisterDevice(ops driver.DeviceOps) *Device {
	dev := &Device{ops: ops, host: h}
	h.mu.Lock()
	h.devs = append(h.devs, dev)
	ws := make([]func(*Device), 0, len(h.watchers))
	for _, w := range h.watchers {
		ws = append(ws, w)
	}
	h.mu.Unlock()
	for _, c := range registeredClients() {
		c.Add(dev)
	}
	for _, w := range ws {
		w(dev)
	}
	return dev
}

// UnregisterDevice removes a device from the host's device list (a
// provider's side). Open contexts keep working until they are closed;
// Open fails with ENODEV.
func (h *Host) UnregisterDevice(dev *Device) {
	h.mu.Lock()
	present := slices.Contains(h.devs, dev)
	h.devs = slices.DeleteFunc(h.devs, func(d *Device) bool { return d == dev })
	h.mu.Unlock()
	dev.mu.Lock()
	dev.closed = true
	dev.mu.Unlock()
	if present {
		cs := registeredClients()
		for i := len(cs) - 1; i >= 0; i-- {
			cs[i].Remove(dev)
		}
	}
}

// DeviceList returns the host's devices (ibv_get_device_list): every
// provider first registers the devices it finds (the RoCEv2 device of
// every network interface, the InfiniBand ports opened). The first call
// of the process names on stderr any SOFTRDMA_ environment variable
// softrdma does not read (a misspelling would otherwise go unnoticed).
func (h *Host) DeviceList() []*Device {
	envvars.WarnOnce()
	for _, p := range driver.Providers() {
		p.Discover(h)
	}
	return h.Devices()
}

// deviceOf returns the host's device whose backend is ops, or nil.
func (h *Host) deviceOf(ops driver.DeviceOps) *Device {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, d := range h.devs {
		if d.ops == ops {
			return d
		}
	}
	return nil
}

// Devices returns the devices registered so far, without discovery.
func (h *Host) Devices() []*Device {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.devs)
}

// DeviceByName returns the device with the given name, or nil.
func (h *Host) DeviceByName(name string) *Device {
	for _, d := range h.DeviceList() {
		if d.Name() == name {
			return d
		}
	}
	return nil
}

// Value returns the host's value for key, made by mk on first use: the
// state a provider or the CM keeps per host (its registry of devices,
// bound ports…). Keys are package-private types, as with context values.
// mk may call OnClose and RegisterDevice, not Value.
func (h *Host) Value(key any, mk func() any) any {
	h.valMu.Lock()
	defer h.valMu.Unlock()
	v, ok := h.vals[key]
	if !ok {
		v = mk()
		h.vals[key] = v
	}
	return v
}

// OnClose registers fn to run when the host is closed (a provider closes
// its devices there), in reverse order of registration.
func (h *Host) OnClose(fn func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closers = append(h.closers, fn)
}

// Close releases everything the host's providers hold: devices, sockets,
// goroutines. The host can be used again afterwards (devices are made anew
// on demand); for DefaultHost this is what a test's cleanup calls.
func (h *Host) Close() {
	h.mu.Lock()
	cs := h.closers
	h.closers = nil
	h.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}
