package testenv

import (
	"bytes"
	"context"
	"os"
	"os/exec"
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
