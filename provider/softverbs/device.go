// Package softverbs is softrdma's software verbs core, shared by the
// software providers (provider/rxe, provider/ib): contexts, PDs, MRs, CQs,
// the UD QP state machine and work queues, address handles. It implements
// the verbs backend interfaces (driver.DeviceOps and the rest); a provider
// brings only its transport, through Driver.
package softverbs

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// Device is a software device: a provider's Driver under the verbs core
// (driver.DeviceOps, driver.CounterSource).
type Device struct {
	drv  Driver
	ctr  counters
	taps taps

	nextKey atomic.Uint32 // numbers the device's MR keys (the kernel's are per device too)

	mu        sync.Mutex // the tables below
	closed    bool
	qps       map[uint32]*qpObj
	groups    map[verbs.GID]*Group
	nattach   int
	attachSeq uint64      // orders a QP's attachments
	objs      [numObj]int // PDs, CQs, MRs, AHs, QPs, against the device's limits

	qpView    *cowMap[uint32, *qpObj]    // read by the receive path
	groupView *cowMap[verbs.GID, *Group] // read by the receive path
}

// New returns the verbs core of a provider's device.
func New(drv Driver) *Device {
	return &Device{
		drv: drv, ctr: newCounters(),
		qps: map[uint32]*qpObj{}, groups: map[verbs.GID]*Group{},
		qpView:    newCOWMap[uint32, *qpObj](func(n uint32) int { return int(n) }),
		groupView: newCOWMap[verbs.GID, *Group](func(g verbs.GID) int { return int(g[15]) }),
	}
}

// CoreOf returns the software core behind a verbs device, or nil when the
// device has another backend.
func CoreOf(d *verbs.Device) *Device {
	sd, _ := d.Ops().(*Device)
	return sd
}

// Driver returns the provider's side of the device.
func (d *Device) Driver() Driver { return d.drv }

// Unwrap returns the provider's driver, through which verbs.Capability
// finds what the provider offers beyond the verbs.
func (d *Device) Unwrap() any { return d.drv }

// objKind is a kind of verbs object the device limits.
type objKind int

const (
	objPD objKind = iota
	objCQ
	objMR
	objAH
	objQP
	numObj
)

// take reserves one object of a kind: ENOMEM beyond the device's limit
// (max_pd, max_cq, max_mr, max_ah, max_qp), ENODEV on a closed device.
func (d *Device) take(k objKind) error {
	a := d.drv.Attr()
	max := [numObj]int{a.MaxPD, a.MaxCQ, a.MaxMR, a.MaxAH, a.MaxQP}[k]
	name := [numObj]string{"PDs", "CQs", "MRs", "AHs", "QPs"}[k]
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("%s: %w", d.drv.Name(), syscall.ENODEV)
	}
	if err := limit(name, d.objs[k], max); err != nil {
		return err
	}
	d.objs[k]++
	return nil
}

// put releases an object taken with take.
func (d *Device) put(k objKind) {
	d.mu.Lock()
	d.objs[k]--
	d.mu.Unlock()
}

// Name returns the device name (driver.DeviceOps).
func (d *Device) Name() string { return d.drv.Name() }

// Attr returns the device capabilities (driver.DeviceOps).
func (d *Device) Attr() verbs.DeviceAttr { return d.drv.Attr() }

// Open opens the device (driver.DeviceOps).
func (d *Device) Open() (driver.ContextOps, error) { return &ctxObj{dev: d}, nil }

// ctxObj is an open software device (driver.ContextOps).
type ctxObj struct {
	dev *Device

	mu     sync.Mutex
	pds    int
	cqs    int
	closed bool
}

// QueryPort returns a port's attributes (driver.ContextOps).
func (c *ctxObj) QueryPort(port uint8) (verbs.PortAttr, error) {
	if port == 0 || port > c.dev.drv.Attr().PhysPortCnt {
		return verbs.PortAttr{}, fmt.Errorf("port %d: %w", port, syscall.EINVAL)
	}
	return c.dev.drv.QueryPort(port)
}

// QueryGIDTable returns a port's GID table (driver.ContextOps).
func (c *ctxObj) QueryGIDTable(port uint8) ([]verbs.GIDEntry, error) {
	if port == 0 || port > c.dev.drv.Attr().PhysPortCnt {
		return nil, fmt.Errorf("port %d: %w", port, syscall.EINVAL)
	}
	return c.dev.drv.GIDTable(port)
}

// queryGIDEntry returns the GID table entry at index.
func (c *ctxObj) queryGIDEntry(port uint8, index int) (verbs.GIDEntry, error) {
	tbl, err := c.QueryGIDTable(port)
	if err != nil {
		return verbs.GIDEntry{}, err
	}
	for _, e := range tbl {
		if e.Index == index {
			return e, nil
		}
	}
	return verbs.GIDEntry{}, fmt.Errorf("gid %d/%d: %w", port, index, syscall.ENODATA)
}

// Close closes the context (driver.ContextOps). It fails with EBUSY while
// protection domains or CQs of the context exist.
func (c *ctxObj) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return syscall.EINVAL
	}
	if c.pds > 0 || c.cqs > 0 {
		return syscall.EBUSY
	}
	c.closed = true
	return nil
}

func (c *ctxObj) use(pd, cq int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return syscall.EINVAL
	}
	c.pds += pd
	c.cqs += cq
	return nil
}

func (c *ctxObj) release(pd, cq int) {
	c.mu.Lock()
	c.pds -= pd
	c.cqs -= cq
	c.mu.Unlock()
}

// The software core implements every backend interface of verbs.
var (
	_ driver.DeviceOps  = (*Device)(nil)
	_ driver.ContextOps = (*ctxObj)(nil)
	_ driver.PDOps      = (*pdObj)(nil)
	_ driver.MROps      = (*mrObj)(nil)
	_ driver.AHOps      = (*ahObj)(nil)
	_ driver.CQOps      = (*cqObj)(nil)
	_ driver.QPOps      = (*qpObj)(nil)

	_ driver.CounterSource = (*Device)(nil)
)
