package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
)

// TestExecPortEvents compiles testdata/portevents.c and runs it through
// softrdma exec on the RoCEv2 device of a veth interface of the test's
// network namespace: the test sets the interface down and up
// (the first round) and then its peer (the carrier, the second round),
// and the program gets IBV_EVENT_PORT_ERR and IBV_EVENT_PORT_ACTIVE of
// port 1 from ibv_get_async_event, with ibv_query_port's state matching
// each, as the kernel's rxe raises them on netdev events.
func TestExecPortEvents(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	prog := buildCTest(t, dir, "portevents")
	if !testenv.InNetns(t) {
		return
	}
	const ifname = "srport0"
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
	step := func(line string, args ...string) {
		t.Helper()
		if !out.wait(line) {
			cmd.Wait()
			t.Fatalf("portevents did not print %q:\n%s", line, out)
		}
		if len(args) > 0 {
			ip(args...)
		}
	}
	step("opened", "link", "set", ifname, "down")
	step("port down 1", "link", "set", ifname, "up")
	step("port active 1", "link", "set", ifname+"p", "down")
	step("port down 2", "link", "set", ifname+"p", "up")
	step("port active 2")
	err := cmd.Wait()
	out.wait("\x00") // the whole output
	t.Logf("portevents:\n%s", out)
	if err != nil {
		t.Fatalf("portevents: %v", err)
	}
	if !strings.Contains(out.String(), "closed") {
		t.Errorf("portevents did not close its device")
	}
}
