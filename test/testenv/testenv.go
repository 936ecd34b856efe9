// Package testenv holds the rules every softrdma test follows about its
// environment: a missing prerequisite skips a test on a developer's machine
// but fails it under CI=true, and tests start from an environment without
// the variables softrdma reads (an inherited SOFTRDMA_SM would make the
// in-process RDMA CM bind to an InfiniBand subnet, an inherited
// SOFTRDMA_DEBUG_ADDR would open endpoints).
//
// It is meant for tests only.
package testenv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/internal/envvars"
)

// Prefix starts the name of every environment variable softrdma reads.
const Prefix = "SOFTRDMA_"

// CI reports whether the tests run in CI (CI=true), where a missing
// prerequisite is a failure, not a reason to skip.
func CI() bool { return os.Getenv("CI") == "true" }

// Require skips the test, saying why, when a prerequisite is missing; under
// CI=true it fails the test instead.
func Require(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatalf("prerequisite missing (CI=true makes this a failure): %s", msg)
	}
	t.Skip(msg)
}

// Vars are the environment variables softrdma itself reads (envvars.Known,
// where a new one is added): an inherited one changes what the tests
// exercise.
var Vars = envvars.Names()

// EndpointDirVar is introspect's EnvDir: the only directory the
// per-process endpoint sockets go to and are looked for in.
const EndpointDirVar = "SOFTRDMA_DEBUG_DIR"

// scopedDir is the directory ScopeEndpoints made, given to children.
var scopedDir string

// ScopeEndpoints gives this test process and the children it starts
// (CleanEnv) a directory of their own for endpoint sockets, so that the
// tools the tests run see the tests' processes only, not a softrdma
// program someone else runs on the host. It returns a function that
// removes the directory. A child a test prepared keeps its parent's.
func ScopeEndpoints() (cleanup func(), err error) {
	if k, v, _ := strings.Cut(ChildEnv, "="); os.Getenv(k) == v {
		return func() {}, nil
	}
	d, err := os.MkdirTemp("", "softrdma-endpoints-")
	if err != nil {
		return func() {}, err
	}
	scopedDir = d
	os.Setenv(EndpointDirVar, d)
	return func() { os.RemoveAll(d) }, nil
}

// ChildEnv marks the environment of a child process a test prepared
// (CleanEnv adds it): the child's ClearSoftRDMA keeps what its parent set.
const ChildEnv = Prefix + "TEST_CHILD=1"

func cleared(name string) bool {
	for _, v := range Vars {
		if name == v {
			return true
		}
	}
	return false
}

// ClearSoftRDMA unsets the variables softrdma reads (Vars) in this
// process, unless a test prepared this process's environment (ChildEnv).
// TestMains call it first, so that the tests do not depend on the shell
// they run in. Other variables, such as a test's own markers for the
// children it starts, are kept: clearing them would make a child run the
// parent's test again.
func ClearSoftRDMA() {
	if k, v, _ := strings.Cut(ChildEnv, "="); os.Getenv(k) == v {
		return
	}
	for _, k := range Vars {
		os.Unsetenv(k)
	}
}

// CleanEnv returns this process's environment without the variables
// softrdma reads, followed by ChildEnv and extra ("NAME=value"): the
// environment of a child process a test starts.
func CleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !cleared(k) && kv != ChildEnv {
			env = append(env, kv)
		}
	}
	if scopedDir != "" { // as the test has it now (a test may set it for a case)
		env = append(env, EndpointDirVar+"="+os.Getenv(EndpointDirVar))
	}
	return append(append(env, ChildEnv), extra...)
}

// BenchEnv names the variable that, set to 1, runs the tests that start a
// multi-process benchmark (.ci/run sets it for a separate step without
// -race). The default `go test -race ./...` leaves them out: they load
// every core while the other packages' tests run.
const BenchEnv = "SOFTRDMA_TEST_BENCH"

// RequireBench skips a multi-process benchmark test unless BenchEnv=1.
func RequireBench(t testing.TB) {
	t.Helper()
	if os.Getenv(BenchEnv) != "1" {
		t.Skipf("multi-process benchmark: runs with %s=1 (a separate CI step, without -race)", BenchEnv)
	}
}

// IsolatedEnv is set (to 1) by .ci/run for the test steps it runs in a
// network namespace of their own, where lo is the only interface: a test
// that forgets to pin its interface fails there (no route) instead of
// sending out of the machine.
const IsolatedEnv = "SOFTRDMA_TEST_ISOLATED"

// RunUntilEnd runs run on a goroutine of its own until the test ends: the
// test's cleanup cancels run's context, waits for run to return and
// reports an error it returned as name's ("softsm: …"). For a server or
// an SM whose Run(ctx) serves until its context ends.
func RunUntilEnd(t testing.TB, name string, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: %v", name, err)
		}
	})
}
