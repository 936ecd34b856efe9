package multihost

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/ipv4"

	"github.com/softrdma/softrdma/test/nettest"
)

// Subnet of the three hosts; it exists only inside the test's namespaces.
const subnet = "10.77.0."

// host is one host namespace with its interface eth0 on the bridge.
type host struct {
	idx  int        // 1, 2, 3
	ns   string     // namespace name
	addr netip.Addr // 10.77.0.1<idx>
	port string     // the switch-side veth of this host: p<idx>
}

func (h *host) String() string { return fmt.Sprintf("h%d(%v)", h.idx, h.addr) }

// topo is a switch namespace with the snooping bridge br0 and three hosts.
type topo struct {
	t     *testing.T
	sw    string
	hosts []*host
	caps  map[string]*nettest.Capture // per switch port, when capturing

}

// h returns host i (1-based).
func (tp *topo) h(i int) *host { return tp.hosts[i-1] }

// run runs a command with a timeout and fails the test on error.
func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := runErr(name, args...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return out
}

func runErr(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// newTopo builds the topology and registers its removal:
//
//	switch ns: br0 (mcast_snooping 1, mcast_querier 1, IGMPv3 queries), ports p1 p2 p3
//	h1 h2 h3:  eth0 10.77.0.11/24 … .13/24, each the peer of p<i>
func newTopo(t *testing.T) *topo {
	t.Helper()
	requireEnv(t)
	base := fmt.Sprintf("%s%06x-", nsPrefix, rand.Uint32()&0xffffff)
	tp := &topo{t: t, sw: base + "sw", caps: map[string]*nettest.Capture{}}
	for i := 1; i <= 3; i++ {
		tp.hosts = append(tp.hosts, &host{
			idx:  i,
			ns:   fmt.Sprintf("%sh%d", base, i),
			addr: netip.MustParseAddr(fmt.Sprintf("%s1%d", subnet, i)),
			port: fmt.Sprintf("p%d", i),
		})
	}
	// Removal runs last (cleanups are LIFO): after processes and captures.
	t.Cleanup(func() {
		for _, ns := range append([]string{tp.sw}, tp.hostNames()...) {
			if err := nettest.Delete(ns); err != nil && !strings.Contains(err.Error(), "No such file") {
				t.Logf("cleanup: %v", err)
			}
		}
	})
	run(t, "ip", "netns", "add", tp.sw)
	for _, h := range tp.hosts {
		run(t, "ip", "netns", "add", h.ns)
	}
	sw := func(args ...string) { t.Helper(); run(t, "ip", append([]string{"-n", tp.sw}, args...)...) }
	sw("link", "set", "lo", "up")
	// Intervals are in centiseconds. IGMPv3 queries keep the hosts in
	// IGMPv3 mode; short startup queries make the bridge the active
	// querier at once. The querier is switched on last: the kernel then
	// waits one query response interval (here 0.5 s) for other queriers,
	// and floods all multicast until that delay has passed.
	sw("link", "add", "br0", "type", "bridge", "stp_state", "0",
		"mcast_snooping", "1", "mcast_igmp_version", "3",
		"mcast_startup_query_count", "2", "mcast_startup_query_interval", "100",
		"mcast_query_interval", "1000", "mcast_query_response_interval", "50",
		"mcast_last_member_count", "2", "mcast_last_member_interval", "50")
	sw("link", "set", "br0", "up")
	sw("link", "set", "br0", "type", "bridge", "mcast_querier", "1")
	for _, h := range tp.hosts {
		run(t, "ip", "-n", h.ns, "link", "set", "lo", "up")
		sw("link", "add", h.port, "mtu", "1500", "type", "veth", "peer", "name", "eth0", "netns", h.ns)
		sw("link", "set", h.port, "master", "br0")
		sw("link", "set", h.port, "up")
		run(t, "ip", "-n", h.ns, "addr", "add", h.addr.String()+"/24", "dev", "eth0")
		run(t, "ip", "-n", h.ns, "link", "set", "eth0", "up")
	}
	return tp
}

func (tp *topo) hostNames() []string {
	var out []string
	for _, h := range tp.hosts {
		out = append(out, h.ns)
	}
	return out
}

// captureAll starts a capture on every switch port (p1 p2 p3).
func (tp *topo) captureAll() {
	tp.t.Helper()
	for _, h := range tp.hosts {
		tp.caps[h.port] = nettest.StartCapture(tp.t, tp.sw, h.port, artifacts)
	}
}

// waitQuerier waits until the bridge's own querier is in effect, that is
// until the snooping bridge stops flooding multicast: it sends probe
// datagrams from h1 to a group nobody joined until one reaches p1 and not
// p3. (The bridge forwards a frame while it handles its arrival on p1, so
// once p1's capture holds the probe, p3's capture has it queued if it was
// flooded.) Needs captureAll.
func (tp *topo) waitQuerier() {
	t := tp.t
	t.Helper()
	h1 := tp.h(1)
	probe := randGroups(1)[0]
	deadline := time.Now().Add(wireTimeout)
	for i := 0; ; i++ {
		payload := fmt.Sprintf("softrdma querier probe %d", i)
		err := nettest.InNetns(h1.ns, func() error { return sendUDP(probe, payload) })
		if err != nil {
			t.Fatalf("querier probe from %v: %v", h1, err)
		}
		if _, ok := tp.caps[h1.port].WaitFor(wireTimeout, func(fs []nettest.Frame) bool { return hasUDPPayload(fs, probe, payload) }); !ok {
			t.Fatalf("querier probe %d not seen on %s", i, h1.port)
		}
		if !hasUDPPayload(tp.caps["p3"].Synced(t, wireTimeout), probe, payload) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bridge still floods multicast %v after its querier was switched on", wireTimeout)
		}
		time.Sleep(50 * time.Millisecond) // the next probe
	}
}

// sendUDP sends one datagram to group:9 out of eth0 (in the namespace
// InNetns entered).
func sendUDP(group netip.Addr, payload string) error {
	c, err := net.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		return err
	}
	defer c.Close()
	ifi, err := net.InterfaceByName("eth0")
	if err != nil {
		return err
	}
	pc := ipv4.NewPacketConn(c)
	if err := pc.SetMulticastInterface(ifi); err != nil {
		return err
	}
	_, err = c.WriteTo([]byte(payload), &net.UDPAddr{IP: group.AsSlice(), Port: 9})
	return err
}

// hasUDPPayload reports whether a UDP datagram to group carrying payload
// is among the frames.
func hasUDPPayload(fs []nettest.Frame, group netip.Addr, payload string) bool {
	for _, f := range fs {
		if ip, ok := nettest.ParseIPv4(f); ok && ip.Dst == group && ip.Proto == 17 && len(ip.Payload) >= 8 && string(ip.Payload[8:]) == payload {
			return true
		}
	}
	return false
}

// waitIGMPUsers waits until h's kernel lists users sockets joined to group
// on eth0 (/proc/net/igmp of its namespace).
func (tp *topo) waitIGMPUsers(h *host, group netip.Addr, users int) {
	t := tp.t
	t.Helper()
	a := group.As4()
	// The kernel prints the __be32 group with %08X: in host byte order.
	want := fmt.Sprintf("%08X", uint32(a[0])|uint32(a[1])<<8|uint32(a[2])<<16|uint32(a[3])<<24)
	deadline := time.Now().Add(wireTimeout)
	last := -1
	for {
		out, err := exec.Command("ip", "netns", "exec", h.ns, "cat", "/proc/net/igmp").Output()
		if err != nil {
			t.Fatalf("/proc/net/igmp of %v: %v", h, err)
		}
		last = 0
		in := false
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			if line[0] != '\t' && line[0] != ' ' {
				in = len(f) >= 2 && f[1] == "eth0"
				continue
			}
			if in && len(f) >= 2 && f[0] == want {
				last, _ = strconv.Atoi(f[1])
			}
		}
		if last == users {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v: %d users of %v on eth0 after %v, want %d", h, last, group, wireTimeout, users)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mdb returns the bridge's multicast database.
func (tp *topo) mdb() ([]nettest.MDBEntry, error) {
	out, err := runErr("bridge", "-n", tp.sw, "-j", "mdb", "show", "dev", "br0")
	if err != nil {
		return nil, err
	}
	return nettest.ParseMDB(out)
}

// mdbPorts returns the bridge ports with an mdb entry for group.
func (tp *topo) mdbPorts(group netip.Addr) []string {
	tp.t.Helper()
	ents, err := tp.mdb()
	if err != nil {
		tp.t.Fatal(err)
	}
	return nettest.MDBPorts(ents, group)
}

// waitMDB waits until the bridge has (present) or no longer has an mdb
// entry for group on port.
func (tp *topo) waitMDB(group netip.Addr, port string, present bool, timeout time.Duration) {
	tp.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ports := tp.mdbPorts(group)
		has := false
		for _, p := range ports {
			has = has || p == port
		}
		if has == present {
			return
		}
		if time.Now().After(deadline) {
			ents, _ := tp.mdb()
			tp.t.Fatalf("bridge mdb: entry for %v on %s present=%v after %v, want present=%v; mdb: %+v", group, port, has, timeout, present, ents)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// randGroups returns n distinct random groups in 239.0.0.0/8 that also
// differ in the 23 bits that make the Ethernet multicast address.
func randGroups(n int) []netip.Addr {
	var out []netip.Addr
	seen := map[uint32]bool{}
	for len(out) < n {
		v := rand.Uint32() & 0x00ffffff
		if v&0xffff00 == 0 || v&0xff == 0 || v&0xff == 255 || seen[v&0x7fffff] {
			continue // skip 239.0.0.x, .0 and .255 for readability
		}
		seen[v&0x7fffff] = true
		out = append(out, netip.AddrFrom4([4]byte{239, byte(v >> 16), byte(v >> 8), byte(v)}))
	}
	return out
}
