package main

// Loopback multi-process tests: real mckey processes (and mcpeer, a helper
// that can observe what mckey cannot) exchanging RoCEv2 over 127.0.0.1.
// Every invocation binds 127.0.0.1 and uses a random group in 239/8; a
// sender starts only after its receivers printed their joined lines.

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// usageLines are the lines of rdma-core mckey's usage(), after "usage: argv0".
var usageLines = []string{
	"\t-m multicast_address",
	"\t[-M unmapped_multicast_address]",
	"\t replaces -m and requires -b",
	"\t[-s(ender)]",
	"\t[-b bind_address]",
	"\t[-c connections]",
	"\t[-C message_count]",
	"\t[-S message_size]",
	"\t[-p port_space - 0x111 for UDP (default), 0x2 for IPOIB]",
	"\t[-o join as a send-only full-member]",
	"\t[-l join without multicast loopback]",
}

// joinedLine is mckey's joined line for an IPv4 group on RoCE.
func joinedLine(group string) string {
	return fmt.Sprintf("mckey: joined dgid: ::ffff:%s mlid 0x0 sl 0", group)
}

// joinedRE matches any joined line of mckey.
var joinedRE = regexp.MustCompile(`^mckey: joined dgid: `)

// checkRun compares a finished mckey run with the expected stdout and
// stderr lines and exit status.
func checkRun(t *testing.T, what string, r mckeyRun, stdout, stderr []string, code int) {
	t.Helper()
	if !slices.Equal(r.stdout, stdout) {
		t.Errorf("%s: stdout\n%s\nwant\n%s", what, strings.Join(r.stdout, "\n"), strings.Join(stdout, "\n"))
	}
	if !slices.Equal(r.stderr, stderr) {
		t.Errorf("%s: stderr %q, want %q", what, r.stderr, stderr)
	}
	if r.code != code {
		t.Errorf("%s: exit status %d, want %d", what, r.code, code)
	}
}

// repeat returns n copies of s.
func repeat(s string, n int) []string { return slices.Repeat([]string{s}, n) }

// concat joins line lists.
func concat(parts ...[]string) []string { return slices.Concat(parts...) }

// TestOutputWithoutPeer checks mckey's output and exit status in the
// situations that need no other process, as rdma-core's mckey prints them.
func TestOutputWithoutPeer(t *testing.T) {
	t.Parallel()
	g := randomGroup()
	server := []string{"mckey: starting server", "mckey: joining"}
	failed := []string{"test complete", "return status -1"}
	tests := []struct {
		name   string
		args   []string
		stdout []string
		stderr []string
		code   int
	}{{
		name: "-M without -b",
		args: []string{"-M", "ff12:4001:ffff::601:203"},
		// exits before touching any device, so the missing -b is harmless
		stdout: []string{"unmapped multicast address requires binding to source address"},
		code:   1,
	}, {
		name:   "address not local",
		args:   []string{"-m", g, "-b", "198.51.100.1"}, // TEST-NET-2: bind fails, nothing is sent
		stdout: concat(server, failed),
		stderr: []string{"mckey: addr bind failure: Cannot assign requested address", "mckey: -b 198.51.100.1: no interface of this host has that address"},
		code:   255,
	}, {
		name:   "message larger than active mtu",
		args:   []string{"-m", g, "-b", "127.0.0.1", "-S", "5000"},
		stdout: concat(server, []string{"mckey: message_size 5000 is larger than active mtu 4096"}, failed),
		stderr: []string{"mckey: failure leaving: Cannot assign requested address"},
		code:   255,
	}, {
		name:   "zero group",
		args:   []string{"-m", "0.0.0.0", "-b", "127.0.0.1"},
		stdout: concat(server, failed),
		stderr: []string{"mckey: failure joining: Invalid argument",
			"mckey: rdma_join_multicast_ex 0.0.0.0:0: group address 0.0.0.0 is unspecified: invalid argument",
			"mckey: failure leaving: Cannot assign requested address"},
		code: 255,
	}, {
		// softrdma refuses loopback groups (DESIGN §3, item 6), where Linux quietly yields MGID 0.
		name:   "loopback group",
		args:   []string{"-m", "127.0.0.5", "-b", "127.0.0.1"},
		stdout: concat(server, failed),
		stderr: []string{"mckey: failure joining: Invalid argument",
			"mckey: rdma_join_multicast_ex 127.0.0.5:0: group address 127.0.0.5 is a loopback address, which softrdma refuses (Linux joins it with MGID 0): invalid argument",
			"mckey: failure leaving: Cannot assign requested address"},
		code: 255,
	}, {
		name:   "receiver without messages",
		args:   []string{"-m", g, "-b", "127.0.0.1", "-C", "0", "--join-pause", "200ms"},
		stdout: concat(server, []string{joinedLine(g), "test complete", "return status 0"}),
		code:   0,
	}, {
		// -C 0 also skips the MTU check.
		name:   "sender without messages",
		args:   []string{"-m", g, "-b", "127.0.0.1", "-s", "-C", "0", "-S", "5000", "--join-pause", "200ms"},
		stdout: []string{"mckey: starting client", "mckey: joining", joinedLine(g), "test complete", "return status 0"},
		code:   0,
	}, {
		// -S 0 forces -C 0.
		name:   "receiver with empty messages",
		args:   []string{"-m", g, "-b", "127.0.0.1", "-S", "0", "--join-pause", "200ms"},
		stdout: concat(server, []string{joinedLine(g), "test complete", "return status 0"}),
		code:   0,
	}, {
		name:   "receiver timeout",
		args:   []string{"-m", g, "-b", "127.0.0.1", "-C", "3", "--timeout", "500ms", "--join-pause", "100ms"},
		stdout: timeoutLines(g, 3),
		stderr: []string{"mckey: device rxe_lo (bound to 127.0.0.1) dropped nothing: no datagram for " + g + " reached it; nor did any datagram for it reach another interface of this host"},
		code:   timeoutStatus,
	}, {
		// GNU getopt: non-option arguments (ignored) may come between options.
		name:   "options after non-options",
		args:   []string{"stray", "-m", g, "more", "-b", "127.0.0.1", "-C", "0", "--join-pause", "200ms"},
		stdout: concat(server, []string{joinedLine(g), "test complete", "return status 0"}),
		code:   0,
	}, {
		// Unlike rxe, softrdma supports BLOCK_SELF_MCAST_LB.
		name:   "receiver with -l",
		args:   []string{"-m", g, "-b", "127.0.0.1", "-l", "-C", "0", "--join-pause", "200ms"},
		stdout: concat(server, []string{joinedLine(g), "test complete", "return status 0"}),
		code:   0,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkRun(t, strings.Join(tc.args, " "), runMckey(t, tc.args...), tc.stdout, tc.stderr, tc.code)
		})
	}

	// getopt errors: the program's own message goes to stderr (not
	// asserted, as rdma-core's tests do not); the usage lines to stdout.
	for _, bad := range [][]string{{"-x"}, {"--bogus"}, {"-C"}} {
		args := append([]string{"-m", g, "-b", "127.0.0.1"}, bad...)
		t.Run("usage "+bad[0], func(t *testing.T) {
			t.Parallel()
			r := runMckey(t, args...)
			want := concat([]string{"usage: " + mckeyBin}, usageLines)
			if len(r.stdout) < len(want) || !slices.Equal(r.stdout[:len(want)], want) {
				t.Errorf("%v: stdout\n%s\nwant it to start with\n%s", args, strings.Join(r.stdout, "\n"), strings.Join(want, "\n"))
			}
			if slices.Contains(r.stdout, "mckey: starting server") {
				t.Errorf("%v: started after a usage error", args)
			}
			if r.code != 1 {
				t.Errorf("%v: exit status %d, want 1", args, r.code)
			}
		})
	}
}

// TestTransfer runs a full-member receiver and a sender process: the
// receiver checks every message (--verify) and both print the documented
// lines and exit 0.
func TestTransfer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		size   string
		sender []string
	}{
		{"full member sender", "1000", nil},
		{"send-only sender", "1000", []string{"-o"}},
		{"send without immediate", "1000", []string{"--no-imm"}},
		{"messages of the active mtu", "4096", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := randomGroup()
			common := []string{"-m", g, "-b", "127.0.0.1", "-C", "20", "-S", tc.size, "--join-pause", "1s"}
			recv := start(t, "receiver", mckeyBin, concat(common, []string{"--verify", "--timeout", "10s"})...)
			recv.waitLine(joinedRE, lineTimeout)
			send := start(t, "sender", mckeyBin, concat(common, []string{"-s"}, tc.sender)...)
			sr := send.finish()
			rr := recv.finish()
			checkRun(t, "sender", sr, []string{
				"mckey: starting client",
				"mckey: joining",
				joinedLine(g),
				"initiating data transfers",
				"data transfers complete",
				"test complete",
				"return status 0",
			}, nil, 0)
			checkRun(t, "receiver", rr, []string{
				"mckey: starting server",
				"mckey: joining",
				joinedLine(g),
				"receiving data transfers",
				"mckey: verified 20 messages",
				"data transfers complete",
				"test complete",
				"return status 0",
			}, nil, 0)
		})
	}
}

// TestSendOnlyMemberReceivesNothing: a send-only full member's datagrams
// reach the full members, but it is never attached and receives nothing,
// not even its own datagrams.
func TestSendOnlyMemberReceivesNothing(t *testing.T) {
	t.Parallel()
	g := randomGroup()
	full := startPeer(t, "full", g)
	only := startPeer(t, "send-only", g, "-o")
	// mckey as a send-only receiver: not attached, so it times out.
	mk := start(t, "mckey -o receiver", mckeyBin, "-m", g, "-b", "127.0.0.1", "-o", "-C", "5",
		"--timeout", "1500ms", "--join-pause", "100ms")
	mk.waitLine(joinedRE, lineTimeout)

	only.send(10)
	full.recv(10, from(only, 10))
	full.quiet(300 * time.Millisecond)

	full.send(10)
	full.recv(10, from(full, 10)) // its own, looped back
	only.quiet(time.Second)

	only.exit()
	full.exit()

	r := mk.finish()
	checkRun(t, "mckey -o receiver", r, timeoutLines(g, 5),
		[]string{"mckey: -o: a send-only full member receives nothing (its QP is not attached, its device not in the group)"}, timeoutStatus)
}

// timeoutStatus is mckey's exit status after --timeout expired: -ETIMEDOUT & 0xff.
const timeoutStatus = -110 & 0xff

// timeoutLines is the output of an mckey receiver that got none of its n
// messages before --timeout expired (the --timeout extension documents
// return status -110).
func timeoutLines(group string, n int) []string {
	return []string{
		"mckey: starting server",
		"mckey: joining",
		joinedLine(group),
		"receiving data transfers",
		fmt.Sprintf("mckey: receive timeout: 0 of %d messages", n),
		"test complete",
		"return status -110",
	}
}

// TestBlockSelfLoopback: a QP created with BLOCK_SELF_MCAST_LB (-l) does
// not receive its own datagrams but does receive everybody else's; a QP
// without it receives its own (rxe's default). A third process, an mckey
// receiver, gets everything.
func TestBlockSelfLoopback(t *testing.T) {
	t.Parallel()
	g := randomGroup()
	rcv := start(t, "mckey receiver", mckeyBin, "-m", g, "-b", "127.0.0.1", "-C", "20", "-S", "100",
		"--verify", "--timeout", "15s", "--join-pause", "100ms")
	rcv.waitLine(joinedRE, lineTimeout)
	a := startPeer(t, "A -l", g, "-l")
	b := startPeer(t, "B", g)

	a.send(10)
	b.recv(10, from(a, 10))
	a.quiet(500 * time.Millisecond)

	b.send(10)
	a.recv(10, from(b, 10))
	b.recv(10, from(b, 10))
	a.quiet(300 * time.Millisecond)
	b.quiet(300 * time.Millisecond)

	r := rcv.finish()
	checkRun(t, "mckey receiver", r, []string{
		"mckey: starting server",
		"mckey: joining",
		joinedLine(g),
		"receiving data transfers",
		"mckey: verified 20 messages",
		"data transfers complete",
		"test complete",
		"return status 0",
	}, nil, 0)
	a.exit()
	b.exit()
}

// TestSeveralGroups runs two groups at once: each receiver gets exactly
// its group's datagrams (sizes differ, so a stray datagram would also fail
// mcpeer's byte_len check).
func TestSeveralGroups(t *testing.T) {
	t.Parallel()
	g1, g2 := twoGroups()
	r1 := startPeer(t, "R1", g1, "-S", "100")
	r2 := startPeer(t, "R2", g2, "-S", "200")
	s1 := startPeer(t, "S1", g1, "-S", "100", "-o")
	s2 := startPeer(t, "S2", g2, "-S", "200", "-o")

	s1.send(7)
	s2.send(11)
	r1.recv(7, from(s1, 7))
	r2.recv(11, from(s2, 11))
	r1.quiet(300 * time.Millisecond)
	r2.quiet(300 * time.Millisecond)

	s2.send(5)
	r2.recv(5, from(s2, 5))
	r1.quiet(300 * time.Millisecond)

	for _, p := range []*peer{s1, s2, r1, r2} {
		p.exit()
	}
}

// TestConnections runs mckey with -c 4: four ids and QPs in one process.
func TestConnections(t *testing.T) {
	t.Parallel()
	t.Run("receiver", func(t *testing.T) {
		t.Parallel()
		g := randomGroup()
		recv := start(t, "receiver", mckeyBin, "-m", g, "-b", "127.0.0.1", "-c", "4", "-C", "10",
			"--verify", "--timeout", "10s", "--join-pause", "500ms")
		for range 4 {
			recv.waitLine(joinedRE, lineTimeout)
		}
		send := runMckey(t, "-m", g, "-b", "127.0.0.1", "-s", "-C", "10", "--join-pause", "500ms")
		checkRun(t, "sender", send, []string{
			"mckey: starting client", "mckey: joining", joinedLine(g),
			"initiating data transfers", "data transfers complete", "test complete", "return status 0",
		}, nil, 0)
		r := recv.finish()
		checkRun(t, "receiver", r, concat(
			[]string{"mckey: starting server", "mckey: joining"},
			repeat(joinedLine(g), 4),
			[]string{"receiving data transfers"},
			repeat("mckey: verified 10 messages", 4),
			[]string{"data transfers complete", "test complete", "return status 0"},
		), nil, 0)
	})
	t.Run("sender", func(t *testing.T) {
		t.Parallel()
		g := randomGroup()
		recv := start(t, "receiver", mckeyBin, "-m", g, "-b", "127.0.0.1", "-C", "20",
			"--verify", "--timeout", "10s", "--join-pause", "500ms")
		recv.waitLine(joinedRE, lineTimeout)
		counter := startPeer(t, "counter", g)
		send := runMckey(t, "-m", g, "-b", "127.0.0.1", "-s", "-c", "4", "-C", "5", "--join-pause", "500ms")
		checkRun(t, "sender", send, concat(
			[]string{"mckey: starting client", "mckey: joining"},
			repeat(joinedLine(g), 4),
			[]string{"initiating data transfers", "data transfers complete", "test complete", "return status 0"},
		), nil, 0)
		r := recv.finish()
		checkRun(t, "receiver", r, []string{
			"mckey: starting server", "mckey: joining", joinedLine(g), "receiving data transfers",
			"mckey: verified 20 messages", "data transfers complete", "test complete", "return status 0",
		}, nil, 0)
		// Four distinct source QPs, five datagrams each.
		got := counter.do("recv 20 10s", lineTimeout)
		m := regexp.MustCompile(`^recv 20 from (0x[0-9a-f]+):5,(0x[0-9a-f]+):5,(0x[0-9a-f]+):5,(0x[0-9a-f]+):5$`).FindStringSubmatch(got)
		if m == nil {
			t.Fatalf("counter: %q, want 5 datagrams from each of 4 QPs", got)
		}
		counter.quiet(300 * time.Millisecond)
		counter.exit()
	})
}

// TestLeaveStopsDelivery: after a leave the member's QP receives nothing
// while the sender's sends still complete and still reach another full
// member; joining again restores delivery.
func TestLeaveStopsDelivery(t *testing.T) {
	t.Parallel()
	g := randomGroup()
	r := startPeer(t, "R", g)
	w := startPeer(t, "W", g) // a witness that stays joined
	s := startPeer(t, "S", g, "-o")

	s.send(10)
	r.recv(10, from(s, 10))
	w.recv(10, from(s, 10))

	r.expect("leave", "left")
	s.send(10)
	w.recv(10, from(s, 10))
	r.quiet(time.Second)

	r.expect("join", "joined")
	s.send(10)
	r.recv(10, from(s, 10))
	w.recv(10, from(s, 10))
	r.quiet(200 * time.Millisecond)

	// Quick leave/join cycles leave the membership intact.
	for range 5 {
		r.expect("leave", "left")
		r.expect("join", "joined")
	}
	s.send(10)
	r.recv(10, from(s, 10))
	w.recv(10, from(s, 10))

	for _, p := range []*peer{r, w, s} {
		p.exit()
	}
}

// TestReceiveQueue: datagrams find no receive once the posted ones are
// used up, and a datagram longer than the receive buffer is dropped
// without consuming a receive (rxe's behaviour).
func TestReceiveQueue(t *testing.T) {
	t.Parallel()
	g := randomGroup()
	r := startPeer(t, "R", g, "-S", "100", "-R", "4")
	big := startPeer(t, "big", g, "-S", "200", "-o")
	small := startPeer(t, "small", g, "-S", "100", "-o")

	big.send(5)
	r.quiet(300 * time.Millisecond)

	small.send(6) // 4 receives are posted: 2 are dropped
	r.expect("recv 6 1s", "recv 4 from "+from(small, 4))

	small.send(2) // the 4 receives are posted again
	r.recv(2, from(small, 2))
	r.quiet(200 * time.Millisecond)

	for _, p := range []*peer{r, big, small} {
		p.exit()
	}
}

// TestVerifyFailure: mckey --verify reports a datagram of the wrong length
// (here from an mcpeer sending 50 bytes to a receiver of 100) and keeps the
// failure (-EIO) in its return status.
func TestVerifyFailure(t *testing.T) {
	t.Parallel()
	g := randomGroup()
	rcv := start(t, "mckey receiver", mckeyBin, "-m", g, "-b", "127.0.0.1", "-C", "3", "-S", "100",
		"--verify", "--timeout", "10s", "--join-pause", "100ms")
	rcv.waitLine(joinedRE, lineTimeout)
	s := startPeer(t, "S", g, "-S", "50", "-o")
	s.send(1)
	r := rcv.finish()
	checkRun(t, "mckey receiver", r, []string{
		"mckey: starting server",
		"mckey: joining",
		joinedLine(g),
		"receiving data transfers",
		"mckey: message 1: byte_len 90, want 140",
		"test complete",
		"return status -5",
	}, nil, -5&0xff)
	s.exit()
}

// TestTimeoutNamesTheDrops: a receiver of 100-byte messages sent 1,000-byte
// ones times out, and says why: its device counted them in too_long_drops.
func TestTimeoutNamesTheDrops(t *testing.T) {
	t.Parallel()
	g := randomGroup()
	// The timeout runs from the receiver's join; the sender starts after
	// it (3 s: a race-built mcpeer on a loaded machine once took longer
	// than 1 s to send).
	rcv := start(t, "mckey receiver", mckeyBin, "-m", g, "-b", "127.0.0.1", "-C", "3", "-S", "100",
		"--timeout", "3s", "--join-pause", "100ms")
	rcv.waitLine(joinedRE, lineTimeout)
	s := startPeer(t, "S", g, "-S", "1000", "-o")
	s.send(3)
	r := rcv.finish()
	want := regexp.MustCompile(`^mckey: device rxe_lo \(bound to 127\.0\.0\.1\) dropped since the receives were posted: too_long_drops=3$`)
	if !slices.ContainsFunc(r.stderr, want.MatchString) || r.code != timeoutStatus {
		t.Errorf("exit %d, stderr %q, want a line matching %v", r.code, r.stderr, want)
	}
	// The first drop was said at once, by the device (without SOFTRDMA_LOG).
	said := regexp.MustCompile(`^softrdma: rxe_lo QP 0x[0-9a-f]+: dropped a datagram of 1000 bytes: its receive WR holds 140 bytes, and a UD receive takes 40 bytes of GRH area before the payload; such drops are counted in too_long_drops, and said once per QP$`)
	if n := slices.IndexFunc(r.stderr, said.MatchString); n < 0 {
		t.Errorf("stderr %q, want a line matching %v", r.stderr, said)
	}
	s.exit()
}

// TestTimeoutNothingAnywhere: a receiver that got nothing, in a network
// namespace where nothing sends, says its device dropped nothing and no
// datagram for its group reached any interface of the host. (A namespace
// of its own: in the package's shared one, the group watch of such a
// receiver once saw datagrams of the parallel tests' senders on lo.)
func TestTimeoutNothingAnywhere(t *testing.T) {
	t.Parallel()
	unshare := unshareCmd(t)
	g := randomGroup()
	p := start(t, "mckey", unshare, "-n", "sh", "-c", `ip link set lo up && exec "$0" "$@"`,
		mckeyBin, "-m", g, "-b", "127.0.0.1", "-C", "1", "--timeout", "300ms", "--join-pause", "0s")
	r := p.finish()
	want := "mckey: device rxe_lo (bound to 127.0.0.1) dropped nothing: no datagram for " + g + " reached it; nor did any datagram for it reach another interface of this host"
	if !slices.Contains(r.stderr, want) || r.code != timeoutStatus {
		t.Errorf("exit %d, stderr %q, want %q", r.code, r.stderr, want)
	}
}
