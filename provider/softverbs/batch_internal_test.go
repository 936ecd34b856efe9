package softverbs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/logging"
	"github.com/softrdma/softrdma/verbs"

	"github.com/softrdma/softrdma/wire"
)

// fakeDrv is a provider whose QPs record what they are asked to send, with
// (batch) or without (plain) the BatchSender interface.
type fakeDrv struct {
	batch bool
	attr  verbs.DeviceAttr // zero: fakeAttr
	qps   []*fakeQP
}

var fakeAttr = verbs.DeviceAttr{PhysPortCnt: 1, MaxQPWR: 1024, MaxSGE: 4, MaxCQE: 1024, MaxInlineData: 64, MaxMcastGrp: 8, MaxMcastQPAttach: 8, MaxTotalMcastQP: 8}

func (f *fakeDrv) Name() string { return "fake0" }
func (f *fakeDrv) Attr() verbs.DeviceAttr {
	if f.attr.PhysPortCnt == 0 {
		return fakeAttr
	}
	return f.attr
}
func (f *fakeDrv) GroupCreated(*Group) error { return nil }
func (f *fakeDrv) GroupDestroyed(*Group)     {}
func (f *fakeDrv) QueryPort(port uint8) (verbs.PortAttr, error) {
	if port != 1 {
		return verbs.PortAttr{}, syscall.EINVAL
	}
	return verbs.PortAttr{State: verbs.PortActive, MaxMTU: verbs.MTU4096, ActiveMTU: verbs.MTU4096, LinkLayer: verbs.LinkLayerEthernet, GIDTblLen: 1}, nil
}
func (f *fakeDrv) GIDTable(uint8) ([]verbs.GIDEntry, error) {
	return []verbs.GIDEntry{{GID: wire.GIDFromAddr(netip.MustParseAddr("127.0.0.1")), PortNum: 1, Type: verbs.GIDTypeRoCEv2}}, nil
}
func (f *fakeDrv) CreateQP(DriverQPInit) (DriverQP, error) {
	q := &fakeQP{qpn: uint32(0x100 + len(f.qps))}
	f.qps = append(f.qps, q)
	if f.batch {
		return &fakeBatchQP{q}, nil
	}
	return q, nil
}

type fakeQP struct {
	qpn     uint32
	mu      sync.Mutex
	sent    [][]byte // payloads, copied
	batches []int    // sizes of SendBatch calls
	fail    map[int]error
	discard bool // count, but do not keep, payloads
	nsent   int
	last    UDSend // the last datagram's header fields (no payload)
}

func (q *fakeQP) QPN() uint32 { return q.qpn }
func (q *fakeQP) Destroy()    {}
func (q *fakeQP) Send(s *UDSend) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := q.nsent
	q.nsent++
	q.last = *s
	q.last.Payload = nil
	if !q.discard {
		q.sent = append(q.sent, append([]byte(nil), s.Payload...))
	}
	if q.fail[n] == nil {
		s.Wire = 40 + len(s.Payload)
	}
	return q.fail[n]
}

type fakeBatchQP struct{ *fakeQP }

func (q *fakeBatchQP) SendBatch(s []UDSend, errs []error) {
	q.mu.Lock()
	q.batches = append(q.batches, len(s))
	q.mu.Unlock()
	for i := range s {
		errs[i] = q.Send(&s[i])
	}
}

type fakeEnv struct {
	drv *fakeDrv
	dev *verbs.Device
	pd  *verbs.PD
	scq *verbs.CQ
	rcq *verbs.CQ
	qp  *verbs.QP
	ah  *verbs.AH
	mr  *verbs.MR
	buf []byte
}

func newFakeEnv(t *testing.T, batch bool, sendCQE int) *fakeEnv {
	t.Helper()
	e := &fakeEnv{drv: &fakeDrv{batch: batch}}
	_, e.dev = register(e.drv)
	t.Cleanup(func() { verbs.UnregisterDevice(e.dev) })
	ctx, err := e.dev.Open()
	if err != nil {
		t.Fatal(err)
	}
	if e.pd, err = ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.scq, err = ctx.CreateCQ(sendCQE); err != nil {
		t.Fatal(err)
	}
	if e.rcq, err = ctx.CreateCQ(16); err != nil {
		t.Fatal(err)
	}
	e.qp, err = e.pd.CreateQP(&verbs.QPInitAttr{SendCQ: e.scq, RecvCQ: e.rcq, QPType: verbs.QPTypeUD,
		Cap: verbs.QPCap{MaxSendWR: 256, MaxRecvWR: 4, MaxSendSGE: 2, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	bringUp(t, e.qp, verbs.QPSRTS)
	if e.ah, err = e.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: 1, GRH: verbs.GlobalRoute{DGID: wire.RoCEv2MGID(netip.MustParseAddr("239.1.2.3"))}}); err != nil {
		t.Fatal(err)
	}
	e.buf = make([]byte, 4096)
	for i := range e.buf {
		e.buf[i] = byte(i)
	}
	if e.mr, err = e.pd.RegMR(e.buf, verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	return e
}

// bringUp takes a new UD QP through INIT (port 1, Q_Key 1) up to state
// last (RTR or RTS).
func bringUp(t *testing.T, qp *verbs.QP, last verbs.QPState) {
	t.Helper()
	for _, st := range []struct {
		a verbs.QPAttr
		m verbs.QPAttrMask
	}{
		{verbs.QPAttr{State: verbs.QPSInit, PortNum: 1, QKey: 1}, verbs.QPAttrState | verbs.QPAttrPKeyIdx | verbs.QPAttrPort | verbs.QPAttrQKey},
		{verbs.QPAttr{State: verbs.QPSRTR}, verbs.QPAttrState},
		{verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState | verbs.QPAttrSQPSN},
	} {
		if err := qp.Modify(&st.a, st.m); err != nil {
			t.Fatal(err)
		}
		if st.a.State == last {
			return
		}
	}
}

// chain builds n send WRs of 4 bytes each (WR i at offset 4i; every
// third one in two SGEs of 2 bytes), signaling those for which sig(i).
func (e *fakeEnv) chain(n int, sig func(int) bool) []verbs.SendWR {
	wrs := make([]verbs.SendWR, n)
	for i := range wrs {
		sgl := []verbs.SGE{e.mr.SGE(4*i, 4)}
		if i%3 == 2 {
			sgl = []verbs.SGE{e.mr.SGE(4*i, 2), e.mr.SGE(4*i+2, 2)}
		}
		wrs[i] = verbs.SendWR{WRID: uint64(i), SGList: sgl, Opcode: verbs.WRSend, UD: verbs.UDWR{AH: e.ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: 1}}
		if sig(i) {
			wrs[i].Flags = verbs.SendSignaled
		}
		if i > 0 {
			wrs[i-1].Next = &wrs[i]
		}
	}
	return wrs
}

func (e *fakeEnv) poll(t *testing.T) []verbs.WC {
	t.Helper()
	var out []verbs.WC
	wc := make([]verbs.WC, 16)
	for {
		n, err := e.scq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return out
		}
		out = append(out, wc[:n]...)
	}
}

// TestPostSendBatches posts a chain to a batching provider: it gets the
// datagrams MaxSendBatch at a time, in order, with the right payloads, and
// the signaled ones complete in order with the status of their send, and
// a failed unsignaled one completes too (rxe completes every failed WQE).
func TestPostSendBatches(t *testing.T) {
	for _, batch := range []bool{false, true} {
		e := newFakeEnv(t, batch, 256)
		q := e.drv.qps[0]
		q.fail = map[int]error{40: syscall.ENOBUFS, 41: syscall.ENETUNREACH} // 41 is unsignaled
		const n = 70
		wrs := e.chain(n, func(i int) bool { return i%2 == 0 })
		if err := e.qp.PostSend(&wrs[0]); err != nil {
			t.Fatalf("batch %v: %v", batch, err)
		}
		if len(q.sent) != n {
			t.Fatalf("batch %v: %d datagrams sent", batch, len(q.sent))
		}
		for i, p := range q.sent {
			if want := e.buf[4*i : 4*i+4]; string(p) != string(want) {
				t.Fatalf("batch %v: datagram %d payload %v, want %v", batch, i, p, want)
			}
		}
		if batch && (len(q.batches) != 3 || q.batches[0] != MaxSendBatch || q.batches[2] != n-2*MaxSendBatch) {
			t.Errorf("batches %v", q.batches)
		}
		// The counters of a batch are added once: the same totals as a
		// datagram at a time, on the device and on the QP.
		c := CoreOf(e.dev).Counters()
		qc, _ := CoreOf(e.dev).QPCounters(e.qp.Num())
		for _, got := range []Snapshot{c, qc} {
			if got.Get(SentPkts) != n-2 || got.Get(SendErrors) != 2 || got.Get(SentBytes) != (n-2)*(40+4) {
				t.Errorf("batch %v: sent_pkts %d send_errors %d sent_bytes %d, want %d, 2, %d",
					batch, got.Get(SentPkts), got.Get(SendErrors), got.Get(SentBytes), n-2, (n-2)*44)
			}
		}
		wcs := e.poll(t)
		var want []uint64 // the WRIDs that complete: the signaled ones and 41
		for i := 0; i < n; i++ {
			if i%2 == 0 || i == 41 {
				want = append(want, uint64(i))
			}
		}
		if len(wcs) != len(want) {
			t.Fatalf("batch %v: %d completions, want %d", batch, len(wcs), len(want))
		}
		for k, wc := range wcs {
			status, vendor := verbs.WCSuccess, uint32(0)
			switch wc.WRID {
			case 40:
				status, vendor = verbs.WCLocQPOpErr, uint32(syscall.ENOBUFS)
			case 41:
				status, vendor = verbs.WCLocQPOpErr, uint32(syscall.ENETUNREACH)
			}
			if wc.WRID != want[k] || wc.Status != status || wc.VendorErr != vendor || wc.ByteLen != 4 || wc.Opcode != verbs.WCOpSend {
				t.Errorf("batch %v: completion %d: %+v", batch, k, wc)
			}
		}
	}
}

// TestPostSendBadWRInChain checks that a bad WR in the middle of a chain
// fails with its index after the WRs before it were sent and completed.
func TestPostSendBadWRInChain(t *testing.T) {
	for _, batch := range []bool{false, true} {
		e := newFakeEnv(t, batch, 256)
		wrs := e.chain(40, func(int) bool { return true })
		wrs[35].UD.AH = nil
		err := e.qp.PostSend(&wrs[0])
		var bad *verbs.BadWRError
		if !errors.As(err, &bad) || bad.Index != 35 || !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("batch %v: %v", batch, err)
		}
		if n := len(e.drv.qps[0].sent); n != 35 {
			t.Errorf("batch %v: %d sent", batch, n)
		}
		if n := len(e.poll(t)); n != 35 {
			t.Errorf("batch %v: %d completions", batch, n)
		}
	}
}

// TestPostSendCQRoom checks that a signaled WR finding no room in the send
// CQ (counting the completions of its batch not yet queued) fails with
// ENOMEM after the ones before it were sent.
func TestPostSendCQRoom(t *testing.T) {
	for _, batch := range []bool{false, true} {
		e := newFakeEnv(t, batch, 4)
		wrs := e.chain(6, func(int) bool { return true })
		err := e.qp.PostSend(&wrs[0])
		var bad *verbs.BadWRError
		if !errors.As(err, &bad) || bad.Index != 4 || !errors.Is(err, syscall.ENOMEM) {
			t.Fatalf("batch %v: %v", batch, err)
		}
		if n := len(e.drv.qps[0].sent); n != 4 {
			t.Errorf("batch %v: %d sent", batch, n)
		}
		if n := len(e.poll(t)); n != 4 {
			t.Errorf("batch %v: %d completions", batch, n)
		}
	}
}

// TestPostSendAllocs checks that posting a chain to a batching provider
// allocates nothing in steady state.
func TestPostSendAllocs(t *testing.T) {
	e := newFakeEnv(t, true, 256)
	q := e.drv.qps[0]
	q.discard = true
	wrs := e.chain(40, func(i int) bool { return i == 39 })
	var wc [4]verbs.WC
	post := func() {
		if err := e.qp.PostSend(&wrs[0]); err != nil {
			t.Fatal(err)
		}
		e.scq.Poll(wc[:])
		q.batches = q.batches[:0]
	}
	post()
	if a := testing.AllocsPerRun(50, post); a != 0 {
		t.Errorf("%v allocations per chain of 40", a)
	}
}

// TestDeliverBurst checks that a completion delivered in a Burst wakes a
// waiter at Flush, and that Wait allocates nothing.
func TestDeliverBurst(t *testing.T) {
	e := newFakeEnv(t, true, 16)
	rbuf := make([]byte, 4*128)
	mr, err := e.pd.RegMR(rbuf, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if err := e.qp.PostRecv(&verbs.RecvWR{WRID: uint64(i), SGList: []verbs.SGE{mr.SGE(128*i, 128)}}); err != nil {
			t.Fatal(err)
		}
	}
	core := CoreOf(e.dev)
	woke := make(chan error, 1)
	go func() { woke <- e.rcq.Wait(context.Background()) }()
	for e.rcq.Ops().(*cqObj).waitersNow() == 0 {
		time.Sleep(time.Millisecond)
	}
	var b Burst
	var grh [verbs.GRHLen]byte
	for _, p := range []string{"one", "two"} {
		core.DeliverUnicast(e.qp.Num(), &Datagram{GRH: &grh, PKey: 0xffff, QKey: 1, SrcQP: 7, Payload: []byte(p)}, &b)
	}
	if n := core.Counters().Get(Delivered); n != 0 {
		t.Fatalf("delivered %d before Flush; the Burst counts at Flush", n)
	}
	select {
	case <-woke:
		t.Fatal("waiter woken before Flush")
	case <-time.After(20 * time.Millisecond):
	}
	b.Flush()
	if err := <-woke; err != nil {
		t.Fatal(err)
	}
	qc, _ := core.QPCounters(e.qp.Num())
	if n, nq := core.Counters().Get(Delivered), qc[Delivered]; n != 2 || nq != 2 {
		t.Fatalf("delivered %d (device), %d (QP) after Flush, want 2", n, nq)
	}
	if n := e.rcq.Len(); n != 2 {
		t.Errorf("%d completions", n)
	}
	// Wait with completions queued returns at once, without allocating.
	if a := testing.AllocsPerRun(100, func() { e.rcq.Wait(context.Background()) }); a != 0 {
		t.Errorf("Wait: %v allocations", a)
	}
}

// TestCQWaiters checks that one completion wakes every waiter, that a
// cancelled waiter leaves, and that Destroy wakes waiters with EINVAL.
func TestCQWaiters(t *testing.T) {
	e := newFakeEnv(t, false, 16)
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 8)
	for range 3 {
		go func() { errs <- e.scq.Wait(context.Background()) }()
	}
	go func() { errs <- e.scq.Wait(ctx) }()
	for e.scq.Ops().(*cqObj).waitersNow() < 4 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	wrs := e.chain(1, func(int) bool { return true })
	if err := e.qp.PostSend(&wrs[0]); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	e.poll(t)
	for range 2 {
		go func() { errs <- e.rcq.Wait(context.Background()) }()
	}
	for e.rcq.Ops().(*cqObj).waitersNow() < 2 {
		time.Sleep(time.Millisecond)
	}
	e.qp.Destroy()
	if err := e.rcq.Destroy(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("waiter on a destroyed CQ: %v", err)
		}
	}
}

func (cq *cqObj) waitersNow() int {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.waiters
}

// pushAllOrOverrun queues what fits, marks the CQ overrun when the rest
// does not, and wakes a waiter once.
func TestPushAllOrOverrun(t *testing.T) {
	cq := &cqObj{cap: 2, ring: make([]verbs.WC, 2), bell: make(chan struct{}, 1), waiters: 1}
	cq.pushAllOrOverrun([]verbs.WC{{WRID: 1}, {WRID: 2}, {WRID: 3}})
	if len(cq.bell) != 1 {
		t.Errorf("bell rung %d times, want 1", len(cq.bell))
	}
	wc := make([]verbs.WC, 4)
	if n, err := cq.Poll(wc); n != 2 || err != nil || wc[0].WRID != 1 || wc[1].WRID != 2 {
		t.Fatalf("poll: %d %v %+v", n, err, wc[:n])
	}
	if _, err := cq.Poll(wc); !errors.Is(err, syscall.EOVERFLOW) {
		t.Fatalf("after the overrun: %v, want EOVERFLOW", err)
	}
	cq2 := &cqObj{cap: 4, ring: make([]verbs.WC, 4), bell: make(chan struct{}, 1)}
	cq2.pushAllOrOverrun([]verbs.WC{{WRID: 7}, {WRID: 8}})
	if n, err := cq2.Poll(wc); n != 2 || err != nil || wc[1].WRID != 8 {
		t.Fatalf("room for all: %d %v", n, err)
	}
}

// TestBurstHoldsLocks delivers with a Burst that holds locks to three QPs,
// two of them sharing a receive CQ, in the order A A B C A B: the Burst
// holds the locks of the QP it delivered to last and no other, the
// completions are queued in delivery order, and Flush releases everything
// and counts every delivery.
func TestBurstHoldsLocks(t *testing.T) {
	e := newFakeEnv(t, true, 16)
	ctx := e.rcq.Context()
	cq2, err := ctx.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	newQP := func(rcq *verbs.CQ) *verbs.QP {
		qp, err := e.pd.CreateQP(&verbs.QPInitAttr{SendCQ: e.scq, RecvCQ: rcq, QPType: verbs.QPTypeUD,
			Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		bringUp(t, qp, verbs.QPSRTR)
		return qp
	}
	qa, qb, qc := e.qp, newQP(e.rcq), newQP(cq2)
	rbuf := make([]byte, 3*4*128)
	mr, err := e.pd.RegMR(rbuf, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for k, qp := range []*verbs.QP{qa, qb, qc} {
		for i := range 4 {
			off := (4*k + i) * 128
			if err := qp.PostRecv(&verbs.RecvWR{WRID: uint64(100*k + i), SGList: []verbs.SGE{mr.SGE(off, 128)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	core := CoreOf(e.dev)
	in := func(qp *verbs.QP) *qpObj { return qp.Ops().(*qpObj) }
	b := Burst{HoldLocks: true}
	var grh [verbs.GRHLen]byte
	for _, qp := range []*verbs.QP{qa, qa, qb, qc, qa, qb} {
		core.DeliverUnicast(qp.Num(), &Datagram{GRH: &grh, PKey: 0xffff, QKey: 1, SrcQP: 7, Payload: []byte("x")}, &b)
	}
	// Held: B's receive queue and its CQ (shared with A); free: A's, C's,
	// C's CQ.
	if in(qb).rmu.TryLock() || e.rcq.Ops().(*cqObj).mu.TryLock() {
		t.Fatal("the locks of the QP delivered to last are not held")
	}
	for _, m := range []interface{ TryLock() bool }{&in(qa).rmu, &in(qc).rmu, &cq2.Ops().(*cqObj).mu} {
		if !m.TryLock() {
			t.Fatal("a lock of another QP is still held")
		}
		m.(interface{ Unlock() }).Unlock()
	}
	b.Flush()
	for _, m := range []interface{ TryLock() bool }{&in(qa).rmu, &in(qb).rmu, &in(qc).rmu, &e.rcq.Ops().(*cqObj).mu, &cq2.Ops().(*cqObj).mu} {
		if !m.TryLock() {
			t.Fatal("a lock is held after Flush")
		}
		m.(interface{ Unlock() }).Unlock()
	}
	wc := make([]verbs.WC, 8)
	n, err := e.rcq.Poll(wc)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, w := range wc[:n] {
		got = append(got, w.WRID)
	}
	if want := []uint64{0, 1, 100, 2, 101}; !slices.Equal(got, want) {
		t.Errorf("completions of the shared CQ: WRIDs %v, want %v", got, want)
	}
	if n, _ := cq2.Poll(wc); n != 1 || wc[0].WRID != 200 {
		t.Errorf("completions of C's CQ: %d, %+v", n, wc[0])
	}
	if d := core.Counters().Get(Delivered); d != 6 {
		t.Errorf("delivered %d, want 6", d)
	}
}

// TestLimitsSayWhich: a CQ, a QP or a receive beyond the device's or the
// QP's limit fails with libibverbs' errno and names the limit.
func TestLimitsSayWhich(t *testing.T) {
	e := newFakeEnv(t, false, 256)
	ctx := e.pd.Context()
	_, err := ctx.CreateCQ(fakeAttr.MaxCQE + 1)
	if !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "the device takes 1 to 1024 (max_cqe)") {
		t.Errorf("create cq: %v", err)
	}
	cq, err := ctx.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Destroy()
	_, err = e.pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTypeUD, Cap: verbs.QPCap{MaxSendWR: fakeAttr.MaxQPWR + 1}})
	if !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "max_qp_wr 1024") {
		t.Errorf("create qp: %v", err)
	}
	wr := verbs.RecvWR{SGList: []verbs.SGE{e.mr.SGE(0, 64)}}
	for range 4 { // the QP's max_recv_wr
		if err := e.qp.PostRecv(&wr); err != nil {
			t.Fatal(err)
		}
	}
	err = e.qp.PostRecv(&wr)
	if !errors.Is(err, syscall.ENOMEM) || !strings.Contains(err.Error(), "receive queue full: 4 of max_recv_wr 4 posted") {
		t.Errorf("post recv: %v", err)
	}
}

// TestTooLongSaid: the first datagram a receive WR cannot hold with its
// GRH area is said (here to the logger) with the sizes and the likely
// cause; the next ones are only counted.
func TestTooLongSaid(t *testing.T) {
	var logs bytes.Buffer
	logging.SetLogger(slog.New(slog.NewTextHandler(&logs, nil)))
	defer logging.SetLogger(nil)
	e := newFakeEnv(t, true, 16)
	rbuf := make([]byte, 64) // room for the payload, not for the GRH area too
	mr, err := e.pd.RegMR(rbuf, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.qp.PostRecv(&verbs.RecvWR{WRID: 1, SGList: []verbs.SGE{mr.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	core := CoreOf(e.dev)
	var grh [verbs.GRHLen]byte
	for range 3 {
		core.DeliverUnicast(e.qp.Num(), &Datagram{GRH: &grh, PKey: 0xffff, QKey: 1, SrcQP: 7, Payload: make([]byte, 50)}, nil)
	}
	qc, _ := core.QPCounters(e.qp.Num())
	if qc[TooLongDrops] != 3 {
		t.Fatalf("too_long_drops %d, want 3", qc[TooLongDrops])
	}
	want := fmt.Sprintf("fake0 QP %#x: dropped a datagram of 50 bytes: its receive WR holds 64 bytes, and a UD receive takes 40 bytes of GRH area before the payload (a buffer without the GRH area?)", e.qp.Num())
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), want) {
		t.Errorf("%d warnings, want one saying %q:\n%s", n, want, logs.String())
	}
}
