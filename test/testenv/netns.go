package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// netnsVar names the variable that tells a re-run test binary which test
// runs in the network namespace InNetns made for it.
const netnsVar = Prefix + "TEST_IN_NETNS"

// InNetns re-runs the calling test in a network namespace of its own
// (unshare -n, with lo up and nothing else) and reports whether the caller
// is that re-run: a test that needs the host's UDP ports to itself (no
// other package's test running beside it holds them) starts with
//
//	if !testenv.InNetns(t) {
//		return
//	}
//
// Outside, the test passes or fails with the re-run (whose output it
// logs). Without root or unshare it skips (fails under CI).
func InNetns(t *testing.T) bool {
	t.Helper()
	return InNetnsFor(t, 120*time.Second)
}

// InNetnsFor is InNetns for a test whose re-run may take up to timeout.
func InNetnsFor(t *testing.T, timeout time.Duration) bool {
	t.Helper()
	if os.Getenv(netnsVar) == t.Name() {
		return true
	}
	if os.Geteuid() != 0 {
		Require(t, "needs root to create a network namespace")
	}
	for _, c := range []string{"unshare", "ip"} {
		if _, err := exec.LookPath(c); err != nil {
			Require(t, "no %s: %v", c, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "-n", "sh", "-c", `ip link set lo up && exec "$0" "$@"`,
		os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = CleanEnv(netnsVar + "=" + t.Name())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("in a network namespace of its own: %v\n%s", err, out)
	}
	if bytes.Contains(out, []byte("--- SKIP")) {
		t.Skipf("skipped in the network namespace:\n%s", out)
	}
	t.Logf("in a network namespace of its own:\n%s", out)
	return false
}

// pkgNetnsVar marks a test binary that OwnNetns re-ran in a network
// namespace of its own (kept by CleanEnv, so the children its tests start,
// and InNetns re-runs, do not make another).
const pkgNetnsVar = Prefix + "TEST_PKG_NETNS"

// NetnsGiven ("NAME=value"), in a test binary's environment, makes
// OwnNetns leave the binary in the network namespace it was started in: a
// QEMU guest's, where the interop suite runs test binaries on the guest's
// interfaces.
const NetnsGiven = pkgNetnsVar + "=1"

// OwnNetns re-executes the test binary, with its arguments, in a network
// namespace of its own (unshare -n, with lo up and nothing else); it
// returns only in that re-execution, or, outside CI, where no namespace
// can be made (not root, no unshare), after saying so. A package whose
// tests run softrdma's device on lo calls it first in its TestMain: every
// process of a user on the host shares UDP 4791 on lo and the kernel hands
// a unicast datagram to any of them, so a test process of another package
// running beside it (go test runs packages in parallel) would add its
// datagrams to this package's counters and captures, and take some of
// this package's. The children the tests start stay in the namespace.
func OwnNetns() {
	if k, v, _ := strings.Cut(ChildEnv, "="); os.Getenv(pkgNetnsVar) == "1" || os.Getenv(k) == v {
		return // re-run already, or a child a test started: its namespace is the test's
	}
	why := ""
	if os.Geteuid() != 0 {
		why = "not root"
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil && why == "" {
		why = "no unshare"
	}
	if _, err := exec.LookPath("ip"); err != nil && why == "" {
		why = "no ip"
	}
	if why != "" {
		if CI() && os.Geteuid() == 0 {
			fmt.Fprintf(os.Stderr, "testenv: under CI=true the package's tests need a network namespace of their own: %s\n", why)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "testenv: the tests share lo with the host's other processes (%s: no network namespace of their own)\n", why)
		return
	}
	os.Setenv(pkgNetnsVar, "1")
	args := append([]string{"unshare", "-n", "sh", "-c", `ip link set lo up && exec "$0" "$@"`}, os.Args...)
	err = syscall.Exec(unshare, args, os.Environ())
	fmt.Fprintf(os.Stderr, "testenv: re-running the tests in a network namespace: %v\n", err)
	os.Exit(1)
}
