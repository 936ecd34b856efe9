package rdmacm

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/rdmacm/internal/addr"
	"github.com/softrdma/softrdma/rdmacm/kernelcm"
	"github.com/softrdma/softrdma/verbs"
)

// This file is the CM's second stack: ids whose address a kernel RDMA
// device owns (an RDMA NIC, the kernel's Soft-RoCE) are librdmacm ids, and
// the kernel's CM does their work (bind, resolve, join, leave and their
// checks and errnos); what librdmacm itself does on top (the attach of the
// QP when a JOIN event is retrieved, the detach on leave, the waits for
// acks) stays in this package and is shared with softrdma's ids. The
// stack is the one registered with rdmacm/kernelcm (provider/rdmacore/cm,
// in builds with the rdmacore tag); without one every id is a softrdma
// id.

// Backend chooses the RDMA stack of a channel's ids.
type Backend uint8

// Backends.
const (
	// BackendAuto gives an id bound to an address that a kernel RDMA
	// device owns to the kernel's stack, and any other id to softrdma's
	// devices (the default).
	BackendAuto Backend = iota
	// BackendSoft uses softrdma's devices only.
	BackendSoft
	// BackendKernel uses the kernel's RDMA stack only, from CreateID on:
	// every call is librdmacm's. Builds without the rdmacore tag have no
	// kernel stack: CreateID fails with ENODEV.
	BackendKernel
)

// BackendEnv is the environment variable that sets the backend of new
// event channels: "auto", "soft" or "kernel".
const BackendEnv = "SOFTRDMA_BACKEND"

var backendNames = [...]string{BackendAuto: "auto", BackendSoft: "soft", BackendKernel: "kernel"}

// String returns "auto", "soft" or "kernel".
func (b Backend) String() string {
	if int(b) < len(backendNames) {
		return backendNames[b]
	}
	return fmt.Sprintf("Backend(%d)", uint8(b))
}

// ParseBackend parses a backend name ("" is auto).
func ParseBackend(s string) (Backend, error) {
	if s == "" {
		return BackendAuto, nil
	}
	for b, n := range backendNames {
		if s == n {
			return Backend(b), nil
		}
	}
	return 0, fmt.Errorf("backend %q: want auto, soft or kernel: %w", s, syscall.EINVAL)
}

// stackOverride, when set, stands for the registered kernel stack: the
// package's tests put a fake stack there (kernelcm.Register takes one stack
// per process, for good).
var stackOverride atomic.Pointer[kernelcm.Stack]

// kernelStack returns the kernel CM stack ids of the kernel use.
func kernelStack() kernelcm.Stack {
	if p := stackOverride.Load(); p != nil {
		return *p
	}
	return kernelcm.Kernel()
}

// KernelAvailable reports whether this program has the kernel's RDMA
// stack: a kernel CM registered with rdmacm/kernelcm (provider/rdmacore/cm,
// which needs the rdmacore build tag and cgo). Whether the machine has a
// kernel RDMA device is another matter: see verbs.DeviceList.
func KernelAvailable() bool { return kernelStack() != nil }

// envBackend is the backend BackendEnv sets.
func envBackend() (Backend, error) {
	b, err := ParseBackend(os.Getenv(BackendEnv))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", BackendEnv, err)
	}
	return b, nil
}

// SetBackend sets the backend of the ids created on the channel from now
// on; it overrides BackendEnv.
func (ch *EventChannel) SetBackend(b Backend) (err error) {
	defer wrapErr(&err, "rdma_set_backend", nil)
	if int(b) >= len(backendNames) {
		return fmt.Errorf("backend %d: %w", b, syscall.EINVAL)
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.backend = b
	return nil
}

// Backend returns the channel's backend.
func (ch *EventChannel) Backend() Backend {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.backend
}

// kernelChannel is a channel's part on the kernel's stack: the librdmacm
// channel of its kernel ids, made on first use, its reader's exit, and the
// tokens of its ids and joins. Its fields are guarded by the mu of the
// EventChannel that holds it (the home of its kernel ids).
type kernelChannel struct {
	c     kernelcm.Channel
	done  chan struct{}
	ids   map[uint64]*kernelEngine
	mcs   map[uint64]*mcJoin
	tok   uint64
	users int // live kernel ids whose librdmacm id is on c
}

// kernelChannelLocked returns the channel's kernel part, creating its
// librdmacm channel and its reader on first use (ch.mu is held).
func (ch *EventChannel) kernelChannelLocked() (*kernelChannel, error) {
	if ch.k != nil {
		return ch.k, nil
	}
	kernel := kernelStack()
	if kernel == nil {
		return nil, fmt.Errorf("no kernel RDMA stack in this program (import provider/rdmacore/cm, build tag rdmacore): %w", syscall.ENODEV)
	}
	kc, err := kernel.NewChannel()
	if err != nil {
		return nil, kernelErr("rdma_create_event_channel", err)
	}
	k := &kernelChannel{c: kc, done: make(chan struct{}), ids: map[uint64]*kernelEngine{}, mcs: map[uint64]*mcJoin{}}
	ch.k = k
	go ch.kernelReader(k)
	return k, nil
}

// kernelReader moves the events of the librdmacm channel into the
// channel's queue. An event of an id being destroyed or of a join being
// left is acked at once: it would have been dropped unread.
//
// The channel is the home of its kernel ids (the librdmacm channel their
// librdmacm ids live on): an id MigrateID moved keeps its librdmacm id
// here, and its events go to the queue of the id's channel of the moment.
func (ch *EventChannel) kernelReader(k *kernelChannel) {
	defer close(k.done)
	for {
		kev, err := k.c.Next()
		if err != nil {
			return
		}
		typ := EventType(kev.Type)
		ch.mu.Lock()
		e := k.ids[kev.IDToken]
		var mc *mcJoin
		if typ == EventMulticastJoin || typ == EventMulticastError {
			mc = k.mcs[kev.MCToken]
		}
		ch.mu.Unlock()
		if e == nil || (mc == nil && kev.MCToken != 0) {
			kev.Ack()
			continue
		}
		id := e.id
		// e.dead is set under the id's channel's lock, and a join's left
		// before its leave takes that lock to purge the join's events.
		target := id.lockCh()
		if target.closed || e.dead || (mc != nil && mc.left.Load()) {
			target.mu.Unlock()
			kev.Ack()
			continue
		}
		ev := &Event{ID: id, Event: typ, Status: kev.Status, mc: mc, kack: kev.Ack}
		if mc != nil {
			ev.Param = UDParam{PrivateData: mc.context, PrivateDataLen: kev.PrivateDataLen, AHAttr: kev.AHAttr, QPNum: kev.QPNum, QKey: kev.QKey}
		}
		target.enqueueLocked(ev)
		target.mu.Unlock()
	}
}

// close ends the reader and destroys the librdmacm channel (every id is
// destroyed, so no event is left to ack); nil: nothing to close.
func (k *kernelChannel) close() {
	if k == nil {
		return
	}
	k.c.Close()
	<-k.done
}

// kernelEngine is the engine of a kernel id: its librdmacm id on the
// librdmacm channel of its home channel (the channel it was created on;
// MigrateID does not move it), the id's token there, and the port the
// kernel bound it to. The kernel's CM makes the checks and gives the
// errnos; librdmacm's own part (the attach of the QP when a JOIN event is
// retrieved, the detach on leave, the waits for acks) stays in the front.
type kernelEngine struct {
	idAddr // what the kernel bound and resolved (refreshLocked)
	id     *ID
	k      kernelcm.ID
	tok    uint64
	port   uint8         // id.mu
	home   *EventChannel // the channel whose librdmacm channel has k
	// dead: the id is being destroyed, its events are acked on arrival
	// (guarded by the id's channel's mu, id.lockCh).
	dead bool
	// joins are the tokens of the id's joins (guarded by home.mu).
	joins map[*mcJoin]uint64
}

// toKernelLocked decides whether the idle id goes to the kernel's stack
// for local address a (nil: not known yet) and, if so, creates its
// librdmacm id and makes it the id's engine: at once for a channel whose
// backend is BackendKernel, at the first bind or resolve for BackendAuto
// (as librdmacm picks the device then) when a kernel device owns the
// address. It returns the id's engine (id.mu is held).
func (id *ID) toKernelLocked(a *sockaddr) (idEngine, error) {
	if _, kern := id.eng.(*kernelEngine); kern {
		return id.eng, nil
	}
	ch := id.lockCh()
	defer ch.mu.Unlock()
	switch ch.backend {
	case BackendSoft:
		return id.eng, nil
	case BackendAuto:
		if kernelStack() == nil || id.state != stateIdle || a == nil || !a.isIP() || a.ip.IsUnspecified() {
			return id.eng, nil
		}
		k, err := ch.kernelChannelLocked()
		if err != nil || k.c.OwnerOf(a.ip.WithZone("")) == "" {
			return id.eng, nil // no kernel RDMA device, or not its address
		}
	}
	kch, err := ch.kernelChannelLocked()
	if err != nil {
		return nil, err
	}
	kch.tok++
	k, err := kch.c.CreateID(kch.tok, uint16(id.ps))
	if err != nil {
		return nil, kernelErr("rdma_create_id", err)
	}
	// The options set so far are the librdmacm id's too, and the TOS
	// asked for stays what TOS reports.
	soft := id.soft()
	for _, o := range soft.opts {
		if err := k.SetOption(o.level, o.name, o.val); err != nil {
			k.Destroy()
			return nil, err
		}
	}
	e := &kernelEngine{id: id, k: k, tok: kch.tok, home: ch, joins: map[*mcJoin]uint64{}}
	e.tos, e.tosSet = soft.tos, soft.tosSet
	id.eng = e
	kch.ids[kch.tok] = e
	kch.users++
	return id.eng, nil
}

// engineForResolve returns the engine of an id about to resolve dst: an
// idle id goes to the kernel's stack when a kernel device owns its source
// (given, else the route's).
func (id *ID) engineForResolve(src *sockaddr, dst sockaddr) (idEngine, error) {
	id.mu.Lock()
	defer id.mu.Unlock()
	if _, kern := id.eng.(*kernelEngine); kern || id.state != stateIdle || !dst.isIP() {
		return id.eng, nil
	}
	var a sockaddr
	if src != nil && !src.ip.IsUnspecified() {
		a = *src
	} else {
		a = sockaddr{family: dst.family, ip: dst.ip}
		if !dst.ip.IsLoopback() {
			var err error
			if a.ip, err = addr.RouteSource(dst.ip.WithZone("")); err != nil {
				a = sockaddr{} // the softrdma engine reports the failed lookup
			}
		}
	}
	return id.toKernelLocked(&a)
}

// bindLocked binds a kernel id (rdma_bind_addr) and takes the address and
// device the kernel bound it to.
func (e *kernelEngine) bindLocked(id *ID, sa sockaddr) error {
	if err := e.k.Bind(toEngine(&sa)); err != nil {
		return err
	}
	id.state = stateAddrBound
	return e.refreshLocked(id)
}

// refreshLocked reads the addresses and device of a kernel id, after a
// bind or a resolution (id.mu is held).
func (e *kernelEngine) refreshLocked(id *ID) error {
	e.src, e.dst = fromEngine(e.k.Local()), fromEngine(e.k.Peer())
	e.port = e.k.PortNum()
	name := e.k.DeviceName()
	if name == "" || (e.dev != nil && e.dev.name() == name) {
		return nil
	}
	vd := id.ch().cm.host.DeviceByName(name)
	if vd == nil {
		return fmt.Errorf("kernel device %s is not in the device list: %w", name, syscall.ENODEV)
	}
	cd, err := id.ch().cm.deviceFor(vd)
	if err != nil {
		return err
	}
	if e.dev != nil {
		e.dev.detach(id)
	}
	e.dev = cd
	cd.attach(id)
	return nil
}

// resolveAddr is librdmacm's rdma_resolve_addr; ADDR_RESOLVED or
// ADDR_ERROR follows on the channel.
func (e *kernelEngine) resolveAddr(id *ID, src *sockaddr, dst sockaddr, timeout time.Duration) error {
	if err := e.k.ResolveAddr(toEngine(src), toEngine(&dst), timeout); err != nil {
		return err
	}
	id.mu.Lock()
	if id.state == stateIdle || id.state == stateAddrBound {
		id.state = stateAddrQuery
	}
	id.mu.Unlock()
	return id.complete(nil)
}

// resolveRoute is librdmacm's rdma_resolve_route.
func (e *kernelEngine) resolveRoute(id *ID, timeout time.Duration) error {
	if err := e.k.ResolveRoute(timeout); err != nil {
		return err
	}
	id.mu.Lock()
	if id.state == stateAddrResolved {
		id.state = stateRouteQuery
	}
	id.mu.Unlock()
	return id.complete(nil)
}

// retrieved follows the kernel's state and addresses when an address or
// route event is retrieved.
func (e *kernelEngine) retrieved(id *ID, ev *Event) {
	switch ev.Event {
	case EventRouteResolved, EventRouteError:
		id.mu.Lock()
		if id.state == stateRouteQuery {
			id.state = stateRouteResolved
			if ev.Event == EventRouteError {
				id.state = stateAddrResolved
			}
		}
		if ev.Event == EventRouteResolved {
			e.route = e.k.Route()
		}
		id.mu.Unlock()
	case EventAddrResolved, EventAddrChange:
		id.mu.Lock()
		if ev.Event == EventAddrResolved && id.state != stateDestroying {
			id.state = stateAddrResolved
		}
		if err := e.refreshLocked(id); err != nil && ev.Status == 0 {
			// The device is the kernel's but not in the device list.
			ev.Event, ev.Status, ev.Err = EventAddrError, -int(verbs.ErrnoOf(err)), err
		}
		id.mu.Unlock()
	}
}

// setOptionLocked passes the option to librdmacm as is.
func (e *kernelEngine) setOptionLocked(id *ID, level, name int, val []byte) error {
	if err := e.k.SetOption(level, name, val); err != nil {
		return err
	}
	if level == OptionID && name == OptionIDTOS && len(val) == 1 {
		e.tos, e.tosSet = val[0], true
	}
	return nil
}

func (e *kernelEngine) srcPort(*ID) uint16 { return e.k.SrcPort() }
func (e *kernelEngine) dstPort(*ID) uint16 { return e.k.DstPort() }
func (e *kernelEngine) portNum(*ID) uint8  { return e.port }

// initQPAttrLocked is the kernel's rdma_init_qp_attr; its Q_Key becomes
// the id's.
func (e *kernelEngine) initQPAttrLocked(id *ID) (verbs.QPAttr, verbs.QPAttrMask, error) {
	init, mask, err := e.k.InitQPAttr()
	if err != nil {
		return init, mask, err
	}
	e.qkey = init.QKey
	return init, mask, nil
}

// join is rdma_join_multicast(_ex) of a kernel id: the attributes go to
// librdmacm as given. The join is recorded first, so that its event finds
// it.
func (e *kernelEngine) join(id *ID, ex bool, attr JoinMCAttrEx, parsed sockaddr, saErr error, ctx any) error {
	var sa *sockaddr // nil: no address, librdmacm's to check
	if attr.Addr != nil {
		if saErr != nil {
			return saErr
		}
		sa = &parsed
	}
	mc := &mcJoin{id: id, context: ctx, sendOnly: ex && attr.CompMask&JoinMCAttrJoinFlags != 0 && attr.JoinFlags == MCJoinFlagSendOnlyFullMember}
	if sa != nil {
		mc.addr = *sa
	}
	ch := e.home
	ch.mu.Lock()
	ch.k.tok++
	tok := ch.k.tok
	ch.k.mcs[tok] = mc
	e.joins[mc] = tok
	ch.mu.Unlock()
	id.mu.Lock()
	id.mcs = append(id.mcs, mc)
	id.mu.Unlock()
	var err error
	if ex {
		err = e.k.JoinEx(attr.CompMask, attr.JoinFlags, toEngine(sa), tok)
	} else {
		err = e.k.Join(toEngine(sa), tok)
	}
	flags := MCJoinFlagFullMember
	if mc.sendOnly {
		flags = MCJoinFlagSendOnlyFullMember
	}
	observeJoin(id, mc.addr, flags, err)
	if err != nil {
		id.mu.Lock()
		id.mcs = slices.DeleteFunc(id.mcs, func(m *mcJoin) bool { return m == mc })
		id.mu.Unlock()
		ch.mu.Lock()
		delete(ch.k.mcs, tok)
		delete(e.joins, mc)
		ch.mu.Unlock()
		return err
	}
	return id.complete(nil)
}

// releaseJoinLocked: the kernel's CM holds a kernel id's join, and
// librdmacm's leave releases it (leave).
func (e *kernelEngine) releaseJoinLocked(*mcJoin) func() error { return nil }

// leave is rdma_leave_multicast of a kernel id, once the front detached
// the QP (librdmacm's id has no QP) and dropped the join's unread events:
// librdmacm leaves and waits for the acks of the events already
// retrieved. An address no join has is librdmacm's EADDRNOTAVAIL.
func (e *kernelEngine) leave(id *ID, mc *mcJoin, sa sockaddr) error {
	err := e.k.Leave(toEngine(&sa))
	if mc != nil {
		e.home.mu.Lock()
		delete(e.home.k.mcs, e.joins[mc])
		delete(e.joins, mc)
		e.home.mu.Unlock()
	}
	return err
}

// cancelLocked: librdmacm's resolutions end with the id.
func (e *kernelEngine) cancelLocked(*ID) func() { return nil }

// releaseLocked: librdmacm leaves the id's groups and waits for the acks
// when the returned wait destroys the id.
func (e *kernelEngine) releaseLocked(id *ID) func() error {
	return func() error { return e.destroy(id) }
}

// destroy ends a kernel id after Destroy's common part: its unread events
// are acked and dropped, later ones acked on arrival, and librdmacm
// destroys the id, waiting for the acks of retrieved events.
func (e *kernelEngine) destroy(id *ID) error {
	ch := id.lockCh()
	e.dead = true
	ch.purgeLocked(func(ev *Event) bool { return ev.ID == id })
	if p := id.ev.parked; p != nil {
		id.ackLocked(p)
		id.ev.parked = nil
	}
	ch.mu.Unlock()
	err := e.k.Destroy()
	home := e.home
	home.mu.Lock()
	k := home.k
	delete(k.ids, e.tok)
	for _, tok := range e.joins {
		delete(k.mcs, tok)
	}
	clear(e.joins)
	// The last kernel id of a channel closed while ids it had moved
	// lived on closes its librdmacm channel.
	k.users--
	var closing *kernelChannel
	if k.users == 0 && home.closed {
		closing, home.k = k, nil
	}
	home.mu.Unlock()
	closing.close()
	return err
}

// toEngine converts a socket address for an engine; nil for none. An
// IPv6 zone becomes the scope id.
func toEngine(sa *sockaddr) *kernelcm.Sockaddr {
	if sa == nil {
		return nil
	}
	if sa.family == afIB {
		return &kernelcm.Sockaddr{
			Family: kernelcm.AFIB, PKey: sa.ib.PKey, FlowInfo: sa.ib.FlowInfo, GID: sa.ib.GID,
			SID: sa.ib.SID, SIDMask: sa.ib.SIDMask, IBScope: sa.ib.ScopeID,
		}
	}
	s := &kernelcm.Sockaddr{Family: sa.family, IP: sa.ip.WithZone(""), Port: sa.port}
	if z := sa.ip.Zone(); z != "" && sa.family == syscall.AF_INET6 {
		if ifi, err := interfaceIndex(z); err == nil {
			s.Scope = uint32(ifi)
		}
	}
	return s
}

// fromEngine converts an engine's socket address; a scope id becomes the
// IPv6 zone.
func fromEngine(s kernelcm.Sockaddr) sockaddr {
	switch s.Family {
	case 0:
		return sockaddr{}
	case kernelcm.AFIB:
		return sockaddr{family: afIB, ib: IBAddr{PKey: s.PKey, FlowInfo: s.FlowInfo, GID: s.GID, SID: s.SID, SIDMask: s.SIDMask, ScopeID: s.IBScope}}
	}
	ip := s.IP
	if s.Family == syscall.AF_INET6 && s.Scope != 0 {
		if name, err := interfaceName(int(s.Scope)); err == nil {
			ip = ip.WithZone(name)
		}
	}
	return sockaddr{family: s.Family, ip: ip, port: s.Port}
}

// interfaceIndex is the scope id of an IPv6 zone (a name or a number).
func interfaceIndex(zone string) (int, error) {
	if ifi, err := net.InterfaceByName(zone); err == nil {
		return ifi.Index, nil
	}
	return strconv.Atoi(zone)
}

// interfaceName is the zone of an IPv6 scope id.
func interfaceName(index int) (string, error) {
	ifi, err := net.InterfaceByIndex(index)
	if err != nil {
		return "", err
	}
	return ifi.Name, nil
}

// kernelErr names what librdmacm's failure means: ENODEV from a channel or
// an id is a host without kernel RDMA devices (librdmacm found none).
func kernelErr(call string, err error) error {
	if errors.Is(err, syscall.ENODEV) {
		return fmt.Errorf("the kernel's stack: librdmacm's %s found no kernel RDMA device on this host (ibv_devices lists none; SOFTRDMA_BACKEND=soft uses softrdma's): %w", call, err)
	}
	return fmt.Errorf("the kernel's stack: librdmacm's %s: %w", call, err)
}
