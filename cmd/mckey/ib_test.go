package main

// mckey on the emulated InfiniBand subnet: a softsm process plays SM, SA
// and switch; mckey processes open IB ports on it because SOFTRDMA_SM
// names it. Every port binds its own 127.0.0.0/8 address.

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

var (
	softsmOnce sync.Once
	softsmBin  string
	softsmErr  error
)

// subnet starts a softsm on free ports and returns its fabric address.
func subnet(t *testing.T, extra ...string) string {
	t.Helper()
	softsmOnce.Do(func() {
		dir := filepath.Dir(mckeyBin)
		softsmBin = filepath.Join(dir, "softsm")
		out, err := exec.Command("go", "build", "-o", softsmBin, "../softsm").CombinedOutput()
		if err != nil {
			softsmErr = fmt.Errorf("build softsm: %v\n%s", err, out)
		}
	})
	if softsmErr != nil {
		t.Fatal(softsmErr)
	}
	args := append([]string{"-listen", "127.0.0.1:0", "-sa-listen", "127.0.0.1:0"}, extra...)
	sm := start(t, "softsm", softsmBin, args...)
	// waitLine fails the test if softsm does not start.
	return sm.waitLine(regexp.MustCompile(`^softsm: listening fabric (\S+) sa (\S+)`), lineTimeout)[1]
}

// onIB runs mckey with SOFTRDMA_SM set.
func onIB(sm string, args ...string) []string {
	return append([]string{"SOFTRDMA_SM=" + sm, mckeyBin}, args...)
}

func TestIBTransfer(t *testing.T) {
	t.Parallel()
	sm := subnet(t)
	rx := start(t, "receiver", "/usr/bin/env", onIB(sm, "-m", "230.1.2.3", "-b", "127.0.1.2", "-C", "10", "-S", "1000",
		"--join-pause", "500ms", "--timeout", "10s", "--verify")...)
	want := "mckey: joined dgid: ff12:4001:ffff::601:203 mlid 0xc001 sl 0"
	rx.waitLine(regexp.MustCompile("^"+regexp.QuoteMeta(want)+"$"), lineTimeout)
	tx := start(t, "sender", "/usr/bin/env", onIB(sm, "-m", "230.1.2.3", "-b", "127.0.1.3", "-s", "-o", "-C", "10", "-S", "1000",
		"--join-pause", "500ms")...)
	for _, p := range []*proc{tx, rx} {
		if code := p.wait(exitTimeout); code != 0 {
			t.Fatalf("%s exit %d: %q %s", p.name, code, p.allLines(), p.stderr.String())
		}
	}
	got := strings.Join(rx.allLines(), "\n")
	if !strings.Contains(got, "mckey: verified 10 messages") {
		t.Errorf("receiver output:\n%s", got)
	}
	if l := tx.allLines(); len(l) < 3 || l[2] != want {
		t.Errorf("sender joined line: %q", l)
	}
}

// TestIBAssignedGroup: -m 0.0.0.0 asks the SA for an MGID; a second mckey
// joins it unmapped (-M) and receives.
func TestIBAssignedGroup(t *testing.T) {
	t.Parallel()
	sm := subnet(t)
	rx := start(t, "receiver", "/usr/bin/env", onIB(sm, "-m", "0.0.0.0", "-b", "127.0.1.4", "-C", "5",
		"--join-pause", "500ms", "--timeout", "10s")...)
	l := rx.waitLine(regexp.MustCompile(`^mckey: joined dgid: (ff12:a01b:fe80::\S*) mlid 0x(c0[0-9a-f]+) sl 0$`), lineTimeout)
	tx := start(t, "sender", "/usr/bin/env", onIB(sm, "-M", l[1], "-b", "127.0.1.5", "-s", "-C", "5", "--join-pause", "500ms")...)
	for _, p := range []*proc{tx, rx} {
		if code := p.wait(exitTimeout); code != 0 {
			t.Fatalf("%s exit %d: %q %s", p.name, code, p.allLines(), p.stderr.String())
		}
	}
	if tl := tx.allLines(); len(tl) < 3 || tl[2] != fmt.Sprintf("mckey: joined dgid: %s mlid 0x%s sl 0", l[1], l[2]) {
		t.Errorf("sender joined another group: %q", tl)
	}
}

// TestIBSendOnlyNeedsSM: a send-only join on an SM without send-only full
// member support fails at join time with EOPNOTSUPP.
func TestIBSendOnlyNeedsSM(t *testing.T) {
	t.Parallel()
	sm := subnet(t, "-no-sendonly-support")
	r := start(t, "sender", "/usr/bin/env", onIB(sm, "-m", "230.4.5.6", "-b", "127.0.1.6", "-s", "-o", "--join-pause", "100ms")...)
	code := r.wait(exitTimeout)
	if code != 255 || !strings.Contains(r.stderr.String(), "mckey: failure joining: Operation not supported") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, r.allLines(), r.stderr.String())
	}
}

// TestIBSARejectExitsZero: an SA rejection reaches mckey as
// MULTICAST_ERROR -22 and, as in rdma-core, the status ends 0 (the leave
// of the failed join succeeds).
func TestIBSARejectExitsZero(t *testing.T) {
	t.Parallel()
	sm := subnet(t)
	// The IPoIB broadcast group has Q_Key 0x0B1B; a PS_UDP id asks 0x01234567.
	r := start(t, "mckey", "/usr/bin/env", onIB(sm, "-M", "ff12:401b:ffff::ffff:ffff", "-b", "127.0.1.7", "--join-pause", "100ms")...)
	code := r.wait(exitTimeout)
	out := strings.Join(r.allLines(), "\n")
	if code != 0 || !strings.Contains(out, "mckey: event: RDMA_CM_EVENT_MULTICAST_ERROR, error: -22") || !strings.Contains(out, "return status 0") {
		t.Fatalf("exit %d:\n%s\n%s", code, out, r.stderr.String())
	}
}

// TestIBBurstLossless: a burst of 10,000 64-byte messages at full speed
// from one port to another through softsm arrives whole: the subnet's
// links are flow controlled, so the sender is held back instead of its
// datagrams being dropped (without flow control about a third were lost).
func TestIBBurstLossless(t *testing.T) {
	t.Parallel()
	sm := subnet(t, "-v") // on a failure its output says whether the switch discarded

	rx := start(t, "receiver", "/usr/bin/env", onIB(sm, "-m", "230.1.2.4", "-b", "127.0.1.8", "-C", "10000", "-S", "64",
		"--join-pause", "500ms", "--timeout", "10s", "--verify")...)
	rx.waitLine(regexp.MustCompile(`^mckey: joined dgid: `), lineTimeout)
	tx := start(t, "sender", "/usr/bin/env", onIB(sm, "-m", "230.1.2.4", "-b", "127.0.1.9", "-s", "-o", "-C", "10000", "-S", "64",
		"--join-pause", "500ms")...)
	for _, p := range []*proc{tx, rx} {
		if code := p.wait(exitTimeout); code != 0 {
			t.Fatalf("%s exit %d: %q %s", p.name, code, p.allLines(), p.stderr.String())
		}
	}
	if got := strings.Join(rx.allLines(), "\n"); !strings.Contains(got, "mckey: verified 10000 messages") {
		t.Errorf("receiver output:\n%s", got)
	}
}
