// Package softverbs is softrdma's software verbs core, shared by the
// software providers (provider/rxe, provider/ib): contexts, PDs, MRs, CQs,
// the UD QP state machine and work queues, address handles. It implements
// the verbs backend interfaces (verbs.DeviceOps and the rest); a provider
// brings only its transport, through Driver.
package softverbs

import (
	"fmt"
	"sync"
	"syscall"

	"github.com/softrdma/softrdma/verbs"
)

// Device is a software device: a provider's Driver under the verbs core
// (verbs.DeviceOps).
type Device struct {
	drv Driver
}

// New returns the verbs backend of a provider's device.
func New(drv Driver) *Device { return &Device{drv: drv} }

// Register creates the verbs device of a provider's device and adds it to
// verbs' device list.
func Register(drv Driver) *verbs.Device { return verbs.RegisterDevice(New(drv)) }

// DriverOf returns the provider's Driver behind a verbs device, or nil when
// the device is not a software device.
func DriverOf(d *verbs.Device) Driver {
	if sd, ok := d.Ops().(*Device); ok {
		return sd.drv
	}
	return nil
}

// Name returns the device name (verbs.DeviceOps).
func (d *Device) Name() string { return d.drv.Name() }

// Attr returns the device capabilities (verbs.DeviceOps).
func (d *Device) Attr() verbs.DeviceAttr { return d.drv.Attr() }

// Open opens the device (verbs.DeviceOps).
func (d *Device) Open() (verbs.ContextOps, error) { return &Context{dev: d}, nil }

// Context is an open software device (verbs.ContextOps).
type Context struct {
	dev *Device

	mu     sync.Mutex
	pds    int
	cqs    int
	closed bool
}

// QueryPort returns a port's attributes (verbs.ContextOps).
func (c *Context) QueryPort(port uint8) (verbs.PortAttr, error) {
	if port == 0 || port > c.dev.drv.Attr().PhysPortCnt {
		return verbs.PortAttr{}, fmt.Errorf("verbs: query port %d: %w", port, syscall.EINVAL)
	}
	return c.dev.drv.QueryPort(port)
}

// QueryGIDTable returns a port's GID table (verbs.ContextOps).
func (c *Context) QueryGIDTable(port uint8) ([]verbs.GIDEntry, error) {
	if port == 0 || port > c.dev.drv.Attr().PhysPortCnt {
		return nil, fmt.Errorf("verbs: query gid table %d: %w", port, syscall.EINVAL)
	}
	return c.dev.drv.GIDTable(port)
}

// queryGIDEntry returns the GID table entry at index.
func (c *Context) queryGIDEntry(port uint8, index int) (verbs.GIDEntry, error) {
	tbl, err := c.QueryGIDTable(port)
	if err != nil {
		return verbs.GIDEntry{}, err
	}
	for _, e := range tbl {
		if e.Index == index {
			return e, nil
		}
	}
	return verbs.GIDEntry{}, fmt.Errorf("verbs: query gid %d/%d: %w", port, index, syscall.ENODATA)
}

// Close closes the context (verbs.ContextOps). It fails with EBUSY while
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

// The software core implements every backend interface of verbs.
var (
	_ verbs.DeviceOps  = (*Device)(nil)
	_ verbs.ContextOps = (*Context)(nil)
	_ verbs.PDOps      = (*PD)(nil)
	_ verbs.MROps      = (*MR)(nil)
	_ verbs.AHOps      = (*AH)(nil)
	_ verbs.CQOps      = (*CQ)(nil)
	_ verbs.QPOps      = (*QP)(nil)
)
