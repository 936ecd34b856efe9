package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
)

// runStress runs testdata/stress (prog) through softrdma exec with the
// libraries of libDir for secs seconds, in the caller's network
// namespace, and checks that it printed "ok" and exited 0.
func runStress(t *testing.T, dir, libDir, prog, secs string, env ...string) {
	t.Helper()
	if out, err := exec.Command("ip", "route", "add", "224.0.0.0/4", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("ip route add 224.0.0.0/4 dev lo: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "softrdma"), "exec", "-libdir", libDir, "--", prog, secs)
	cmd.Env = testenv.CleanEnv(env...)
	out, err := cmd.CombinedOutput()
	t.Logf("%s %s:\n%s", filepath.Base(prog), secs, out)
	if err != nil {
		t.Fatalf("%s: %v", filepath.Base(prog), err)
	}
	if !strings.Contains(string(out), "\nok\n") {
		t.Errorf("%s did not print ok", filepath.Base(prog))
	}
}

// TestExecThreads runs testdata/stress.c through softrdma exec on rxe_lo
// for 5 s: two threads post UD sends on the same 4 QPs while a third
// waits on their CQs' completion channel, polls and posts receives again,
// a fourth joins and leaves multicast groups and reads the CM events, a
// fifth creates and destroys AHs and MRs, a sixth watches async_fd (issue
// 23, item 5). Every send must complete and arrive exactly once.
func TestExecThreads(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	prog := buildCTest(t, dir, "stress", "-lrdmacm", "-pthread")
	if !testenv.InNetns(t) {
		return
	}
	runStress(t, dir, filepath.Join(dir, "lib"), prog, "5")
}

// tsanDirVar carries the directory of the libraries built with
// ThreadSanitizer into the re-run of TestExecThreadsTSan.
const tsanDirVar = "SOFTRDMA_TEST_TSAN_DIR"

// TestExecThreadsTSan runs testdata/stress.c built with gcc's
// -fsanitize=thread on libraries whose C side (capi's C files and cgo's)
// is built with it too: any data race ThreadSanitizer sees between the
// program's threads and softrdma's C code ends the program with status
// 66. softrdma's Go code is not instrumented: Go's race detector cannot
// run inside a C program (a -race c-shared library fails to map its
// shadow memory for the C threads' stacks).
func TestExecThreadsTSan(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	tsan := os.Getenv(tsanDirVar)
	if tsan == "" {
		prog := filepath.Join(dir, "stress-tsan")
		if out, err := exec.Command("cc", "-g", "-O1", "-fsanitize=thread", "-Wall", "-o", prog,
			filepath.Join("testdata", "stress.c"), "-libverbs", "-lrdmacm", "-pthread").CombinedOutput(); err != nil {
			testenv.Require(t, "cc -fsanitize=thread (gcc with libtsan): %v\n%s", err, out)
		}
		tsan = filepath.Join(dir, "lib-tsan")
		start := time.Now()
		cmd := exec.Command(filepath.Join(dir, "softrdma"), "exec", "-install", tsan)
		cmd.Env = append(os.Environ(), "CGO_CFLAGS=-g -O1 -fsanitize=thread", "CGO_LDFLAGS=-fsanitize=thread")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("softrdma exec -install with -fsanitize=thread: %v\n%s", err, out)
		}
		t.Logf("libraries with -fsanitize=thread built in %v", time.Since(start).Round(time.Millisecond))
		t.Setenv(tsanDirVar, tsan)
	}
	if !testenv.InNetns(t) {
		return
	}
	runStress(t, dir, tsan, filepath.Join(dir, "stress-tsan"), "3", "TSAN_OPTIONS=halt_on_error=1 exitcode=66")
}
