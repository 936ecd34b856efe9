package unicast

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/nettest"
	"github.com/softrdma/softrdma/wire"
)

// requests is how many requests every process multicasts.
const requests = 5

// run runs a command with a timeout and fails the test on error.
func run(t testing.TB, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
}

// newNS creates a namespace with lo up and registers its removal.
func newNS(t *testing.T, name string) string {
	t.Helper()
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		if err := nettest.Delete(name); err != nil {
			t.Logf("%v", err)
		}
	})
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return name
}

// waitUp waits until interface ifname of ns is operationally up (a veth
// is once both ends are).
func waitUp(t *testing.T, ns, ifname string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		out, _ := exec.Command("ip", "-n", ns, "-o", "link", "show", ifname).CombinedOutput()
		if strings.Contains(string(out), "state UP") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s in %s not up: %s", ifname, ns, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// member is one mcreply process.
type member struct {
	t    *testing.T
	name string
	p    *nettest.Proc
	in   io.WriteCloser
	next int // the first output line not consumed yet
	qpn  uint32
}

// start starts mcreply in ns, bound to addr, and waits for its join.
func start(t *testing.T, ns, addr, group string) *member {
	t.Helper()
	p, in := nettest.StartProcStdin(t, ns, mcreplyBin, 2*time.Minute, "-b", addr, "-m", group)
	m := &member{t: t, name: p.Name, p: p, in: in}
	l := m.expect("joined qpn ", 20*time.Second)
	q, err := strconv.ParseUint(strings.TrimPrefix(l, "joined qpn 0x"), 16, 32)
	if err != nil {
		t.Fatalf("%s: %q", m.name, l)
	}
	m.qpn = uint32(q)
	return m
}

// send writes one command line.
func (m *member) send(line string) {
	m.t.Helper()
	if _, err := fmt.Fprintln(m.in, line); err != nil {
		m.t.Fatalf("%s: %s: %v", m.name, line, err)
	}
}

// expect returns the next output line starting with one of prefixes,
// skipping others; an "err" line, the process's exit or the timeout fails
// the test.
func (m *member) expect(prefix string, timeout time.Duration, more ...string) string {
	m.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out := m.p.Output()
		lines := strings.Split(out, "\n")
		lines = lines[:len(lines)-1] // complete lines only
		for m.next < len(lines) {
			l := lines[m.next]
			m.next++
			for _, p := range append([]string{prefix}, more...) {
				if strings.HasPrefix(l, p) {
					return l
				}
			}
			if strings.HasPrefix(l, "err ") {
				m.t.Fatalf("%s: %s", m.name, l)
			}
		}
		if m.p.Exited() {
			m.t.Fatalf("%s exited (status %d) before %q", m.name, m.p.ExitCode(), prefix)
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("%s: no %q within %v", m.name, prefix, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// counters asks for the device's counters.
func (m *member) counters() map[string]uint64 {
	m.t.Helper()
	m.send("counters")
	l := m.expect("counters ", 10*time.Second)
	c := map[string]uint64{}
	for _, f := range strings.Fields(strings.TrimPrefix(l, "counters ")) {
		k, v, _ := strings.Cut(f, "=")
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			m.t.Fatalf("%s: %q", m.name, l)
		}
		c[k] = n
	}
	return c
}

// exit ends the process and checks its exit status.
func (m *member) exit() {
	m.t.Helper()
	m.send("exit")
	m.expect("bye", 10*time.Second)
	m.in.Close()
	m.p.ExpectExit(0, 10*time.Second)
}

// randGroup returns an administratively scoped IPv4 group.
func randGroup() string {
	return fmt.Sprintf("239.%d.%d.%d", 100+rand.IntN(100), rand.IntN(256), 1+rand.IntN(254))
}

// exchange has every member multicast requests and checks that each
// receives exactly one reply from every other member for every request
// (and every other member's requests, once each), then that the devices'
// counters agree: every forward arrived, nothing was dropped, and each
// device delivered exactly the requests and replies. It returns the total
// of forwarded datagrams.
func exchange(t *testing.T, ms []*member) uint64 {
	t.Helper()
	peers := len(ms) - 1
	for _, m := range ms {
		m.send(fmt.Sprintf("request %d", requests))
	}
	for _, m := range ms {
		m.expect(fmt.Sprintf("requested %d", requests), 20*time.Second)
	}
	for _, m := range ms {
		m.send(fmt.Sprintf("wait %d %d 20s", requests, peers))
	}
	for _, m := range ms {
		l := m.expect("done ", 30*time.Second, "timeout ")
		var others []string
		for _, o := range ms {
			if o != m {
				others = append(others, fmt.Sprintf("%#x:%d", o.qpn, requests))
			}
		}
		slices.Sort(others) // same width hex QPNs: ascending as numbers
		want := strings.Join(others, ",")
		if wantLine := fmt.Sprintf("done req %s rep %s dup 0 bad 0", want, want); l != wantLine {
			t.Errorf("%s (qpn %#x):\n got %s\nwant %s", m.name, m.qpn, l, wantLine)
		}
	}
	// Every forward read (rcvd_forwarded) is one forwarded: wait until none
	// is in flight, then check every device's totals.
	var cs []map[string]uint64
	var fwd, rcvdFwd uint64
	for deadline := time.Now().Add(10 * time.Second); ; {
		cs, fwd, rcvdFwd = nil, 0, 0
		for _, m := range ms {
			c := m.counters()
			cs = append(cs, c)
			fwd += c["forwarded"]
			rcvdFwd += c["rcvd_forwarded"]
		}
		if fwd == rcvdFwd || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if fwd != rcvdFwd {
		t.Errorf("forwarded %d, forwards read %d", fwd, rcvdFwd)
	}
	for i, m := range ms {
		c := cs[i]
		t.Logf("%s: forwarded %d rcvd_forwarded %d delivered %d rcvd_pkts %d", m.name, c["forwarded"], c["rcvd_forwarded"], c["delivered"], c["rcvd_pkts"])
		if want := uint64(2 * peers * requests); c["delivered"] != want {
			t.Errorf("%s: delivered %d, want %d", m.name, c["delivered"], want)
		}
		for _, k := range []string{"forward_drops", "no_owner_drops", "no_qp_drops", "icrc_errors", "no_group_drops", "malformed_drops", "truncated_drops"} {
			if c[k] != 0 {
				t.Errorf("%s: %s %d", m.name, k, c[k])
			}
		}
	}
	return fwd
}

// TestReplyOnLoopback runs three processes on one host's loopback: every
// unicast reply reaches the one receive socket the kernel picks, and is
// forwarded unless that is its owner's.
func TestReplyOnLoopback(t *testing.T) {
	requireEnv(t)
	ns := newNS(t, fmt.Sprintf("%s%06x-h", nsPrefix, rand.Uint32()&0xffffff))
	g := randGroup()
	var ms []*member
	for range 3 {
		ms = append(ms, start(t, ns, "127.0.0.1", g))
	}
	if fwd := exchange(t, ms); fwd == 0 {
		t.Errorf("nothing was forwarded: the kernel handed every reply to its owner")
	}
	for _, m := range ms {
		m.exit()
	}
}

// TestReplyAcrossHosts runs three processes on one host and one on
// another, the hosts connected by a veth pair: replies between the first
// three are forwarded on their host, the fourth's replies to them arrive
// over the veth (plain RoCEv2 to port 4791) and are forwarded too.
func TestReplyAcrossHosts(t *testing.T) {
	requireEnv(t)
	base := fmt.Sprintf("%s%06x-", nsPrefix, rand.Uint32()&0xffffff)
	h1 := newNS(t, base+"h1")
	h2 := newNS(t, base+"h2")
	run(t, "ip", "-n", h1, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", h2)
	for i, ns := range []string{h1, h2} {
		run(t, "ip", "-n", ns, "addr", "add", fmt.Sprintf("10.79.0.%d/24", i+1), "dev", "eth0")
		run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
	}
	for _, ns := range []string{h1, h2} {
		waitUp(t, ns, "eth0")
	}
	capt := nettest.StartCapture(t, h2, "eth0", artifacts)
	g := randGroup()
	var ms []*member
	for range 3 {
		ms = append(ms, start(t, h1, "10.79.0.1", g))
	}
	ms = append(ms, start(t, h2, "10.79.0.2", g))
	if fwd := exchange(t, ms); fwd == 0 {
		t.Errorf("nothing was forwarded")
	}
	for _, m := range ms {
		m.exit()
	}
	// The wire between the hosts: plain RoCEv2 to port 4791 with valid
	// ICRCs, nothing else over UDP; the requests and the replies, once each.
	h1Addr, h2Addr, group := netip.MustParseAddr("10.79.0.1"), netip.MustParseAddr("10.79.0.2"), netip.MustParseAddr(g)
	count := map[[2]netip.Addr]int{}
	for _, f := range capt.Synced(t, 10*time.Second) {
		ip, ok := nettest.ParseIPv4(f)
		if !ok || ip.Proto != 17 {
			continue
		}
		if len(ip.Payload) < 8 || binary.BigEndian.Uint16(ip.Payload[2:4]) != wire.UDPPort {
			t.Errorf("UDP frame %v → %v not to port %d: % x", ip.Src, ip.Dst, wire.UDPPort, ip.Payload[:min(len(ip.Payload), 16)])
			continue
		}
		var p wire.Packet
		if err := wire.ParseUD(ip.Payload[8:], &p); err != nil {
			t.Errorf("frame %v → %v: %v", ip.Src, ip.Dst, err)
			continue
		}
		if got := wire.ICRCv4(wire.IPv4(ip.IP), wire.UDP(ip.Payload[:8]), p.Body); got != p.ICRC {
			t.Errorf("frame %v → %v: ICRC %08x, recomputed %08x", ip.Src, ip.Dst, p.ICRC, got)
		}
		count[[2]netip.Addr{ip.Src, ip.Dst}]++
	}
	want := map[[2]netip.Addr]int{
		{h1Addr, group}:  3 * requests, // the requests of h1's three members
		{h2Addr, group}:  requests,     // h2's member's requests
		{h1Addr, h2Addr}: 3 * requests, // the replies to h2's member
		{h2Addr, h1Addr}: 3 * requests, // h2's member's replies to h1's members
	}
	if !maps.Equal(count, want) {
		t.Errorf("RoCEv2 frames by source → destination on the veth: %v, want %v", count, want)
	}
}
