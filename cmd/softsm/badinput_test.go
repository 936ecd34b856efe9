package main

// Bad invocations of the softsm binary, and the docs' flags that the
// other tests do not reach (-state, -sa-delay, -sa-drop).

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/test/testenv"
)

// TestBadInvocationsProcess runs the softsm binary with each mistake: it
// must exit by itself, non-zero (2 for a flag, 1 for what fails while
// starting), say why on stderr, and never panic (a panic in a goroutine of
// the SM would end the process, which the in-process TestBadInvocations
// cannot see).
func TestBadInvocationsProcess(t *testing.T) {
	t.Parallel()
	garbage := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(garbage, []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	lo := []string{"-listen", "127.0.0.1:0", "-sa-listen", "127.0.0.1:0"}
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-port-timeout", "-1s"}, 2, "-port-timeout -1s: must be longer than the ports' keepalive interval (1s)"},
		{[]string{"-port-timeout", "1ns"}, 2, "-port-timeout 1ns: must be longer than"},
		{[]string{"-port-timeout", "0s"}, 2, "-port-timeout 0s: must be longer than"},
		{[]string{"-port-timeout", "5"}, 2, `invalid value "5" for flag -port-timeout`},
		{[]string{"-hoq-life", "0s"}, 2, "-hoq-life and -vl-stall-count must be positive"},
		{[]string{"-vl-stall-count", "-1"}, 2, "-hoq-life and -vl-stall-count must be positive"},
		{[]string{"-sa-delay", "-1s"}, 2, "-sa-delay -1s: negative duration"},
		{[]string{"-sa-timeout", "-5ms"}, 2, "-sa-timeout -5ms: negative duration"},
		{[]string{"-port", "zz"}, 2, `bad GUID "zz"`},
		{[]string{"-port", "0"}, 2, `bad GUID "0"`},
		{[]string{"-subnet-prefix", "x"}, 2, `bad -subnet-prefix "x"`},
		{[]string{"extra"}, 2, `unexpected argument "extra"`},
		{[]string{"-nosuchflag"}, 2, "flag provided but not defined: -nosuchflag"},
		{[]string{"-listen", "256.0.0.1:1", "-sa-listen", "127.0.0.1:0"}, 1, "softsm: "},
		{[]string{"-listen", ":::", "-sa-listen", "127.0.0.1:0"}, 1, "too many colons"},
		{[]string{"-listen", "127.0.0.1:0", "-sa-listen", "192.0.2.1:1"}, 1, "not a loopback address"},
		{[]string{"-listen", "127.0.0.1:0", "-sa-listen", "192.0.2.1:1", "-sa-allow-remote"}, 1, "cannot assign requested address"},
		{append([]string{"-state", "/nonexistent/dir/state.json"}, lo...), 1, "no such file or directory"},
		{append([]string{"-state", garbage}, lo...), 1, "softsm: "},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, softsmBin, tc.args...)
			cmd.Env = testenv.CleanEnv()
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if ctx.Err() != nil {
				t.Fatalf("still running after 30s: stdout %q stderr %q", stdout.String(), stderr.String())
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tc.code {
				t.Errorf("exit %v, want status %d; stderr:\n%s", err, tc.code, stderr.String())
			}
			if strings.Contains(stderr.String(), "panic:") || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr lacks %q (or panicked):\n%s", tc.want, stderr.String())
			}
			if stdout.Len() != 0 {
				t.Errorf("started anyway: %q", stdout.String())
			}
		})
	}
}

// attach sends an attach for guid to a softsm's fabric address and returns
// the LID of its port_info answer.
func attach(t *testing.T, p *proc, guid uint64) uint16 {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pi, err := attachFrom(c, p.fabric, guid)
	if err != nil || pi.LID == 0 {
		t.Fatalf("port_info %+v %v", pi, err)
	}
	return pi.LID
}

// TestStateFlag: with -state, a GUID keeps its LID across a restart even
// when another GUID attaches first; without it, the first GUID to attach
// after a restart gets the first LID.
func TestStateFlag(t *testing.T) {
	t.Parallel()
	state := filepath.Join(t.TempDir(), "softsm.json")
	p := start(t, "-state", state)
	a, b := attach(t, p, 0x200001), attach(t, p, 0x200002)
	if a == b {
		t.Fatalf("two ports share LID %d", a)
	}
	p.stop(t)
	if _, err := os.Stat(state); err != nil {
		t.Fatalf("state file: %v", err)
	}
	p = start(t, "-state", state)
	if got := attach(t, p, 0x200002); got != b {
		t.Errorf("after a restart with -state, GUID 0x200002 has LID %d, had %d", got, b)
	}
	if got := attach(t, p, 0x200001); got != a {
		t.Errorf("after a restart with -state, GUID 0x200001 has LID %d, had %d", got, a)
	}
	p.stop(t)

	q := start(t) // no -state: LIDs are handed out afresh
	if got := attach(t, q, 0x200002); got != a {
		t.Errorf("without -state the first port got LID %d, want the first LID %d", got, a)
	}
	q.stop(t)
}

// TestSADelayFlag: -sa-delay D answers no SA MAD before D.
func TestSADelayFlag(t *testing.T) {
	t.Parallel()
	const d = 700 * time.Millisecond
	p := start(t, "-sa-delay", d.String())
	t0 := time.Now()
	r := query(t, p.sa, mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 7, 0))
	if el := time.Since(t0); el < d {
		t.Errorf("answered after %v, before -sa-delay %v", el, d)
	}
	if r.TID() != 7 || r.Status() != 0 {
		t.Errorf("answer TID %#x status %#x", r.TID(), r.Status())
	}
	p.stop(t)
}

// TestSADropFlag: -sa-drop answers no SA MAD, while the same query to a
// softsm without it is answered (so the silence is the flag's doing).
func TestSADropFlag(t *testing.T) {
	t.Parallel()
	m := mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 9, 0)
	if r := query(t, start(t).sa, m); r.TID() != 9 {
		t.Fatalf("control softsm: answer TID %#x", r.TID())
	}
	p := start(t, "-sa-drop")
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for range 3 {
		if _, err := conn.WriteToUDPAddrPort(m, p.sa); err != nil {
			t.Fatal(err)
		}
	}
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, _, err := conn.ReadFromUDPAddrPort(make([]byte, 1024)); err == nil {
		t.Fatalf("-sa-drop answered %d bytes", n)
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("read: %v", err)
	}
	p.stop(t)
}
