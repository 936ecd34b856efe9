package bench

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
)

// endpoint is an RDMA CM id bound to a local address, with a UD QP (its
// CQs created by the CM, sized by the work queues) and one registered
// buffer.
type endpoint struct {
	ch  *rdmacm.EventChannel
	id  *rdmacm.ID
	qp  *verbs.QP
	mr  *verbs.MR
	buf []byte
	cqs []*verbs.CQ // the QP's CQs, without completion channels (CQ.Wait)
}

// eventTimeout bounds every wait for a CM event.
const eventTimeout = 5 * time.Second

// newEndpoint binds an id to bind and creates its QP and a registered
// buffer of bufLen bytes.
func newEndpoint(bind netip.Addr, sendWR, recvWR, bufLen int) (*endpoint, error) {
	var buf []byte
	if bufLen > 0 {
		buf = make([]byte, bufLen)
	}
	return newEndpointBuf(bind, sendWR, recvWR, buf)
}

// newEndpointBuf is newEndpoint with buf (none when empty) as the
// registered buffer.
func newEndpointBuf(bind netip.Addr, sendWR, recvWR int, buf []byte) (*endpoint, error) {
	ch, err := rdmacm.CreateEventChannel()
	if err != nil {
		return nil, err
	}
	e := &endpoint{ch: ch}
	if e.id, err = rdmacm.CreateID(ch, nil, rdmacm.PS_UDP); err != nil {
		ch.Close()
		return nil, err
	}
	if err := e.id.BindAddr(rdmacm.UDPAddr(bind)); err != nil {
		e.close()
		return nil, fmt.Errorf("bind %v: %w", bind, err)
	}
	// The CQs are made here, without completion channels, so that the
	// benchmark waits on them with CQ.Wait (the CM's own CQs have
	// channels, as librdmacm's).
	for _, n := range []int{sendWR, recvWR} {
		cq, err := e.id.Verbs().CreateCQ(max(n, 1))
		if err != nil {
			e.close()
			return nil, err
		}
		e.cqs = append(e.cqs, cq)
	}
	attr := verbs.QPInitAttr{QPType: verbs.QPTypeUD, SendCQ: e.cqs[0], RecvCQ: e.cqs[1],
		Cap: verbs.QPCap{MaxSendWR: sendWR, MaxRecvWR: recvWR, MaxSendSGE: 1, MaxRecvSGE: 1}}
	if err := e.id.CreateQP(nil, &attr); err != nil {
		e.close()
		return nil, fmt.Errorf("create qp: %w", err)
	}
	e.qp = e.id.QP()
	if len(buf) > 0 {
		e.buf = buf
		if e.mr, err = e.id.RegMsgs(e.buf); err != nil {
			e.close()
			return nil, err
		}
	}
	return e, nil
}

// join joins group (send-only or full member), waits for the JOIN event
// and returns an address handle for sending to the group and its Q_Key.
func (e *endpoint) join(group netip.Addr, sendOnly bool) (*verbs.AH, uint32, error) {
	flags := rdmacm.MCJoinFlagFullMember
	if sendOnly {
		flags = rdmacm.MCJoinFlagSendOnlyFullMember
	}
	attr := rdmacm.JoinMCAttrEx{CompMask: rdmacm.JoinMCAttrAddress | rdmacm.JoinMCAttrJoinFlags, JoinFlags: flags, Addr: rdmacm.UDPAddr(group)}
	if err := e.id.JoinMulticastEx(&attr, nil); err != nil {
		return nil, 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), eventTimeout)
	defer cancel()
	ev, err := e.ch.GetEvent(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer ev.Ack()
	if ev.Event != rdmacm.EventMulticastJoin {
		return nil, 0, fmt.Errorf("join %v: %v", group, ev)
	}
	ah, err := e.id.PD().CreateAH(&ev.Param.AHAttr)
	if err != nil {
		return nil, 0, err
	}
	return ah, ev.Param.QKey, nil
}

// joinRecv joins group as a full member to receive from it: the join's
// address handle, which a receiver does not send with, is destroyed (on the
// rdma-core backend one dropped undestroyed leaks its C object).
func (e *endpoint) joinRecv(group netip.Addr) error {
	ah, _, err := e.join(group, false)
	if ah != nil {
		ah.Destroy()
	}
	return err
}

func (e *endpoint) leave(group netip.Addr) error { return e.id.LeaveMulticast(rdmacm.UDPAddr(group)) }

func (e *endpoint) close() {
	if e.mr != nil {
		e.mr.Dereg()
	}
	if e.qp != nil {
		e.id.DestroyQP()
	}
	for _, cq := range e.cqs {
		cq.Destroy()
	}
	e.id.Destroy()
	e.ch.Close()
}

// sendChain is a chain of batch send WRs of size bytes each from slots of
// an endpoint's buffer starting at offset base; only the last is signaled.
type sendChain struct {
	wrs []verbs.SendWR
	sgl []verbs.SGE
	cq  *verbs.CQ
	wc  [8]verbs.WC
}

func newSendChain(e *endpoint, ah *verbs.AH, qkey uint32, base, batch, size int) *sendChain {
	c := &sendChain{wrs: make([]verbs.SendWR, batch), sgl: make([]verbs.SGE, batch), cq: e.id.SendCQ()}
	for i := range c.wrs {
		off := base + i*size
		c.sgl[i] = e.mr.SGE(off, size)
		for k := range size {
			e.buf[off+k] = byte(i + k)
		}
		c.wrs[i] = verbs.SendWR{
			WRID: uint64(i), SGList: c.sgl[i : i+1 : i+1], Opcode: verbs.WRSend,
			UD: verbs.UDWR{AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: qkey},
		}
		if i > 0 {
			c.wrs[i-1].Next = &c.wrs[i]
		}
	}
	c.wrs[batch-1].Flags = verbs.SendSignaled
	return c
}

// post posts the chain and reaps its completion; it returns how many
// datagrams the device reported sent (all of them, or none when the
// signaled completion failed).
func (c *sendChain) post(qp *verbs.QP) (int, error) {
	if err := qp.PostSend(&c.wrs[0]); err != nil {
		return 0, err
	}
	for {
		n, err := c.cq.Poll(c.wc[:])
		if err != nil {
			return 0, err
		}
		if n > 0 {
			if c.wc[n-1].Status != verbs.WCSuccess {
				return 0, fmt.Errorf("send completion: %v", c.wc[n-1].Status)
			}
			return len(c.wrs), nil
		}
		if err := c.cq.Wait(context.Background()); err != nil {
			return 0, err
		}
	}
}

// recvRing keeps every slot of an endpoint's buffer posted as a receive
// and reposts consumed slots in one chain.
type recvRing struct {
	qp   *verbs.QP
	cq   *verbs.CQ
	slot int
	sgl  []verbs.SGE
	wrs  []verbs.RecvWR
	wc   []verbs.WC
}

func newRecvRing(e *endpoint, slots, slot int) (*recvRing, error) {
	r := &recvRing{qp: e.qp, cq: e.id.RecvCQ(), slot: slot, sgl: make([]verbs.SGE, slots), wrs: make([]verbs.RecvWR, slots), wc: make([]verbs.WC, 64)}
	for i := range r.sgl {
		r.sgl[i] = e.mr.SGE(i*slot, slot)
	}
	for i := range r.wrs {
		r.wrs[i] = verbs.RecvWR{WRID: uint64(i), SGList: r.sgl[i : i+1 : i+1]}
		if i > 0 {
			r.wrs[i-1].Next = &r.wrs[i]
		}
	}
	if err := r.qp.PostRecv(&r.wrs[0]); err != nil {
		return nil, err
	}
	return r, nil
}

// poll reaps up to len(r.wc) completions without waiting, reposts their
// slots and returns the number of successful receives and their payload
// bytes (without the GRH area).
func (r *recvRing) poll() (msgs, bytes uint64, n int, err error) {
	n, err = r.cq.Poll(r.wc)
	if n == 0 {
		return 0, 0, 0, err
	}
	for k, wc := range r.wc[:n] {
		if wc.Status == verbs.WCSuccess {
			msgs++
			bytes += uint64(wc.ByteLen) - verbs.GRHLen
		}
		w := &r.wrs[k]
		w.WRID = wc.WRID
		w.SGList = r.sgl[wc.WRID : wc.WRID+1 : wc.WRID+1]
		w.Next = nil
		if k > 0 {
			r.wrs[k-1].Next = w
		}
	}
	if perr := r.qp.PostRecv(&r.wrs[0]); perr != nil {
		return msgs, bytes, n, perr
	}
	return msgs, bytes, n, err
}
