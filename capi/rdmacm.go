//go:build capi

package main

/*
#include <stdlib.h>
#include <string.h>
#include <capi.h>
*/
import "C"

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
)

// eventChannel is the Go side of a C event channel: the rdmacm channel
// and the eventfd that is readable while events are queued (the fd a C
// program polls), kept so by a watcher goroutine.
type eventChannel struct {
	ch      *rdmacm.EventChannel
	fd      C.int
	mu      sync.Mutex
	raised  bool          // fd holds a count (readable)
	drained chan struct{} // the queue went empty: the watcher waits again
	stop    chan struct{} // closed by rdma_destroy_event_channel
	done    chan struct{} // the watcher has returned
	closed  bool
}

// watch raises the fd while events are queued.
func (ec *eventChannel) watch() {
	defer close(ec.done)
	for {
		select {
		case <-ec.ch.Ready():
		case <-ec.stop:
			return
		}
		ec.mu.Lock()
		if ec.closed {
			ec.mu.Unlock()
			return
		}
		if !ec.raised && ec.ch.Len() > 0 {
			C.sr_eventfd_signal(ec.fd)
			ec.raised = true
		}
		raised := ec.raised
		ec.mu.Unlock()
		if !raised {
			// Ready fired for an event another thread already took.
			select {
			case <-time.After(time.Millisecond):
			case <-ec.stop:
				return
			}
			continue
		}
		select {
		case <-ec.drained:
		case <-ec.stop:
			return
		}
	}
}

// lower clears the fd once the queue is empty.
func (ec *eventChannel) lower() {
	ec.mu.Lock()
	defer ec.mu.Unlock()
	if ec.raised && ec.ch.Len() == 0 {
		C.sr_eventfd_clear(ec.fd)
		ec.raised = false
		select {
		case ec.drained <- struct{}{}:
		default:
		}
	}
}

// refresh makes the fd readable exactly while events are queued, after a
// call that moved or dropped events without reading them (rdma_migrate_id,
// rdma_leave_multicast, rdma_destroy_id): the kernel's file is readable
// while it holds events, at once.
func (ec *eventChannel) refresh() {
	if ec == nil {
		return
	}
	ec.mu.Lock()
	defer ec.mu.Unlock()
	if ec.closed {
		return
	}
	switch n := ec.ch.Len(); {
	case n > 0 && !ec.raised:
		C.sr_eventfd_signal(ec.fd)
		ec.raised = true
	case n == 0 && ec.raised:
		C.sr_eventfd_clear(ec.fd)
		ec.raised = false
		select {
		case ec.drained <- struct{}{}:
		default:
		}
	}
}

// channelOf returns the Go side of a C event channel (nil for none).
func channelOf(ch *C.struct_rdma_event_channel) *eventChannel {
	if ch == nil {
		return nil
	}
	ec, ok := get[*eventChannel]((*C.struct_sr_channel)(unsafe.Pointer(ch)).h)
	if !ok {
		return nil
	}
	return ec
}

// cmID is the Go side of a C CM id.
type cmID struct {
	id *rdmacm.ID
	c  *C.struct_sr_id
	qp *cqp // the id's QP (id.QP()), if any

	mu      sync.Mutex          // sync's
	parked  *rdmacm.Event       // a synchronous id's last event, as id->event shows it
	parkedC *C.struct_sr_event  // its C copy (id->event), the library's: never acked by the program
	route   []rdmacm.PathRecord // what id->route.path_rec holds
}

var ids = struct {
	sync.Mutex
	m map[*rdmacm.ID]*cmID
}{m: map[*rdmacm.ID]*cmID{}}

func goID(id *C.struct_rdma_cm_id) (*cmID, bool) {
	return get[*cmID]((*C.struct_sr_id)(unsafe.Pointer(id)).h)
}

// sync copies the id's state into its C struct: the device context, port,
// addresses, as librdmacm refreshes them after a call or an event.
//
// As librdmacm: id->pd is the device's protection domain once the id has
// a device (ucma_get_device allocates one per device), or its QP's;
// id->route.path_rec the resolved route's paths; id->event a synchronous
// id's last event.
func (ci *cmID) sync() {
	ci.mu.Lock()
	defer ci.mu.Unlock()
	c := &ci.c.id
	if v := ci.id.Verbs(); v != nil {
		c.verbs = cContext(v)
		c.port_num = C.uint8_t(ci.id.PortNum())
	}
	if pd := ci.id.PD(); pd != nil {
		c.pd = cPD(pd)
	}
	if a := ci.id.SrcAddr(); a != nil {
		putAddr(C.sr_id_src(c), a)
	}
	if a := ci.id.DstAddr(); a != nil {
		putAddr(C.sr_id_dst(c), a)
	}
	ci.syncRoute()
	if ev := ci.id.Event(); ev != ci.parked {
		old := ci.parkedC
		ci.parked, ci.parkedC, c.event = ev, nil, nil
		if ev != nil {
			ci.parkedC = newCEvent(ci, ev)
			c.event = &ci.parkedC.ev
		}
		if old != nil {
			C.free(unsafe.Pointer(old))
		}
	}
}

// syncRoute copies the id's route into id->route.path_rec (malloc'd, as
// librdmacm's, freed with the id).
func (ci *cmID) syncRoute() {
	r := ci.id.Route()
	if slices.Equal(r, ci.route) {
		return
	}
	c := &ci.c.id
	if c.route.path_rec != nil {
		C.free(unsafe.Pointer(c.route.path_rec))
		c.route.path_rec, c.route.num_paths = nil, 0
	}
	ci.route = slices.Clone(r)
	if len(r) == 0 {
		return
	}
	recs := (*C.struct_ibv_sa_path_rec)(C.calloc(C.size_t(len(r)), C.sizeof_struct_ibv_sa_path_rec))
	for i := range r {
		p, g := &unsafe.Slice(recs, len(r))[i], &r[i]
		p.dgid = *(*C.union_ibv_gid)(unsafe.Pointer(&g.DGID))
		p.sgid = *(*C.union_ibv_gid)(unsafe.Pointer(&g.SGID))
		p.dlid, p.slid = C.__be16(htons(g.DLID)), C.__be16(htons(g.SLID))
		p.raw_traffic = cBool(g.RawTraffic)
		p.flow_label = C.__be32(htonl(g.FlowLabel))
		p.hop_limit, p.traffic_class = C.uint8_t(g.HopLimit), C.uint8_t(g.TrafficClass)
		p.reversible = cBool(g.Reversible)
		p.numb_path = C.uint8_t(g.NumbPath)
		p.pkey = C.__be16(htons(g.PKey))
		p.sl = C.uint8_t(g.SL)
		p.mtu_selector, p.mtu = C.uint8_t(g.MTUSelector), C.uint8_t(g.MTU)
		p.rate_selector, p.rate = C.uint8_t(g.RateSelector), C.uint8_t(g.Rate)
		p.packet_life_time_selector, p.packet_life_time = C.uint8_t(g.PacketLifeTimeSelector), C.uint8_t(g.PacketLifeTime)
		p.preference = C.uint8_t(g.Preference)
	}
	c.route.path_rec, c.route.num_paths = recs, C.int(len(r))
}

func cBool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// forget frees what sync allocated for the id's C struct.
func (ci *cmID) forget() {
	ci.mu.Lock()
	defer ci.mu.Unlock()
	c := &ci.c.id
	if c.route.path_rec != nil {
		C.free(unsafe.Pointer(c.route.path_rec))
		c.route.path_rec, c.route.num_paths = nil, 0
	}
	if ci.parkedC != nil {
		C.free(unsafe.Pointer(ci.parkedC))
		ci.parkedC, c.event = nil, nil
	}
}

//export srCreateEventChannel
func srCreateEventChannel(out **C.struct_rdma_event_channel) C.int {
	ch, err := rdmacm.CreateEventChannel()
	if err != nil {
		return errno(err)
	}
	fd, _, e := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC, 0)
	if e != 0 {
		ch.Close()
		return C.int(e)
	}
	ec := &eventChannel{ch: ch, fd: C.int(fd), drained: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	cc := (*C.struct_sr_channel)(C.calloc(1, C.sizeof_struct_sr_channel))
	cc.ch.fd = ec.fd
	cc.h = reg.put(ec)
	go ec.watch()
	*out = &cc.ch
	return 0
}

//export srDestroyEventChannel
func srDestroyEventChannel(ch *C.struct_rdma_event_channel) {
	cc := (*C.struct_sr_channel)(unsafe.Pointer(ch))
	ec, ok := get[*eventChannel](cc.h)
	if !ok {
		return
	}
	ec.mu.Lock()
	ec.closed = true
	ec.mu.Unlock()
	if err := ec.ch.Close(); err != nil {
		// Ids left (EBUSY): librdmacm frees the channel anyway; ours stays
		// for the ids.
		ec.mu.Lock()
		ec.closed = false
		ec.mu.Unlock()
		return
	}
	close(ec.stop)
	<-ec.done
	reg.del(cc.h)
	syscall.Close(int(ec.fd))
	C.free(unsafe.Pointer(cc))
}

//export srCreateID
func srCreateID(ch *C.struct_rdma_event_channel, ctx unsafe.Pointer, ps C.enum_rdma_port_space, out **C.struct_rdma_cm_id) C.int {
	var gch *rdmacm.EventChannel
	if ch != nil {
		ec, ok := get[*eventChannel]((*C.struct_sr_channel)(unsafe.Pointer(ch)).h)
		if !ok {
			return C.EINVAL
		}
		gch = ec.ch
	}
	id, err := rdmacm.CreateID(gch, nil, rdmacm.PortSpace(ps))
	if err != nil {
		return errno(err)
	}
	*out = newCmID(id, ch, ctx, ps)
	return 0
}

//export srDestroyID
func srDestroyID(id *C.struct_rdma_cm_id) C.int {
	ci, ok := goID(id)
	if !ok {
		return C.EINVAL
	}
	if ci.qp != nil {
		// The bounce buffer's MR would keep the id's PD.
		ci.qp.dropBounce()
	}
	ec := channelOf(id.channel)
	if err := ci.id.Destroy(); err != nil {
		return errno(err)
	}
	ec.refresh() // the id's unread events are gone
	ci.forgetQP()
	ci.forget()
	ids.Lock()
	delete(ids.m, ci.id)
	ids.Unlock()
	reg.del(ci.c.h)
	C.free(unsafe.Pointer(ci.c))
	return 0
}

//export srBindAddr
func srBindAddr(id *C.struct_rdma_cm_id, sa *C.struct_sockaddr) C.int {
	ci, ok := goID(id)
	if !ok {
		return C.EINVAL
	}
	a, err := goAddr(sa)
	if err != nil {
		return errno(err)
	}
	err = ci.id.BindAddr(a)
	ci.sync()
	return errno(err)
}

//export srResolveAddr
func srResolveAddr(id *C.struct_rdma_cm_id, src, dst *C.struct_sockaddr, timeoutMS C.int) C.int {
	ci, ok := goID(id)
	if !ok {
		return C.EINVAL
	}
	s, err := goAddr(src)
	if err != nil {
		return errno(err)
	}
	d, err := goAddr(dst)
	if err != nil {
		return errno(err)
	}
	err = ci.id.ResolveAddr(s, d, time.Duration(timeoutMS)*time.Millisecond)
	ci.sync()
	return errno(err)
}

//export srResolveRoute
func srResolveRoute(id *C.struct_rdma_cm_id, timeoutMS C.int) C.int {
	ci, ok := goID(id)
	if !ok {
		return C.EINVAL
	}
	err := ci.id.ResolveRoute(time.Duration(timeoutMS) * time.Millisecond)
	ci.sync()
	return errno(err)
}

//export srCreateQP
func srCreateQP(id *C.struct_rdma_cm_id, in *C.struct_sr_qp_init) C.int {
	ci, ok := goID(id)
	if !ok {
		return C.EINVAL
	}
	pd := in.pd
	if pd == nil {
		pd = id.pd
	}
	var gpd *verbs.PD
	if pd != nil {
		if gpd, ok = goPD(pd); !ok {
			return C.EINVAL
		}
	}
	attr, ok := goQPInit(in)
	if !ok {
		return C.EINVAL
	}
	if err := ci.id.CreateQPEx(gpd, &attr); err != nil {
		return errno(err)
	}
	gq := ci.id.QP()
	if gpd == nil {
		gpd = gq.PD()
		pd = cPD(gpd)
	}
	ci.sync()
	// The CQs the id made have a completion channel each and the id as
	// their context, as librdmacm's ucma_create_cqs makes them: the
	// inlines rdma_get_send_comp and rdma_get_recv_comp wait in
	// ibv_get_cq_event on id->send_cq_channel and id->recv_cq_channel.
	scq, rcq := in.send_cq, in.recv_cq
	if scq == nil {
		id.send_cq_channel = ci.cChannelOf(ci.id.SendCQChannel(), id.verbs)
		scq = cCQ(gq.SendCQ(), id.send_cq_channel, unsafe.Pointer(id))
		id.send_cq = scq
	}
	if rcq == nil {
		id.recv_cq_channel = ci.cChannelOf(ci.id.RecvCQChannel(), id.verbs)
		rcq = cCQ(gq.RecvCQ(), id.recv_cq_channel, unsafe.Pointer(id))
		id.recv_cq = rcq
	}
	q := newCQP(gq, pd, in.qp_context, scq, rcq, ci, attr.SQSigAll)
	ci.qp = q
	id.qp = C.sr_qp_base(q.c)
	putQPCap(in, gq.Query().Cap)
	return 0
}

// cChannelOf returns the C struct of a completion channel the id made
// (nil for nil, or when it cannot be made: the CQ then has no channel,
// and rdma_get_recv_comp fails with EINVAL instead of waiting).
func (ci *cmID) cChannelOf(ch *verbs.CompChannel, c *C.struct_ibv_context) *C.struct_ibv_comp_channel {
	if ch == nil {
		return nil
	}
	cch, err := newCCompChannel(ch, c)
	if err != nil {
		return nil
	}
	return cch
}

// forgetQP frees the C structs of the id's QP and of the CQs the id made,
// with their completion channels.
func (ci *cmID) forgetQP() {
	if ci.qp == nil {
		return
	}
	c := &ci.c.id
	for _, ch := range []**C.struct_ibv_comp_channel{&c.send_cq_channel, &c.recv_cq_channel} {
		if *ch != nil {
			freeCCompChannel(*ch)
			*ch = nil
		}
	}
	if c.send_cq != nil {
		if g, ok := goCQ(c.send_cq); ok {
			forgetCQ(g)
		}
	}
	if c.recv_cq != nil && c.recv_cq != c.send_cq {
		if g, ok := goCQ(c.recv_cq); ok {
			forgetCQ(g)
		}
	}
	c.send_cq, c.recv_cq, c.qp = nil, nil, nil
	ci.qp.free()
	ci.qp = nil
}

// destroyQP destroys the id's QP (rdma_destroy_qp, or ibv_destroy_qp on
// the id's QP).
func (ci *cmID) destroyQP() {
	if ci.qp != nil {
		ci.qp.dropBounce()
	}
	ci.id.DestroyQP()
	ci.forgetQP()
}

//export srDestroyQP
func srDestroyQP(id *C.struct_rdma_cm_id) {
	ci, ok := goID(id)
	if !ok {
		return
	}
	ci.destroyQP()
}

// cmEvent is the Go side of a C CM event.
type cmEvent struct {
	ev *rdmacm.Event
	pd unsafe.Pointer // malloc'd private data of a UD connection's event
}

//export srGetEvent
func srGetEvent(ch *C.struct_rdma_event_channel, nonblock C.int, out **C.struct_rdma_cm_event) C.int {
	ec, ok := get[*eventChannel]((*C.struct_sr_channel)(unsafe.Pointer(ch)).h)
	if !ok {
		return C.EINVAL
	}
	var ev *rdmacm.Event
	var err error
	if nonblock != 0 {
		ev, err = ec.ch.TryGetEvent()
	} else {
		ev, err = ec.ch.GetEvent(context.Background())
	}
	if err != nil {
		ec.mu.Lock()
		closed := ec.closed
		ec.mu.Unlock()
		if closed && errors.Is(err, syscall.EBADF) {
			// The channel was destroyed while this thread waited: the
			// kernel's read keeps the file and goes on waiting, and so
			// does this call (the program exits around it).
			select {}
		}
		return errno(err)
	}
	ec.lower()
	ids.Lock()
	ci := ids.m[ev.ID]
	lci := ids.m[ev.ListenID]
	ids.Unlock()
	if ci == nil && ev.Event == rdmacm.EventConnectRequest {
		ci = connRequestID(ev)
	}
	if ci == nil {
		ev.Ack()
		return C.EIO
	}
	ci.sync()
	c := newCEvent(ci, ev)
	ce := &cmEvent{ev: ev}
	switch ev.Event {
	case rdmacm.EventConnectRequest, rdmacm.EventEstablished, rdmacm.EventUnreachable:
		ce.pd = putUDConnEvent(c, ev, lci)
	}
	c.h = reg.put(ce)
	*out = &c.ev
	return 0
}

// newCEvent returns a malloc'd C copy of an event of the id.
func newCEvent(ci *cmID, ev *rdmacm.Event) *C.struct_sr_event {
	c := (*C.struct_sr_event)(C.calloc(1, C.sizeof_struct_sr_event))
	c.ev.id = &ci.c.id
	c.ev.event = uint32(ev.Event)
	c.ev.status = C.int(ev.Status)
	switch ev.Event {
	case rdmacm.EventMulticastJoin, rdmacm.EventMulticastError:
		ud := C.sr_event_ud(&c.ev)
		putAHAttr(&ud.ah_attr, &ev.Param.AHAttr)
		ud.qp_num = C.uint32_t(ev.Param.QPNum)
		ud.qkey = C.uint32_t(ev.Param.QKey)
		if p, ok := ev.Param.PrivateData.(unsafe.Pointer); ok {
			// librdmacm puts the join's context (C memory) in private_data.
			ud.private_data = p
		}
	}
	return c
}

//export srAckEvent
func srAckEvent(ev *C.struct_rdma_cm_event) C.int {
	c := (*C.struct_sr_event)(unsafe.Pointer(ev))
	ce, ok := get[*cmEvent](c.h)
	if !ok {
		return C.EINVAL
	}
	if err := ce.ev.Ack(); err != nil {
		return errno(err)
	}
	reg.del(c.h)
	if ce.pd != nil {
		C.free(ce.pd)
	}
	C.free(unsafe.Pointer(c))
	return 0
}

//export srJoin
func srJoin(id *C.struct_rdma_cm_id, sa *C.struct_sockaddr, compMask, flags C.uint32_t, ex C.int, ctx unsafe.Pointer) C.int {
	ci, ok := goID(id)
	if !ok {
		return C.EINVAL
	}
	var a net.Addr
	if compMask&C.RDMA_CM_JOIN_MC_ATTR_ADDRESS != 0 {
		if sa == nil {
			return C.EINVAL
		}
		var err error
		if a, err = goAddr(sa); err != nil {
			return errno(err)
		}
	}
	var err error
	if ex != 0 {
		err = ci.id.JoinMulticastEx(&rdmacm.JoinMCAttrEx{CompMask: uint32(compMask), JoinFlags: uint32(flags), Addr: a}, ctx)
	} else {
		err = ci.id.JoinMulticast(a, ctx)
	}
	ci.sync()
	return errno(err)
}

//export srLeave
func srLeave(id *C.struct_rdma_cm_id, sa *C.struct_sockaddr) C.int {
	ci, ok := goID(id)
	if !ok {
		return C.EINVAL
	}
	a, err := goAddr(sa)
	if err != nil {
		return errno(err)
	}
	err = ci.id.LeaveMulticast(a)
	channelOf(id.channel).refresh() // the group's unread events are gone
	ci.sync()                       // a parked JOIN event of the group is acked
	return errno(err)
}

//export srPort
func srPort(id *C.struct_rdma_cm_id, src C.int) C.__be16 {
	ci, ok := goID(id)
	if !ok {
		return 0
	}
	if src != 0 {
		return C.__be16(htons(ci.id.SrcPort()))
	}
	return C.__be16(htons(ci.id.DstPort()))
}

// cBytes copies b into malloc'd memory (nil for none).
func cBytes(b []byte) (unsafe.Pointer, C.size_t) {
	if len(b) == 0 {
		return nil, 0
	}
	return C.CBytes(b), C.size_t(len(b))
}

// cSockaddr returns a malloc'd copy of a (nil for none) and its length.
func cSockaddr(a net.Addr) (*C.struct_sockaddr, C.socklen_t) {
	if a == nil {
		return nil, 0
	}
	sa := (*C.struct_sockaddr)(C.malloc(C.sizeof_struct_sockaddr_storage))
	n := putAddr(sa, a)
	if n == 0 {
		C.free(unsafe.Pointer(sa))
		return nil, 0
	}
	return sa, n
}

//export srGetAddrInfo
func srGetAddrInfo(node, service *C.char, hints *C.struct_rdma_addrinfo, res **C.struct_rdma_addrinfo, cerr *C.int) C.int {
	var h *rdmacm.AddrInfo
	if hints != nil {
		h = &rdmacm.AddrInfo{
			Flags: int(hints.ai_flags), Family: int(hints.ai_family),
			QPType: verbs.QPType(hints.ai_qp_type), PortSpace: rdmacm.PortSpace(hints.ai_port_space),
		}
		if hints.ai_src_len != 0 {
			h.SrcAddr, _ = goAddr(hints.ai_src_addr)
		}
		if hints.ai_dst_len != 0 {
			h.DstAddr, _ = goAddr(hints.ai_dst_addr)
		}
	}
	var n, s string
	if node != nil {
		n = C.GoString(node)
	}
	if service != nil {
		s = C.GoString(service)
	}
	ai, err := rdmacm.GetAddrInfo(n, s, h)
	if err != nil {
		*cerr = errno(err)
		var eai rdmacm.AddrInfoError
		if errors.As(err, &eai) {
			return C.int(eai)
		}
		return -1
	}
	var head *C.struct_rdma_addrinfo
	tail := &head
	for ; ai != nil; ai = ai.Next {
		c := (*C.struct_rdma_addrinfo)(C.calloc(1, C.sizeof_struct_rdma_addrinfo))
		c.ai_flags = C.int(ai.Flags)
		c.ai_family = C.int(ai.Family)
		c.ai_qp_type = C.int(ai.QPType)
		c.ai_port_space = C.int(ai.PortSpace)
		c.ai_src_addr, c.ai_src_len = cSockaddr(ai.SrcAddr)
		c.ai_dst_addr, c.ai_dst_len = cSockaddr(ai.DstAddr)
		if ai.SrcCanonName != "" {
			c.ai_src_canonname = C.CString(ai.SrcCanonName)
		}
		if ai.DstCanonName != "" {
			c.ai_dst_canonname = C.CString(ai.DstCanonName)
		}
		c.ai_route, c.ai_route_len = cBytes(ai.Route)
		c.ai_connect, c.ai_connect_len = cBytes(ai.Connect)
		*tail = c
		tail = &c.ai_next
	}
	*res = head
	return 0
}
