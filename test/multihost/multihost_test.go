package multihost

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/nettest"
	"github.com/softrdma/softrdma/wire"
)

// Generous limits for a loaded 2-core machine; the waits end as soon as
// their condition holds.
const (
	lineTimeout = 20 * time.Second
	exitTimeout = 30 * time.Second
	wireTimeout = 10 * time.Second
)

func joinedLine(g netip.Addr) string {
	return fmt.Sprintf("mckey: joined dgid: ::ffff:%v mlid 0x0 sl 0", g)
}

// checkRoCE checks that frames are exactly the count datagrams one mckey
// sender (one UD QP) sent from src to group with size-byte payloads, and
// that each is byte-valid RoCEv2: it returns the sender's QPN.
func checkRoCE(t *testing.T, frames []nettest.RoCEFrame, src, group netip.Addr, size, count int) uint32 {
	t.Helper()
	if len(frames) != count {
		t.Errorf("%d RoCEv2 frames %v → %v captured, want %d", len(frames), src, group, count)
	}
	wantMAC := nettest.MulticastMAC(group)
	var srcQP, psn uint32
	var sport uint16
	for i, f := range frames {
		errorf := func(format string, args ...any) {
			t.Helper()
			t.Errorf("frame %d of %d (%v → %v): %s", i+1, len(frames), src, group, fmt.Sprintf(format, args...))
		}
		if !nettest.CheckIPv4(t, f, wantMAC, errorf) {
			continue
		}
		nettest.CheckUDP(t, f, i == 0, &sport, errorf)
		var p wire.Packet
		if err := wire.ParseUD(f.Body, &p); err != nil {
			errorf("ParseUD: %v (% x)", err, f.Body[:min(len(f.Body), 32)])
			continue
		}
		if op := p.BTH.Opcode(); op != 0x65 {
			errorf("opcode %#x, want 0x65 (UD SEND_ONLY_WITH_IMMEDIATE)", op)
		}
		nettest.CheckMcastUD(t, f, &p, size, errorf)
		if !p.HasImm || p.Imm != p.DETH.SrcQP() {
			errorf("imm %#x (present %v), want SrcQP %#x", p.Imm, p.HasImm, p.DETH.SrcQP())
		}
		if i == 0 {
			srcQP = p.DETH.SrcQP()
		} else {
			if p.DETH.SrcQP() != srcQP {
				errorf("SrcQP %#x, earlier frames %#x", p.DETH.SrcQP(), srcQP)
			}
			if want := (psn + 1) & 0xffffff; p.BTH.PSN() != want {
				errorf("PSN %#x, want %#x (previous + 1)", p.BTH.PSN(), want)
			}
		}
		psn = p.BTH.PSN()
		nettest.CheckPayload(t, f, &p, size, true, errorf)
	}
	return srcQP
}

// waitRoCE waits until capture c holds count RoCEv2 frames src → group,
// then until it has read every frame the kernel queued to it (so extra
// frames already sent show too), and returns them all.
func waitRoCE(t *testing.T, c *nettest.Capture, src, group netip.Addr, count int) []nettest.RoCEFrame {
	t.Helper()
	if _, ok := c.WaitFor(wireTimeout, nettest.RoCECount(src, group, count)); !ok {
		t.Errorf("capture %s: fewer than %d RoCEv2 frames %v → %v within %v (%v)", c.Iface, count, src, group, wireTimeout, c.Health())
	}
	return nettest.RoCEFrames(c.Synced(t, wireTimeout), src, group)
}

func logIGMP(t *testing.T, c *nettest.Capture) {
	t.Helper()
	var b strings.Builder
	for _, e := range nettest.IGMPEvents(c.Snapshot()) {
		fmt.Fprintf(&b, "\t%v\n", e)
	}
	t.Logf("IGMP seen on %s:\n%s", c.Iface, b.String())
}

// TestIGMP checks what joins and leaves put on the wire:
//   - h1, full member of G1: an IGMP membership report for G1 while joined
//     (the bridge learns it), then the leave (TO_IN {} or v2 leave);
//   - h2, send-only full member of G2: no IGMP message about G2 at all, and
//     no bridge membership;
//   - h3, two full members of G3 in two processes: the first one leaving
//     sends nothing, the last one leaving sends the leave.
func TestIGMP(t *testing.T) {
	tp := newTopo(t)
	tp.captureAll()
	h1, h2, h3 := tp.h(1), tp.h(2), tp.h(3)
	gs := randGroups(3)
	g1, g2, g3 := gs[0], gs[1], gs[2]
	defer func() {
		if t.Failed() {
			for _, h := range tp.hosts {
				logIGMP(t, tp.caps[h.port])
			}
		}
	}()

	// The members that must stay joined until the test lets them go are
	// receivers of one message; poke sends it (as a send-only member, which
	// sends no IGMP) when the test wants them to leave and exit.
	stay := func(h *host, g netip.Addr) *nettest.Proc {
		return tp.mckey(h, "-m", g.String(), "-b", h.addr.String(), "-C", "1", "--timeout", "120s", "--join-pause", "0s")
	}
	poke := func(h *host, g netip.Addr, p *nettest.Proc) {
		t.Helper()
		tp.mckey(h, "-m", g.String(), "-b", h.addr.String(), "-s", "-o", "-C", "1", "--join-pause", "0s").ExpectExit(0, exitTimeout)
		p.ExpectExit(0, exitTimeout)
	}
	full := stay(h1, g1)
	sendOnly := tp.mckey(h2, "-m", g2.String(), "-b", h2.addr.String(), "-o", "-C", "0", "--join-pause", "3s")
	last := stay(h3, g3)
	full.WaitLine(joinedLine(g1), lineTimeout)
	sendOnly.WaitLine(joinedLine(g2), lineTimeout)
	last.WaitLine(joinedLine(g3), lineTimeout)
	first := tp.mckey(h3, "-m", g3.String(), "-b", h3.addr.String(), "-C", "0", "--join-pause", "1s")
	first.WaitLine(joinedLine(g3), lineTimeout)

	// Full member h1: a report for G1 from h1, and the bridge learned it.
	c1 := tp.caps[h1.port]
	if _, ok := c1.WaitFor(wireTimeout, func(fs []nettest.Frame) bool {
		for _, e := range nettest.IGMPAbout(fs, h1.addr, g1) {
			if e.Join() {
				return true
			}
		}
		return false
	}); !ok {
		t.Errorf("no IGMP membership report for %v from full member %v within %v", g1, h1, wireTimeout)
	}
	tp.waitMDB(g1, h1.port, true, wireTimeout)
	tp.waitMDB(g3, h3.port, true, wireTimeout)
	if ports := tp.mdbPorts(g2); len(ports) != 0 {
		t.Errorf("bridge has members of %v (only a send-only member joined it) on %v", g2, ports)
	}

	// h3: the first of two members leaving sends no leave.
	first.ExpectExit(0, exitTimeout)
	// Wait until the kernel of h3 dropped the first process's membership
	// (one user of the group left): had it sent a leave, it would be on the
	// wire by then.
	tp.waitIGMPUsers(h3, g3, 1)
	c3 := tp.caps[h3.port]
	if last.Exited() {
		t.Fatalf("the last member of %v in %v exited before it was let go:\n%s", g3, h3, last.Output())
	}
	for _, e := range nettest.IGMPAbout(c3.Synced(t, wireTimeout), h3.addr, g3) {
		if e.Leave() {
			t.Errorf("%v sent a leave for %v while another process was still a member: %v", h3, g3, e)
		}
	}

	// h1 leaves: the leave shows, after the report.
	poke(h1, g1, full)
	if fs, ok := c1.WaitFor(wireTimeout, func(fs []nettest.Frame) bool {
		for _, e := range nettest.IGMPAbout(fs, h1.addr, g1) {
			if e.Leave() {
				return true
			}
		}
		return false
	}); !ok {
		t.Errorf("no IGMP leave (TO_IN {} or v2 leave) for %v from %v within %v of its exit", g1, h1, wireTimeout)
	} else {
		var join, leave time.Time
		for _, e := range nettest.IGMPAbout(fs, h1.addr, g1) {
			if e.Join() && join.IsZero() {
				join = e.TS
			}
			if e.Leave() && leave.IsZero() {
				leave = e.TS
			}
		}
		if join.IsZero() || !join.Before(leave) {
			t.Errorf("%v: first report for %v at %v, first leave at %v: want report before leave", h1, g1, join, leave)
		}
	}

	// h3: the last member leaving sends the leave.
	poke(h3, g3, last)
	if _, ok := c3.WaitFor(wireTimeout, func(fs []nettest.Frame) bool {
		for _, e := range nettest.IGMPAbout(fs, h3.addr, g3) {
			if e.Leave() {
				return true
			}
		}
		return false
	}); !ok {
		t.Errorf("no IGMP leave for %v from %v after its last member left", g3, h3)
	}

	// The send-only member: nothing about G2 from h2, on any port.
	sendOnly.ExpectExit(0, exitTimeout)
	for _, h := range tp.hosts {
		for _, e := range nettest.IGMPAbout(tp.caps[h.port].Synced(t, wireTimeout), h2.addr, g2) {
			t.Errorf("send-only member %v sent IGMP about %v: %v", h2, g2, e)
		}
	}
	// The bridge forgets G1 after the leave (its querier's last-member queries go unanswered).
	tp.waitMDB(g1, h1.port, false, wireTimeout)
}

// TestDataAcrossHosts sends 20 messages from h1 to a receiver in h2 and
// checks the receiver verified them and every frame on the wire.
func TestDataAcrossHosts(t *testing.T) {
	for _, sendOnly := range []bool{false, true} {
		name := "full-member-sender"
		if sendOnly {
			name = "send-only-sender"
		}
		t.Run(name, func(t *testing.T) {
			tp := newTopo(t)
			tp.captureAll()
			h1, h2 := tp.h(1), tp.h(2)
			g := randGroups(1)[0]
			recv := tp.mckey(h2, "-m", g.String(), "-b", h2.addr.String(), "--verify", "--timeout", "60s",
				"-C", "20", "-S", "512", "--join-pause", "1s")
			recv.WaitLine(joinedLine(g), lineTimeout)
			args := []string{"-m", g.String(), "-b", h1.addr.String(), "-s", "-C", "20", "-S", "512", "--join-pause", "1s"}
			if sendOnly {
				args = append(args, "-o")
			}
			send := tp.mckey(h1, args...)
			send.WaitLine(joinedLine(g), lineTimeout)
			send.ExpectExit(0, exitTimeout)
			recv.ExpectExit(0, exitTimeout)
			if !nettest.HasLine(recv.Output(), "mckey: verified 20 messages") {
				t.Errorf("receiver did not print %q", "mckey: verified 20 messages")
			}

			sent := waitRoCE(t, tp.caps[h1.port], h1.addr, g, 20)
			qpn := checkRoCE(t, sent, h1.addr, g, 512, 20)
			t.Logf("sender QPN %#x, UDP source port %d", qpn, wire.UDP(sent[0].UDP).SrcPort())
			// The bridge forwarded the same bytes to h2.
			fwd := waitRoCE(t, tp.caps[h2.port], h1.addr, g, 20)
			checkRoCE(t, fwd, h1.addr, g, 512, 20)
			for i := range min(len(sent), len(fwd)) {
				if string(sent[i].Body) != string(fwd[i].Body) || string(sent[i].IP) != string(fwd[i].IP) {
					t.Errorf("frame %d differs between %s and %s", i+1, h1.port, h2.port)
				}
			}

			// IGMP: the receiver reported; the sender only when a full member.
			reported := func(h *host) bool {
				for _, e := range nettest.IGMPAbout(tp.caps[h.port].Synced(t, wireTimeout), h.addr, g) {
					if e.Join() {
						return true
					}
				}
				return false
			}
			if !reported(h2) {
				t.Errorf("no IGMP report for %v from the receiver %v", g, h2)
			}
			if got := reported(h1); got == sendOnly {
				t.Errorf("sender %v (send-only %v): IGMP report for %v on the wire = %v", h1, sendOnly, g, got)
			}
			if sendOnly {
				for _, e := range nettest.IGMPAbout(tp.caps[h1.port].Synced(t, wireTimeout), h1.addr, g) {
					t.Errorf("send-only sender %v sent IGMP about %v: %v", h1, g, e)
				}
			}
		})
	}
}

// TestSnooping checks that the snooping bridge forwards a group's frames
// only to the port of its member (h2), not to h3 (whose capture does see
// the frames the bridge floods, such as h2's IGMPv3 report), and frames of
// a group without members to no host.
func TestSnooping(t *testing.T) {
	tp := newTopo(t)
	tp.captureAll()
	h1, h2, h3 := tp.h(1), tp.h(2), tp.h(3)
	gs := randGroups(2)
	g, unreg := gs[0], gs[1]

	recv := tp.mckey(h2, "-m", g.String(), "-b", h2.addr.String(), "--verify", "--timeout", "60s",
		"-C", "20", "-S", "256", "--join-pause", "1s")
	recv.WaitLine(joinedLine(g), lineTimeout)
	tp.waitMDB(g, h2.port, true, wireTimeout)
	tp.waitQuerier()
	if ports := tp.mdbPorts(g); len(ports) != 1 {
		t.Fatalf("bridge members of %v on %v, want only %s", g, ports, h2.port)
	}
	send := tp.mckey(h1, "-m", g.String(), "-b", h1.addr.String(), "-s", "-o", "-C", "20", "-S", "256", "--join-pause", "500ms")
	send.ExpectExit(0, exitTimeout)
	recv.ExpectExit(0, exitTimeout)
	if !nettest.HasLine(recv.Output(), "mckey: verified 20 messages") {
		t.Errorf("receiver did not print %q", "mckey: verified 20 messages")
	}
	checkRoCE(t, waitRoCE(t, tp.caps[h1.port], h1.addr, g, 20), h1.addr, g, 256, 20)
	checkRoCE(t, waitRoCE(t, tp.caps[h2.port], h1.addr, g, 20), h1.addr, g, 256, 20)
	if n := len(nettest.RoCEFrames(tp.caps[h3.port].Synced(t, wireTimeout), netip.Addr{}, g)); n != 0 {
		t.Errorf("%d frames for %v forwarded to %s (%v, not a member)", n, g, h3.port, h3)
	}

	// h3's port does see frames the bridge forwards: h2's IGMPv3 report
	// (to the link-local 224.0.0.22, which a bridge floods).
	if len(nettest.IGMPAbout(tp.caps[h3.port].Synced(t, wireTimeout), h2.addr, g)) == 0 {
		t.Errorf("capture on %s saw no forwarded IGMP report of %v: the capture does not see forwarded frames", h3.port, h2)
	}

	// A group without members is forwarded to no port at all (with an
	// active querier, unregistered multicast goes to router ports only).
	ctl := tp.mckey(h1, "-m", unreg.String(), "-b", h1.addr.String(), "-s", "-o", "-C", "5", "-S", "64", "--join-pause", "0s")
	ctl.ExpectExit(0, exitTimeout)
	checkRoCE(t, waitRoCE(t, tp.caps[h1.port], h1.addr, unreg, 5), h1.addr, unreg, 64, 5)
	for _, h := range []*host{h2, h3} {
		if n := len(nettest.RoCEFrames(tp.caps[h.port].Synced(t, wireTimeout), netip.Addr{}, unreg)); n != 0 {
			t.Errorf("%d frames of %v (no members) forwarded to %s", n, unreg, h.port)
		}
	}
}

// TestMTU checks mckey's message size check against the active MTU: 1024
// on a 1500-byte veth, 4096 on a 9000-byte one, and that the largest
// allowed messages go out whole.
func TestMTU(t *testing.T) {
	tp := newTopo(t)
	tp.captureAll()
	h1, h2, h3 := tp.h(1), tp.h(2), tp.h(3)
	g := randGroups(1)[0]
	run(t, "ip", "-n", tp.sw, "link", "set", h3.port, "mtu", "9000")
	run(t, "ip", "-n", h3.ns, "link", "set", "eth0", "mtu", "9000")

	for _, c := range []struct {
		h    *host
		size int
		mtu  int
		role []string
	}{
		{h1, 1100, 1024, []string{"-s"}},
		{h2, 1025, 1024, nil},
		{h3, 4097, 4096, []string{"-s"}},
	} {
		args := append([]string{"-m", g.String(), "-b", c.h.addr.String(), "-S", fmt.Sprint(c.size), "-C", "1", "--join-pause", "0s"}, c.role...)
		p := tp.mckey(c.h, args...)
		p.ExpectExit(255, exitTimeout)
		if want := fmt.Sprintf("mckey: message_size %d is larger than active mtu %d", c.size, c.mtu); !nettest.HasLine(p.Output(), want) {
			t.Errorf("%s: no line %q", p.Name, want)
		}
		if nettest.HasLine(p.Output(), joinedLine(g)) {
			t.Errorf("%s: joined despite the size check", p.Name)
		}
	}
	for _, c := range []struct {
		h     *host
		size  int
		count int
	}{
		{h1, 1024, 3},
		{h3, 4096, 2},
	} {
		p := tp.mckey(c.h, "-m", g.String(), "-b", c.h.addr.String(), "-s", "-o", "-S", fmt.Sprint(c.size), "-C", fmt.Sprint(c.count), "--join-pause", "0s")
		p.ExpectExit(0, exitTimeout)
		checkRoCE(t, waitRoCE(t, tp.caps[c.h.port], c.h.addr, g, c.count), c.h.addr, g, c.size, c.count)
	}
	// The refused runs never joined: no IGMP about the group from anyone.
	for _, h := range tp.hosts {
		for _, e := range nettest.IGMPAbout(tp.caps[h.port].Synced(t, wireTimeout), h.addr, g) {
			t.Errorf("IGMP about %v from %v: %v", g, h, e)
		}
	}
}

// TestTwoGroups runs two groups at once: h2 receives G1 (256-byte
// messages), h3 receives G2 (512-byte messages), two sender processes in
// h1 send to each. Each receiver verifies its 20 messages, each member port
// carries only its group's frames, and the two senders on one host use
// different QPNs.
func TestTwoGroups(t *testing.T) {
	tp := newTopo(t)
	tp.captureAll()
	h1, h2, h3 := tp.h(1), tp.h(2), tp.h(3)
	gs := randGroups(2)
	g1, g2 := gs[0], gs[1]

	r1 := tp.mckey(h2, "-m", g1.String(), "-b", h2.addr.String(), "--verify", "--timeout", "60s", "-C", "20", "-S", "256", "--join-pause", "1s")
	r2 := tp.mckey(h3, "-m", g2.String(), "-b", h3.addr.String(), "--verify", "--timeout", "60s", "-C", "20", "-S", "512", "--join-pause", "1s")
	r1.WaitLine(joinedLine(g1), lineTimeout)
	r2.WaitLine(joinedLine(g2), lineTimeout)
	tp.waitMDB(g1, h2.port, true, wireTimeout)
	tp.waitMDB(g2, h3.port, true, wireTimeout)
	tp.waitQuerier()
	s1 := tp.mckey(h1, "-m", g1.String(), "-b", h1.addr.String(), "-s", "-C", "20", "-S", "256", "--join-pause", "1s")
	s2 := tp.mckey(h1, "-m", g2.String(), "-b", h1.addr.String(), "-s", "-o", "-C", "20", "-S", "512", "--join-pause", "1s")
	for _, p := range []*nettest.Proc{s1, s2, r1, r2} {
		p.ExpectExit(0, exitTimeout)
	}
	for _, r := range []*nettest.Proc{r1, r2} {
		if !nettest.HasLine(r.Output(), "mckey: verified 20 messages") {
			t.Errorf("%s: no %q", r.Name, "mckey: verified 20 messages")
		}
	}
	q1 := checkRoCE(t, waitRoCE(t, tp.caps[h1.port], h1.addr, g1, 20), h1.addr, g1, 256, 20)
	q2 := checkRoCE(t, waitRoCE(t, tp.caps[h1.port], h1.addr, g2, 20), h1.addr, g2, 512, 20)
	if q1 == q2 {
		t.Errorf("two sender processes on %v both used QPN %#x", h1, q1)
	}
	for _, c := range []struct {
		h           *host
		want, other netip.Addr
		size        int
	}{{h2, g1, g2, 256}, {h3, g2, g1, 512}} {
		checkRoCE(t, waitRoCE(t, tp.caps[c.h.port], h1.addr, c.want, 20), h1.addr, c.want, c.size, 20)
		fs := nettest.NotFrom(tp.caps[c.h.port].Synced(t, wireTimeout), c.h.addr)
		if n := len(nettest.RoCEFrames(fs, netip.Addr{}, c.other)); n != 0 {
			t.Errorf("%d frames of %v forwarded to %v (a member of %v only)", n, c.other, c.h, c.want)
		}
	}
}
