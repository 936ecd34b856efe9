package main

// docs/mckey.md's claims about mckey's flags that the other tests do not reach.

import (
	"regexp"
	"strings"
	"testing"
)

// TestIfaceFlag: --iface lo binds to lo's address: a receiver started with
// it gets the messages a sender bound to 127.0.0.1 sends.
func TestIfaceFlag(t *testing.T) {
	t.Parallel()
	g := randomGroup()
	rx := start(t, "receiver", mckeyBin, "-m", g, "--iface", "lo", "-C", "3", "--timeout", "20s", "--verify", "--join-pause", "0s")
	rx.waitLine(regexp.MustCompile(`^receiving data transfers$`), lineTimeout)
	tx := start(t, "sender", mckeyBin, "-m", g, "-b", "127.0.0.1", "-s", "-C", "3", "--join-pause", "0s")
	for _, p := range []*proc{tx, rx} {
		if code := p.wait(exitTimeout); code != 0 {
			t.Fatalf("%s exit %d: %q %s", p.name, code, p.allLines(), p.stderr.String())
		}
	}
	if out := strings.Join(rx.allLines(), "\n"); !strings.Contains(out, "mckey: verified 3 messages") || !strings.Contains(out, joinedLine(g)) {
		t.Errorf("receiver with --iface lo:\n%s", out)
	}
}

// TestIPoIBPortSpace: -p 2 (RDMA_PS_IPOIB) on InfiniBand maps the group to
// ff12:401b:… and carries data; on RoCE an IPoIB id cannot bind the
// device's address (EINVAL, as the kernel's cma_acquire_dev_by_src_ip).
func TestIPoIBPortSpace(t *testing.T) {
	t.Parallel()
	sm := subnet(t)
	rx := start(t, "receiver", "/usr/bin/env", onIB(sm, "-p", "2", "-m", "230.1.2.9", "-b", "127.0.3.1", "-C", "4",
		"--join-pause", "300ms", "--timeout", "20s", "--verify")...)
	want := "mckey: joined dgid: ff12:401b:ffff::601:209 mlid 0xc001 sl 0"
	rx.waitLine(regexp.MustCompile("^"+regexp.QuoteMeta(want)+"$"), lineTimeout)
	tx := start(t, "sender", "/usr/bin/env", onIB(sm, "-p", "0x2", "-m", "230.1.2.9", "-b", "127.0.3.2", "-s", "-C", "4", "--join-pause", "300ms")...)
	for _, p := range []*proc{tx, rx} {
		if code := p.wait(exitTimeout); code != 0 {
			t.Fatalf("%s exit %d: %q %s", p.name, code, p.allLines(), p.stderr.String())
		}
	}
	if out := strings.Join(rx.allLines(), "\n"); !strings.Contains(out, "mckey: verified 4 messages") {
		t.Errorf("receiver:\n%s", out)
	}

	r := runMckey(t, "-p", "2", "-m", randomGroup(), "-b", "127.0.0.1", "-C", "0", "--join-pause", "0s")
	if r.code != 255 || !strings.Contains(strings.Join(r.stderr, "\n"), "mckey: addr bind failure: Invalid argument") {
		t.Errorf("-p 2 on RoCE: exit %d, stderr %q", r.code, r.stderr)
	}
}
