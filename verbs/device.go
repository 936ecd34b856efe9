// Package verbs is softrdma's libibverbs: devices, protection domains,
// memory regions, completion queues, UD queue pairs, address handles and
// multicast attach/detach, with libibverbs' names and errno contract.
//
// Devices come from providers (provider/rxe for RoCEv2); a provider
// registers each device it creates with RegisterDevice. verbs owns the
// generic objects and their rules; the provider only moves datagrams.
//
// Errors carry the errno libibverbs would set: errors.Is(err, syscall.EINVAL).
package verbs

import (
	"fmt"
	"sync"
	"syscall"
)

var registry struct {
	sync.Mutex
	devs []*Device
}

// Device is an RDMA device (struct ibv_device).
type Device struct {
	drv Driver

	mu     sync.Mutex
	closed bool
}

// RegisterDevice adds a provider's device to the device list and returns it.
func RegisterDevice(d Driver) *Device {
	dev := &Device{drv: d}
	registry.Lock()
	registry.devs = append(registry.devs, dev)
	registry.Unlock()
	return dev
}

// UnregisterDevice removes a device from the device list. Open contexts
// keep working with the driver until they are closed.
func UnregisterDevice(dev *Device) {
	registry.Lock()
	defer registry.Unlock()
	for i, d := range registry.devs {
		if d == dev {
			registry.devs = append(registry.devs[:i:i], registry.devs[i+1:]...)
			break
		}
	}
	dev.mu.Lock()
	dev.closed = true
	dev.mu.Unlock()
}

// DeviceList returns the devices that exist in this process
// (ibv_get_device_list). RoCEv2 devices are created on demand, one per
// network interface, by provider/rxe.
func DeviceList() []*Device {
	registry.Lock()
	defer registry.Unlock()
	return append([]*Device(nil), registry.devs...)
}

// DeviceByName returns the device with the given name, or nil.
func DeviceByName(name string) *Device {
	for _, d := range DeviceList() {
		if d.Name() == name {
			return d
		}
	}
	return nil
}

// Name returns the device name (ibv_get_device_name).
func (d *Device) Name() string { return d.drv.Name() }

// GUID returns the node GUID (ibv_get_device_guid).
func (d *Device) GUID() uint64 { return d.drv.Attr().NodeGUID }

// Driver returns the provider's side of the device.
func (d *Device) Driver() Driver { return d.drv }

// Open opens the device (ibv_open_device).
func (d *Device) Open() (*Context, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("verbs: open %s: %w", d.Name(), syscall.ENODEV)
	}
	return &Context{dev: d}, nil
}

// Context is an open device (struct ibv_context).
type Context struct {
	dev *Device

	mu     sync.Mutex
	pds    int
	cqs    int
	closed bool
}

// Device returns the device the context was opened on.
func (c *Context) Device() *Device { return c.dev }

// QueryDevice returns the device attributes (ibv_query_device).
func (c *Context) QueryDevice() DeviceAttr { return c.dev.drv.Attr() }

// QueryPort returns a port's attributes (ibv_query_port).
func (c *Context) QueryPort(port uint8) (PortAttr, error) {
	if port == 0 || port > c.dev.drv.Attr().PhysPortCnt {
		return PortAttr{}, fmt.Errorf("verbs: query port %d: %w", port, syscall.EINVAL)
	}
	return c.dev.drv.QueryPort(port)
}

// QueryGID returns the GID at index of a port (ibv_query_gid).
func (c *Context) QueryGID(port uint8, index int) (GID, error) {
	e, err := c.QueryGIDEntry(port, index)
	return e.GID, err
}

// QueryGIDEntry returns the GID table entry at index (ibv_query_gid_ex).
func (c *Context) QueryGIDEntry(port uint8, index int) (GIDEntry, error) {
	tbl, err := c.QueryGIDTable(port)
	if err != nil {
		return GIDEntry{}, err
	}
	for _, e := range tbl {
		if e.Index == index {
			return e, nil
		}
	}
	return GIDEntry{}, fmt.Errorf("verbs: query gid %d/%d: %w", port, index, syscall.ENODATA)
}

// QueryGIDTable returns a port's GID table (ibv_query_gid_table).
func (c *Context) QueryGIDTable(port uint8) ([]GIDEntry, error) {
	if port == 0 || port > c.dev.drv.Attr().PhysPortCnt {
		return nil, fmt.Errorf("verbs: query gid table %d: %w", port, syscall.EINVAL)
	}
	return c.dev.drv.GIDTable(port)
}

// Close closes the context (ibv_close_device). It fails with EBUSY while
// protection domains or CQs of the context exist.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("verbs: close device: %w", syscall.EINVAL)
	}
	if c.pds > 0 || c.cqs > 0 {
		return fmt.Errorf("verbs: close device: %w", syscall.EBUSY)
	}
	c.closed = true
	return nil
}

func (c *Context) use(pd, cq int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return syscall.EINVAL
	}
	c.pds += pd
	c.cqs += cq
	return nil
}

func (c *Context) release(pd, cq int) {
	c.mu.Lock()
	c.pds -= pd
	c.cqs -= cq
	c.mu.Unlock()
}
