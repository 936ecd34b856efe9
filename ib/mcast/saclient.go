package mcast

import (
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
// as stray and dropped.
type saClient struct {
	port    Port
	timeout time.Duration
	retries int
	tidBase uint64
	tidSeq  atomic.Uint32
	done    chan struct{} // closed by close: pending requests fail with ENODEV

	mu      sync.Mutex
	pending map[uint64]*pending
	closed  bool

	answers, stray atomic.Uint64
}

// pending is one request waiting for its answer.
type pending struct {
	method uint8  // the response method expected
	attr   uint16 // the attribute of the request
	smLID  uint16 // the SA's LID when the request was sent
	ch     chan []byte
}

func newSAClient(p Port, timeout time.Duration, retries int) *saClient {
	return &saClient{
		port: p, timeout: timeout, retries: retries,
		tidBase: rand.Uint64() &^ 0xffffffff,
		done:    make(chan struct{}), pending: map[uint64]*pending{},
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
// -ETIMEDOUT, or -ENODEV once the engine is closed.
func (c *saClient) transact(method uint8, req *GroupRecord, mask uint64) (*GroupRecord, int) {
	tid := c.newTID()
	resp, err := c.roundTrip(tid, mad.AttrMCMemberRecord, encodeMCMemberMAD(method, tid, req, mask))
	if err != nil {
		return nil, -int(verbs.ErrnoOf(err))
	}
	rec, status, err := decodeMCMemberMAD(resp)
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
	return decodeClassPortInfoSendOnly(resp)
}

func (c *saClient) newTID() uint64 { return c.tidBase | uint64(c.tidSeq.Add(1)) }

// roundTrip sends a request and waits for the answer with the same TID,
// resending after each timeout up to retries times.
func (c *saClient) roundTrip(tid uint64, attr uint16, req []byte) ([]byte, error) {
	p := &pending{method: responseMethod(mad.MAD(req).Method()), attr: attr, smLID: c.port.SMLID(), ch: make(chan []byte, 1)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, syscall.ENODEV
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
		if err := c.port.SendSA(req); err != nil {
			return nil, err
		}
		t.Reset(c.timeout)
		select {
		case resp := <-p.ch:
			return resp, nil
		case <-c.done:
			return nil, syscall.ENODEV
		case <-t.C:
		}
	}
	return nil, syscall.ETIMEDOUT
}

// receive offers a MAD that arrived on QP1 from (slid, srcQP); it reports
// whether the MAD answered a pending request.
func (c *saClient) receive(slid uint16, srcQP uint32, b []byte) bool {
	m := mad.MAD(b)
	if len(b) < mad.Len || m.MgmtClass() != mad.ClassSubnAdm || !m.IsResponse() || srcQP != mad.GSIQPN {
		c.stray.Add(1)
		return false
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
	p.ch <- append([]byte(nil), b[:mad.Len]...)
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
