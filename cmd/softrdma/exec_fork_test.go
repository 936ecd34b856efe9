package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
)

// TestExecFork runs testdata/fork.c through softrdma exec on rxe_lo: a child of fork() that calls on the objects it
// inherited gets EINVAL (ENOSYS for ibv_get_device_list and
// rdma_create_event_channel), never a hang, and one line on stderr; a
// child that execs uses softrdma afresh and sends to its parent; the
// parent sends and receives before and after.
func TestExecFork(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	prog := buildCTest(t, dir, "fork", "-lrdmacm")
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd, out := startExec(t, ctx, dir, prog)
	err := cmd.Wait()
	out.wait("\x00") // the whole output
	t.Logf("fork:\n%s", out)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	for _, want := range []string{"child: every call on inherited objects failed", "exec child: sent",
		"parent: received from the exec'd child", "parent: sent and received after fork", "ok"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if n := strings.Count(out.String(), "in a child of fork()"); n != 1 {
		t.Errorf("the child printed %d lines about fork, want 1", n)
	}
}

// TestExecSignals runs testdata/signals.c through softrdma exec: the
// program's SIGALRM and SIGINT handlers (installed with signal(), without
// SA_ONSTACK) run while its thread spins in ibv_poll_cq, and its exit
// status (3) comes out of softrdma exec as is; a SIGTERM with the default
// action kills the program, and softrdma exec's caller sees it die of
// SIGTERM.
func TestExecSignals(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	prog := buildCTest(t, dir, "signals")
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cmd, out := startExec(t, ctx, dir, prog, "handlers")
	if !out.wait("waiting for SIGINT") {
		cmd.Wait()
		t.Fatalf("signals handlers did not get to SIGINT:\n%s", out)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	out.wait("\x00")
	t.Logf("signals handlers:\n%s", out)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Errorf("signals handlers: %v, want exit status 3", err)
	}
	for _, want := range []string{"SIGALRM handled", "SIGINT handled"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("signals handlers: output lacks %q", want)
		}
	}

	cmd, out = startExec(t, ctx, dir, prog, "die")
	if !out.wait("ready") {
		cmd.Wait()
		t.Fatalf("signals die did not get ready:\n%s", out)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	out.wait("\x00")
	if !errors.As(err, &ee) {
		t.Fatalf("signals die: %v, want death by SIGTERM\n%s", err, out)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Errorf("signals die: %v, want death by SIGTERM\n%s", err, out)
	}
}
