package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
)

// TestNetdevEvents checks ADDR_CHANGE when the bound address goes away and
// DEVICE_REMOVAL when the interface goes away. It runs the scenario in a
// child process inside a network namespace of its own, on a veth
// pair, so nothing touches the host's interfaces.
func TestNetdevEvents(t *testing.T) {
	if os.Getenv("SOFTRDMA_TEST_NETNS_CHILD") == "netdev-events" {
		netdevEventsChild(t)
		return
	}
	runInNetns(t, "netdev-events", "^TestNetdevEvents$", [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "dummy0", "type", "veth", "peer", "name", "dummy1"},
		{"link", "set", "dummy1", "up"},
		{"addr", "add", "10.66.0.1/24", "dev", "dummy0"},
		{"addr", "add", "10.67.0.2/24", "dev", "dummy0"}, // another subnet: not a secondary of the first
		{"link", "set", "dummy0", "up"},
	})
}

// runInNetns runs the test named by run again in a child process inside a
// new network namespace set up with the given `ip` commands; the child
// sees SOFTRDMA_TEST_NETNS_CHILD=mode. It skips unless root.
func runInNetns(t *testing.T, mode, run string, setup [][]string) {
	if os.Geteuid() != 0 {
		testenv.Require(t, "needs root to create a network namespace")
	}
	ns := fmt.Sprintf("srm-%d-%s-%d", os.Getpid(), mode[:2], rand.IntN(1e6))
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		testenv.Require(t, "ip netns add: %v %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	for _, c := range setup {
		if out, err := exec.Command("ip", append([]string{"-n", ns}, c...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", c, err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, os.Args[0], "-test.run="+run, "-test.v")
	cmd.Env = testenv.CleanEnv("SOFTRDMA_TEST_NETNS_CHILD=" + mode)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: ") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func netdevEventsChild(t *testing.T) {
	ch, _ := CreateEventChannel()
	defer ch.Close()
	// No route to the destination: the call fails with ENETUNREACH (the
	// kernel's rdma_resolve_ip), no event.
	u, _ := CreateID(ch, "u", PS_UDP)
	if err := u.ResolveAddr(nil, UDPAddr(netip.MustParseAddr("192.0.2.99")), time.Second); !errors.Is(err, syscall.ENETUNREACH) {
		t.Fatalf("resolve without a route: %v, want ENETUNREACH", err)
	}
	if n := ch.Len(); n != 0 {
		t.Fatalf("%d events after a failed resolve", n)
	}
	u.Destroy()
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
	// The device is gone and the id was told (DEVICE_REMOVAL): the id is no
	// longer bound to a device, so a join fails with EINVAL, which comes
	// before ENODEV in the README's order (as in Linux, where the id is in
	// RDMA_CM_DEVICE_REMOVAL). The old join can still be left.
	if err := b.JoinMulticast(randGroup(), nil); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("join after device removal: %v, want EINVAL", err)
	}
	if err := a.LeaveMulticast(g); err != nil {
		t.Errorf("leave after device removal: %v", err)
	}
}

// TestIPv6Group checks the IPv6 extension: a RoCEv2 join of an IPv6 group
// (MGID = the address, MLD membership while a full member is joined) and a
// datagram through it. IPv6 multicast does not work on lo, so it runs in a
// child process in a network namespace with a veth pair.
func TestIPv6Group(t *testing.T) {
	if os.Getenv("SOFTRDMA_TEST_NETNS_CHILD") == "ipv6" {
		ipv6Child(t)
		return
	}
	runInNetns(t, "ipv6", "^TestIPv6Group$", [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "v0", "type", "veth", "peer", "name", "v1"},
		{"addr", "add", "fd00:66::1/64", "dev", "v0", "nodad"},
		{"link", "set", "v1", "up"},
		{"link", "set", "v0", "up"},
	})
}

// igmp6Has reports whether /proc/net/igmp6 lists group g on interface ifname.
func igmp6Has(t *testing.T, ifname string, g netip.Addr) bool {
	b, err := os.ReadFile("/proc/net/igmp6")
	if err != nil {
		t.Fatal(err)
	}
	hex := fmt.Sprintf("%x", g.AsSlice())
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[1] == ifname && f[2] == hex {
			return true
		}
	}
	return false
}

func ipv6Child(t *testing.T) {
	src := UDPAddr(netip.MustParseAddr("fd00:66::1"))
	g := netip.MustParseAddr("ff0e::5d:1")
	ga := UDPAddr(g)
	ch, rx := func() (*EventChannel, *ID) {
		ch, _ := CreateEventChannel()
		id, _ := CreateID(ch, "rx", PS_UDP)
		if err := id.BindAddr(src); err != nil {
			t.Fatal(err)
		}
		return ch, id
	}()
	defer ch.Close()
	defer rx.Destroy()
	tx, _ := CreateID(ch, "tx", PS_UDP)
	defer tx.Destroy()
	if err := tx.BindAddr(src); err != nil {
		t.Fatal(err)
	}
	rmr := withQP(t, rx, 2, 40+64, 0)
	tmr := withQP(t, tx, 1, 40+64, 0)
	ev := join(t, tx, ga, MCJoinFlagSendOnlyFullMember, nil)
	if igmp6Has(t, "v0", g) {
		t.Error("a send-only join took an MLD membership")
	}
	ah, err := tx.PD().CreateAH(&ev.Param.AHAttr)
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Destroy()
	if ev.Param.AHAttr.GRH.DGID != g.As16() {
		t.Errorf("IPv6 MGID %v, want the group verbatim", ev.Param.AHAttr.GRH.DGID)
	}
	ev.Ack()
	join(t, rx, ga, MCJoinFlagFullMember, nil).Ack()
	if !igmp6Has(t, "v0", g) {
		t.Error("a full-member join took no MLD membership")
	}
	copy(tmr.Buf(), "over IPv6")
	if err := tx.PostUDSend(1, tmr, 0, 9, verbs.SendSignaled, ah, MulticastQPN); err != nil {
		t.Fatal(err)
	}
	if wc, err := tx.GetSendComp(ctxT(t)); err != nil || wc.Status != verbs.WCSuccess {
		t.Fatalf("send: %+v %v", wc, err)
	}
	wc, err := rx.GetRecvComp(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	b := rmr.Buf()[int(wc.WRID)*(40+64):]
	if wc.ByteLen != 49 || string(b[40:49]) != "over IPv6" || b[0]>>4 != 6 || netip.AddrFrom16([16]byte(b[24:40])) != g {
		t.Errorf("wc %+v, grh % x", wc, b[:40])
	}
	if err := rx.LeaveMulticast(ga); err != nil {
		t.Fatal(err)
	}
	if igmp6Has(t, "v0", g) {
		t.Error("MLD membership kept after the last full member left")
	}
	if err := tx.LeaveMulticast(ga); err != nil {
		t.Fatal(err)
	}
}
