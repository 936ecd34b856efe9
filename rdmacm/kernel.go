package rdmacm

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/rdmacm/engine"
	"github.com/softrdma/softrdma/rdmacm/internal/addr"
)

// This file is the CM's second stack: ids whose address a kernel RDMA
// device owns (an RDMA NIC, the kernel's Soft-RoCE) are librdmacm ids, and
// the kernel's CM does their work (bind, resolve, join, leave and their
// checks and errnos); what librdmacm itself does on top (the attach of the
// QP when a JOIN event is retrieved, the detach on leave, the waits for
// acks) stays in this package and is shared with softrdma's ids. The
// stack is the engine registered with rdmacm/engine (provider/rdmacore/cm,
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

// KernelAvailable reports whether this program has the kernel's RDMA
// stack: an engine registered with rdmacm/engine (provider/rdmacore/cm,
// which needs the rdmacore build tag and cgo). Whether the machine has a
// kernel RDMA device is another matter: see verbs.DeviceList.
func KernelAvailable() bool { return engine.Kernel() != nil }

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

// kernelChannelLocked returns the channel's librdmacm channel, creating it
// and its reader on first use (ch.mu is held).
func (ch *EventChannel) kernelChannelLocked() (engine.Channel, error) {
	if ch.kc != nil {
		return ch.kc, nil
	}
	kernel := engine.Kernel()
	if kernel == nil {
		return nil, fmt.Errorf("no kernel RDMA stack in this program (import provider/rdmacore/cm, build tag rdmacore): %w", syscall.ENODEV)
	}
	kc, err := kernel.NewChannel()
	if err != nil {
		return nil, err
	}
	ch.kc, ch.kdone = kc, make(chan struct{})
	ch.kids, ch.kmcs = map[uint64]*ID{}, map[uint64]*mcJoin{}
	go ch.kernelReader(kc, ch.kdone)
	return kc, nil
}

// kernelReader moves the events of the librdmacm channel into the
// channel's queue. An event of an id being destroyed or of a join being
// left is acked at once: it would have been dropped unread.
//
// The channel is the home of its kernel ids (the librdmacm channel their
// librdmacm ids live on): an id MigrateID moved keeps its librdmacm id
// here, and its events go to the queue of the id's channel of the moment.
func (ch *EventChannel) kernelReader(kc engine.Channel, done chan struct{}) {
	defer close(done)
	for {
		kev, err := kc.Next()
		if err != nil {
			return
		}
		typ := EventType(kev.Type)
		ch.mu.Lock()
		id := ch.kids[kev.IDToken]
		var mc *mcJoin
		if typ == EventMulticastJoin || typ == EventMulticastError {
			mc = ch.kmcs[kev.MCToken]
		}
		ch.mu.Unlock()
		if id == nil || (mc == nil && kev.MCToken != 0) {
			kev.Ack()
			continue
		}
		// kdead and kleft are set under the id's channel's lock.
		target := id.lockCh()
		if target.closed || id.kdead || (mc != nil && mc.kleft) {
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

// closeKernel ends the reader and destroys the librdmacm channel (every
// id is destroyed, so no event is left to ack).
func (ch *EventChannel) closeKernel(kc engine.Channel, done chan struct{}) {
	if kc == nil {
		return
	}
	kc.Close()
	<-done
}

// toKernelLocked decides whether the idle id goes to the kernel's stack
// for local address a (nil: not known yet) and, if so, creates its
// librdmacm id. It reports whether the id is a kernel id (id.mu is held).
func (id *ID) toKernelLocked(a *sockaddr) (bool, error) {
	if id.k != nil {
		return true, nil
	}
	ch := id.lockCh()
	defer ch.mu.Unlock()
	switch ch.backend {
	case BackendSoft:
		return false, nil
	case BackendAuto:
		if engine.Kernel() == nil || id.state != stateIdle || a == nil || !a.isIP() || a.ip.IsUnspecified() {
			return false, nil
		}
		kc, err := ch.kernelChannelLocked()
		if err != nil || kc.OwnerOf(a.ip.WithZone("")) == "" {
			return false, nil // no kernel RDMA device, or not its address
		}
	}
	kc, err := ch.kernelChannelLocked()
	if err != nil {
		return false, err
	}
	ch.ktok++
	k, err := kc.CreateID(ch.ktok, uint16(id.ps))
	if err != nil {
		return false, err
	}
	// The options set so far are the librdmacm id's too.
	for _, o := range id.opts {
		if err := k.SetOption(o.level, o.name, o.val); err != nil {
			k.Destroy()
			return false, err
		}
	}
	id.k, id.ktok, id.khome = k, ch.ktok, ch
	ch.kids[id.ktok] = id
	ch.kusers++
	return true, nil
}

// kernelBindLocked binds a kernel id (rdma_bind_addr) and takes the
// address and device the kernel bound it to (id.mu is held).
func (id *ID) kernelBindLocked(sa *sockaddr) error {
	if err := id.k.Bind(toEngine(sa)); err != nil {
		return err
	}
	id.state = stateAddrBound
	return id.kernelRefreshLocked()
}

// kernelRefreshLocked reads the addresses and device of a kernel id, after
// a bind or a resolution (id.mu is held).
func (id *ID) kernelRefreshLocked() error {
	id.src, id.dst = fromEngine(id.k.Local()), fromEngine(id.k.Peer())
	id.kport = id.k.PortNum()
	name := id.k.DeviceName()
	if name == "" || (id.dev != nil && id.dev.name() == name) {
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
	if id.dev != nil {
		id.dev.detach(id)
	}
	id.dev = cd
	cd.attach(id)
	return nil
}

// kernelJoin is rdma_join_multicast(_ex) of a kernel id: the attributes go
// to librdmacm as given. The join is recorded first, so that its event
// finds it.
func (id *ID) kernelJoin(k engine.ID, ex bool, attr JoinMCAttrEx, ctx any) error {
	var sa *sockaddr
	if attr.Addr != nil {
		s, err := toSockaddr(attr.Addr)
		if err != nil {
			return err
		}
		sa = &s
	}
	mc := &mcJoin{id: id, context: ctx, sendOnly: ex && attr.CompMask&JoinMCAttrJoinFlags != 0 && attr.JoinFlags == MCJoinFlagSendOnlyFullMember}
	if sa != nil {
		mc.addr = *sa
	}
	ch := id.khome // the channel of the librdmacm id
	ch.mu.Lock()
	ch.ktok++
	mc.ktok = ch.ktok
	ch.kmcs[mc.ktok] = mc
	ch.mu.Unlock()
	id.mu.Lock()
	id.mcs = append(id.mcs, mc)
	id.mu.Unlock()
	var err error
	if ex {
		err = k.JoinEx(attr.CompMask, attr.JoinFlags, toEngine(sa), mc.ktok)
	} else {
		err = k.Join(toEngine(sa), mc.ktok)
	}
	flags := MCJoinFlagFullMember
	if mc.sendOnly {
		flags = MCJoinFlagSendOnlyFullMember
	}
	observeJoin(id, mc.addr, flags, err)
	if err != nil {
		id.mu.Lock()
		if i := indexOf(id.mcs, mc); i >= 0 {
			id.mcs = append(id.mcs[:i], id.mcs[i+1:]...)
		}
		id.mu.Unlock()
		ch.mu.Lock()
		delete(ch.kmcs, mc.ktok)
		ch.mu.Unlock()
		return err
	}
	return id.complete(nil)
}

func indexOf(mcs []*mcJoin, mc *mcJoin) int {
	for i, m := range mcs {
		if m == mc {
			return i
		}
	}
	return -1
}

// kernelLeave is rdma_leave_multicast of a kernel id: the QP is detached
// here (librdmacm's id has no QP), the join's unread events are acked and
// dropped, then librdmacm leaves and waits for the acks of the events
// already retrieved. An address no join has is librdmacm's EADDRNOTAVAIL.
func (id *ID) kernelLeave(k engine.ID, sa sockaddr) error {
	id.mu.Lock()
	var mc *mcJoin
	for i := len(id.mcs) - 1; i >= 0; i-- {
		if id.mcs[i].addr == sa {
			mc = id.mcs[i]
			id.mcs = append(id.mcs[:i], id.mcs[i+1:]...)
			break
		}
	}
	if mc != nil {
		id.leaveLocked(mc)
	}
	id.mu.Unlock()
	if mc != nil {
		ch := id.lockCh()
		if p := id.parked; p != nil && p.mc == mc {
			id.ackLocked(p)
			id.parked = nil
		}
		ch.mu.Unlock()
	}
	err := k.Leave(toEngine(&sa))
	if mc != nil {
		home := id.khome
		home.mu.Lock()
		delete(home.kmcs, mc.ktok)
		home.mu.Unlock()
	}
	return err
}

// kernelDestroy ends a kernel id after Destroy's common part: its unread
// events are acked and dropped, later ones acked on arrival, and
// librdmacm destroys the id, waiting for the acks of retrieved events.
func (id *ID) kernelDestroy() error {
	ch := id.lockCh()
	id.kdead = true
	ch.purgeLocked(func(ev *Event) bool { return ev.ID == id })
	if p := id.parked; p != nil {
		id.ackLocked(p)
		id.parked = nil
	}
	ch.mu.Unlock()
	err := id.k.Destroy()
	home := id.khome
	home.mu.Lock()
	delete(home.kids, id.ktok)
	for tok, mc := range home.kmcs {
		if mc.id == id {
			delete(home.kmcs, tok)
		}
	}
	// The last kernel id of a channel closed while ids it had moved
	// lived on closes its librdmacm channel.
	home.kusers--
	var kc engine.Channel
	var done chan struct{}
	if home.kusers == 0 && home.closed {
		kc, done, home.kc = home.kc, home.kdone, nil
	}
	home.mu.Unlock()
	home.closeKernel(kc, done)
	return err
}

// kernel returns the id's librdmacm id, nil for a softrdma id.
func (id *ID) kernel() engine.ID {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.k
}

// kernelResolve is rdma_resolve_addr of a kernel id, or of an idle id
// whose source (given, else the route's) a kernel device owns; done
// reports whether the id is a kernel id.
func (id *ID) kernelResolve(hasSrc bool, src, dst sockaddr, timeout time.Duration) (done bool, err error) {
	id.mu.Lock()
	var k engine.ID
	if id.k == nil && id.state == stateIdle && dst.isIP() {
		a := src
		if !hasSrc || src.ip.IsUnspecified() {
			a = sockaddr{family: dst.family, ip: dst.ip}
			if !dst.ip.IsLoopback() {
				if a.ip, err = addr.RouteSource(dst.ip.WithZone("")); err != nil {
					a = sockaddr{} // the softrdma path reports the failed lookup
				}
			}
		}
		if _, err := id.toKernelLocked(&a); err != nil {
			id.mu.Unlock()
			return true, err
		}
	}
	k = id.k
	id.mu.Unlock()
	if k == nil {
		return false, nil
	}
	var s *sockaddr
	if hasSrc {
		s = &src
	}
	if err := k.ResolveAddr(toEngine(s), toEngine(&dst), timeout); err != nil {
		return true, err
	}
	id.mu.Lock()
	if id.state == stateIdle || id.state == stateAddrBound {
		id.state = stateAddrQuery
	}
	id.mu.Unlock()
	return true, id.complete(nil)
}

// toEngine converts a socket address for an engine; nil for none. An
// IPv6 zone becomes the scope id.
func toEngine(sa *sockaddr) *engine.Sockaddr {
	if sa == nil {
		return nil
	}
	if sa.family == afIB {
		return &engine.Sockaddr{
			Family: engine.AFIB, PKey: sa.ib.PKey, FlowInfo: sa.ib.FlowInfo, GID: sa.ib.GID,
			SID: sa.ib.SID, SIDMask: sa.ib.SIDMask, IBScope: sa.ib.ScopeID,
		}
	}
	s := &engine.Sockaddr{Family: sa.family, IP: sa.ip.WithZone(""), Port: sa.port}
	if z := sa.ip.Zone(); z != "" && sa.family == syscall.AF_INET6 {
		if ifi, err := interfaceIndex(z); err == nil {
			s.Scope = uint32(ifi)
		}
	}
	return s
}

// fromEngine converts an engine's socket address; a scope id becomes the
// IPv6 zone.
func fromEngine(s engine.Sockaddr) sockaddr {
	switch s.Family {
	case 0:
		return sockaddr{}
	case engine.AFIB:
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
