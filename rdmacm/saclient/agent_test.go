package saclient

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sa"
	"github.com/softrdma/softrdma/verbs"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

const testGUID = 0x0002c90000000042

// fakePort is a port whose SA is an in-process ib/sa answering from LID
// 1, QP1; silent makes it drop every request.
type fakePort struct {
	t      *testing.T
	e      *Agent
	silent atomic.Bool

	mu   sync.Mutex
	sa   *sa.SA
	sent map[uint8]int // requests by method
	last mad.MAD       // the last request
	wg   sync.WaitGroup
}

func newFakePort(t *testing.T, cfg Config) *fakePort {
	p := &fakePort{t: t, sa: sa.New(sa.Config{SubnetPrefix: fabric.DefaultSubnetPrefix, SendOnlySupport: true}), sent: map[uint8]int{}}
	p.sa.AddPort(sa.Port{GUID: testGUID, MTU: fabric.PortMTU, Rate: fabric.PortRate})
	p.e = New(p, cfg)
	t.Cleanup(func() { p.e.Close(); p.wg.Wait() })
	return p
}

func (p *fakePort) SendSA(m []byte) error {
	req := append(mad.MAD(nil), m...)
	p.mu.Lock()
	p.sent[req.Method()]++
	p.last = req
	p.mu.Unlock()
	if p.silent.Load() {
		return nil
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.mu.Lock()
		resps := p.sa.Handle(req, sa.From{GUID: testGUID})
		p.mu.Unlock()
		for _, r := range resps {
			p.e.Receive(fabric.SMLID, mad.GSIQPN, r)
		}
	}()
	return nil
}

func (p *fakePort) PortGID() verbs.GID { return fabric.PortGID(fabric.DefaultSubnetPrefix, testGUID) }
func (p *fakePort) SMLID() uint16      { return fabric.SMLID }

func (p *fakePort) count(method uint8) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent[method]
}

// saJoinState is the JoinState the SA holds for the port in mgid (0: none).
func (p *fakePort) saJoinState(mgid verbs.GID) uint8 {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, g := range p.sa.Groups() {
		if g.Rec.MGID == mgid {
			for _, m := range g.Members {
				if m.GUID == testGUID {
					return m.JoinState
				}
			}
		}
	}
	return 0
}

// join joins mgid with a JoinState and returns the member and the status
// of its first callback; later callbacks go to the returned channel.
func (p *fakePort) join(mgid verbs.GID, state uint8) (*Member, int, chan int) {
	p.t.Helper()
	bc, ok := p.e.BroadcastGroup()
	if !ok {
		p.t.Fatal("no broadcast group")
	}
	req := bc
	req.MGID, req.PortGID, req.QKey, req.MLID, req.JoinState = mgid, p.PortGID(), 0x01234567, 0, state
	ch := make(chan int, 8)
	m, err := p.e.Join(req, mad.CompCreateRequired, func(status int, _ *GroupRecord) { ch <- status })
	if err != nil {
		p.t.Fatal(err)
	}
	select {
	case st := <-ch:
		return m, st, ch
	case <-time.After(10 * time.Second):
		p.t.Fatal("no join callback")
	}
	return nil, 0, nil
}

var testMGID = verbs.GID{0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 15: 0x42}

// TestSharedMembership: two local FullMember joins share one SA
// membership: one Set, no Delete for the first leave, one Delete for the
// last, after which the SA holds nothing for the port.
func TestSharedMembership(t *testing.T) {
	p := newFakePort(t, Config{})
	p.e.Refresh()
	sets := p.count(mad.MethodSet)
	a, st, _ := p.join(testMGID, mad.JoinFullMember)
	if st != 0 {
		t.Fatalf("first join: %d", st)
	}
	b, st, _ := p.join(testMGID, mad.JoinFullMember)
	if st != 0 {
		t.Fatalf("second join: %d", st)
	}
	if n := p.count(mad.MethodSet) - sets; n != 1 {
		t.Errorf("%d Sets for two joins of one JoinState, want 1", n)
	}
	if ms := p.e.Memberships(); len(ms) != 1 || ms[0].Members != [4]int{2, 0, 0, 0} || ms[0].JoinState != mad.JoinFullMember {
		t.Errorf("memberships %+v", ms)
	}
	if err := p.e.Leave(a); err != nil {
		t.Fatal(err)
	}
	if n := p.count(mad.MethodDelete); n != 0 {
		t.Errorf("%d Deletes while a member remains", n)
	}
	if js := p.saJoinState(testMGID); js != mad.JoinFullMember {
		t.Errorf("SA join state %#x after the first leave", js)
	}
	if err := p.e.Leave(b); err != nil {
		t.Fatal(err)
	}
	// Leave returned: the Delete was answered, no waiting needed.
	if js := p.saJoinState(testMGID); js != 0 {
		t.Errorf("SA still holds join state %#x after the last leave returned", js)
	}
	if n := p.count(mad.MethodDelete); n != 1 {
		t.Errorf("%d Deletes, want 1", n)
	}
	if ms := p.e.Memberships(); len(ms) != 0 {
		t.Errorf("memberships after leaving: %+v", ms)
	}
}

// TestLeaveTimesOut: a leave the SA never answers returns ETIMEDOUT after
// the timeout and its retries, not earlier and not never.
func TestLeaveTimesOut(t *testing.T) {
	p := newFakePort(t, Config{Timeout: 100 * time.Millisecond, Retries: 1})
	p.e.Refresh()
	m, st, _ := p.join(testMGID, mad.JoinFullMember)
	if st != 0 {
		t.Fatal(st)
	}
	p.silent.Store(true)
	start := time.Now()
	err := p.e.Leave(m)
	if el := time.Since(start); el < 200*time.Millisecond {
		t.Errorf("leave returned after %v, before the SA timed out twice", el)
	}
	if !errors.Is(err, syscall.ETIMEDOUT) {
		t.Fatalf("leave: %v, want ETIMEDOUT", err)
	}
	if n := p.count(mad.MethodDelete); n != 2 {
		t.Errorf("%d Deletes sent, want 2 (one retry)", n)
	}
}

// TestSilentSAFreezesNothing: while a leave waits for a silent SA (here
// up to 2 × 1 s), the port's other groups, its events and its snapshots
// go on: a reregister reaches the other group's member at once, a join of
// a third group is sent at once, and Close ends the leave (with no error:
// the reregister dropped the membership anyway).
// (Before ib/mcast, a leave held the group's lock across its SA retries,
// and the port's event handling waited for it.)
func TestSilentSAFreezesNothing(t *testing.T) {
	p := newFakePort(t, Config{Timeout: time.Second, Retries: 1})
	p.e.Refresh()
	mgidB := testMGID
	mgidB[15] = 0x43
	a, st, _ := p.join(testMGID, mad.JoinFullMember)
	if st != 0 {
		t.Fatal(st)
	}
	_, st, cbB := p.join(mgidB, mad.JoinFullMember)
	if st != 0 {
		t.Fatal(st)
	}
	p.silent.Store(true)
	leave := p.e.StartLeave(a)
	left := make(chan error, 1)
	go func() { left <- leave.Wait() }()
	waitFor(t, "the Delete to go out", func() bool { return p.count(mad.MethodDelete) == 1 })

	if ms := p.e.Memberships(); len(ms) != 1 || ms[0].MGID != mgidB {
		t.Errorf("memberships while a leave is pending: %+v", ms)
	}
	p.e.Event(ClientReregister)
	select {
	case st := <-cbB:
		if st != -int(syscall.ENETRESET) {
			t.Errorf("the other group's member got %d, want -ENETRESET", st)
		}
	case err := <-left:
		t.Fatalf("the reregister reached the other group only after the leave ended (%v)", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no -ENETRESET for the other group's member")
	}
	sets := p.count(mad.MethodSet)
	mgidC := testMGID
	mgidC[15] = 0x44
	if _, err := p.e.Join(GroupRecord{MGID: mgidC, PortGID: p.PortGID(), JoinState: mad.JoinFullMember}, mad.CompCreateRequired, func(int, *GroupRecord) {}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the third group's Set", func() bool { return p.count(mad.MethodSet) > sets })
	select {
	case err := <-left:
		t.Fatalf("the leave ended before the SA timed out: %v", err)
	default:
	}
	p.e.Close()
	select {
	case err := <-left:
		if err != nil {
			t.Errorf("leave of a membership the reregister dropped: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the pending leave")
	}
}

// TestCloseEndsLeave: Close ends a leave waiting for a silent SA with
// ENODEV at once.
func TestCloseEndsLeave(t *testing.T) {
	p := newFakePort(t, Config{Timeout: 10 * time.Second, Retries: 1})
	p.e.Refresh()
	a, st, _ := p.join(testMGID, mad.JoinFullMember)
	if st != 0 {
		t.Fatal(st)
	}
	p.silent.Store(true)
	leave := p.e.StartLeave(a)
	waitFor(t, "the Delete to go out", func() bool { return p.count(mad.MethodDelete) == 1 })
	start := time.Now()
	p.e.Close()
	if err := leave.Wait(); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("leave ended by Close: %v, want ENODEV", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("Close and the leave took %v with a 10 s SA timeout pending", el)
	}
	if _, err := p.e.Join(GroupRecord{MGID: testMGID}, 0, func(int, *GroupRecord) {}); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("join after Close: %v, want ENODEV", err)
	}
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestSAAnswerMustMatch: an SA answer is taken only with the TID, the
// response method and the attribute of the pending request, from the SM's
// LID and QP1; anything else is dropped and counted.
func TestSAAnswerMustMatch(t *testing.T) {
	p := newFakePort(t, Config{Timeout: 10 * time.Second})
	p.silent.Store(true)
	got := make(chan int, 1)
	req := GroupRecord{MGID: testMGID, PortGID: p.PortGID(), QKey: 0x01234567, PKey: 0xffff, MTU: 4, Rate: 3, JoinState: mad.JoinFullMember}
	if _, err := p.e.Join(req, mad.CompCreateRequired, func(st int, _ *GroupRecord) { got <- st }); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the Set", func() bool { return p.count(mad.MethodSet) == 1 })
	p.mu.Lock()
	resps := p.sa.Handle(p.last, sa.From{GUID: testGUID})
	p.mu.Unlock()
	if len(resps) != 1 || resps[0].Status() != 0 {
		t.Fatalf("SA answer %v", resps)
	}
	good := resps[0]
	variant := func(fn func(mad.MAD)) mad.MAD {
		m := append(mad.MAD(nil), good...)
		fn(m)
		return m
	}
	for _, c := range []struct {
		name  string
		slid  uint16
		srcQP uint32
		m     mad.MAD
	}{
		{"another TID", fabric.SMLID, 1, variant(func(m mad.MAD) { m.SetTID(m.TID() + 1) })},
		{"a request, not a response", fabric.SMLID, 1, variant(func(m mad.MAD) { m.SetMethod(mad.MethodSet) })},
		{"a DeleteResp", fabric.SMLID, 1, variant(func(m mad.MAD) { m.SetMethod(mad.MethodDeleteResp) })},
		{"another attribute", fabric.SMLID, 1, variant(func(m mad.MAD) { m.SetAttrID(mad.AttrClassPortInfo) })},
		{"another class", fabric.SMLID, 1, variant(func(m mad.MAD) { m.SetMgmtClass(0x81) })},
		{"another source LID", 9, 1, good},
		{"another source QP", fabric.SMLID, 0, good},
		{"a short MAD", fabric.SMLID, 1, good[:100]},
	} {
		if p.e.Receive(c.slid, c.srcQP, c.m) {
			t.Errorf("%s: taken", c.name)
		}
		select {
		case st := <-got:
			t.Fatalf("%s: the join completed with %d", c.name, st)
		default:
		}
	}
	if !p.e.Receive(fabric.SMLID, 1, good) {
		t.Fatal("the matching answer was not taken")
	}
	if st := <-got; st != 0 {
		t.Fatalf("join status %d", st)
	}
	if p.e.Receive(fabric.SMLID, 1, good) {
		t.Error("a second copy of the answer was taken")
	}
	if st := p.e.Stats(); st.Answers != 1 || st.Stray != 9 {
		t.Errorf("stats %+v, want 1 answer and 9 stray", st)
	}
}
