package verbs_test

import (
	"errors"
	"net/netip"
	"sync"
	"syscall"
	"testing"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// owner is an address owner for the test: it claims addrs with its run's
// device, fails for fail, claims foreign with a device of no host, and
// says nothing of the rest.
// Registrations last for the process: the owners are registered once and
// find the run's devices in ownerDevs.
type owner struct {
	order   int
	addrs   map[netip.Addr]bool
	fail    netip.Addr
	foreign netip.Addr
}

var (
	registerOwners sync.Once
	ownerDevs      map[int]*verbs.Device // by order, set by each run
	asked          []int                 // the orders asked, in order
)

func (o owner) DeviceForAddr(h driver.Host, a netip.Addr) (driver.DeviceOps, error) {
	asked = append(asked, o.order)
	switch {
	case a == o.fail:
		return nil, syscall.ENODEV
	case a == o.foreign:
		return capDev{inner: "foreign"}, nil
	case o.addrs[a]:
		return ownerDevs[o.order].Ops(), nil
	}
	return nil, nil
}

func (o owner) AddrOrder() int { return o.order }

// capDev is a device backend offering a capability on its DeviceOps or on
// what it unwraps to.
type capDev struct {
	driver.DeviceOps
	inner any
}

func (c capDev) Unwrap() any { return c.inner }

type netdev struct{ driver.NetdevPort }

// TestAddrOwnersAndCapability: owners are asked in AddrOrder whatever the
// registration order, the first claim or failure ends the search, an
// address they do not claim goes on to the next owners; Capability finds a capability on
// the backend or behind its Unwrap, and nothing otherwise.
func TestAddrOwnersAndCapability(t *testing.T) {
	h := verbs.NewHost()
	defer h.Close()
	a1, a2, a3, a4, none := netip.MustParseAddr("192.0.2.71"), netip.MustParseAddr("192.0.2.72"),
		netip.MustParseAddr("192.0.2.73"), netip.MustParseAddr("192.0.2.75"), netip.MustParseAddr("192.0.2.74")
	late := h.RegisterDevice(capDev{inner: netdev{}})
	early := h.RegisterDevice(capDev{})
	ownerDevs, asked = map[int]*verbs.Device{1: early, 2: late}, nil
	registerOwners.Do(func() {
		// Registered late first: order, not registration, decides.
		driver.RegisterAddrOwner("test-owner-2", owner{order: 2, addrs: map[netip.Addr]bool{a1: true, a2: true, a3: true}})
		driver.RegisterAddrOwner("test-owner-1", owner{order: 1, addrs: map[netip.Addr]bool{a1: true}, fail: a2, foreign: a4})
	})
	// Orders 1 and 2 come before every provider's (the providers this
	// test binary imports are asked after them).
	ours := func() []int {
		out := asked
		asked = nil
		return out
	}
	if d, err := h.DeviceForAddr(a1); d != early || err != nil {
		t.Errorf("a1: %v %v, want the early owner's device", d, err)
	}
	if got := ours(); len(got) != 1 || got[0] != 1 {
		t.Errorf("a1 asked %v, want [1]", got)
	}
	if d, err := h.DeviceForAddr(a2); d != nil || !errors.Is(err, syscall.ENODEV) {
		t.Errorf("a2: %v %v, want the early owner's failure", d, err)
	}
	if got := ours(); len(got) != 1 {
		t.Errorf("a2 asked %v: a failure must end the search", got)
	}
	if d, err := h.DeviceForAddr(a3); d != late || err != nil {
		t.Errorf("a3: %v %v, want the late owner's device", d, err)
	}
	if got := ours(); len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Errorf("a3 asked %v, want [1 2]", got)
	}
	// A device the host does not list is no answer: ENODEV, and the
	// search ends.
	if d, err := h.DeviceForAddr(a4); d != nil || !errors.Is(err, syscall.ENODEV) {
		t.Errorf("a4: %v %v, want ENODEV for a device of no host", d, err)
	}
	if got := ours(); len(got) != 1 {
		t.Errorf("a4 asked %v, want [1]", got)
	}
	// Unclaimed by ours: the providers after them answer (rxe: not a
	// local address).
	if d, _ := h.DeviceForAddr(none); d != nil {
		t.Errorf("unclaimed: %v, want none", d)
	}
	if got := ours(); len(got) != 2 {
		t.Errorf("unclaimed asked %v, want [1 2]", got)
	}
	if _, ok := verbs.Capability[driver.NetdevPort](late); !ok {
		t.Error("the capability behind Unwrap is not found")
	}
	if _, ok := verbs.Capability[driver.NetdevPort](early); ok {
		t.Error("a capability found on a device without one")
	}
	if _, ok := verbs.Capability[interface{ Unwrap() any }](early); !ok {
		t.Error("a capability of the backend itself is not found")
	}
}
