package rdmacm

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/rdmacm/kernelcm"
	"github.com/softrdma/softrdma/verbs"
)

// fakeKernel stands in for librdmacm, to test what rdmacm does around a
// kernel id (event routing, migration, options) on a host without kernel
// RDMA: each id answers resolve and join with the event the kernel would
// queue.
type fakeKernel struct {
	mu       sync.Mutex
	chans    []*fakeKChan
	opts     []idOption
	acks     atomic.Int64
	events   atomic.Int64
	destroys atomic.Int64
}

func (f *fakeKernel) NewChannel() (kernelcm.Channel, error) {
	c := &fakeKChan{f: f, evs: make(chan *kernelcm.Event, 64), stop: make(chan struct{})}
	f.mu.Lock()
	f.chans = append(f.chans, c)
	f.mu.Unlock()
	return c, nil
}

type fakeKChan struct {
	f      *fakeKernel
	evs    chan *kernelcm.Event
	stop   chan struct{}
	closed atomic.Bool
}

func (c *fakeKChan) CreateID(tok uint64, ps uint16) (kernelcm.ID, error) {
	return &fakeKID{c: c, tok: tok}, nil
}
func (c *fakeKChan) OwnerOf(netip.Addr) string { return "" }
func (c *fakeKChan) Next() (*kernelcm.Event, error) {
	select {
	case ev := <-c.evs:
		return ev, nil
	case <-c.stop:
		return nil, errors.New("closed")
	}
}
func (c *fakeKChan) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		close(c.stop)
	}
	return nil
}

func (c *fakeKChan) push(ev *kernelcm.Event) {
	c.f.events.Add(1)
	ev.Ack = func() error { c.f.acks.Add(1); return nil }
	c.evs <- ev
}

type fakeKID struct {
	c   *fakeKChan
	tok uint64
	src kernelcm.Sockaddr
}

func (k *fakeKID) Bind(sa *kernelcm.Sockaddr) error { k.src = *sa; return nil }
func (k *fakeKID) ResolveAddr(src, dst *kernelcm.Sockaddr, _ time.Duration) error {
	k.c.push(&kernelcm.Event{Type: int(EventAddrResolved), IDToken: k.tok})
	return nil
}
func (k *fakeKID) Join(sa *kernelcm.Sockaddr, tok uint64) error {
	k.c.push(&kernelcm.Event{Type: int(EventMulticastJoin), IDToken: k.tok, MCToken: tok, QPNum: MulticastQPN, QKey: UDPQKey})
	return nil
}
func (k *fakeKID) JoinEx(_, _ uint32, sa *kernelcm.Sockaddr, tok uint64) error {
	return k.Join(sa, tok)
}
func (k *fakeKID) Leave(*kernelcm.Sockaddr) error { return nil }
func (k *fakeKID) SetOption(level, name int, val []byte) error {
	if level != OptionID || name > OptionIDAckTimeout {
		return syscall.ENOSYS
	}
	k.c.f.mu.Lock()
	k.c.f.opts = append(k.c.f.opts, idOption{level, name, val})
	k.c.f.mu.Unlock()
	return nil
}
func (k *fakeKID) ResolveRoute(time.Duration) error {
	k.c.push(&kernelcm.Event{Type: int(EventRouteResolved), IDToken: k.tok})
	return nil
}
func (k *fakeKID) SrcPort() uint16 { return 4242 }
func (k *fakeKID) DstPort() uint16 { return 4791 }
func (k *fakeKID) InitQPAttr() (verbs.QPAttr, verbs.QPAttrMask, error) {
	return verbs.QPAttr{}, 0, syscall.ENOSYS
}
func (k *fakeKID) Local() kernelcm.Sockaddr     { return k.src }
func (k *fakeKID) Peer() kernelcm.Sockaddr      { return kernelcm.Sockaddr{} }
func (k *fakeKID) DeviceName() string           { return "" }
func (k *fakeKID) Route() []kernelcm.PathRecord { return nil }
func (k *fakeKID) PortNum() uint8               { return 1 }
func (k *fakeKID) Destroy() error               { k.c.f.destroys.Add(1); return nil }

// withKernelStack makes s the kernel stack for the test.
func withKernelStack(t *testing.T, s kernelcm.Stack) {
	stackOverride.Store(&s)
	t.Cleanup(func() { stackOverride.Store(nil) })
}

// withFakeKernel makes f the kernel stack for the test.
func withFakeKernel(t *testing.T) *fakeKernel {
	f := &fakeKernel{}
	withKernelStack(t, f)
	return f
}

// TestKernelIDMigrate: a kernel id moved by MigrateID keeps its librdmacm
// id on its first channel's librdmacm channel; its unread events move,
// later ones are delivered to the new channel, the first channel closes
// (its librdmacm channel with the id's Destroy), and every event is acked
// once. Options set before the id became a kernel id reach librdmacm; the
// ports and the route come from librdmacm.
func TestKernelIDMigrate(t *testing.T) {
	f := withFakeKernel(t)
	h := verbs.NewHost()
	defer h.Close()
	ch1, err := CreateEventChannelOn(h)
	if err != nil {
		t.Fatal(err)
	}
	ch2, err := CreateEventChannelOn(h)
	if err != nil {
		t.Fatal(err)
	}
	ch1.SetBackend(BackendKernel)
	id, err := CreateID(ch1, nil, PS_UDP)
	if err != nil {
		t.Fatal(err)
	}
	if _, kern := id.engine().(*kernelEngine); !kern {
		t.Fatal("not a kernel id")
	}
	if err := id.SetOption(OptionID, OptionIDTOS, uint8(0x20)); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, id.SetOption(OptionIB, OptionIBPath, nil), syscall.ENOSYS) // librdmacm's answer
	if err := id.ResolveAddr(lo, lo, time.Second); err != nil {
		t.Fatal(err)
	}
	waitLen := func(ch *EventChannel, n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for ch.Len() < n && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if ch.Len() != n {
			t.Fatalf("%d events queued, want %d", ch.Len(), n)
		}
	}
	waitLen(ch1, 1)
	if err := id.MigrateID(ch2); err != nil {
		t.Fatal(err)
	}
	if ch1.Len() != 0 || ch2.Len() != 1 {
		t.Fatalf("queued %d/%d after the migration", ch1.Len(), ch2.Len())
	}
	ev, err := ch2.GetEvent(ctxT(t))
	if err != nil || ev.Event != EventAddrResolved {
		t.Fatalf("%v %v", ev, err)
	}
	ev.Ack()
	// ch1 has no id left; its librdmacm channel stays for the id.
	if err := ch1.Close(); err != nil {
		t.Fatal(err)
	}
	if f.chans[0].closed.Load() {
		t.Fatal("the librdmacm channel of a migrated kernel id was closed")
	}
	g := randGroup()
	if err := id.JoinMulticast(g, "after"); err != nil {
		t.Fatal(err)
	}
	ev, err = ch2.GetEvent(ctxT(t))
	if err != nil || ev.Event != EventMulticastJoin || ev.Param.PrivateData != "after" || ev.Param.PrivateDataLen != 0 {
		t.Fatalf("join event %v %v", ev, err)
	}
	ev.Ack()
	if id.SrcPort() != 4242 || id.DstPort() != 4791 {
		t.Errorf("ports %d/%d, want librdmacm's", id.SrcPort(), id.DstPort())
	}
	// To synchronous and on: ResolveRoute waits for ROUTE_RESOLVED.
	if err := id.MigrateID(nil); err != nil {
		t.Fatal(err)
	}
	if err := id.ResolveRoute(time.Second); err != nil {
		t.Fatal(err)
	}
	if ev := id.Event(); ev == nil || ev.Event != EventRouteResolved {
		t.Fatalf("parked %v", ev)
	}
	if err := id.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
	if err := id.Destroy(); err != nil {
		t.Fatal(err)
	}
	if !f.chans[0].closed.Load() {
		t.Error("the librdmacm channel outlived its last id")
	}
	if err := ch2.Close(); err != nil {
		t.Fatal(err)
	}
	if f.acks.Load() != f.events.Load() || f.destroys.Load() != 1 {
		t.Errorf("%d events, %d acks, %d destroys", f.events.Load(), f.acks.Load(), f.destroys.Load())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.opts) != 1 || f.opts[0].name != OptionIDTOS {
		t.Errorf("options given to librdmacm: %+v", f.opts)
	}
}

// TestKernelIDOptionsReplayed: options set on an id before it becomes a
// kernel id (BackendAuto binds it later) are given to its librdmacm id.
func TestKernelIDOptionsReplayed(t *testing.T) {
	f := withFakeKernel(t)
	h := verbs.NewHost()
	defer h.Close()
	ch, err := CreateEventChannelOn(h)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	id, err := CreateID(ch, nil, PS_UDP)
	if err != nil {
		t.Fatal(err)
	}
	defer id.Destroy()
	if err := id.SetOption(OptionID, OptionIDReuseAddr, 1); err != nil {
		t.Fatal(err)
	}
	if err := id.SetOption(OptionID, OptionIDTOS, uint8(0x10)); err != nil {
		t.Fatal(err)
	}
	ch.SetBackend(BackendKernel)
	// An idle id of a kernel channel becomes a kernel id at bind.
	id.mu.Lock()
	eng, err := id.toKernelLocked(&sockaddr{})
	id.mu.Unlock()
	if _, kern := eng.(*kernelEngine); err != nil || !kern {
		t.Fatalf("to kernel: %T %v", eng, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.opts) != 2 || f.opts[0].name != OptionIDReuseAddr || f.opts[1].name != OptionIDTOS || f.opts[1].val[0] != 0x10 {
		t.Errorf("replayed %+v", f.opts)
	}
}

// noDevKernel is librdmacm on a host without kernel RDMA devices: its
// channel opens, its ids fail with ENODEV.
type noDevKernel struct{ fakeKernel }

func (f *noDevKernel) NewChannel() (kernelcm.Channel, error) {
	c, _ := f.fakeKernel.NewChannel()
	return noDevChan{c.(*fakeKChan)}, nil
}

type noDevChan struct{ *fakeKChan }

func (noDevChan) CreateID(uint64, uint16) (kernelcm.ID, error) { return nil, syscall.ENODEV }

// TestKernelWithoutDevicesSaysSo: SOFTRDMA_BACKEND=kernel on a host whose
// librdmacm finds no device fails CreateID with librdmacm's ENODEV and a
// reason that says so.
func TestKernelWithoutDevicesSaysSo(t *testing.T) {
	withKernelStack(t, &noDevKernel{})
	h := verbs.NewHost()
	defer h.Close()
	ch, err := CreateEventChannelOn(h)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ch.SetBackend(BackendKernel)
	_, err = CreateID(ch, nil, PS_UDP)
	if !errors.Is(err, syscall.ENODEV) || !strings.Contains(fmt.Sprint(err), "found no kernel RDMA device") {
		t.Errorf("CreateID: %v, want ENODEV saying no kernel RDMA device was found", err)
	}
}
