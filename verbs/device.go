// Package verbs is softrdma's libibverbs: devices, protection domains,
// memory regions, completion queues, UD queue pairs, address handles and
// multicast attach/detach, with libibverbs' names and errno contract. It
// is what programs use.
//
// The objects are handles over a backend, which implements package
// verbs/driver (as a database/sql driver implements database/sql/driver):
// softrdma's software verbs core (provider/softverbs) under the RoCEv2
// device (provider/rxe) and the emulated InfiniBand port (provider/ib),
// or the kernel's devices (provider/rdmacore). A program picks the kinds
// of device it has by importing their packages (provider/all: every one).
//
// Errors carry the errno libibverbs would set: errors.Is(err, syscall.EINVAL).
package verbs

import (
	"fmt"
	"sync"
	"syscall"

	"github.com/softrdma/softrdma/verbs/driver"
)

// Device is an RDMA device (struct ibv_device).
type Device struct {
	ops  driver.DeviceOps
	host *Host

	mu         sync.Mutex
	closed     bool
	clientData map[any]any // Client values (client.go)
}

// RegisterDevice adds a backend's device to DefaultHost's device list and
// returns it.
func RegisterDevice(ops driver.DeviceOps) *Device { return defaultHost.RegisterDevice(ops) }

// UnregisterDevice removes a device from its host's device list. Open
// contexts keep working until they are closed.
func UnregisterDevice(dev *Device) { dev.host.UnregisterDevice(dev) }

// DeviceList returns DefaultHost's devices (ibv_get_device_list): the
// RoCEv2 device of every network interface, and the InfiniBand ports
// opened.
func DeviceList() []*Device { return defaultHost.DeviceList() }

// DeviceByName returns DefaultHost's device with the given name, or nil.
func DeviceByName(name string) *Device { return defaultHost.DeviceByName(name) }

// Host returns the host the device belongs to.
func (d *Device) Host() *Host { return d.host }

// Name returns the device name (ibv_get_device_name).
func (d *Device) Name() string { return d.ops.Name() }

// GUID returns the node GUID (ibv_get_device_guid).
func (d *Device) GUID() uint64 { return d.ops.Attr().NodeGUID }

// Ops returns the backend's side of the device.
func (d *Device) Ops() driver.DeviceOps { return d.ops }

// Open opens the device (ibv_open_device).
func (d *Device) Open() (_ *Context, err error) {
	defer wrap(&err, "ibv_open_device", d.Name())
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("device removed: %w", syscall.ENODEV)
	}
	ops, err := d.ops.Open()
	if err != nil {
		return nil, err
	}
	return &Context{dev: d, ops: ops}, nil
}

// Context is an open device (struct ibv_context).
type Context struct {
	dev   *Device
	ops   driver.ContextOps
	async asyncState // asynchronous events (async.go)
}

// Device returns the device the context was opened on.
func (c *Context) Device() *Device { return c.dev }

// Ops returns the backend's side of the context.
func (c *Context) Ops() driver.ContextOps { return c.ops }

// QueryDevice returns the device attributes (ibv_query_device).
func (c *Context) QueryDevice() DeviceAttr { return c.dev.ops.Attr() }

// QueryPort returns a port's attributes (ibv_query_port).
func (c *Context) QueryPort(port uint8) (PortAttr, error) {
	pa, err := c.ops.QueryPort(port)
	return pa, OpError("ibv_query_port", c.dev.Name(), err)
}

// QueryGID returns the GID at index of a port (ibv_query_gid).
func (c *Context) QueryGID(port uint8, index int) (GID, error) {
	e, err := c.QueryGIDEntry(port, index)
	return e.GID, err
}

// QueryGIDEntry returns the GID table entry at index (ibv_query_gid_ex).
func (c *Context) QueryGIDEntry(port uint8, index int) (GIDEntry, error) {
	tbl, err := c.ops.QueryGIDTable(port)
	if err != nil {
		return GIDEntry{}, OpError("ibv_query_gid", c.dev.Name(), err)
	}
	for _, e := range tbl {
		if e.Index == index {
			return e, nil
		}
	}
	return GIDEntry{}, OpError("ibv_query_gid", c.dev.Name(), fmt.Errorf("port %d index %d: %w", port, index, syscall.ENODATA))
}

// QueryGIDTable returns a port's GID table (ibv_query_gid_table).
func (c *Context) QueryGIDTable(port uint8) ([]GIDEntry, error) {
	tbl, err := c.ops.QueryGIDTable(port)
	return tbl, OpError("ibv_query_gid_table", c.dev.Name(), err)
}

// Close closes the context (ibv_close_device). It fails with EBUSY while
// protection domains or CQs of the context exist.
func (c *Context) Close() error {
	if err := c.ops.Close(); err != nil {
		return OpError("ibv_close_device", c.dev.Name(), err)
	}
	c.stopAsync()
	return nil
}

// AllocPD allocates a protection domain (ibv_alloc_pd).
func (c *Context) AllocPD() (*PD, error) {
	ops, err := c.ops.AllocPD()
	if err != nil {
		return nil, OpError("ibv_alloc_pd", c.dev.Name(), err)
	}
	return &PD{ctx: c, ops: ops}, nil
}

// CreateCQ creates a CQ with room for at least cqe completions and no
// completion channel (ibv_create_cq(ctx, cqe, NULL, NULL, 0)); CQ.Wait
// waits for its completions. CreateCQEx takes the other arguments.
func (c *Context) CreateCQ(cqe int) (*CQ, error) { return c.CreateCQEx(cqe, CQInit{}) }
