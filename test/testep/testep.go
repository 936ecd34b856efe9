// Package testep is a UD endpoint for tests that move data through an RDMA
// CM id: the id's QP, a ring of posted receives and a send buffer, with
// tagged messages sent to a group ("<tag> i") and received back as
// strings. The conformance suite and the OpenSM tests share it.
package testep

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
)

// Slot is the size of one receive slot: the GRH area and 256 bytes.
const Slot = verbs.GRHLen + 256

// timeout bounds one Send's or Recv's wait for its completions.
const timeout = 10 * time.Second

// EP is a UD endpoint: the id's QP, a receive ring and a send buffer.
type EP struct {
	id       *rdmacm.ID
	rmr, smr *verbs.MR
	rbuf     []byte
}

// New creates the id's QP (create flags flags) and posts n receives. When
// the test ends, destroy (nil: the QP's and the id's Destroy) runs before
// the memory regions are deregistered, as a QP goes before its MRs.
func New(t testing.TB, id *rdmacm.ID, n int, flags verbs.CreateFlags, destroy func()) *EP {
	t.Helper()
	if err := id.CreateQP(nil, &verbs.QPInitAttr{Cap: verbs.QPCap{MaxSendWR: n, MaxRecvWR: n, MaxSendSGE: 1, MaxRecvSGE: 1}, CreateFlags: flags}); err != nil {
		t.Fatalf("create qp: %v", err)
	}
	if destroy == nil {
		destroy = func() {
			id.DestroyQP()
			id.Destroy()
		}
	}
	e := &EP{id: id, rbuf: make([]byte, n*Slot)}
	var err error
	if e.rmr, err = id.RegMsgs(e.rbuf); err != nil {
		t.Fatal(err)
	}
	if e.smr, err = id.RegMsgs(make([]byte, 256)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		destroy()
		e.rmr.Dereg()
		e.smr.Dereg()
	})
	for i := range n {
		if err := id.PostRecv(uint64(i), e.rmr, i*Slot, Slot); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// Send sends n messages "<tag> i" to the group of p through a new AH,
// each with its send completion reaped.
func (e *EP) Send(t testing.TB, p rdmacm.UDParam, tag string, n int) {
	t.Helper()
	ah, err := e.id.PD().CreateAH(&p.AHAttr)
	if err != nil {
		t.Fatalf("create ah: %v", err)
	}
	defer ah.Destroy()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for i := range n {
		msg := fmt.Appendf(nil, "%s %d", tag, i)
		copy(e.smr.Buf(), msg)
		if err := e.id.PostUDSend(uint64(i), e.smr, 0, len(msg), verbs.SendSignaled, ah, p.QPNum); err != nil {
			t.Fatalf("send: %v", err)
		}
		wc, err := e.id.GetSendComp(ctx)
		if err != nil || wc.Status != verbs.WCSuccess {
			t.Fatalf("send completion: %v %v", wc.Status, err)
		}
	}
}

// Recv waits for n messages, reposting each one's receive, and returns
// their payloads.
func (e *EP) Recv(t testing.TB, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got []string
	for range n {
		wc, err := e.id.GetRecvComp(ctx)
		if err != nil {
			t.Fatalf("receive %d of %d: %v (got %q)", len(got)+1, n, err, got)
		}
		if wc.Status != verbs.WCSuccess {
			t.Fatalf("receive: %v", wc.Status)
		}
		off := int(wc.WRID) * Slot
		got = append(got, strings.Clone(string(e.rbuf[off+verbs.GRHLen:off+int(wc.ByteLen)])))
		if err := e.id.PostRecv(wc.WRID, e.rmr, off, Slot); err != nil {
			t.Fatalf("repost: %v", err)
		}
	}
	return got
}

// Slot returns receive slot i (its GRH area first) as the last datagram
// received into it left it.
func (e *EP) Slot(i int) []byte { return e.rbuf[i*Slot : (i+1)*Slot] }

// Pending returns the completions queued on the id's receive CQ now.
func (e *EP) Pending() int { return e.id.RecvCQ().Len() }

// ID returns the endpoint's RDMA CM id.
func (e *EP) ID() *rdmacm.ID { return e.id }
