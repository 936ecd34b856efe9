package multihost

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

var (
	// mckeyBin is the mckey binary built once in TestMain.
	mckeyBin string
	// skipReason, when set, makes every test skip (not root, no netns).
	skipReason string
	// nsPrefix starts the name of every namespace this process creates.
	// The PID lets a later run sweep namespaces of dead runs.
	nsPrefix = fmt.Sprintf("srm-%d-", os.Getpid())
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	switch {
	case os.Geteuid() != 0:
		skipReason = "multi-host tests need root to create network namespaces (euid " + strconv.Itoa(os.Geteuid()) + ")"
	default:
		if _, err := exec.LookPath("ip"); err != nil {
			skipReason = "iproute2 'ip' not found: " + err.Error()
		} else if _, err := exec.LookPath("bridge"); err != nil {
			skipReason = "iproute2 'bridge' not found: " + err.Error()
		}
	}
	if skipReason == "" {
		sweepStaleNamespaces()
		probe := nsPrefix + "probe"
		if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
			skipReason = fmt.Sprintf("ip netns add failed: %v: %s", err, strings.TrimSpace(string(out)))
		} else {
			_ = exec.Command("ip", "netns", "del", probe).Run()
		}
	}
	var dir string
	if skipReason == "" {
		var err error
		dir, err = os.MkdirTemp("", "softrdma-multihost-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "multihost:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		mckeyBin = filepath.Join(dir, "mckey")
		cmd := exec.Command(goTool(), "build", "-o", mckeyBin, "github.com/softrdma/softrdma/cmd/mckey")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "multihost: building mckey: %v\n%s", err, out)
			return 1
		}
	}
	code := m.Run()
	if skipReason == "" {
		removeOwnNamespaces() // normally a no-op: every test cleans up
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "multihost: goleak:", err)
			return 1
		}
	}
	return code
}

// goTool returns the go command that runs this test.
func goTool() string {
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); fileExists(p) {
			return p
		}
	}
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "go"
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// requireEnv skips the test when the environment cannot run it.
func requireEnv(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}

// netnsNames lists the named network namespaces (ip netns).
func netnsNames() []string {
	ents, err := os.ReadDir("/run/netns")
	if err != nil {
		ents, _ = os.ReadDir("/var/run/netns")
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// sweepStaleNamespaces deletes namespaces named srm-<pid>-… whose creating
// process is gone (a run that was killed before it could clean up), after
// killing whatever still runs inside them.
func sweepStaleNamespaces() {
	for _, name := range netnsNames() {
		rest, ok := strings.CutPrefix(name, "srm-")
		if !ok {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || err == syscall.EPERM {
			continue // its creator still runs
		}
		deleteNamespace(name)
	}
}

// removeOwnNamespaces deletes every namespace of this process.
func removeOwnNamespaces() {
	for _, name := range netnsNames() {
		if strings.HasPrefix(name, nsPrefix) {
			deleteNamespace(name)
		}
	}
}

// deleteNamespace kills the processes inside a namespace and deletes it.
func deleteNamespace(name string) error {
	if out, err := exec.Command("ip", "netns", "pids", name).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del %s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}
