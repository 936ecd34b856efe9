package main

// The first hour with the tool: its usage, its refusals, and what it says
// when the process it watches goes away.

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/introspect"
)

// TestHelpListsSubcommands: -h, --help and help print every subcommand
// (not the demo's flags) and exit 0.
func TestHelpListsSubcommands(t *testing.T) {
	for _, h := range []string{"-h", "-help", "--help", "help"} {
		code, out, errOut := softrdma(h)
		if code != 0 {
			t.Errorf("softrdma %s: exit %d (%s)", h, code, errOut)
		}
		if strings.Contains(out+errOut, "Usage of demo") {
			t.Errorf("softrdma %s printed the demo's flags:\n%s", h, out)
		}
		for name, c := range commands {
			if !strings.Contains(out, fmt.Sprintf("  %-10s %s\n", name, c.summary)) {
				t.Errorf("softrdma %s does not list %s:\n%s", h, name, out)
			}
		}
	}
}

// TestBadInvocations: every subcommand refuses a bad flag or value with
// status 2 and a message on stderr naming it, and an unreachable target
// with status 1 and a message; nothing is started.
func TestBadInvocations(t *testing.T) {
	t.Setenv(introspect.EnvDir, t.TempDir())
	pcap := filepath.Join(t.TempDir(), "x.pcap")
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"nosuchcommand"}, 2, `softrdma: unknown command "nosuchcommand"`},
		{[]string{"-count", "0"}, 2, "demo: -size must be 1..256 and -count 1..1000"},
		{[]string{"demo", "-size", "1000"}, 2, "demo: -size must be 1..256"},
		{[]string{"demo", "-group", "10.1.2.3"}, 2, `demo: "10.1.2.3" is not an IPv4 multicast group`},
		{[]string{"demo", "-bind", "nohost"}, 2, "demo: bad -bind"},
		{[]string{"demo", "-nosuchflag"}, 2, "flag provided but not defined: -nosuchflag"},
		{[]string{"devices", "extra"}, 2, `softrdma devices: unexpected argument "extra"`},
		{[]string{"devices", "-p", "x"}, 2, `invalid value "x" for flag -p`},
		{[]string{"groups", "-nosuchflag"}, 2, "flag provided but not defined: -nosuchflag"},
		{[]string{"stat", "-w", "-1s"}, 2, "-w must be at least 10ms"},
		{[]string{"stat", "-w", "1ms"}, 2, "-w must be at least 10ms"},
		{[]string{"stat", "-n", "-1"}, 2, "-n at least 0"},
		{[]string{"capture", "-p", "1"}, 2, "-w FILE is required"},
		{[]string{"capture", "-w", pcap, "-dir", "sideways"}, 2, "sideways"},
		{[]string{"capture", "-w", pcap, "-c", "-1"}, 2, "must not be negative"},
		{[]string{"capture", "-w", pcap, "-d", "-1s"}, 2, "must not be negative"},
		{[]string{"saquery", "-nosuchflag"}, 2, "flag provided but not defined: -nosuchflag"},
		{[]string{"bench", "-batch", "0"}, 2, "bench"},
		{[]string{"bench", "-sizes", "9000"}, 2, "bench"},
		{[]string{"devices"}, 1, "no process with an endpoint found"},
		{[]string{"devices", "-p", "999999999"}, 1, "softrdma devices: "},
		{[]string{"devices", "-addr", "192.0.2.1:80"}, 1, "softrdma devices: "},
		{[]string{"groups", "-addr", "unix:/nonexistent/x.sock"}, 1, "softrdma groups: "},
		{[]string{"stat", "-addr", "127.0.0.1:1"}, 1, "softrdma stat: "},
		{[]string{"devices", "-p", "1", "-addr", "127.0.0.1:1"}, 1, "give -p or -addr, not both"},
		{[]string{"capture", "-addr", "unix:/nonexistent/x.sock", "-w", pcap}, 1, "softrdma capture: "},
	}
	for _, tc := range tests {
		code, out, errOut := softrdma(tc.args...)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("softrdma %s: exit %d, want %d with %q; stdout:\n%s\nstderr:\n%s",
				strings.Join(tc.args, " "), code, tc.code, tc.want, out, errOut)
		}
	}
	if _, err := os.Stat(pcap); err == nil {
		t.Errorf("a refused capture created %s", pcap)
	}
}

// TestToolsSayProcessExited: `stat -w` and `capture` of a process that
// exits while they watch end with "process N exited" and status 0, not
// with the broken connection.
func TestToolsSayProcessExited(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(introspect.EnvDir, dir)
	env := []string{"XDG_RUNTIME_DIR=" + dir, introspect.EnvAddr + "=unix"}
	for _, tool := range []string{"stat", "capture"} {
		t.Run(tool, func(t *testing.T) {
			t.Parallel()
			// A receiver that gives up after 4s without a message.
			rx := startMckey(t, "receiver", env, "-m", randomGroup(), "-b", "127.0.0.1", "-C", "1", "--timeout", "4s", "--join-pause", "0")
			rx.waitLine("receiving data transfers")
			pid := strconv.Itoa(rx.pid())
			args := []string{"stat", "-p", pid, "-w", "100ms"}
			if tool == "capture" {
				args = []string{"capture", "-p", pid, "-w", filepath.Join(t.TempDir(), "c.pcap")}
			}
			code, _, errOut := softrdma(args...)
			want := fmt.Sprintf("softrdma %s: process %s exited", tool, pid)
			if code != 0 || !strings.Contains(errOut, want) || strings.Contains(errOut, "EOF") {
				t.Errorf("softrdma %s: exit %d, stderr %q, want status 0 and %q", strings.Join(args, " "), code, errOut, want)
			}
		})
	}
}

// TestCaptureEndsAtDuration: capture -d D of a live process ends by itself
// after D with status 0 and its summary; the process keeps running.
func TestCaptureEndsAtDuration(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(introspect.EnvDir, dir)
	env := []string{"XDG_RUNTIME_DIR=" + dir, introspect.EnvAddr + "=unix"}
	rx := startMckey(t, "receiver", env, "-m", randomGroup(), "-b", "127.0.0.1", "-C", "1", "--timeout", "120s", "--join-pause", "0")
	rx.waitLine("receiving data transfers")
	const d = 500 * time.Millisecond
	t0 := time.Now()
	code, _, errOut := softrdma("capture", "-p", strconv.Itoa(rx.pid()), "-w", filepath.Join(dir, "d.pcap"), "-d", d.String())
	el := time.Since(t0)
	if code != 0 || !strings.Contains(errOut, "softrdma capture: 0 frames (24 bytes) in ") {
		t.Errorf("capture -d %v: exit %d, stderr %q", d, code, errOut)
	}
	if el < d || el > d+20*time.Second {
		t.Errorf("capture -d %v ended after %v", d, el)
	}
	if !processAlive(rx.pid()) {
		t.Errorf("the process ended with the capture")
	}
}

// TestSocketFallbackTmp: with SOFTRDMA_DEBUG_ADDR=unix and no
// XDG_RUNTIME_DIR, the endpoint listens on /tmp/softrdma-<pid>.sock, mode
// 0600, and the tools find it there by PID; the socket goes with the
// process.
func TestSocketFallbackTmp(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv(introspect.EnvDir, "") // the default places, which this test is about
	rx := startMckey(t, "receiver", []string{introspect.EnvAddr + "=unix"}, "-m", randomGroup(), "-b", "127.0.0.1", "-C", "1", "--timeout", "120s", "--join-pause", "0")
	rx.waitLine("receiving data transfers")
	path := fmt.Sprintf("/tmp/softrdma-%d.sock", rx.pid())
	var fi os.FileInfo
	waitFor(t, path, 10*time.Second, func() bool { var err error; fi, err = os.Stat(path); return err == nil })
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: mode %v, want a socket with 0600", path, fi.Mode())
	}
	code, out, errOut := softrdma("devices", "-p", strconv.Itoa(rx.pid()))
	if code != 0 || !strings.Contains(out, "hca_id:\trxe_lo") || !strings.Contains(out, "unix:"+path) && !strings.Contains(out, "rxe_lo") {
		t.Errorf("devices -p through /tmp: exit %d\n%s\n%s", code, out, errOut)
	}
	if eps := introspect.Endpoints(); !slices.ContainsFunc(eps, func(e introspect.Endpoint) bool { return e.PID == rx.pid() && e.Path == path }) {
		t.Errorf("Endpoints() %+v lacks %s", eps, path)
	}
	rx.cmd.Process.Signal(os.Interrupt)
	waitFor(t, path+" removed", 20*time.Second, func() bool { _, err := os.Stat(path); return os.IsNotExist(err) })
}

// TestReadmeStatWatch runs docs/operators.md's `stat -w` example as written: a
// receiver with an endpoint, `softrdma stat -w` (the only process with an
// endpoint, no -p), and a sender of 5 messages: the deltas add up to 5
// delivered to the receiver's QP, and at least 5 received on rxe_lo.
func TestReadmeStatWatch(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(introspect.EnvDir, dir)
	g := randomGroup() // the docs' 239.1.2.3 could meet another test's traffic
	rx := startMckey(t, "receiver", []string{"XDG_RUNTIME_DIR=" + dir, introspect.EnvAddr + "=unix"}, "-m", g, "-b", "127.0.0.1", "-C", "1000")
	rx.waitLine("receiving data transfers")
	var out, errOut lockedBuffer
	done := make(chan int, 1)
	go func() { done <- run([]string{"stat", "-w", "300ms", "-n", "8"}, &out, &errOut) }()
	waitFor(t, "stat's header", 20*time.Second, func() bool { return strings.Contains(out.String(), "changes every 300ms") })
	tx := startMckey(t, "sender", nil, "-m", g, "-b", "127.0.0.1", "-s", "-C", "5", "--join-pause", "0")
	tx.wait()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("stat -w: exit %d: %s", code, errOut.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("stat -w -n 8 did not end")
	}
	sum := map[string]int{}
	re := regexp.MustCompile(`^  (rxe_lo(?:/0x[0-9a-f]+)?)\s+(rcvd_pkts|delivered)\s+\+(\d+)\s+[0-9.]+/s\s+\d+$`)
	for _, l := range strings.Split(out.String(), "\n") {
		if m := re.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[3])
			key := "device " + m[2]
			if strings.Contains(m[1], "/") {
				key = "qp " + m[2]
			}
			sum[key] += n
		}
	}
	// Other processes' datagrams to port 4791 may reach the device too.
	if sum["device rcvd_pkts"] < 5 || sum["qp delivered"] != 5 {
		t.Errorf("deltas %v, want 5 received on rxe_lo and 5 delivered to the QP:\n%s", sum, out.String())
	}
	// Without -p, stat says which process it picked.
	if want := fmt.Sprintf("softrdma: process %d (mckey), the only one with an endpoint (-p to choose)\n", rx.cmd.Process.Pid); errOut.String() != want {
		t.Errorf("stat's stderr %q, want %q", errOut.String(), want)
	}
}
