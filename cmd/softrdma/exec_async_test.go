package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
)

// TestExecAsyncEvents compiles testdata/async.c and runs it through
// softrdma exec on the RoCEv2 device of a veth interface of the test's
// network namespace: once the program opened the device, the
// test adds an address to the interface, and the program gets
// IBV_EVENT_GID_CHANGE of port 1 from ibv_get_async_event after polling
// async_fd, acks it and closes the device.
func TestExecAsyncEvents(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	prog := buildCTest(t, dir, "async")
	if !testenv.InNetns(t) {
		return
	}
	const ifname = "srasync0"
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("link", "add", ifname, "type", "veth", "peer", "name", ifname+"p")
	ip("link", "set", ifname, "up")
	ip("link", "set", ifname+"p", "up")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd, out := startExec(t, ctx, dir, prog, "rxe_"+ifname)
	if !out.wait("opened") {
		cmd.Wait()
		t.Fatalf("async did not open rxe_%s:\n%s", ifname, out)
	}
	ip("addr", "add", "10.23.0.1/24", "dev", ifname)
	err := cmd.Wait()
	out.wait("\x00") // the whole output
	t.Logf("async:\n%s", out)
	if err != nil {
		t.Fatalf("async: %v", err)
	}
	for _, want := range []string{"event: GID table change port 1", "closed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("async output lacks %q", want)
		}
	}
}
