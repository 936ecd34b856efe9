package softverbs

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/softrdma/softrdma/logging"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// qpObj is a queue pair (struct ibv_qp). Only UD QPs are supported.
type qpObj struct {
	pd      *pdObj
	drv     DriverQP
	sendCQ  *cqObj
	recvCQ  *cqObj
	cap     verbs.QPCap
	typ     verbs.QPType
	sigAll  bool
	flags   verbs.CreateFlags
	context any
	qpn     uint32

	dev       *Device
	blockSelf bool
	ctr       counters
	groups    map[attachment]uint64 // attachments and their attach sequence (dev.mu)

	// What the receive path reads without locks.
	rxState atomic.Uint32 // verbs.QPState
	rxQKey  atomic.Uint32
	rxPort  atomic.Uint32

	mu      sync.Mutex // state, attributes
	state   verbs.QPState
	attr    verbs.QPAttr
	dead    bool
	port    verbs.PortAttr
	sendBuf []byte
	psn     atomic.Uint32 // next send PSN

	smu sync.Mutex // send side: serializes PostSend and owns sendBuf, us and batch
	us  UDSend
	bs  BatchSender // the driver's batch send, if it has one
	sb  *sendBatch  // allocated on the first chain posted to a BatchSender

	rmu   sync.Mutex // receive queue
	rq    []recvWQE
	rhead int
	rn    int
	rdead bool
	// tooLongSaid: the QP's first datagram too long for its receive WR
	// was reported (tooLongWarning); later ones are only counted.
	tooLongSaid bool
}

type recvWQE struct {
	wrid  uint64
	segs  []seg
	total int
}

// CreateQP creates a queue pair (ibv_create_qp / ibv_create_qp_ex).
func (pd *pdObj) CreateQP(init *driver.QPInitAttr) (driver.QPOps, error) {
	if init == nil || init.SendCQ == nil || init.RecvCQ == nil {
		return nil, fmt.Errorf("missing cq: %w", syscall.EINVAL)
	}
	sendCQ, ok1 := init.SendCQ.(*cqObj)
	recvCQ, ok2 := init.RecvCQ.(*cqObj)
	if !ok1 || !ok2 || sendCQ.ctx != pd.ctx || recvCQ.ctx != pd.ctx {
		return nil, fmt.Errorf("cq of another device: %w", syscall.EINVAL)
	}
	if init.QPType != verbs.QPTypeUD {
		return nil, fmt.Errorf("%v: %w", init.QPType, syscall.EOPNOTSUPP)
	}
	if init.CreateFlags&^verbs.CreateBlockSelfMcastLB != 0 {
		return nil, fmt.Errorf("create flags %#x: %w", uint32(init.CreateFlags), syscall.EOPNOTSUPP)
	}
	da := pd.ctx.dev.drv.Attr()
	c := init.Cap
	if c.MaxSendWR < 0 || c.MaxRecvWR < 0 || c.MaxSendWR > da.MaxQPWR || c.MaxRecvWR > da.MaxQPWR ||
		c.MaxSendSGE < 0 || c.MaxRecvSGE < 0 || c.MaxSendSGE > da.MaxSGE || c.MaxRecvSGE > da.MaxSGE ||
		c.MaxInlineData < 0 || c.MaxInlineData > da.MaxInlineData {
		return nil, fmt.Errorf("capabilities %+v beyond the device's (max_qp_wr %d, max_sge %d, max_inline_data %d): %w",
			c, da.MaxQPWR, da.MaxSGE, da.MaxInlineData, syscall.EINVAL)
	}
	if c.MaxSendSGE == 0 {
		c.MaxSendSGE = 1
	}
	if c.MaxRecvSGE == 0 {
		c.MaxRecvSGE = 1
	}
	d := pd.ctx.dev
	qp := &qpObj{
		pd: pd, dev: d, sendCQ: sendCQ, recvCQ: recvCQ, cap: c, typ: init.QPType,
		sigAll: init.SQSigAll, flags: init.CreateFlags, context: init.Context,
		blockSelf: init.CreateFlags&verbs.CreateBlockSelfMcastLB != 0,
		ctr:       newCounters(), rq: make([]recvWQE, max(c.MaxRecvWR, 1)),
	}
	qp.rxPort.Store(1)
	if err := d.take(objQP); err != nil {
		return nil, err
	}
	if err := pd.hold(1, 0); err != nil {
		d.put(objQP)
		return nil, err
	}
	drv, err := d.drv.CreateQP(DriverQPInit{Type: init.QPType, CreateFlags: init.CreateFlags})
	if err != nil {
		pd.hold(-1, 0)
		d.put(objQP)
		return nil, err
	}
	qp.drv = drv
	qp.bs, _ = drv.(BatchSender)
	qp.qpn = drv.QPN()
	sendCQ.hold(1)
	recvCQ.hold(1)
	d.mu.Lock()
	d.qps[qp.qpn] = qp
	d.qpView.store(qp.qpn, qp)
	d.mu.Unlock()
	return qp, nil
}

// Num returns the QP number (qp->qp_num).
func (qp *qpObj) Num() uint32 { return qp.qpn }

// Type returns the QP type.
func (qp *qpObj) Type() verbs.QPType { return qp.typ }

// PD returns the protection domain of the QP.
func (qp *qpObj) PD() *pdObj { return qp.pd }

// UserContext returns the Context given at creation (qp->qp_context).
func (qp *qpObj) UserContext() any { return qp.context }

// SendCQ returns the send completion queue.
func (qp *qpObj) SendCQ() *cqObj { return qp.sendCQ }

// RecvCQ returns the receive completion queue.
func (qp *qpObj) RecvCQ() *cqObj { return qp.recvCQ }

// CreateFlags returns the creation flags.
func (qp *qpObj) CreateFlags() verbs.CreateFlags { return qp.flags }

// State returns the current QP state.
func (qp *qpObj) State() verbs.QPState {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.state
}

// Query returns the QP's attributes (ibv_query_qp).
func (qp *qpObj) Query() verbs.QPAttr {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	a := qp.attr
	a.State, a.CurState, a.Cap = qp.state, qp.state, qp.cap
	return a
}

// required and optional attribute masks of UD transitions (IBA 11.2.4.2).
var udTransitions = map[[2]verbs.QPState][2]verbs.QPAttrMask{
	{verbs.QPSReset, verbs.QPSInit}: {verbs.QPAttrState | verbs.QPAttrPKeyIdx | verbs.QPAttrPort | verbs.QPAttrQKey, 0},
	{verbs.QPSInit, verbs.QPSInit}:  {0, verbs.QPAttrPKeyIdx | verbs.QPAttrPort | verbs.QPAttrQKey},
	{verbs.QPSInit, verbs.QPSRTR}:   {verbs.QPAttrState, verbs.QPAttrPKeyIdx | verbs.QPAttrQKey},
	{verbs.QPSRTR, verbs.QPSRTS}:    {verbs.QPAttrState | verbs.QPAttrSQPSN, verbs.QPAttrQKey},
	{verbs.QPSRTS, verbs.QPSRTS}:    {0, verbs.QPAttrQKey},
	{verbs.QPSRTR, verbs.QPSRTR}:    {0, verbs.QPAttrQKey},
}

// Modify changes QP attributes and state (ibv_modify_qp). UD QPs walk
// RESET → INIT (P_Key index, port, Q_Key) → RTR → RTS (SQ PSN); any state
// may go to RESET or ERR. A wrong transition or mask gives EINVAL.
func (qp *qpObj) Modify(attr *verbs.QPAttr, mask verbs.QPAttrMask) error {
	if attr == nil {
		return syscall.EINVAL
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.dead {
		return syscall.EINVAL
	}
	cur, next := qp.state, qp.state
	if mask&verbs.QPAttrState != 0 {
		next = attr.State
	}
	if next == verbs.QPSReset || next == verbs.QPSErr {
		if mask&verbs.QPAttrState == 0 || mask&^verbs.QPAttrState != 0 && next == verbs.QPSErr {
			return fmt.Errorf("%v→%v: mask %#x: %w", cur, next, uint32(mask), syscall.EINVAL)
		}
	} else {
		t, ok := udTransitions[[2]verbs.QPState{cur, next}]
		if !ok {
			return fmt.Errorf("%v→%v: %w", cur, next, syscall.EINVAL)
		}
		if mask&t[0] != t[0] || mask&^(t[0]|t[1]|verbs.QPAttrState) != 0 {
			return fmt.Errorf("%v→%v: mask %#x: %w", cur, next, uint32(mask), syscall.EINVAL)
		}
	}
	if mask&verbs.QPAttrPort != 0 {
		pa, err := qp.pd.ctx.QueryPort(attr.PortNum)
		if err != nil {
			return err
		}
		qp.port = pa
	}
	if mask&verbs.QPAttrPKeyIdx != 0 && attr.PKeyIdx != 0 {
		return fmt.Errorf("pkey index %d: %w", attr.PKeyIdx, syscall.EINVAL)
	}
	na := qp.attr
	if mask&verbs.QPAttrPort != 0 {
		na.PortNum = attr.PortNum
	}
	if mask&verbs.QPAttrPKeyIdx != 0 {
		na.PKeyIdx = attr.PKeyIdx
	}
	if mask&verbs.QPAttrQKey != 0 {
		na.QKey = attr.QKey
	}
	if mask&verbs.QPAttrSQPSN != 0 {
		na.SQPSN = attr.SQPSN & 0xffffff
	}
	na.State = next
	if mask&verbs.QPAttrSQPSN != 0 {
		qp.psn.Store(na.SQPSN)
	}
	qp.attr, qp.state = na, next
	qp.rxQKey.Store(na.QKey)
	qp.rxPort.Store(uint32(na.PortNum))
	qp.rxState.Store(uint32(next))
	switch next {
	case verbs.QPSReset:
		qp.flushRecv(false)
	case verbs.QPSErr:
		qp.flushRecv(true)
	}
	return nil
}

// flushRecv empties the receive queue, with flush completions when report.
func (qp *qpObj) flushRecv(report bool) {
	qp.rmu.Lock()
	defer qp.rmu.Unlock()
	for qp.rn > 0 {
		w := qp.rq[qp.rhead]
		qp.rq[qp.rhead].segs = clearSegs(qp.rq[qp.rhead].segs)
		qp.rhead = (qp.rhead + 1) % len(qp.rq)
		qp.rn--
		if report {
			qp.recvCQ.pushOrOverrun(&verbs.WC{WRID: w.wrid, Status: verbs.WCWRFlushErr, Opcode: verbs.WCOpRecv, QPNum: qp.qpn})
		}
	}
}

// PostRecv posts a chain of receive work requests (ibv_post_recv). Each
// buffer must hold the 40-byte GRH area plus the payload.
func (qp *qpObj) PostRecv(wr *verbs.RecvWR) error {
	qp.mu.Lock()
	st, dead := qp.state, qp.dead
	qp.mu.Unlock()
	// One receive-queue lock for the whole chain: the checks and the SGE
	// lookups take no lock of their own.
	qp.rmu.Lock()
	defer qp.rmu.Unlock()
	for i := 0; wr != nil; i, wr = i+1, wr.Next {
		if dead || st == verbs.QPSReset {
			return &verbs.BadWRError{Index: i, Err: syscall.EINVAL}
		}
		if len(wr.SGList) > qp.cap.MaxRecvSGE {
			return &verbs.BadWRError{Index: i, Err: syscall.EINVAL}
		}
		var segs [maxInlineSGE]seg
		total := 0
		for k, s := range wr.SGList {
			sg, err := qp.pd.resolve(s, true)
			if err != nil {
				return &verbs.BadWRError{Index: i, Err: err}
			}
			if k < len(segs) {
				segs[k] = sg
			}
			total += sg.n
		}
		if qp.rn == len(qp.rq) || qp.cap.MaxRecvWR == 0 {
			return &verbs.BadWRError{Index: i, Err: fmt.Errorf("receive queue full: %d of max_recv_wr %d posted: %w", qp.rn, qp.cap.MaxRecvWR, syscall.ENOMEM)}
		}
		w := &qp.rq[(qp.rhead+qp.rn)%len(qp.rq)]
		w.wrid, w.total = wr.WRID, total
		w.segs = w.segs[:0]
		if len(wr.SGList) <= len(segs) {
			w.segs = append(w.segs, segs[:len(wr.SGList)]...)
		} else {
			for _, s := range wr.SGList {
				sg, _ := qp.pd.resolve(s, true)
				w.segs = append(w.segs, sg)
			}
		}
		qp.rn++
	}
	return nil
}

// PostSend posts a chain of send work requests (ibv_post_send). Sends on a
// UD QP in RTS go out immediately; a signaled request (or every request
// with SQSigAll) queues a send completion. When the provider can send
// several datagrams at once (BatchSender), the datagrams of a chain go to
// it MaxSendBatch at a time, and their completions are queued after each
// batch; a request that fails its checks ends the chain with BadWRError
// after the requests before it were sent.
func (qp *qpObj) PostSend(wr *verbs.SendWR) error {
	qp.smu.Lock()
	defer qp.smu.Unlock()
	qp.mu.Lock()
	st, dead := qp.state, qp.dead
	qp.mu.Unlock()
	if qp.bs != nil && wr != nil && wr.Next != nil {
		return qp.postBatch(wr, dead || st != verbs.QPSRTS)
	}
	for i := 0; wr != nil; i, wr = i+1, wr.Next {
		if dead || st != verbs.QPSRTS {
			return &verbs.BadWRError{Index: i, Err: syscall.EINVAL}
		}
		if err := qp.postOne(wr); err != nil {
			return &verbs.BadWRError{Index: i, Err: err}
		}
	}
	return nil
}

// checkSend runs the checks of one send WR and returns its address
// handle, its length and
// whether it is signaled; pending is the number of signaled WRs whose
// completions are not queued yet.
func (qp *qpObj) checkSend(wr *verbs.SendWR, pending int) (ah *ahObj, n int, signaled bool, err error) {
	if wr.Opcode != verbs.WRSend && wr.Opcode != verbs.WRSendWithImm {
		return nil, 0, false, fmt.Errorf("opcode %v on a UD QP, which takes only IBV_WR_SEND and IBV_WR_SEND_WITH_IMM: %w", wr.Opcode, syscall.EINVAL)
	}
	if wr.UD.AH != nil {
		ah, _ = wr.UD.AH.Ops().(*ahObj)
	}
	if ah == nil || ah.dead || ah.pd != qp.pd {
		return nil, 0, false, fmt.Errorf("bad address handle: %w", syscall.EINVAL)
	}
	if len(wr.SGList) > qp.cap.MaxSendSGE {
		return nil, 0, false, fmt.Errorf("%d sges: %w", len(wr.SGList), syscall.EINVAL)
	}
	for _, s := range wr.SGList {
		n += int(s.Length)
	}
	if wr.Flags&verbs.SendInline != 0 && n > qp.cap.MaxInlineData {
		return nil, 0, false, fmt.Errorf("inline %d > %d: %w", n, qp.cap.MaxInlineData, syscall.EINVAL)
	}
	signaled = qp.sigAll || wr.Flags&verbs.SendSignaled != 0
	if signaled && !qp.sendCQ.roomFor(pending+1) {
		return nil, 0, false, fmt.Errorf("send cq full: %w", syscall.ENOMEM)
	}
	return ah, n, signaled, nil
}

// payload returns the bytes of a send WR of n bytes: the registered
// memory itself for one SGE, else a copy gathered into *gather.
func (qp *qpObj) payload(wr *verbs.SendWR, n int, gather *[]byte) ([]byte, error) {
	if len(wr.SGList) == 1 {
		sg, err := qp.pd.resolve(wr.SGList[0], false)
		if err != nil {
			return nil, err
		}
		return sg.mr.buf[sg.off : sg.off+sg.n : sg.off+sg.n], nil
	}
	if cap(*gather) < n {
		*gather = make([]byte, n)
	}
	buf := (*gather)[:0]
	for _, s := range wr.SGList {
		sg, err := qp.pd.resolve(s, false)
		if err != nil {
			return nil, err
		}
		buf = append(buf, sg.mr.buf[sg.off:sg.off+sg.n]...)
	}
	return buf, nil
}

func (qp *qpObj) udSend(ah *ahObj, wr *verbs.SendWR, payload []byte) UDSend {
	return UDSend{
		AH: &ah.attr, RemoteQPN: wr.UD.RemoteQPN & 0xffffff, RemoteQKey: wr.UD.RemoteQKey,
		PSN: (qp.psn.Add(1) - 1) & 0xffffff,
		Imm: wr.ImmData, HasImm: wr.Opcode == verbs.WRSendWithImm, Solicited: wr.Flags&verbs.SendSolicited != 0,
		Payload: payload,
	}
}

func (qp *qpObj) postOne(wr *verbs.SendWR) error {
	ah, n, signaled, err := qp.checkSend(wr, 0)
	if err != nil {
		return err
	}
	buf, err := qp.payload(wr, n, &qp.sendBuf)
	if err != nil {
		return err
	}
	qp.us = qp.udSend(ah, wr, buf)
	err = qp.drv.Send(&qp.us)
	qp.sent(qp.us.Wire, err)
	qp.us = UDSend{}
	if signaled || err != nil {
		// A failed send completes even unsignaled, as rxe's completer
		// posts every WQE whose status is not success.
		wc := sendWC(wr.WRID, n, qp.qpn, err)
		qp.sendCQ.pushOrOverrun(&wc)
	}
	return nil
}

// sent counts the outcome of one send: sent, refused, or dropped for its
// size (wire 0).
func (qp *qpObj) sent(wire int, err error) {
	switch {
	case err != nil:
		qp.countSent(0, 0, 1, 0)
	case wire == 0:
		qp.countSent(0, 0, 0, 1)
	default:
		qp.countSent(1, uint64(wire), 0, 0)
	}
}

// sendWC is the completion of a send: success, or LOC_QP_OP_ERR with the
// errno as vendor error, as rxe reports a failed transmit.
func sendWC(wrid uint64, n int, qpn uint32, err error) verbs.WC {
	wc := verbs.WC{WRID: wrid, Status: verbs.WCSuccess, Opcode: verbs.WCOpSend, ByteLen: uint32(n), QPNum: qpn}
	if err != nil {
		wc.Status = verbs.WCLocQPOpErr
		var errno syscall.Errno
		if errors.As(err, &errno) {
			wc.VendorErr = uint32(errno)
		}
	}
	return wc
}

// sendBatch is the datagrams of a chain not yet handed to a BatchSender.
type sendBatch struct {
	us     [MaxSendBatch]UDSend
	errs   [MaxSendBatch]error
	wrid   [MaxSendBatch]uint64
	n      [MaxSendBatch]int
	sig    [MaxSendBatch]bool
	gather [MaxSendBatch][]byte // copies of multi-SGE payloads
	wcs    [MaxSendBatch]verbs.WC
	k      int // datagrams staged
	nsig   int // of which signaled
}

// postBatch posts a chain through the driver's BatchSender.
func (qp *qpObj) postBatch(wr *verbs.SendWR, notRTS bool) error {
	if qp.sb == nil {
		qp.sb = &sendBatch{}
	}
	b := qp.sb
	for i := 0; wr != nil; i, wr = i+1, wr.Next {
		if notRTS {
			qp.flushBatch(b)
			return &verbs.BadWRError{Index: i, Err: syscall.EINVAL}
		}
		ah, n, signaled, err := qp.checkSend(wr, b.nsig)
		var buf []byte
		if err == nil {
			buf, err = qp.payload(wr, n, &b.gather[b.k])
		}
		if err != nil {
			qp.flushBatch(b)
			return &verbs.BadWRError{Index: i, Err: err}
		}
		k := b.k
		b.us[k] = qp.udSend(ah, wr, buf)
		b.wrid[k], b.n[k], b.sig[k] = wr.WRID, n, signaled
		b.k++
		if signaled {
			b.nsig++
		}
		if b.k == MaxSendBatch {
			qp.flushBatch(b)
		}
	}
	qp.flushBatch(b)
	return nil
}

// flushBatch sends the staged datagrams and queues their completions:
// the counters of the batch are added once and its completions queued
// under one CQ lock with one wake-up.
func (qp *qpObj) flushBatch(b *sendBatch) {
	if b.k == 0 {
		return
	}
	qp.bs.SendBatch(b.us[:b.k], b.errs[:b.k])
	var sent, bytes, failed, oversized uint64
	nwc := 0
	for j := range b.k {
		switch w := b.us[j].Wire; {
		case b.errs[j] != nil:
			failed++
		case w == 0:
			oversized++
		default:
			sent++
			bytes += uint64(w)
		}
		if b.sig[j] || b.errs[j] != nil { // a failure completes even unsignaled (postOne)
			b.wcs[nwc] = sendWC(b.wrid[j], b.n[j], qp.qpn, b.errs[j])
			nwc++
		}
		b.us[j] = UDSend{}
		b.errs[j] = nil
	}
	qp.countSent(sent, bytes, failed, oversized)
	qp.sendCQ.pushAllOrOverrun(b.wcs[:nwc])
	b.k, b.nsig = 0, 0
}

// countSent adds the outcomes of sends to the device's and the QP's
// counters.
func (qp *qpObj) countSent(sent, bytes, failed, oversized uint64) {
	d := qp.dev
	for _, c := range [...]struct {
		k Counter
		n uint64
	}{{SentPkts, sent}, {SentBytes, bytes}, {SendErrors, failed}, {OversizedSendDrops, oversized}} {
		if c.n != 0 {
			d.ctr[c.k].Add(c.n)
			qp.ctr[c.k].Add(c.n)
		}
	}
}

// AttachMcast attaches the QP to a multicast group (ibv_attach_mcast). The
// GID must be multicast and, on InfiniBand, the LID a multicast LID; on
// RoCE the LID is ignored.
func (qp *qpObj) AttachMcast(gid verbs.GID, lid uint16) error {
	lid, err := qp.checkMcast(gid, lid)
	if err == nil {
		err = qp.dev.attach(qp, gid, lid)
	}
	if err != nil {
		return err
	}
	return nil
}

// DetachMcast detaches the QP from a multicast group (ibv_detach_mcast).
func (qp *qpObj) DetachMcast(gid verbs.GID, lid uint16) error {
	lid, err := qp.checkMcast(gid, lid)
	if err == nil {
		err = qp.dev.detach(qp, gid, lid)
	}
	if err != nil {
		return err
	}
	return nil
}

// checkMcast checks an attach or detach and returns the LID the group
// table keys it by (0 on RoCE).
func (qp *qpObj) checkMcast(gid verbs.GID, lid uint16) (uint16, error) {
	qp.mu.Lock()
	dead := qp.dead
	qp.mu.Unlock()
	switch {
	case dead:
		return 0, fmt.Errorf("the QP is destroyed: %w", syscall.EINVAL)
	case qp.typ != verbs.QPTypeUD:
		return 0, fmt.Errorf("only a UD QP joins multicast: %w", syscall.EINVAL)
	case !gid.IsMulticast():
		return 0, fmt.Errorf("%v is not a multicast GID (a unicast group address?): %w", gid, syscall.EINVAL)
	}
	if qp.linkLayer() != verbs.LinkLayerInfiniBand {
		return 0, nil
	}
	if lid < verbs.MulticastLIDBase || lid == 0xffff {
		return 0, fmt.Errorf("LID %#x is not a multicast LID: %w", lid, syscall.EINVAL)
	}
	return lid, nil
}

func (qp *qpObj) linkLayer() verbs.LinkLayer {
	qp.mu.Lock()
	ll := qp.port.LinkLayer
	qp.mu.Unlock()
	if ll != verbs.LinkLayerUnspecified {
		return ll
	}
	pa, err := qp.pd.ctx.QueryPort(1)
	if err != nil {
		return verbs.LinkLayerUnspecified
	}
	return pa.LinkLayer
}

// Destroy destroys the QP (ibv_destroy_qp); it is detached from every
// multicast group first, as the kernel does for userspace QPs. When it
// returns, no receive path touches the QP's buffers: the receive queue is
// closed under its lock, which every delivery holds.
func (qp *qpObj) Destroy() error {
	qp.mu.Lock()
	if qp.dead {
		qp.mu.Unlock()
		return syscall.EINVAL
	}
	qp.dead = true
	qp.mu.Unlock()
	qp.rxState.Store(uint32(verbs.QPSErr))
	d := qp.dev
	d.mu.Lock()
	d.detachAllLocked(qp)
	delete(d.qps, qp.qpn)
	d.qpView.delete(qp.qpn)
	d.mu.Unlock()
	qp.rmu.Lock()
	qp.rdead = true
	qp.rmu.Unlock()
	qp.smu.Lock() // a PostSend in progress finishes with the transport QP
	qp.drv.Destroy()
	qp.smu.Unlock()
	d.put(objQP)
	qp.sendCQ.hold(-1)
	qp.recvCQ.hold(-1)
	qp.pd.hold(-1, 0)
	return nil
}

// receive consumes the next receive WR and queues the completion; with a
// Burst the CQ's waiter is woken at the Burst's Flush, and with one that
// holds locks the QP's and its CQ's stay held after it returns. It returns
// the counter of the outcome.
func (qp *qpObj) receive(dg *Datagram, burst *Burst) Counter {
	if burst != nil && burst.HoldLocks {
		burst.lockRQ(qp)
	} else {
		qp.rmu.Lock()
		defer qp.rmu.Unlock()
	}
	if qp.rdead {
		return NotReadyDrops
	}
	if qp.rn == 0 {
		return NoRecvWRDrops
	}
	w := &qp.rq[qp.rhead]
	need := verbs.GRHLen + len(dg.Payload)
	if w.total < need {
		if !qp.tooLongSaid {
			qp.tooLongSaid = true
			tooLongWarning(qp.dev.drv.Name(), qp.qpn, len(dg.Payload), w.total)
		}
		return TooLongDrops
	}
	scatter(w.segs, dg.GRH[:], dg.Payload)
	wc := verbs.WC{
		WRID: w.wrid, Status: verbs.WCSuccess, Opcode: verbs.WCOpRecv, ByteLen: uint32(need),
		QPNum: qp.qpn, SrcQP: dg.SrcQP, Flags: verbs.WCGRH,
	}
	if dg.HasImm {
		wc.Flags |= verbs.WCWithImm
		wc.ImmData = dg.Imm
	}
	if ib := dg.IB; ib != nil {
		wc.SLID, wc.SL, wc.DLIDPathBits = ib.SLID, ib.SL, ib.DLIDPathBits
		if !ib.GRH {
			wc.Flags &^= verbs.WCGRH
		}
	}
	// One CQ lock: a full CQ leaves the WR posted (its buffer was written,
	// which a WR not completed yet allows).
	switch {
	case burst == nil:
		if !qp.recvCQ.push(&wc, dg.Solicited) {
			return CQFullDrops
		}
	case burst.HoldLocks:
		burst.lockCQ(qp.recvCQ)
		if !qp.recvCQ.enqueueLocked(&wc, dg.Solicited) {
			return CQFullDrops
		}
		burst.add(qp.recvCQ)
	default:
		if !qp.recvCQ.pushQuiet(&wc, dg.Solicited) {
			return CQFullDrops
		}
		burst.add(qp.recvCQ)
	}
	w.segs = clearSegs(w.segs)
	if qp.rhead++; qp.rhead == len(qp.rq) {
		qp.rhead = 0
	}
	qp.rn--
	return Delivered
}

// tooLongWarning says, once per QP, that a datagram was dropped because
// the next receive WR could not hold it: a buffer without room for the
// 40-byte GRH area that precedes every UD payload otherwise drops every
// datagram with nothing said but a counter. It goes to softrdma's logger
// when logging is on, else one line on stderr.
func tooLongWarning(dev string, qpn uint32, payload, room int) {
	hint := ""
	if room >= payload {
		hint = " (a buffer without the GRH area?)"
	}
	msg := fmt.Sprintf("%s QP %#x: dropped a datagram of %d bytes: its receive WR holds %d bytes, and a UD receive takes 40 bytes of GRH area before the payload%s; such drops are counted in too_long_drops, and said once per QP", dev, qpn, payload, room, hint)
	if l := logging.Logger(); l != nil {
		l.Warn(msg)
		return
	}
	fmt.Fprintln(os.Stderr, "softrdma: "+msg)
}

// maxInlineSGE is how many SGEs a receive WR resolves without allocating.
const maxInlineSGE = 4

// clearSegs drops the MR references of a consumed WQE, keeping its capacity.
func clearSegs(s []seg) []seg {
	clear(s)
	return s[:0]
}

// scatter copies a then b across the segments.
func scatter(segs []seg, a, b []byte) {
	for _, s := range segs {
		dst := s.mr.buf[s.off : s.off+s.n]
		k := copy(dst, a)
		a = a[k:]
		dst = dst[k:]
		k = copy(dst, b)
		b = b[k:]
		if len(a) == 0 && len(b) == 0 {
			return
		}
	}
}
