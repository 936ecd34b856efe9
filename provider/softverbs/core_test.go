package softverbs

import (
	"errors"
	"syscall"
	"testing"

	"github.com/softrdma/softrdma/verbs"
)

// TestQKeyRule checks the one Q_Key rule of the software devices, the
// kernel rxe's: a send puts the posted Q_Key in the DETH as is (no
// high-bit substitution: rxe_req.c only substitutes for QP1), and a
// receive takes a datagram only when its Q_Key equals the QP's.
func TestQKeyRule(t *testing.T) {
	e := newFakeEnv(t, false, 16)
	wr := &verbs.SendWR{Opcode: verbs.WRSend, UD: verbs.UDWR{AH: e.ah, RemoteQPN: 0x123, RemoteQKey: 0x80000001}}
	if err := e.qp.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	if got := e.drv.qps[0].last.RemoteQKey; got != 0x80000001 {
		t.Errorf("DETH Q_Key %#x, want the posted 0x80000001", got)
	}
	core := CoreOf(e.dev)
	var grh [verbs.GRHLen]byte
	before := core.Counters()
	core.DeliverUnicast(e.qp.Num(), &Datagram{GRH: &grh, PKey: 0xffff, QKey: 0x80000001, Payload: []byte("x")}, nil)
	after := core.Counters()
	if after.Get(QKeyViolations) != before.Get(QKeyViolations)+1 || after.Get(Delivered) != before.Get(Delivered) {
		t.Errorf("high-bit Q_Key to a QP with Q_Key 1: %v → %v", before, after)
	}
}

// TestLimits checks that every limit the device advertises is enforced
// with ENOMEM, as libibverbs reports an exhausted resource: PDs, CQs, MRs,
// AHs, QPs, groups, QPs per group and attachments in all.
func TestLimits(t *testing.T) {
	drv := &fakeDrv{attr: fakeAttr}
	drv.attr.MaxPD, drv.attr.MaxCQ, drv.attr.MaxMR, drv.attr.MaxAH, drv.attr.MaxQP = 2, 3, 1, 1, 2
	drv.attr.MaxMcastGrp, drv.attr.MaxMcastQPAttach, drv.attr.MaxTotalMcastQP = 2, 1, 2
	_, dev := register(drv)
	defer verbs.UnregisterDevice(dev)
	ctx, err := dev.Open()
	if err != nil {
		t.Fatal(err)
	}
	enomem := func(what string, err error) {
		t.Helper()
		var ve *verbs.Error
		if !errors.Is(err, syscall.ENOMEM) || !errors.As(err, &ve) {
			t.Errorf("%s beyond the limit: %v, want ENOMEM", what, err)
		}
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	pd2, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	_, err = ctx.AllocPD()
	enomem("PD", err)
	pd2.Dealloc()
	if pd2, err = ctx.AllocPD(); err != nil {
		t.Errorf("PD after a dealloc: %v", err)
	}
	var cqs []*verbs.CQ
	for range 3 {
		cq, err := ctx.CreateCQ(4)
		if err != nil {
			t.Fatal(err)
		}
		cqs = append(cqs, cq)
	}
	_, err = ctx.CreateCQ(4)
	enomem("CQ", err)
	mr, err := pd.RegMR(make([]byte, 64), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pd.RegMR(make([]byte, 64), verbs.AccessLocalWrite)
	enomem("MR", err)
	ahAttr := &verbs.AHAttr{IsGlobal: true, PortNum: 1}
	ah, err := pd.CreateAH(ahAttr)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pd.CreateAH(ahAttr)
	enomem("AH", err)
	init := &verbs.QPInitAttr{SendCQ: cqs[0], RecvCQ: cqs[1], QPType: verbs.QPTypeUD, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}}
	q1, err := pd.CreateQP(init)
	if err != nil {
		t.Fatal(err)
	}
	q2, err := pd.CreateQP(init)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pd.CreateQP(init)
	enomem("QP", err)
	g1, g2, g3 := verbs.GID{0: 0xff, 15: 1}, verbs.GID{0: 0xff, 15: 2}, verbs.GID{0: 0xff, 15: 3}
	if err := q1.AttachMcast(g1, 0); err != nil {
		t.Fatal(err)
	}
	enomem("QPs in a group", q2.AttachMcast(g1, 0))
	if err := q2.AttachMcast(g2, 0); err != nil {
		t.Fatal(err)
	}
	enomem("groups", q1.AttachMcast(g3, 0))
	// Attaching again is a no-op, not a new attachment.
	if err := q1.AttachMcast(g1, 0); err != nil {
		t.Errorf("attach again: %v", err)
	}
	enomem("attachments", q1.AttachMcast(g2, 0))
	for _, q := range []*verbs.QP{q1, q2} {
		if err := q.Destroy(); err != nil {
			t.Fatal(err)
		}
	}
	if q, err := pd.CreateQP(init); err != nil {
		t.Errorf("QP after a destroy: %v", err)
	} else {
		q.Destroy()
	}
	ah.Destroy()
	mr.Dereg()
	for _, cq := range cqs {
		cq.Destroy()
	}
	pd.Dealloc()
	pd2.Dealloc()
	if err := ctx.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
}

// register creates the verbs core of a provider's device and adds it to
// verbs' device list.
func register(drv Driver) (*Device, *verbs.Device) {
	d := New(drv)
	return d, verbs.RegisterDevice(d)
}
