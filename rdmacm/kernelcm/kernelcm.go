// Package kernelcm is the seam between the rdmacm front and the kernel's
// RDMA CM, reached through rdma-core's librdmacm (provider/rdmacore/cm).
// The front keeps librdmacm's own part (event queues and acks, the QP
// attach on a JOIN event, the detach on leave); the kernel's CM does bind,
// resolve, join and leave with its checks and errnos. The package that
// implements it registers itself from init with Register, as a
// database/sql driver does; a build without one has no kernel stack.
package kernelcm

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/softrdma/softrdma/internal/registry"
	"github.com/softrdma/softrdma/verbs"
)

// Stack is the kernel's RDMA CM.
type Stack interface {
	// NewChannel creates an event channel (rdma_create_event_channel).
	NewChannel() (Channel, error)
}

// Channel is an event channel of the kernel's CM.
type Channel interface {
	// CreateID creates an id of port space ps whose events carry tok.
	CreateID(tok uint64, ps uint16) (ID, error)
	// OwnerOf returns the name of the kernel device that owns a local
	// address, or "".
	OwnerOf(a netip.Addr) string
	// Next waits for the next event; an error once the channel is closed.
	Next() (*Event, error)
	// Close ends Next and destroys the channel.
	Close() error
}

// ID is a CM id of the kernel's CM. Addresses are passed as given (nil: none), so
// that the kernel makes the checks.
type ID interface {
	Bind(sa *Sockaddr) error
	ResolveAddr(src, dst *Sockaddr, timeout time.Duration) error
	Join(sa *Sockaddr, tok uint64) error
	JoinEx(compMask, flags uint32, sa *Sockaddr, tok uint64) error
	Leave(sa *Sockaddr) error
	// SetOption is rdma_set_option with the option's C bytes.
	SetOption(level, name int, val []byte) error
	// ResolveRoute is rdma_resolve_route.
	ResolveRoute(timeout time.Duration) error
	// SrcPort and DstPort are rdma_get_src_port and rdma_get_dst_port, in
	// host order.
	SrcPort() uint16
	DstPort() uint16
	// InitQPAttr is rdma_init_qp_attr for the INIT state.
	InitQPAttr() (verbs.QPAttr, verbs.QPAttrMask, error)
	Local() Sockaddr
	Peer() Sockaddr
	// DeviceName is the device the id is bound to, or "".
	DeviceName() string
	// Route returns the paths of the id's route (id->route.path_rec).
	Route() []PathRecord
	PortNum() uint8
	Destroy() error
}

// Event is an event of a kernel CM channel.
type Event struct {
	Type           int // enum rdma_cm_event_type
	Status         int
	IDToken        uint64
	MCToken        uint64 // the join's token for MULTICAST_JOIN / _ERROR
	QPNum, QKey    uint32
	AHAttr         verbs.AHAttr
	PrivateDataLen uint8
	Ack            func() error // rdma_ack_cm_event
}

// Sockaddr is a socket address as librdmacm takes it: AF_INET, AF_INET6
// (IP, Port, Scope) or AF_IB (the sockaddr_ib fields).
type Sockaddr struct {
	Family int
	IP     netip.Addr // without zone: Scope carries it
	Port   uint16
	Scope  uint32
	// The AF_IB fields.
	PKey     uint16
	FlowInfo uint32
	GID      verbs.GID
	SID      uint64
	SIDMask  uint64
	IBScope  uint64
}

// AFIB is AF_IB, the InfiniBand address family.
const AFIB = 27

var registered = registry.New[Stack]("kernel CM stack")

// Register makes s, under name, the kernel stack of every new event
// channel. There is one: a second registration panics, as do an empty
// name and a nil s.
func Register(name string, s Stack) {
	if registered.Len() > 0 {
		panic(fmt.Sprintf("softrdma: Register kernel CM stack %q: %q is registered already", name, registered.Names()[0]))
	}
	registered.Register(name, s)
}

// Kernel returns the registered stack, nil when none is.
func Kernel() Stack {
	if all := registered.All(); len(all) > 0 {
		return all[0]
	}
	return nil
}

// PathRecord is one path of an id's route (librdmacm's struct
// ibv_sa_path_rec, id->route.path_rec, in host order).
type PathRecord struct {
	ServiceID  uint64
	DGID, SGID verbs.GID
	DLID, SLID uint16
	RawTraffic bool
	FlowLabel  uint32
	HopLimit   uint8
	// TrafficClass is the GRH traffic class.
	TrafficClass uint8
	Reversible   bool
	NumbPath     uint8
	PKey         uint16
	QoSClass     uint16
	SL           uint8
	// The selectors are IB_SA_GT 0, IB_SA_LT 1, IB_SA_EQ 2, best 3; MTU
	// and Rate are the IB enums (IBV_MTU_*, enum ibv_rate), PacketLifeTime
	// 4.096 µs × 2^v.
	MTUSelector, MTU                       uint8
	RateSelector, Rate                     uint8
	PacketLifeTimeSelector, PacketLifeTime uint8
	Preference                             uint8
}
