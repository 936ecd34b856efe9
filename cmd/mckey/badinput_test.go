package main

// Bad invocations and signals: every mistake a user can type is refused
// with a message naming it and a non-zero exit status, never a panic or a
// hang; SIGINT/SIGTERM leave the groups and remove the endpoint socket.

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/softrdma/softrdma/test/testenv"
)

// closedUDPPort returns a loopback UDP address nothing listens on.
func closedUDPPort(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := c.LocalAddr().String()
	c.Close()
	return a
}

// TestBadInvocations runs mckey with flags, values, addresses and files a
// user may get wrong. Each run must end by itself (within exitTimeout),
// exit non-zero with the status rdma-core's mckey gives (1 for what it
// refuses before starting, the return status otherwise), print a line
// naming the cause, and never panic.
func TestBadInvocations(t *testing.T) {
	t.Parallel()
	g := randomGroup()
	noSM := closedUDPPort(t)
	lo := []string{"-m", g, "-b", "127.0.0.1", "--join-pause", "0s"}
	tests := []struct {
		name string
		env  []string
		args []string
		code int
		want string // a line of stdout or stderr contains it
	}{
		{"unknown option", nil, []string{"-x"}, 1, "invalid option -- 'x'"},
		{"unknown long option", nil, []string{"--bogus"}, 1, "unrecognized option '--bogus'"},
		{"option without its argument", nil, []string{"-m"}, 1, "option requires an argument -- 'm'"},
		{"long option without its argument", nil, []string{"-m", g, "--timeout"}, 1, "option '--timeout' requires an argument"},
		{"argument to a flag", nil, []string{"--verify=yes"}, 1, "option '--verify' doesn't allow an argument"},
		{"not a duration", nil, []string{"--timeout", "5"}, 1, "--timeout: time: missing unit in duration"},
		{"negative timeout", nil, []string{"--timeout=-1s"}, 1, "--timeout: negative duration -1s"},
		{"negative join pause", nil, []string{"--join-pause", "-1ns"}, 1, "--join-pause: negative duration -1ns"},
		{"negative connections", nil, append([]string{"-c", "-1"}, lo...), 1, "mckey: unable to allocate memory for test nodes"},
		{"unknown port space", nil, append([]string{"-p", "5"}, lo...), 1, "mckey: rdma_create_id (port space 0x5): Invalid argument"},
		{"no group", nil, []string{"-b", "127.0.0.1"}, 254, "getaddrinfo failed (Name or service not known)"},
		// GNU getopt permutes: an option after a non-option is parsed.
		{"unknown option after a non-option", nil, []string{"stray", "-x"}, 1, "invalid option -- 'x'"},
		{"-- ends the options", nil, []string{"-b", "127.0.0.1", "--", "-m", g}, 254, "getaddrinfo failed (Name or service not known)"},
		{"POSIXLY_CORRECT stops at a non-option", []string{"POSIXLY_CORRECT=1"}, []string{"-b", "127.0.0.1", "stray", "-m", g}, 254,
			"getaddrinfo failed (Name or service not known)"},
		{"unrecognized long option with a value", nil, []string{"--bogus=1"}, 1, "unrecognized option '--bogus=1'"},
		{"-M not a GID", nil, []string{"-M", "zzz", "-b", "127.0.0.1"}, 1, "mckey: -M zzz: not an IPv6 address"},
		{"-M on RoCE", nil, []string{"-M", "ff12:401b::1", "-b", "127.0.0.1", "--join-pause", "0s"}, 255,
			"mckey: -M ff12:401b::1: an unmapped (AF_IB) group needs an InfiniBand port"},
		{"-M with negative size", nil, []string{"-M", "ff12:401b::1", "-b", "127.0.0.1", "-S", "-1"}, 255,
			"mckey: resolve addr failure: Cannot allocate memory"},
		{"negative size", nil, append([]string{"-S", "-1"}, lo...), 255, "failed message allocation"},
		{"negative count", nil, append([]string{"-C", "-5"}, lo...), 255, "mckey: unable to create CQ"},
		{"size above the MTU", nil, append([]string{"-S", "99999"}, lo...), 255, "message_size 99999 is larger than active mtu 4096"},
		{"address not local", nil, []string{"-m", g, "-b", "198.51.100.1"}, 255, "mckey: -b 198.51.100.1: no interface of this host has that address"},
		{"no such interface", nil, []string{"--iface", "nosuch0", "-m", g}, 1, "mckey: --iface nosuch0: "},
		{"pcap not writable", nil, append([]string{"--pcap", "/nonexistent/dir/x.pcap"}, lo...), 1, "mckey: --pcap /nonexistent/dir/x.pcap: "},
		{"no subnet manager", []string{"SOFTRDMA_SM=" + noSM}, []string{"-m", "230.1.2.3", "-b", "127.0.2.1"}, 255,
			"mckey: no subnet manager answered at SOFTRDMA_SM=" + noSM},
		{"unknown backend", []string{"SOFTRDMA_BACKEND=bogus"}, lo, 1,
			`SOFTRDMA_BACKEND: backend "bogus": want auto, soft or kernel`},
		{"zero group", nil, []string{"-m", "0.0.0.0", "-b", "127.0.0.1", "--join-pause", "0s"}, 255, "group address 0.0.0.0 is unspecified"},
		{"SOFTRDMA_SM not an address", []string{"SOFTRDMA_SM=nosm"}, []string{"-m", "230.1.2.3", "-b", "127.0.2.2"}, 255,
			"mckey: SOFTRDMA_SM=nosm: "},
		// rdma-core's mckey ends a failed attach (status -1) with status 0 too;
		// one line says why.
		{"unicast group", nil, []string{"-m", "10.1.2.3", "-b", "127.0.0.1", "--join-pause", "0s", "-C", "1", "--timeout", "2s"}, 0,
			"mckey: RDMA_CM_EVENT_MULTICAST_ERROR: ibv_attach_mcast ::ffff:10.1.2.3: ::ffff:10.1.2.3 is not a multicast GID"},
		{"misspelled variable", []string{"SOFTRDMA_SMM=127.0.0.1:4792"}, []string{"-m", "0.0.0.0", "-b", "127.0.0.1", "--join-pause", "0s"}, 255,
			"softrdma: ignoring unknown environment variable SOFTRDMA_SMM (did you mean SOFTRDMA_SM?)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := startEnv(t, "mckey", tc.env, mckeyBin, tc.args...)
			p.stdin.Close()
			r := p.finish() // fails the test if mckey hangs
			all := strings.Join(append(r.stdout, r.stderr...), "\n")
			if strings.Contains(all, "panic:") || strings.Contains(all, "goroutine ") {
				t.Fatalf("%v panicked:\n%s", tc.args, all)
			}
			if r.code != tc.code {
				t.Errorf("%v: exit status %d, want %d\n%s", tc.args, r.code, tc.code, all)
			}
			if !strings.Contains(all, tc.want) {
				t.Errorf("%v: no %q in\n%s", tc.args, tc.want, all)
			}
		})
	}
}

// unshareCmd returns the path of unshare(1) for a test that runs mckey in
// a network namespace of its own, or skips it (needs root).
func unshareCmd(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Require(t, "needs root for a network namespace of its own")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		testenv.Require(t, "no unshare: %v", err)
	}
	return unshare
}

// TestNoRouteNamesTheCause runs mckey without -b in a network namespace
// that has no route to the group: rdma_resolve_addr fails (as the kernel's
// does), the perror line stays rdma-core's, and a line on stderr says that
// the route lookup found no interface.
func TestNoRouteNamesTheCause(t *testing.T) {
	t.Parallel()
	unshare := unshareCmd(t)
	g := randomGroup()
	p := start(t, "mckey", unshare, "-n", mckeyBin, "-m", g, "--join-pause", "0s")
	r := p.finish()
	if !strings.Contains(strings.Join(r.stderr, "\n"), "mckey: resolve addr failure: Network is unreachable") {
		t.Errorf("stderr %q, want rdma-core's perror line", r.stderr)
	}
	want := "mckey: no -b: the route lookup for " + g + " found no interface (network is unreachable); name the local address with -b or the interface with --iface"
	if !strings.Contains(strings.Join(r.stderr, "\n"), want) {
		t.Errorf("stderr %q, want %q", r.stderr, want)
	}
	if r.code == 0 {
		t.Errorf("exit status 0")
	}
}

// TestNoBindSaysWhere runs mckey without -b or --iface in a network
// namespace whose route for multicast is lo: one stderr line names the
// interface the route lookup picked and the address and device the id
// landed on.
func TestNoBindSaysWhere(t *testing.T) {
	t.Parallel()
	unshare := unshareCmd(t)
	g := randomGroup()
	p := start(t, "mckey", unshare, "-n", "sh", "-c", `ip link set lo up && ip route add 224.0.0.0/4 dev lo && exec "$0" "$@"`,
		mckeyBin, "-m", g, "-C", "0", "--join-pause", "0s")
	r := p.finish()
	want := regexp.MustCompile(`^mckey: no -b: the route lookup for ` + regexp.QuoteMeta(g) + ` picked interface lo; bound to 127\.0\.0\.1:\d+ on device rxe_lo$`)
	if !slices.ContainsFunc(r.stderr, want.MatchString) || r.code != 0 {
		t.Errorf("exit %d, stderr %q, want a line matching %v", r.code, r.stderr, want)
	}
}

// TestFailedSendsSaySo sends to an IPv6 group in a network namespace whose
// only interface is lo, which has no route to it: every send fails
// (ENETUNREACH), as rxe fails the WQE. rdma-core's mckey would print "data
// transfers complete" and exit 0; this one names the failure and exits
// non-zero.
func TestFailedSendsSaySo(t *testing.T) {
	t.Parallel()
	unshare := unshareCmd(t)
	p := start(t, "mckey", unshare, "-n", "sh", "-c", `ip link set lo up && exec "$0" "$@"`,
		mckeyBin, "-m", "ff15::1234", "-b", "::1", "-s", "-C", "5", "--join-pause", "0s")
	r := p.finish()
	all := strings.Join(append(r.stdout, r.stderr...), "\n")
	if want := "mckey: 5 of 5 sends to ff15::1234 failed: local QP operation error (vendor_err 101: Network is unreachable)"; !strings.Contains(all, want) {
		t.Errorf("no %q in\n%s", want, all)
	}
	if strings.Contains(all, "data transfers complete") || r.code == 0 {
		t.Errorf("exit status %d, output\n%s", r.code, all)
	}
}

// TestSignalLeaves sends SIGINT and SIGTERM to a receiver waiting for
// messages: it leaves its group (the leave is logged, not a teardown of
// the id), removes its endpoint socket, and dies of the signal, as
// rdma-core's mckey would.
func TestSignalLeaves(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			g := randomGroup()
			sock := filepath.Join(t.TempDir(), "mckey.sock")
			p := startEnv(t, "receiver", []string{"SOFTRDMA_DEBUG_ADDR=unix:" + sock, "SOFTRDMA_LOG=info,json"},
				mckeyBin, "-m", g, "-b", "127.0.0.1", "-C", "5", "--join-pause", "100ms")
			p.waitLine(regexp.MustCompile(`^receiving data transfers$`), lineTimeout)
			if _, err := os.Stat(sock); err != nil {
				t.Fatalf("endpoint socket: %v", err)
			}
			if err := p.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			p.wait(exitTimeout)
			ws, _ := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
			if !ws.Signaled() || ws.Signal() != sig {
				t.Errorf("wait status %v, want killed by %v", p.cmd.ProcessState, sig)
			}
			if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("endpoint socket left behind: %v", err)
			}
			var left bool
			for _, l := range lines(p.stderr.String()) {
				var rec struct {
					Msg, Group string
					Destroying *bool
				}
				if json.Unmarshal([]byte(l), &rec) == nil && rec.Msg == "multicast leave" && rec.Group == g &&
					rec.Destroying != nil && !*rec.Destroying {
					left = true
				}
			}
			if !left || !strings.Contains(p.stderr.String(), "mckey: interrupted: left 1 group(s)") {
				t.Errorf("no leave of %s logged:\n%s", g, p.stderr.String())
			}
			if out := strings.Join(p.allLines(), "\n"); strings.Contains(out, "return status") {
				t.Errorf("an interrupted mckey printed a return status:\n%s", out)
			}
		})
	}
}
