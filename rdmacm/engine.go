package rdmacm

import (
	"time"

	"github.com/softrdma/softrdma/verbs"
)

// idEngine does the CM work of an id: softEngine on softrdma's devices
// (soft.go), kernelEngine on the kernel's stack through the registered
// rdmacm/kernelcm (kernel.go). The front (id.go, mcast.go, ep.go,
// options.go, event.go) keeps what librdmacm itself does — ids, channels,
// events and acks, the QP and its attach on a JOIN event, the waits — and
// hands the rest to the id's engine without asking which one it is. An
// id's engine is softrdma's until toKernelLocked gives it to the kernel:
// at CreateID on a BackendKernel channel, at the first bind or resolve on
// a BackendAuto one when a kernel device owns the address.
//
// The engines own their state: *softEngine the device, addresses, route,
// port-space reservation, options, resolution and UD connection of a
// softrdma id; *kernelEngine the librdmacm id, its token and joins' tokens
// (the channel's kernelChannel has the librdmacm channel). Both hold an
// idAddr, which the front reads through addrs. The front parses an
// address once, at the API call; a join goes front → engine → port (the
// soft engine makes the id's checks and calls the port's join); a leave's
// lookup of the join is the front's (takeJoinLocked), the engine ending
// the leave.
//
// Methods named …Locked are called with id.mu held; the others without.
type idEngine interface {
	// bindLocked binds the idle id to sa (rdma_bind_addr).
	bindLocked(id *ID, sa sockaddr) error
	// resolveAddr resolves dst from src (nil: none given)
	// (rdma_resolve_addr); the result is an event.
	resolveAddr(id *ID, src *sockaddr, dst sockaddr, timeout time.Duration) error
	// resolveRoute is rdma_resolve_route.
	resolveRoute(id *ID, timeout time.Duration) error
	// retrieved runs when one of the id's events is retrieved, before the
	// front's own processing.
	retrieved(id *ID, ev *Event)
	// setOptionLocked is rdma_set_option with the option's C bytes.
	setOptionLocked(id *ID, level, name int, val []byte) error
	// srcPort, dstPort and portNum are rdma_get_src_port,
	// rdma_get_dst_port and the id's port_num (id.mu is held).
	srcPort(id *ID) uint16
	dstPort(id *ID) uint16
	portNum(id *ID) uint8
	// initQPAttrLocked is rdma_init_qp_attr for INIT.
	initQPAttrLocked(id *ID) (verbs.QPAttr, verbs.QPAttrMask, error)
	// join is rdma_join_multicast (ex false) or rdma_join_multicast_ex.
	// sa is attr.Addr as the front parsed it, once, and saErr the parse's
	// failure (a nil Addr fails too): the engine decides when a bad
	// address counts.
	join(id *ID, ex bool, attr JoinMCAttrEx, sa sockaddr, saErr error, ctx any) error
	// releaseJoinLocked releases what the engine holds for the join mc
	// being left (the front's leaveLocked); it returns when no callback
	// of the join runs any more. What it still waits for (an SA Delete)
	// is the returned wait, called once id.mu is released (nil: nothing).
	releaseJoinLocked(mc *mcJoin) (wait func() error)
	// leave ends rdma_leave_multicast of the address sa once the front
	// took the join (mc; nil: the id has none of sa), left it
	// (leaveLocked), waited and acked its parked event; id.mu is not
	// held.
	leave(id *ID, mc *mcJoin, sa sockaddr) error
	// releaseLocked ends the engine's part of a Destroy once the front
	// left the joins; what it still waits for is the returned wait,
	// called once id.mu is released (nil: nothing).
	releaseLocked(id *ID) (wait func() error)
	// cancelLocked stops, without an event, what the engine runs for the
	// id in the background (an address resolution) when it is destroyed;
	// the returned wait, called once id.mu is released, waits for its
	// end (nil: nothing runs).
	cancelLocked(id *ID) (wait func())
	// addrs returns the id's device, addresses, route, TOS and Q_Key as
	// the engine holds them (id.mu is held; the front reads them).
	addrs() *idAddr
}

// idAddr is what both engines hold of an id and the front reads: the
// device it is bound to, its addresses and route (rdma_cm_id's verbs and
// route), the TOS asked for and its Q_Key. Guarded by id.mu.
type idAddr struct {
	dev      *cmDevice
	src, dst sockaddr
	route    []PathRecord // the route's paths (Route)
	tos      uint8
	tosSet   bool
	qkey     uint32
}

func (a *idAddr) addrs() *idAddr { return a }

// engine returns the id's engine.
func (id *ID) engine() idEngine {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.eng
}

var (
	_ idEngine = (*softEngine)(nil)
	_ idEngine = (*kernelEngine)(nil)
)
