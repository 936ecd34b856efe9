package rxe

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
)

// TestAsyncPortEvents: the RoCEv2 device of a veth interface (in a network
// namespace of the test's own) raises IBV_EVENT_PORT_ERR when the
// interface is set down or loses its carrier (its peer set down) and
// IBV_EVENT_PORT_ACTIVE when it is up and running again, as the kernel's
// rxe does on netdev events; the port's state QueryPort reports has
// changed when the event is read. Removing the interface is PORT_ERR too.
func TestAsyncPortEvents(t *testing.T) {
	if !testenv.InNetns(t) {
		return
	}
	const name = "srport0"
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	running := func() bool {
		i, err := net.InterfaceByName(name)
		return err == nil && i.Flags&net.FlagRunning != 0
	}
	ip("link", "add", name, "type", "veth", "peer", "name", name+"p")
	ip("link", "set", name, "up")
	ip("link", "set", name+"p", "up")
	eventually(t, "veth running", running)
	d, err := ForName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, err := d.Verbs().Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.WatchAsyncEvents()

	// expect reads events until one of type want (the GID table changes
	// as the kernel adds and removes the veth's link-local address on the
	// way are skipped) and checks the port's state.
	expect := func(what string, want verbs.AsyncEventType, state verbs.PortState) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for {
			ev, err := c.GetAsyncEvent(ctx)
			if err != nil {
				t.Fatalf("%s: no %v event: %v", what, want, err)
			}
			c.AckAsyncEvent(ev)
			if ev.PortNum != 1 {
				t.Errorf("%s: event %v of port %d, want port 1", what, ev.Type, ev.PortNum)
			}
			if ev.Type == verbs.EventGIDChange {
				continue
			}
			if ev.Type != want {
				t.Fatalf("%s: event %v, want %v", what, ev.Type, want)
			}
			break
		}
		if pa, err := c.QueryPort(1); err != nil || pa.State != state {
			t.Errorf("%s: port state %v (%v), want %v", what, pa.State, err, state)
		}
	}
	ip("link", "set", name, "down")
	expect("link down", verbs.EventPortErr, verbs.PortDown)
	ip("link", "set", name, "up")
	expect("link up", verbs.EventPortActive, verbs.PortActive)
	ip("link", "set", name+"p", "down")
	expect("carrier lost", verbs.EventPortErr, verbs.PortDown)
	ip("link", "set", name+"p", "up")
	expect("carrier back", verbs.EventPortActive, verbs.PortActive)
	ip("link", "del", name)
	expect("interface removed", verbs.EventPortErr, verbs.PortDown)
	if n := c.UnackedAsyncEvents(); n != 0 {
		t.Errorf("%d events not acknowledged", n)
	}
}

// TestRemovedInterfaceUnlisted: once its interface is removed, the
// device is no longer in the host's device list and is closed (the
// kernel's rxe unregisters its device with its netdev); an interface made
// again with the same name has a device of its own.
func TestRemovedInterfaceUnlisted(t *testing.T) {
	if !testenv.InNetns(t) {
		return
	}
	const name = "srgone0"
	listed := func() *verbs.Device {
		for _, vd := range verbs.DefaultHost().DeviceList() {
			if vd.Name() == "rxe_"+name {
				return vd
			}
		}
		return nil
	}
	ipCmd(t, "link", "add", name, "type", "veth", "peer", "name", name+"p")
	d, err := ForName(name)
	if err != nil {
		t.Fatal(err)
	}
	if listed() != d.Verbs() {
		t.Fatal("the device of a new interface is not listed")
	}
	ipCmd(t, "link", "del", name)
	if vd := listed(); vd != nil {
		t.Errorf("%s listed after its interface was removed", vd.Name())
	}
	if existing(name) != nil {
		t.Error("the device of the removed interface is still in the registry")
	}
	ipCmd(t, "link", "add", name, "type", "veth", "peer", "name", name+"p")
	defer exec.Command("ip", "link", "del", name).Run()
	d2, err := ForName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if d2 == d || listed() != d2.Verbs() {
		t.Error("the new interface of the same name did not get a device of its own")
	}
}
