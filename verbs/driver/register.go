package driver

import (
	"net/netip"

	"github.com/softrdma/softrdma/internal/registry"
)

// Host is a program's RDMA world as a provider sees it: the host whose
// device list a provider's devices join and that keeps the provider's
// state. *verbs.Host is its one implementation (driver cannot name verbs'
// types); a provider that registers devices asserts it back,
// h.(*verbs.Host), and calls its RegisterDevice and UnregisterDevice.
type Host interface {
	// Value returns the host's value for key, made by mk on first use:
	// the state a provider keeps per host. Keys are package-private
	// types, as with context values.
	Value(key any, mk func() any) any
	// OnClose registers fn to run when the host is closed (a provider
	// closes its devices there), in reverse order of registration.
	OnClose(fn func())
}

// Provider is a kind of device (a provider of rdma-core's providers/): it
// makes the devices of a host exist, as ibv_get_device_list finds the
// devices of every registered driver.
type Provider interface {
	// Discover registers the host's devices of this provider that do not
	// exist yet.
	Discover(h Host)
}

// AddrOwner is a kind of device that can say which of a host's devices a
// local IP address belongs to, making the device exist if needed (the
// kernel's cma_acquire_dev_by_src_ip), for the RDMA CM
// (verbs.Host.DeviceForAddr).
type AddrOwner interface {
	// DeviceForAddr returns the DeviceOps of h's device of local address
	// a, a device registered with h; (nil, nil) when the address is not
	// one of this kind's.
	DeviceForAddr(h Host, a netip.Addr) (DeviceOps, error)
	// AddrOrder orders the owners asked: lower first. A kind whose devices
	// have addresses of their own (an InfiniBand port's IPoIB address)
	// comes before one that claims every address of an interface.
	AddrOrder() int
}

var (
	providers  = registry.New[Provider]("provider")
	addrOwners = registry.New[AddrOwner]("address owner")
)

// Register adds a provider to every host's device discovery under name
// (a provider package calls it from init, like rdma-core's
// PROVIDER_DRIVER). It panics when name is empty or taken, or p is nil.
func Register(name string, p Provider) { providers.Register(name, p) }

// RegisterAddrOwner adds a kind of device to every host's address lookup
// under name (a provider package calls it from init). It panics when name
// is empty or taken, or o is nil.
func RegisterAddrOwner(name string, o AddrOwner) { addrOwners.Register(name, o) }

// Providers returns the registered providers in registration order (what
// verbs.Host.DeviceList asks).
func Providers() []Provider { return providers.All() }

// AddrOwners returns the registered address owners in registration order
// (what verbs.Host.DeviceForAddr asks, in AddrOrder).
func AddrOwners() []AddrOwner { return addrOwners.All() }
