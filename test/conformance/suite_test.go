package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/test/nettest"
	"github.com/softrdma/softrdma/test/testep"
	"github.com/softrdma/softrdma/verbs"
)

// config is what the environment chose (see the package doc).
type config struct {
	target  target
	backend rdmacm.Backend
	addr    netip.Addr
	unreach netip.Addr
	// unreachSrc is the bound source of the unreachable case from a
	// source: an address on a link where nothing answers (default addr).
	unreachSrc netip.Addr
	// inNet runs a call where unreach has no route (nil: here).
	inNet func(func() error) error
	// noUnreach says why there is no unreachable address.
	noUnreach string
}

func loadConfig(t *testing.T) config {
	t.Helper()
	c := config{target: targetSoft, backend: rdmacm.BackendSoft, addr: netip.MustParseAddr("127.0.0.1")}
	if s := os.Getenv("SOFTRDMA_CONFORMANCE_BACKEND"); s != "" {
		b, err := rdmacm.ParseBackend(s)
		if err != nil || b == rdmacm.BackendAuto {
			t.Fatalf("SOFTRDMA_CONFORMANCE_BACKEND=%q: want soft or kernel", s)
		}
		c.backend = b
		if b == rdmacm.BackendKernel {
			c.target = targetKernel
		}
	}
	if c.backend == rdmacm.BackendKernel && !rdmacm.KernelAvailable() {
		t.Fatal("SOFTRDMA_CONFORMANCE_BACKEND=kernel needs a build with -tags rdmacore")
	}
	for _, v := range []struct {
		env string
		dst *netip.Addr
	}{{"SOFTRDMA_CONFORMANCE_ADDR", &c.addr}, {"SOFTRDMA_CONFORMANCE_UNREACH", &c.unreach}} {
		if s := os.Getenv(v.env); s != "" {
			a, err := netip.ParseAddr(s)
			if err != nil {
				t.Fatalf("%s: %v", v.env, err)
			}
			*v.dst = a
		}
	}
	if !c.unreach.IsValid() && c.backend == rdmacm.BackendSoft {
		// On the host: a namespace without routes, where 192.0.2.1
		// (TEST-NET-1) is unreachable.
		ns, why := routelessNetns()
		if ns == "" {
			c.noUnreach = why
		} else {
			c.unreach = netip.MustParseAddr("192.0.2.1")
			c.unreachSrc = netip.MustParseAddr(routelessSrc)
			c.inNet = func(fn func() error) error { return nettest.InNetns(ns, fn) }
		}
	}
	if !c.unreachSrc.IsValid() {
		c.unreachSrc = c.addr
	}
	return c
}

// suite is one run of the cases on one backend.
type suite struct {
	config
	groups sync.Map // group addresses handed out, to keep them distinct
}

// target is what a run tests: softrdma's RoCEv2 device, softrdma's
// emulated InfiniBand subnet, a kind of device registered from this test
// package (fakekind_test.go), or the kernel's RDMA stack.
type target string

const (
	targetSoft   target = "soft"
	targetSoftIB target = "soft-ib"
	targetFake   target = "fake-kind" // expects what soft does
	targetKernel target = "kernel"
)

// want is a case's expected outcome per target; kernel or ib "" means the
// same as soft. A difference is listed in docs/kernel.md's differences table.
type want struct{ soft, kernel, ib string }

func (w want) of(tg target) string {
	switch {
	case tg == targetKernel && w.kernel != "":
		return w.kernel
	case tg == targetSoftIB && w.ib != "":
		return w.ib
	}
	return w.soft
}

// same is a want that both backends share.
func same(s string) want { return want{soft: s} }

// run runs one case and prints its line.
func (s *suite) run(t *testing.T, name string, fn func(t *testing.T) string) {
	t.Run(name, func(t *testing.T) {
		var seen string
		t.Cleanup(func() {
			res := "PASS"
			switch {
			case t.Skipped():
				res = "SKIP"
				if s.target == targetSoft {
					softSkipped.Store(true)
				}
			case t.Failed():
				res = "FAIL"
			}
			fmt.Printf("CONFORMANCE %-7s %-34s %s %s\n", s.target, name, res, seen)
		})
		seen = fn(t)
	})
}

// expect checks an outcome against the backend's and returns it.
func (s *suite) expect(t *testing.T, what, got string, w want) string {
	t.Helper()
	record(t, what, w)
	if exp := w.of(s.target); got != exp {
		t.Errorf("%s: got %s, want %s (documented for %s)", what, got, exp, s.target)
	}
	return what + "=" + got
}

// outcome names what a call did: OK, an errno name, or an unknown error.
func outcome(err error) string {
	if err == nil {
		return "OK"
	}
	var e syscall.Errno
	if !errors.As(err, &e) {
		return "error(" + err.Error() + ")"
	}
	if n, ok := errnoNames[e]; ok {
		return n
	}
	return fmt.Sprintf("errno%d", int(e))
}

var errnoNames = map[syscall.Errno]string{
	syscall.EINVAL: "EINVAL", syscall.EOPNOTSUPP: "EOPNOTSUPP", syscall.EADDRNOTAVAIL: "EADDRNOTAVAIL",
	syscall.ENODEV: "ENODEV", syscall.ENOMEM: "ENOMEM", syscall.ENETUNREACH: "ENETUNREACH",
	syscall.ETIMEDOUT: "ETIMEDOUT", syscall.EAGAIN: "EAGAIN", syscall.EBUSY: "EBUSY",
	syscall.EADDRINUSE: "EADDRINUSE", syscall.ENOSYS: "ENOSYS", syscall.EPERM: "EPERM",
	syscall.EHOSTUNREACH: "EHOSTUNREACH", syscall.ENOENT: "ENOENT", rdmacm.ENOTSUPP: "ENOTSUPP(524)",
	syscall.EAFNOSUPPORT: "EAFNOSUPPORT", syscall.EPROTONOSUPPORT: "EPROTONOSUPPORT", syscall.EACCES: "EACCES",
}

// group returns a multicast group no other case of the run uses.
func (s *suite) group(t *testing.T) netip.Addr {
	t.Helper()
	for {
		g := netip.AddrFrom4([4]byte{239, byte(1 + rand.IntN(250)), byte(rand.IntN(256)), byte(1 + rand.IntN(250))})
		if _, dup := s.groups.LoadOrStore(g, true); !dup {
			return g
		}
	}
}

// channel returns an event channel of the backend, closed at the end.
func (s *suite) channel(t *testing.T) *rdmacm.EventChannel {
	t.Helper()
	ch, err := rdmacm.CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.SetBackend(s.backend); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ch.Close(); err != nil {
			t.Errorf("close channel: %v", err)
		}
	})
	return ch
}

// id creates an id on ch, destroyed at the end (unless the case did).
func (s *suite) id(t *testing.T, ch *rdmacm.EventChannel, ps rdmacm.PortSpace) *rdmacm.ID {
	t.Helper()
	id, err := rdmacm.CreateID(ch, nil, ps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, id) })
	return id
}

// destroyed records ids a case destroyed itself.
var destroyed sync.Map

func destroy(t *testing.T, id *rdmacm.ID) {
	if _, done := destroyed.LoadOrStore(id, true); done {
		return
	}
	if qp := id.QP(); qp != nil {
		id.DestroyQP()
	}
	if err := id.Destroy(); err != nil {
		t.Errorf("destroy id: %v", err)
	}
}

// bound returns a UD id bound to the configured address.
func (s *suite) bound(t *testing.T, ch *rdmacm.EventChannel) *rdmacm.ID {
	t.Helper()
	id := s.id(t, ch, rdmacm.PS_UDP)
	if err := id.BindAddr(rdmacm.UDPAddr(s.addr)); err != nil {
		t.Fatalf("bind %v: %v", s.addr, err)
	}
	return id
}

// event waits for the next event of ch.
func event(t *testing.T, ch *rdmacm.EventChannel) *rdmacm.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ev, err := ch.GetEvent(ctx)
	if err != nil {
		t.Fatalf("get event: %v", err)
	}
	return ev
}

// joinEx joins g with the extended call.
func joinEx(id *rdmacm.ID, g netip.Addr, flags uint32, ctx any) error {
	return id.JoinMulticastEx(&rdmacm.JoinMCAttrEx{
		CompMask: rdmacm.JoinMCAttrAddress | rdmacm.JoinMCAttrJoinFlags, JoinFlags: flags, Addr: rdmacm.UDPAddr(g),
	}, ctx)
}

// joined joins g and returns the acked JOIN event's parameters.
func joined(t *testing.T, ch *rdmacm.EventChannel, id *rdmacm.ID, g netip.Addr, flags uint32) rdmacm.UDParam {
	t.Helper()
	if err := joinEx(id, g, flags, g); err != nil {
		t.Fatalf("join %v: %v", g, err)
	}
	ev := event(t, ch)
	defer ev.Ack()
	if ev.Event != rdmacm.EventMulticastJoin || ev.ID != id {
		t.Fatalf("join %v: event %v (status %d, err %v), want MULTICAST_JOIN of the id", g, ev.Event, ev.Status, ev.Err)
	}
	return ev.Param
}

// endpoint creates the id's QP (create flags flags) and posts n receives
// (package testep); the id goes with the test, before the endpoint's
// memory.
func endpoint(t *testing.T, id *rdmacm.ID, n int, flags verbs.CreateFlags) *testep.EP {
	t.Helper()
	return testep.New(t, id, n, flags, func() { destroy(t, id) })
}

func messages(tag string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s %d;", tag, i)
	}
	return b.String()
}

func joinStrings(ss []string) string { return strings.Join(ss, ";") + ";" }

// TestConformance runs every case on the configured backend.
func TestConformance(t *testing.T) {
	s := &suite{config: loadConfig(t)}
	s.runAll(t)
}

// TestConformanceIB runs every case on softrdma's emulated InfiniBand
// subnet: an in-process subnet manager and one IB port of this process
// (its IPoIB address 127.0.0.2). Only where the suite tests softrdma.
func TestConformanceIB(t *testing.T) {
	c := loadConfig(t)
	if c.backend != rdmacm.BackendSoft {
		t.Skip("the emulated IB subnet is softrdma's: the kernel run has no such target")
	}
	c.target, c.addr = targetSoftIB, netip.MustParseAddr("127.0.0.2")
	c.unreach, c.inNet, c.noUnreach = netip.Addr{}, nil, "the emulated subnet has no route table"
	startSubnet(t, c.addr)
	s := &suite{config: c}
	s.runAll(t)
}

// runAll runs every case.
func (s *suite) runAll(t *testing.T) {
	t.Logf("target %s, address %v", s.target, s.addr)
	s.run(t, "join-validation", s.joinValidation)
	s.run(t, "join-event", s.joinEvent)
	s.run(t, "full-member-receives", s.fullMemberReceives)
	s.run(t, "send-only-never-receives", s.sendOnly)
	s.run(t, "manual-attach-without-qp", s.manualAttach)
	s.run(t, "several-ids-one-group", s.severalIDs)
	s.run(t, "leave-rules", s.leaveRules)
	s.run(t, "destroy-with-joins", s.destroyWithJoins)
	s.run(t, "resolve-unreachable", s.resolveUnreachable)
	s.run(t, "resolve-unreachable-from-src", s.resolveUnreachableFromSrc)
	s.run(t, "ipv6-group-on-ipv4-id", s.ipv6Group)
	s.run(t, "block-self-mcast-lb", s.blockSelfLB)
	s.run(t, "attach-failure", s.attachFailure)
	s.run(t, "join-leave-race", s.joinLeaveRace)
	s.run(t, "set-option", s.setOption)
	s.run(t, "tos-join", s.tosJoin)
	s.run(t, "port-rules", s.portRules)
	s.run(t, "port-spaces", s.portSpaces)
	s.run(t, "ipoib-join", s.ipoibJoin)
	s.run(t, "route-then-join", s.routeThenJoin)
	s.run(t, "migrate-id", s.migrateID)
	s.run(t, "passive-ep", s.passiveEP)
}

var _ net.Addr = (*rdmacm.IBAddr)(nil)
