package rdmacm

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
	"github.com/softrdma/softrdma/wire"
)

// UD connections through the CM: Service ID Resolution (SIDR), as the
// kernel's cma.c and cm.c do it for a UD id (RDMA_PS_UDP, RDMA_PS_IPOIB)
// on a RoCE port. The active side's rdma_connect sends a SIDR_REQ to QP1
// of the destination (service ID RDMA_IP_PS << 16 | port, private data the
// RDMA CM's header and the caller's data) and resends it every sidrTimeout
// until a SIDR_REP answers, sidrRetries times, then reports UNREACHABLE
// -ETIMEDOUT (cma_resolve_ib_udp's CMA_CM_RESPONSE_TIMEOUT and
// CMA_MAX_CM_RETRIES). The passive side's listener gets
// CONNECT_REQUEST on a new id; rdma_accept answers SUCCESS with the QP's
// number and Q_Key, rdma_reject answers REJECT, and the active side gets
// ESTABLISHED or UNREACHABLE with the SIDR status (cma_sidr_rep_handler).
//
// QP1 is the device's (driver.GSIPort). A SIDR_REP is taken only when it
// comes from the address the request went to and carries the request's
// ID, transaction ID and service ID; a duplicate SIDR_REQ (same source
// and request ID) makes no second id: while unanswered it is dropped,
// once answered the answer is sent again.

// The SIDR timing, the kernel's: 1 << (CMA_CM_RESPONSE_TIMEOUT(20) - 8)
// ms per try and CMA_MAX_CM_RETRIES resends. Variables: tests shorten
// them.
var (
	sidrTimeout = 4096 * time.Millisecond
	sidrRetries = 15
)

// sidrKeep is how long an answered SIDR_REQ is remembered, so that its
// retransmissions get the same answer and no second id.
var sidrKeep = 2 * time.Minute

// Private data limits of UD connections (the SIDR messages' sizes, less
// the RDMA CM's header in a request).
const (
	// UDConnectPrivateDataMax is the largest private data of a UD
	// rdma_connect: IB_CM_SIDR_REQ_PRIVATE_DATA_SIZE less the CMA header.
	UDConnectPrivateDataMax = mad.SIDRReqPrivateDataLen - mad.CMAHeaderLen
	// UDAcceptPrivateDataMax is the largest private data of a UD
	// rdma_accept or rdma_reject: IB_CM_SIDR_REP_PRIVATE_DATA_SIZE.
	UDAcceptPrivateDataMax = mad.SIDRRepPrivateDataLen
)

// ConnParam is struct rdma_conn_param. A UD connection reads PrivateData
// and, in Accept, QPNum (the QP the answer names when the id has none);
// the other fields are for connected QPs, which softrdma does not offer.
type ConnParam struct {
	PrivateData        []byte
	ResponderResources uint8
	InitiatorDepth     uint8
	FlowControl        uint8
	RetryCount         uint8
	RNRRetryCount      uint8
	SRQ                bool
	QPNum              uint32
}

// sidrState is a host's SIDR state (cmState.sidr).
type sidrState struct {
	mu      sync.Mutex
	listens map[uint64][]listenEntry  // by service ID
	active  map[uint32]*sidrOut       // by request ID
	passive map[remoteReq]*sidrIn     // by the requester's address and request ID
	claims  map[claimKey]*sidrClaim   // what this process claims on a device
	gsis    map[*cmDevice]*sidrDevice // QP1 of a device, while used
}

// listenEntry is a listening id and what a request is matched against
// (fixed while it listens: no id lock is needed to read it).
type listenEntry struct {
	id   *ID
	ps   PortSpace
	addr netip.Addr // unspecified: any
	port uint16
	dev  *cmDevice // nil: any
}

// remoteReq names a SIDR_REQ: its datagram's source and its request ID.
type remoteReq struct {
	src   netip.Addr
	reqID uint32
}

type claimKey struct {
	cd  *cmDevice
	key string
}

type sidrClaim struct {
	refs    int
	release func()
}

// sidrDevice is a device's QP1 opened for the CM, with its users.
type sidrDevice struct {
	gsi  driver.GSI
	refs int
}

// sidrOut is an active id's outstanding SIDR_REQ.
type sidrOut struct {
	id    *ID
	cd    *cmDevice
	reqID uint32
	tid   uint64
	sid   uint64
	dst   netip.Addr // where it went: the only source of an answer taken
	mad   []byte
	tries int
	timer *time.Timer
	done  bool
}

// sidrIn is a SIDR_REQ received: its id until answered, then the answer.
type sidrIn struct {
	key    remoteReq
	cd     *cmDevice
	child  *ID // nil once answered
	tid    uint64
	sid    uint64
	hop    uint8
	tclass uint8
	rep    []byte // the answer sent
	at     time.Time
}

// sidrOf returns the host's SIDR state.
func (cm *cmState) sidrOf() *sidrState {
	cm.sidrOnce.Do(func() {
		cm.sidr = &sidrState{
			listens: map[uint64][]listenEntry{}, active: map[uint32]*sidrOut{}, passive: map[remoteReq]*sidrIn{},
			claims: map[claimKey]*sidrClaim{}, gsis: map[*cmDevice]*sidrDevice{},
		}
	})
	return cm.sidr
}

// gsiAgent is the CM's agent on one device's QP1.
type gsiAgent struct {
	cm *cmState
	cd *cmDevice
}

// acquireLocked opens (or takes another reference on) the QP1 of cd; s.mu
// is held.
func (s *sidrState) acquireLocked(cm *cmState, cd *cmDevice) (driver.GSI, error) {
	if g := s.gsis[cd]; g != nil {
		g.refs++
		return g.gsi, nil
	}
	gp, ok := verbs.Capability[driver.GSIPort](cd.ctx.Device())
	if !ok {
		return nil, fmt.Errorf("device %s has no QP1 for the CM's MADs (UD connections work on softrdma's RoCE devices): %w", cd.name(), syscall.EOPNOTSUPP)
	}
	gsi, err := gp.OpenGSI(gsiAgent{cm, cd})
	if err != nil {
		return nil, err
	}
	s.gsis[cd] = &sidrDevice{gsi: gsi, refs: 1}
	return gsi, nil
}

// releaseLocked drops a reference taken by acquireLocked; the last closes
// QP1 (after s.mu is released: the returned func, nil if none).
func (s *sidrState) releaseLocked(cd *cmDevice) func() {
	g := s.gsis[cd]
	if g == nil {
		return nil
	}
	if g.refs--; g.refs > 0 {
		return nil
	}
	delete(s.gsis, cd)
	return func() { g.gsi.Close() }
}

// claimLocked claims key on cd for this process (s.mu held).
func (s *sidrState) claimLocked(gsi driver.GSI, cd *cmDevice, key string) error {
	k := claimKey{cd, key}
	if c := s.claims[k]; c != nil {
		c.refs++
		return nil
	}
	rel, err := gsi.Claim(key)
	if err != nil {
		return err
	}
	s.claims[k] = &sidrClaim{refs: 1, release: rel}
	return nil
}

// unclaimLocked drops a claim (s.mu held).
func (s *sidrState) unclaimLocked(cd *cmDevice, key string) {
	k := claimKey{cd, key}
	c := s.claims[k]
	if c == nil {
		return
	}
	if c.refs--; c.refs == 0 {
		delete(s.claims, k)
		c.release()
	}
}

// serviceID is the id's service ID for port (cma_get_service_id).
func (id *ID) serviceID(port uint16) uint64 { return mad.ServiceID(uint16(id.ps), port) }

// udConnChecks are the checks of Listen, Connect, Accept and Reject that
// come before the id's state: softrdma's CM, a UD port space.
func (id *ID) udConnChecksLocked(op string) error {
	if id.soft() == nil {
		return fmt.Errorf("%s on a kernel id: %w", op, syscall.EOPNOTSUPP)
	}
	if id.qpType != verbs.QPTypeUD {
		return fmt.Errorf("%s: connected QPs (%v) are not offered, only UD port spaces (RDMA_PS_UDP, RDMA_PS_IPOIB): %w", op, id.ps, syscall.EOPNOTSUPP)
	}
	return nil
}

// Listen makes the id listen for UD connection requests (rdma_listen): a
// SIDR_REQ for the id's port and port space, to its bound address (or
// any, for a wildcard bind), becomes RDMA_CM_EVENT_CONNECT_REQUEST on a
// new id. An idle id is bound to the IPv4 wildcard address first, as
// librdmacm does. A connected port space (RDMA_PS_TCP, RDMA_PS_IB's RC)
// is EOPNOTSUPP; an id not bound (or bound and in another state) EINVAL.
// On softrdma's RoCE devices a port listened on by another process of
// the user is EADDRINUSE. backlog is accepted and not enforced.
func (id *ID) Listen(backlog int) (err error) {
	defer wrapErr(&err, "rdma_listen", nil)
	_ = backlog
	id.mu.Lock()
	if err := id.udConnChecksLocked("rdma_listen"); err != nil {
		id.mu.Unlock()
		return err
	}
	e := id.soft()
	if id.state == stateIdle {
		if err := id.eng.bindLocked(id, sockaddr{family: syscall.AF_INET, ip: netip.IPv4Unspecified()}); err != nil {
			id.mu.Unlock()
			return err
		}
	}
	if id.state != stateAddrBound {
		st := id.state
		id.mu.Unlock()
		return fmt.Errorf("id is %s, a listen wants ADDR_BOUND: %w", stateName(st), syscall.EINVAL)
	}
	cm := id.ch().cm
	devs := []*cmDevice{e.dev}
	if e.dev == nil {
		// A wildcard bind listens on every device of the host that has
		// QP1 (discovered now: a device that appears later is not
		// listened on).
		devs = devs[:0]
		for _, vd := range cm.host.DeviceList() {
			if _, ok := verbs.Capability[driver.GSIPort](vd); !ok {
				continue
			}
			if cd, err := cm.deviceFor(vd); err == nil {
				devs = append(devs, cd)
			}
		}
	}
	sid := id.serviceID(e.src.port)
	s := cm.sidrOf()
	s.mu.Lock()
	var closers []func()
	var done []*cmDevice
	for _, cd := range devs {
		gsi, err := s.acquireLocked(cm, cd)
		if err == nil {
			if err = s.claimLocked(gsi, cd, driver.GSIServiceKey(sid)); err != nil {
				closers = append(closers, s.releaseLocked(cd))
			}
		}
		if err != nil {
			for _, d := range done {
				s.unclaimLocked(d, driver.GSIServiceKey(sid))
				closers = append(closers, s.releaseLocked(d))
			}
			s.mu.Unlock()
			id.mu.Unlock()
			runAll(closers)
			return err
		}
		done = append(done, cd)
	}
	s.listens[sid] = append(s.listens[sid], listenEntry{id: id, ps: id.ps, addr: e.src.ip.WithZone(""), port: e.src.port, dev: e.dev})
	s.mu.Unlock()
	e.listenDevs = done
	id.state = stateListen
	id.mu.Unlock()
	return nil
}

func runAll(fns []func()) {
	for _, f := range fns {
		if f != nil {
			f()
		}
	}
}

// Connect starts a UD connection (rdma_connect): it sends a SIDR_REQ for
// the destination's port to the resolved destination and reports the
// answer as RDMA_CM_EVENT_ESTABLISHED, whose Param carries the remote QP
// number, Q_Key, address handle attributes and the answer's private data
// (UDAcceptPrivateDataMax bytes), or RDMA_CM_EVENT_UNREACHABLE with the
// SIDR status (2: rejected, 1: nobody listens) or, when no answer came
// after the kernel's resends, -ETIMEDOUT. The id's route must be resolved
// (else EINVAL); private data longer than UDConnectPrivateDataMax is
// EINVAL; a connected port space is EOPNOTSUPP. A synchronous id waits
// for the answer.
func (id *ID) Connect(param *ConnParam) (err error) {
	defer wrapErr(&err, "rdma_connect", id.DstAddr())
	var pdata []byte
	if param != nil {
		pdata = param.PrivateData
	}
	id.mu.Lock()
	if err := id.udConnChecksLocked("rdma_connect"); err != nil {
		id.mu.Unlock()
		return err
	}
	e := id.soft()
	if id.state != stateRouteResolved || e.dev == nil || !e.dst.isIP() {
		st := id.state
		id.mu.Unlock()
		return fmt.Errorf("id is %s, a connect wants ROUTE_RESOLVED: %w", stateName(st), syscall.EINVAL)
	}
	if len(pdata) > UDConnectPrivateDataMax {
		id.mu.Unlock()
		return fmt.Errorf("%d bytes of private data, at most %d: %w", len(pdata), UDConnectPrivateDataMax, syscall.EINVAL)
	}
	cm := id.ch().cm
	cd := e.dev
	s := cm.sidrOf()
	s.mu.Lock()
	gsi, err := s.acquireLocked(cm, cd)
	if err != nil {
		s.mu.Unlock()
		id.mu.Unlock()
		return err
	}
	var reqID uint32
	for try := 0; ; try++ {
		reqID = rand.Uint32()
		if reqID == 0 || s.active[reqID] != nil {
			continue
		}
		if err = s.claimLocked(gsi, cd, driver.GSIRequestKey(reqID)); err == nil {
			break
		}
		if try == 16 {
			c := s.releaseLocked(cd)
			s.mu.Unlock()
			id.mu.Unlock()
			runAll([]func(){c})
			return err
		}
	}
	sid := id.serviceID(e.dst.port)
	m := mad.NewCM(mad.AttrSIDRReq, rand.Uint64())
	r := mad.SIDRReq(m)
	r.SetRequestID(reqID)
	r.SetPKey(wire.DefaultPKey)
	r.SetServiceID(sid)
	h := mad.CMAHeader(r.PrivateData())
	h.SetVersion(mad.CMAVersion)
	if e.src.ip.Is4() {
		h.SetIPVersion(4)
	} else {
		h.SetIPVersion(6)
	}
	h.SetSrcPort(e.src.port)
	h.SetSrcAddr(e.src.ip.WithZone(""))
	h.SetDstAddr(e.dst.ip.WithZone(""))
	copy(r.PrivateData()[mad.CMAHeaderLen:], pdata)
	o := &sidrOut{id: id, cd: cd, reqID: reqID, tid: mad.MAD(m).TID(), sid: sid, dst: e.dst.ip.WithZone(""), mad: m}
	s.active[reqID] = o
	e.sidrOut = o
	id.state = stateConnect
	dgid, sgid, tos := wire.GIDFromAddr(o.dst), e.sgidIdx, e.tos
	o.timer = time.AfterFunc(sidrTimeout, func() { cm.sidrExpire(o) })
	s.mu.Unlock()
	id.mu.Unlock()
	// A lost send is a lost datagram: the resends cover it.
	_ = gsi.Send(sgid, dgid, 0, tos, m)
	return id.complete(nil)
}

// sidrExpire resends o's SIDR_REQ, or after the last try ends it with
// UNREACHABLE -ETIMEDOUT (IB_CM_SIDR_REQ_ERROR).
func (cm *cmState) sidrExpire(o *sidrOut) {
	s := cm.sidrOf()
	s.mu.Lock()
	if o.done {
		s.mu.Unlock()
		return
	}
	if o.tries < sidrRetries {
		o.tries++
		gsi := s.gsis[o.cd].gsi
		o.timer.Reset(sidrTimeout)
		s.mu.Unlock()
		id := o.id
		id.mu.Lock()
		e := id.soft()
		sgid, tos := e.sgidIdx, e.tos
		id.mu.Unlock()
		_ = gsi.Send(sgid, wire.GIDFromAddr(o.dst), 0, tos, o.mad)
		return
	}
	c := s.endOutLocked(o)
	s.mu.Unlock()
	runAll([]func(){c})
	o.id.sidrEvent(&Event{ID: o.id, Event: EventUnreachable, Status: -int(syscall.ETIMEDOUT)})
}

// endOutLocked ends an outstanding request (s.mu held); the returned func
// closes QP1 if it was its last use.
func (s *sidrState) endOutLocked(o *sidrOut) func() {
	o.done = true
	o.timer.Stop()
	delete(s.active, o.reqID)
	s.unclaimLocked(o.cd, driver.GSIRequestKey(o.reqID))
	return s.releaseLocked(o.cd)
}

// sidrEvent queues the answer of the id's request (or its timeout),
// unless the id went away meanwhile.
func (id *ID) sidrEvent(ev *Event) {
	id.mu.Lock()
	if id.state != stateConnect {
		id.mu.Unlock()
		return
	}
	e := id.soft()
	e.sidrOut = nil
	if ev.Event == EventEstablished && ev.Param.QKey != 0 {
		e.qkey = ev.Param.QKey
	}
	id.mu.Unlock()
	id.queue(ev)
}

// Accept answers the connection request of an id that a CONNECT_REQUEST
// event gave (rdma_accept): a SIDR_REP SUCCESS that names the id's QP (or,
// without one, param.QPNum) and the id's Q_Key, with param's private data
// (at most UDAcceptPrivateDataMax bytes, else EINVAL). An id without a
// request to answer is EINVAL. The passive side of a UD connection gets
// no event.
func (id *ID) Accept(param *ConnParam) (err error) {
	defer wrapErr(&err, "rdma_accept", nil)
	var pdata []byte
	var qpn uint32
	if param != nil {
		pdata, qpn = param.PrivateData, param.QPNum
	}
	return id.answer(mad.SIDRSuccess, qpn, pdata)
}

// Reject refuses the connection request of an id that a CONNECT_REQUEST
// event gave (rdma_reject): a SIDR_REP REJECT with the private data (at
// most UDAcceptPrivateDataMax bytes, else EINVAL); the active side gets
// UNREACHABLE with status 2 (IB_SIDR_REJECT) and the data. An id without
// a request to answer is EINVAL.
func (id *ID) Reject(privateData []byte) (err error) {
	defer wrapErr(&err, "rdma_reject", nil)
	return id.answer(mad.SIDRReject, 0, privateData)
}

// answer sends the SIDR_REP of the id's request (cma_send_sidr_rep).
func (id *ID) answer(status uint8, qpn uint32, pdata []byte) error {
	id.mu.Lock()
	if err := id.udConnChecksLocked("answer"); err != nil {
		id.mu.Unlock()
		return err
	}
	e := id.soft()
	in := e.sidrIn
	if in == nil || in.child != id {
		id.mu.Unlock()
		return fmt.Errorf("no connection request to answer: %w", syscall.EINVAL)
	}
	if len(pdata) > UDAcceptPrivateDataMax {
		id.mu.Unlock()
		return fmt.Errorf("%d bytes of private data, at most %d: %w", len(pdata), UDAcceptPrivateDataMax, syscall.EINVAL)
	}
	var qkey uint32
	if status == mad.SIDRSuccess {
		if id.qp != nil {
			qpn = id.qp.Num()
		}
		var err error
		if qkey, err = e.defaultQKey(); err != nil {
			id.mu.Unlock()
			return err
		}
	}
	sgid := e.sgidIdx
	id.mu.Unlock()
	return id.ch().cm.sendRep(in, id, status, qpn, qkey, pdata, sgid)
}

// sendRep answers in (for child, or for a destroyed child: nil) and
// remembers the answer for the request's retransmissions.
func (cm *cmState) sendRep(in *sidrIn, child *ID, status uint8, qpn, qkey uint32, pdata []byte, sgid uint8) error {
	m := mad.NewCM(mad.AttrSIDRRep, in.tid)
	r := mad.SIDRRep(m)
	r.SetRequestID(in.key.reqID)
	r.SetStatus(status)
	r.SetQPN(qpn)
	r.SetServiceID(in.sid)
	r.SetQKey(qkey)
	copy(r.PrivateData(), pdata)
	s := cm.sidrOf()
	s.mu.Lock()
	if in.child != child || in.rep != nil {
		s.mu.Unlock()
		return fmt.Errorf("the request was answered already: %w", syscall.EINVAL)
	}
	g := s.gsis[in.cd]
	in.rep, in.child, in.at = m, nil, time.Now()
	c := s.releaseLocked(in.cd)
	s.mu.Unlock()
	var err error
	if g != nil {
		err = g.gsi.Send(sgid, wire.GIDFromAddr(in.key.src), in.hop, in.tclass, m)
	}
	runAll([]func(){c})
	return err
}

// Receive takes a CM MAD of this process (driver.GSIAgent).
func (a gsiAgent) Receive(m *driver.GSIMAD) bool {
	if mad.CheckCM(m.MAD) != nil {
		return false
	}
	switch mad.MAD(m.MAD).AttrID() {
	case mad.AttrSIDRReq:
		return a.cm.sidrReq(a.cd, m)
	case mad.AttrSIDRRep:
		return a.cm.sidrRep(m)
	}
	return false
}

// sidrReq handles a SIDR_REQ (cma_ib_req_handler for UD): a duplicate is
// dropped or answered again; one for a listener of this process becomes
// CONNECT_REQUEST on a new id. It reports whether the request was this
// process's.
func (cm *cmState) sidrReq(cd *cmDevice, m *driver.GSIMAD) bool {
	req := mad.SIDRReq(m.MAD)
	sid := req.ServiceID()
	psv, _, ok := mad.ServicePort(sid)
	if !ok {
		return false
	}
	h := mad.CMAHeader(req.PrivateData())
	srcIP, dstIP := h.SrcAddr(), h.DstAddr()
	if h.Version() != mad.CMAVersion || !srcIP.IsValid() || !dstIP.IsValid() {
		return false
	}
	key := remoteReq{m.Src, req.RequestID()}
	s := cm.sidrOf()
	s.mu.Lock()
	s.pruneLocked()
	if in := s.passive[key]; in != nil {
		var rep []byte
		var g *sidrDevice
		if in.rep != nil {
			rep, g = in.rep, s.gsis[in.cd]
		}
		s.mu.Unlock()
		if rep != nil && g != nil {
			if sgid, err := cd.gidIndex(m.Dst); err == nil {
				_ = g.gsi.Send(sgid, wire.GIDFromAddr(m.Src), m.HopLimit, m.TClass, rep)
			}
		}
		return true
	}
	var l *ID
	var lport uint16
	for _, c := range s.listens[sid] {
		if c.ps == PortSpace(psv) && (c.addr.IsUnspecified() || c.addr == dstIP) && (c.dev == nil || c.dev == cd) {
			l, lport = c.id, c.port
			break
		}
	}
	if l == nil {
		s.mu.Unlock()
		return false
	}
	gsiDev := s.gsis[cd]
	if gsiDev == nil {
		s.mu.Unlock()
		return false
	}
	gsiDev.refs++ // the child's, until it answers
	ch := l.ch()
	fam := syscall.AF_INET
	if !dstIP.Is4() {
		fam = syscall.AF_INET6
	}
	child := &ID{context: l.context, ps: l.ps, qpType: l.qpType} // fixed at creation: read without l.mu
	ce := &softEngine{id: child}
	child.eng = ce
	child.chp.Store(ch)
	child.state = stateConnect
	ce.src = sockaddr{family: fam, ip: dstIP, port: lport}
	ce.dst = sockaddr{family: fam, ip: srcIP, port: h.SrcPort()}
	ce.dev = cd
	ce.sgidIdx, _ = cd.gidIndex(dstIP)
	in := &sidrIn{key: key, cd: cd, child: child, tid: mad.MAD(m.MAD).TID(), sid: sid, hop: m.HopLimit, tclass: m.TClass, at: time.Now()}
	ce.sidrIn = in
	s.passive[key] = in
	s.mu.Unlock()
	pd := slices.Clone(req.PrivateData()[mad.CMAHeaderLen:])
	ev := &Event{ID: child, ListenID: l, Event: EventConnectRequest, Param: UDParam{PrivateData: pd, PrivateDataLen: uint8(len(pd))}}
	ch.mu.Lock()
	if ch.closed {
		ch.mu.Unlock()
		return true
	}
	ch.ids++
	ch.enqueueLocked(ev)
	ch.mu.Unlock()
	cd.attach(child)
	return true
}

// pruneLocked forgets answered requests older than sidrKeep (s.mu held).
func (s *sidrState) pruneLocked() {
	now := time.Now()
	for k, in := range s.passive {
		if in.rep != nil && now.Sub(in.at) > sidrKeep {
			delete(s.passive, k)
		}
	}
}

// sidrRep handles a SIDR_REP: taken only for an outstanding request of
// this process with the same request ID, transaction ID and service ID,
// from the address the request went to (anything else is dropped: a
// forged answer cannot redirect an id).
func (cm *cmState) sidrRep(m *driver.GSIMAD) bool {
	rep := mad.SIDRRep(m.MAD)
	s := cm.sidrOf()
	s.mu.Lock()
	o := s.active[rep.RequestID()]
	if o == nil {
		s.mu.Unlock()
		return false
	}
	if o.done || m.Src != o.dst || mad.MAD(m.MAD).TID() != o.tid || rep.ServiceID() != o.sid {
		s.mu.Unlock()
		return true // this process's request ID: dropped
	}
	c := s.endOutLocked(o)
	s.mu.Unlock()
	if c != nil {
		// The last use of QP1: closing it waits for its agent, which is
		// running this.
		go c()
	}
	pd := slices.Clone(rep.PrivateData())
	ev := &Event{ID: o.id, Event: EventUnreachable, Status: int(rep.Status()), Param: UDParam{PrivateData: pd, PrivateDataLen: uint8(len(pd))}}
	if rep.Status() == mad.SIDRSuccess {
		id := o.id
		id.mu.Lock()
		e := id.soft()
		ah := verbs.AHAttr{IsGlobal: true, PortNum: 1, GRH: verbs.GlobalRoute{
			DGID: wire.GIDFromAddr(o.dst), SGIDIndex: e.sgidIdx, HopLimit: 64, TrafficClass: e.tos,
		}}
		id.mu.Unlock()
		ev.Event, ev.Status = EventEstablished, 0
		ev.Param.AHAttr, ev.Param.QPNum, ev.Param.QKey = ah, rep.QPN(), rep.QKey()
	}
	o.id.sidrEvent(ev)
	return true
}

// releaseSIDRLocked ends the id's SIDR part when it is destroyed (id.mu
// held): its listen, its outstanding request, or its unanswered request,
// which is rejected (cm_destroy_id in IB_CM_SIDR_REQ_RCVD).
func (e *softEngine) releaseSIDRLocked() (after func()) {
	id := e.id
	cm := id.ch().cm
	s := cm.sidrOf()
	var fns []func()
	s.mu.Lock()
	if e.src.isIP() {
		sid := id.serviceID(e.src.port)
		s.listens[sid] = slices.DeleteFunc(s.listens[sid], func(x listenEntry) bool { return x.id == id })
		if len(s.listens[sid]) == 0 {
			delete(s.listens, sid)
		}
		for _, cd := range e.listenDevs {
			s.unclaimLocked(cd, driver.GSIServiceKey(sid))
			fns = append(fns, s.releaseLocked(cd))
		}
		e.listenDevs = nil
	}
	if o := e.sidrOut; o != nil {
		if !o.done {
			fns = append(fns, s.endOutLocked(o))
		}
		e.sidrOut = nil
	}
	in := e.sidrIn
	reject := in != nil && in.child == id
	s.mu.Unlock()
	if reject {
		sgid := e.sgidIdx
		fns = append([]func(){func() { _ = cm.sendRep(in, id, mad.SIDRReject, 0, 0, nil, sgid) }}, fns...)
	}
	return func() { runAll(fns) }
}
