package rdmacm

import (
	"context"
	"fmt"
	"sync"
	"syscall"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// The helpers of rdma_verbs.h that multicast programs use.

// RegMsgs registers a message buffer on the id's default PD for sends and
// receives (rdma_reg_msgs).
func (id *ID) RegMsgs(buf []byte) (_ *verbs.MR, err error) {
	defer wrapErr(&err, "rdma_reg_msgs", nil)
	pd := id.PD()
	if pd == nil {
		return nil, fmt.Errorf("unbound id: %w", syscall.EINVAL)
	}
	return pd.RegMR(buf, verbs.AccessLocalWrite)
}

// PostRecv posts one receive of length bytes at offset off of mr
// (rdma_post_recv). The buffer needs 40 bytes of GRH area before the payload.
func (id *ID) PostRecv(wrid uint64, mr *verbs.MR, off, length int) (err error) {
	defer wrapErr(&err, "rdma_post_recv", nil)
	qp := id.QP()
	if qp == nil || mr == nil {
		return syscall.EINVAL
	}
	w := getPostWR()
	defer putPostWR(w)
	w.sge[0] = mr.SGE(off, length)
	w.recv = verbs.RecvWR{WRID: wrid, SGList: w.sge[:]}
	return qp.PostRecv(&w.recv)
}

var getCompWCs = sync.Pool{New: func() any { return new([1]verbs.WC) }}

// postWR is the work request rdma_post_recv or rdma_post_ud_send fills:
// a WR handed to the QP (an interface, the provider's) escapes, so one
// made per call would cost a heap allocation each time, on every
// message. The QP takes what it needs before the post returns (verbs:
// the caller may reuse a WR then), so the WR goes back to the pool.
type postWR struct {
	recv verbs.RecvWR
	send verbs.SendWR
	sge  [1]verbs.SGE
}

var postWRs = sync.Pool{New: func() any { return new(postWR) }}

func getPostWR() *postWR { return postWRs.Get().(*postWR) }

// putPostWR returns w to the pool, holding no MR or AH alive there.
func putPostWR(w *postWR) {
	*w = postWR{}
	postWRs.Put(w)
}

// PostUDSend posts one UD send of length bytes at offset off of mr to the
// remote QPN through ah, with the RDMA_UDP_QKEY Q_Key (rdma_post_ud_send).
func (id *ID) PostUDSend(wrid uint64, mr *verbs.MR, off, length int, flags verbs.SendFlags, ah *verbs.AH, remoteQPN uint32) (err error) {
	defer wrapErr(&err, "rdma_post_ud_send", nil)
	qp := id.QP()
	if qp == nil || mr == nil || ah == nil {
		return syscall.EINVAL
	}
	w := getPostWR()
	defer putPostWR(w)
	w.sge[0] = mr.SGE(off, length)
	w.send = verbs.SendWR{
		WRID:   wrid,
		SGList: w.sge[:],
		Opcode: verbs.WRSend,
		Flags:  flags,
		UD:     verbs.UDWR{AH: ah, RemoteQPN: remoteQPN, RemoteQKey: UDPQKey},
	}
	return qp.PostSend(&w.send)
}

// GetRecvComp waits for one receive completion (rdma_get_recv_comp). Like
// the C helper it does not check the completion's status.
func (id *ID) GetRecvComp(ctx context.Context) (_ verbs.WC, err error) {
	defer wrapErr(&err, "rdma_get_recv_comp", nil)
	return getComp(ctx, id.RecvCQ())
}

// GetSendComp waits for one send completion (rdma_get_send_comp).
func (id *ID) GetSendComp(ctx context.Context) (_ verbs.WC, err error) {
	defer wrapErr(&err, "rdma_get_send_comp", nil)
	return getComp(ctx, id.SendCQ())
}

// getComp is rdma_get_recv_comp / rdma_get_send_comp: poll; a CQ with a
// completion channel (the ones CreateQP makes) is armed, polled again and
// waited for through its channel, each event acknowledged; a CQ without
// one is waited for with Wait.
func getComp(ctx context.Context, cq *verbs.CQ) (verbs.WC, error) {
	if cq == nil {
		return verbs.WC{}, fmt.Errorf("no cq: %w", syscall.EINVAL)
	}
	// The WC handed to the CQ (its provider's, an interface) escapes: one
	// of a pool, not a heap allocation per call.
	wc := getCompWCs.Get().(*[1]verbs.WC)
	defer getCompWCs.Put(wc)
	ch := cq.Channel()
	// The backend's own loop (the kernel backend's: one call into C for
	// what below is up to seven).
	if pw, ok := cq.Ops().(driver.CQPollWaiter); ok && ch != nil {
		n, done, err := pw.PollWait(ctx, wc[:])
		if done && (err != nil || n == 1) {
			return wc[0], err
		}
	}
	for {
		// What is queued; no progress on an empty CQ (Len, and a Poll of
		// nothing for an overrun CQ's error): the wait below reads the
		// device's socket itself, at once if it is readable.
		if cq.Len() > 0 {
			if n, err := cq.Poll(wc[:]); err != nil || n == 1 {
				return wc[0], err
			}
		} else if _, err := cq.Poll(wc[:0]); err != nil {
			return wc[0], err
		}
		if ch == nil {
			if err := cq.Wait(ctx); err != nil {
				return wc[0], err
			}
			continue
		}
		if err := cq.ReqNotify(false); err != nil {
			return wc[0], err
		}
		if cq.Len() > 0 {
			continue
		}
		evCQ, _, err := ch.GetCQEvent(ctx)
		if err != nil {
			return wc[0], err
		}
		evCQ.AckEvents(1)
	}
}
