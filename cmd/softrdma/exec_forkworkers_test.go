package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
)

// TestExecForkWorkers runs testdata/forkworkers.c through softrdma exec:
// after the parent opened a device it forks two workers, and each makes
// its own event channel, id, context objects and UD QP through the parent
// (docs/c-programs.md, "fork()"), joins one multicast group on lo, and
// one sends 50 messages the other receives in order, through a
// completion channel; the parent's context used in a worker gives
// EINVAL. Each worker sets options on its id (rdma_set_option) and
// queries its QP (ibv_query_qp); the receiver attaches a second QP of its
// own to the group (ibv_attach_mcast), which receives the 50 messages
// too, and detaches it (ibv_detach_mcast), after which one more message
// reaches only the id's QP. Both workers exit 0 and the parent uses its
// context after.
func TestExecForkWorkers(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	prog := buildCTest(t, dir, "forkworkers", "-lrdmacm")
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd, out := startExec(t, ctx, dir, prog, "50")
	err := cmd.Wait()
	out.wait("\x00")
	t.Logf("forkworkers:\n%s", out)
	if err != nil {
		t.Fatalf("forkworkers: %v", err)
	}
	for _, want := range []string{"sender: sent 50", "receiver: received 50 in order",
		"receiver: the attached QP received 50", "receiver: the detached QP received nothing more", "ok"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// TestExecForkLatency runs forkworkers lat: the time per call of
// ibv_query_port and of an empty ibv_poll_cq in the parent and in a child
// of fork() (a round trip to the parent each); it logs them and checks
// that the child's calls work.
func TestExecForkLatency(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	prog := buildCTest(t, dir, "forkworkers", "-lrdmacm")
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd, out := startExec(t, ctx, dir, prog, "lat", "2000")
	err := cmd.Wait()
	out.wait("\x00")
	t.Logf("forkworkers lat:\n%s", out)
	if err != nil {
		t.Fatalf("forkworkers lat: %v", err)
	}
	for _, want := range []string{"child: ibv_query_port", "child: empty ibv_poll_cq", "ok"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// The child opens a device of the list it inherited (by name, as
	// rdma-core allows): not a call on a parent's object.
	if strings.Contains(out.String(), "in a child of fork()") {
		t.Errorf("the child said it used a parent's object")
	}
}

// TestExecForkFamily runs forkworkers family: a grandchild is served too
// (its own id resolves) while the child's id is not its own (EINVAL), and
// a child whose parent exited gets EIO from its calls, not a hang.
func TestExecForkFamily(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	prog := buildCTest(t, dir, "forkworkers", "-lrdmacm")
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd, out := startExec(t, ctx, dir, prog, "family")
	err := cmd.Wait()
	if err != nil {
		t.Fatalf("forkworkers family: %v\n%s", err, out)
	}
	// The orphan's line comes after the parent exited: wait for it.
	for _, want := range []string{"grandchild: an id of its own resolved", "parent: exits before its child",
		"orphan: EIO after the parent exited"} {
		if !out.wait(want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestExecForkExits runs forkworkers exits: ten children in turn join a
// group and exit without cleaning up (half with the join's event not
// acknowledged, half after destroying the id under its QP); the parent
// destroys what each left without hanging, each next child joins, and
// the parent joins the group after them.
func TestExecForkExits(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	prog := buildCTest(t, dir, "forkworkers", "-lrdmacm")
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd, out := startExec(t, ctx, dir, prog, "exits")
	err := cmd.Wait()
	out.wait("\x00")
	if err != nil {
		t.Fatalf("forkworkers exits: %v\n%s", err, out)
	}
	if !strings.Contains(out.String(), "exits: ok") {
		t.Errorf("output lacks %q:\n%s", "exits: ok", out)
	}
}
