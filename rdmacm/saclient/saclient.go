package saclient

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/verbs"
)

// saClient sends SA requests and matches their answers (the kernel's
// sa_query.c): a request is a 256-byte MAD with a fresh TID, resent after
// each timeout; an answer is taken only when it comes from the SA (source
// LID = the port's SM LID, source QP 1) and carries the TID, the response
// method and the attribute of a pending request. Anything else is counted
// as stray and dropped. An RMPP-active answer (a GetTableResp) is
// reassembled, and its segments acknowledged to the SA as the kernel's RMPP
// receiver (mad_rmpp.c) does; a completed transfer is kept for
// rmppLinger so that segments resent after a lost final ACK are
// acknowledged again.
type saClient struct {
	port    Port
	timeout time.Duration
	retries int
	tidBase uint64
	tidSeq  atomic.Uint32
	done    chan struct{} // closed by close: pending requests fail with ENODEV

	mu      sync.Mutex
	pending map[uint64]*pending
	recent  map[uint64]*finished // completed RMPP transfers, by TID
	closed  bool

	answers, stray atomic.Uint64
}

// pending is one request waiting for its answer.
type pending struct {
	method uint8  // the response method expected
	attr   uint16 // the attribute of the request
	smLID  uint16 // the SA's LID when the request was sent
	ch     chan answer
	re     *mad.Reassembler // RMPP reassembly (GetTable), else nil
}

// answer is what a pending request gets: the answer MAD (the first
// segment of an RMPP answer) and, for an RMPP answer, the record data.
type answer struct {
	m    []byte
	data []byte
}

// finished is a completed RMPP transfer, kept to acknowledge again.
type finished struct {
	re    *mad.Reassembler
	smLID uint16
	at    time.Time
}

// rmppLinger is how long a completed RMPP transfer is remembered (the
// kernel's cleanup delay, 10 s).
const rmppLinger = 10 * time.Second

func newSAClient(p Port, timeout time.Duration, retries int) *saClient {
	return &saClient{
		port: p, timeout: timeout, retries: retries,
		tidBase: rand.Uint64() &^ 0xffffffff,
		done:    make(chan struct{}), pending: map[uint64]*pending{}, recent: map[uint64]*finished{},
	}
}

// responseMethod is the method of the answer to a request method.
func responseMethod(method uint8) uint8 {
	if method == mad.MethodSet {
		return mad.MethodGetResp // SubnAdmSet is answered by SubnAdmGetResp
	}
	return method | mad.MethodResp
}

// transact sends one MCMemberRecord request and waits for its answer; the
// status is 0, -EINVAL for any non-zero MAD status or a malformed answer,
// -ETIMEDOUT, or -ENODEV once the agent is closed.
func (c *saClient) transact(method uint8, req *GroupRecord, mask uint64) (*GroupRecord, int) {
	tid := c.newTID()
	resp, err := c.roundTrip(tid, mad.AttrMCMemberRecord, encodeMCMemberMAD(method, tid, req, mask))
	if err != nil {
		return nil, -int(verbs.ErrnoOf(err))
	}
	rec, status, err := decodeMCMemberMAD(resp.m)
	if err != nil || status != 0 {
		return nil, -int(syscall.EINVAL)
	}
	return rec, 0
}

// classPortInfo reads the SA's send-only full member support.
func (c *saClient) classPortInfo() (sendOnly bool, err error) {
	tid := c.newTID()
	resp, err := c.roundTrip(tid, mad.AttrClassPortInfo, encodeClassPortInfoGet(tid))
	if err != nil {
		return false, err
	}
	return decodeClassPortInfoSendOnly(resp.m)
}

// getTable sends SubnAdmGetTable(MCMemberRecord) and returns the records
// of the (RMPP) answer.
func (c *saClient) getTable(req *GroupRecord, mask uint64) ([]GroupRecord, error) {
	tid := c.newTID()
	resp, err := c.roundTrip(tid, mad.AttrMCMemberRecord, encodeMCMemberMAD(mad.MethodGetTable, tid, req, mask))
	if err != nil {
		return nil, err
	}
	m := mad.MAD(resp.m)
	if st := m.Status(); st != mad.StatusOK {
		if st == mad.StatusNoRecords {
			return nil, nil
		}
		return nil, fmt.Errorf("mcast: SA GetTable status %#04x: %w", st, syscall.EINVAL)
	}
	data := resp.data
	if data == nil {
		data = m.SAData() // a plain (not RMPP) answer
	}
	if m.AttrOffset() == 0 {
		return nil, nil
	}
	stride := int(m.AttrOffset()) * 8
	if stride < mad.MCMemberRecordLen {
		return nil, errBadMAD
	}
	var out []GroupRecord
	for off := 0; off+mad.MCMemberRecordLen <= len(data); off += stride {
		out = append(out, mad.MCMemberRecord(data[off:off+mad.MCMemberRecordLen]).Fields())
	}
	return out, nil
}

func (c *saClient) newTID() uint64 { return c.tidBase | uint64(c.tidSeq.Add(1)) }

// roundTrip sends a request and waits for the answer with the same TID,
// resending after each timeout up to retries times.
func (c *saClient) roundTrip(tid uint64, attr uint16, req []byte) (answer, error) {
	rmpp := mad.MAD(req).Method() == mad.MethodGetTable
	p := &pending{method: responseMethod(mad.MAD(req).Method()), attr: attr, smLID: c.port.SMLID(), ch: make(chan answer, 1)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return answer{}, syscall.ENODEV
	}
	c.pending[tid] = p
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, tid)
		c.mu.Unlock()
	}()
	t := time.NewTimer(c.timeout)
	defer t.Stop()
	for try := 0; try <= c.retries; try++ {
		if rmpp {
			// A resent request starts the SA's transfer again.
			c.mu.Lock()
			p.re = &mad.Reassembler{}
			c.mu.Unlock()
		}
		if err := c.port.SendSA(req); err != nil {
			return answer{}, err
		}
		t.Reset(c.timeout)
		select {
		case resp := <-p.ch:
			return resp, nil
		case <-c.done:
			return answer{}, syscall.ENODEV
		case <-t.C:
		}
	}
	return answer{}, syscall.ETIMEDOUT
}

// receive offers a MAD that arrived on QP1 from (slid, srcQP); it reports
// whether the MAD answered a pending request.
func (c *saClient) receive(slid uint16, srcQP uint32, b []byte) bool {
	m := mad.MAD(b)
	if len(b) < mad.Len || m.MgmtClass() != mad.ClassSubnAdm || !m.IsResponse() || srcQP != mad.GSIQPN {
		c.stray.Add(1)
		return false
	}
	if m.RMPPFlags()&mad.RMPPFlagActive != 0 {
		return c.receiveRMPP(slid, m[:mad.Len])
	}
	c.mu.Lock()
	p := c.pending[m.TID()]
	ok := p != nil && p.method == m.Method() && p.attr == m.AttrID() && p.smLID == slid
	if ok {
		delete(c.pending, m.TID()) // the first matching answer wins
	}
	c.mu.Unlock()
	if !ok {
		c.stray.Add(1)
		return false
	}
	c.answers.Add(1)
	p.ch <- answer{m: append([]byte(nil), b[:mad.Len]...)}
	return true
}

// receiveRMPP takes one RMPP segment of an answer: it is reassembled and
// acknowledged; the request is answered when the transfer is complete. A
// segment of a transfer completed lately is only acknowledged again.
func (c *saClient) receiveRMPP(slid uint16, m mad.MAD) bool {
	tid := m.TID()
	c.mu.Lock()
	var re *mad.Reassembler
	p := c.pending[tid]
	ok := p != nil && p.re != nil && p.method == m.Method() && p.attr == m.AttrID() && p.smLID == slid
	if ok {
		re = p.re
	} else if f := c.recent[tid]; f != nil && f.smLID == slid && time.Since(f.at) < rmppLinger {
		re = f.re
	}
	if re == nil {
		c.mu.Unlock()
		c.stray.Add(1)
		return false
	}
	done, data, err := re.Add(m)
	ack := re.Ack()
	if done {
		delete(c.pending, tid)
		now := time.Now()
		for t, f := range c.recent {
			if now.Sub(f.at) >= rmppLinger {
				delete(c.recent, t)
			}
		}
		c.recent[tid] = &finished{re: re, smLID: slid, at: now}
	}
	c.mu.Unlock()
	if ack != nil {
		c.port.SendSA(ack) // a lost ACK is made up for by the SA's retransmission
	}
	if err != nil || (!ok && ack == nil) {
		c.stray.Add(1)
		return false
	}
	if done {
		c.answers.Add(1)
		p.ch <- answer{m: append([]byte(nil), re.Header()...), data: data}
	}
	return true
}

func (c *saClient) close() {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.done)
	}
	c.mu.Unlock()
}
