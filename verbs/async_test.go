package verbs_test

import (
	"context"
	"errors"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/provider/rxe"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// fakeAsyncDev is a device whose asynchronous events the test raises.
type fakeAsyncDev struct {
	mu   sync.Mutex
	subs map[int]func(verbs.AsyncEvent)
	next int
}

type fakeAsyncCtx struct{ driver.ContextOps }

func (fakeAsyncCtx) Close() error { return nil }

func (*fakeAsyncDev) Name() string                     { return "fake0" }
func (*fakeAsyncDev) Attr() verbs.DeviceAttr           { return verbs.DeviceAttr{PhysPortCnt: 1} }
func (*fakeAsyncDev) Open() (driver.ContextOps, error) { return fakeAsyncCtx{}, nil }

func (d *fakeAsyncDev) SubscribeAsync(fn func(verbs.AsyncEvent)) func() {
	d.mu.Lock()
	defer d.mu.Unlock()
	id := d.next
	d.next++
	d.subs[id] = fn
	return func() {
		d.mu.Lock()
		delete(d.subs, id)
		d.mu.Unlock()
	}
}

func (d *fakeAsyncDev) raise(ev verbs.AsyncEvent) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, fn := range d.subs {
		fn(ev)
	}
}

func (d *fakeAsyncDev) subscribers() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.subs)
}

// TestAsyncEvents: a context queues its device's events from
// WatchAsyncEvents on, in order, each once; AsyncEventReady says when one
// waits; AckAsyncEvent counts them off; Close unsubscribes and a waiting
// GetAsyncEvent returns EBADF.
func TestAsyncEvents(t *testing.T) {
	h := verbs.NewHost()
	defer h.Close()
	fd := &fakeAsyncDev{subs: map[int]func(verbs.AsyncEvent){}}
	dev := h.RegisterDevice(fd)
	c, err := dev.Open()
	if err != nil {
		t.Fatal(err)
	}
	fd.raise(verbs.AsyncEvent{Type: verbs.EventPortErr, PortNum: 1}) // before the watch: not queued
	ready := c.AsyncEventReady()
	if fd.subscribers() != 1 {
		t.Fatalf("%d subscribers, want 1", fd.subscribers())
	}
	c.WatchAsyncEvents() // idempotent
	if fd.subscribers() != 1 {
		t.Fatalf("%d subscribers after a second watch, want 1", fd.subscribers())
	}
	select {
	case <-ready:
		t.Fatal("ready without an event")
	default:
	}
	want := []verbs.AsyncEvent{{Type: verbs.EventPortErr, PortNum: 1}, {Type: verbs.EventPortActive, PortNum: 1}, {Type: verbs.EventClientReregister, PortNum: 1}}
	for _, ev := range want {
		fd.raise(ev)
	}
	<-ready
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, w := range want {
		ev, err := c.GetAsyncEvent(ctx)
		if err != nil || ev != w {
			t.Fatalf("event %d: %+v, %v; want %+v", i, ev, err, w)
		}
	}
	if n := c.UnackedAsyncEvents(); n != 3 {
		t.Errorf("%d unacknowledged, want 3", n)
	}
	for _, w := range want {
		c.AckAsyncEvent(w)
	}
	if n := c.UnackedAsyncEvents(); n != 0 {
		t.Errorf("%d unacknowledged after the acks, want 0", n)
	}
	if s := verbs.EventPortActive.String(); s != "port active" {
		t.Errorf("EventPortActive: %q", s)
	}
	short, cancelShort := context.WithCancel(context.Background())
	cancelShort()
	if _, err := c.GetAsyncEvent(short); !errors.Is(err, context.Canceled) {
		t.Errorf("GetAsyncEvent with a done context: %v", err)
	}
	got := make(chan error, 1)
	go func() { _, err := c.GetAsyncEvent(ctx); got <- err }()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, syscall.EBADF) {
		t.Errorf("GetAsyncEvent across Close: %v, want EBADF", err)
	}
	if fd.subscribers() != 0 {
		t.Errorf("%d subscribers after Close", fd.subscribers())
	}
	fd.raise(verbs.AsyncEvent{Type: verbs.EventPortActive, PortNum: 1}) // nobody listens
}

// TestAsyncEventsRXE: the RoCEv2 device of lo raises IBV_EVENT_GID_CHANGE
// when an address is added to lo (a network namespace of the test's own,
// the address pinned).
func TestAsyncEventsRXE(t *testing.T) {
	if !testenv.InNetns(t) {
		return
	}
	d, err := rxe.ForName("lo")
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.Verbs().Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.WatchAsyncEvents()
	if out, err := exec.Command("ip", "addr", "add", "127.0.9.1/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("ip addr add: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := c.GetAsyncEvent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ev != (verbs.AsyncEvent{Type: verbs.EventGIDChange, PortNum: 1}) {
		t.Errorf("event %+v, want GID change on port 1", ev)
	}
	c.AckAsyncEvent(ev)
}
