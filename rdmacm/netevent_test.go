package rdmacm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestNetdevEvents checks ADDR_CHANGE when the bound address goes away and
// DEVICE_REMOVAL when the interface goes away. It runs the scenario in a
// child process inside a network namespace of its own, on a veth
// pair, so nothing touches the host's interfaces.
func TestNetdevEvents(t *testing.T) {
	if os.Getenv("SOFTRDMA_NETNS_CHILD") == "netdev-events" {
		netdevEventsChild(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	ns := fmt.Sprintf("srm-%d-ev%d", os.Getpid(), rand.IntN(1e6))
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("ip netns add: %v %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	for _, c := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "dummy0", "type", "veth", "peer", "name", "dummy1"},
		{"link", "set", "dummy1", "up"},
		{"addr", "add", "10.66.0.1/24", "dev", "dummy0"},
		{"addr", "add", "10.67.0.2/24", "dev", "dummy0"}, // another subnet: not a secondary of the first
		{"link", "set", "dummy0", "up"},
	} {
		if out, err := exec.Command("ip", append([]string{"-n", ns}, c...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", c, err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestNetdevEvents$", "-test.v")
	cmd.Env = append(os.Environ(), "SOFTRDMA_NETNS_CHILD=netdev-events")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestNetdevEvents") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func netdevEventsChild(t *testing.T) {
	ch, _ := CreateEventChannel()
	defer ch.Close()
	a, _ := CreateID(ch, "a", PS_UDP) // bound to the address that goes away
	b, _ := CreateID(ch, "b", PS_UDP) // bound to the other one
	defer a.Destroy()
	defer b.Destroy()
	if err := a.BindAddr(UDPAddr(netip.MustParseAddr("10.66.0.1"))); err != nil {
		t.Fatal(err)
	}
	if err := b.BindAddr(UDPAddr(netip.MustParseAddr("10.67.0.2"))); err != nil {
		t.Fatal(err)
	}
	if a.DeviceName() != "rxe_dummy0" {
		t.Fatalf("device %q", a.DeviceName())
	}
	g := randGroup()
	ev := join(t, a, g, MCJoinFlagFullMember, nil)
	ev.Ack()
	run := func(args ...string) {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", args, err, out)
		}
	}
	next := func() *Event {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ev, err := ch.GetEvent(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	run("addr", "del", "10.66.0.1/24", "dev", "dummy0")
	ev = next()
	ev.Ack()
	if ev.Event != EventAddrChange || ev.ID != a {
		t.Fatalf("after address removal: %v for %v", ev.Event, ev.ID.Context())
	}
	run("link", "del", "dummy0")
	seen := map[any]bool{}
	for len(seen) < 2 {
		ev = next()
		ev.Ack()
		switch {
		case ev.Event == EventDeviceRemoval:
			seen[ev.ID.Context()] = true
		case ev.Event == EventAddrChange && ev.ID == b && !seen["b"]:
			// b's address goes with the link, just before the link.
		default:
			t.Fatalf("after link removal: %v for %v", ev.Event, ev.ID.Context())
		}
	}
	// The device is gone: joins fail, the old join can still be left.
	if err := b.JoinMulticast(randGroup(), nil); err == nil {
		t.Error("join after device removal succeeded")
	}
	if err := a.LeaveMulticast(g); err != nil {
		t.Errorf("leave after device removal: %v", err)
	}
}
