package multihost

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/softrdma/softrdma/test/nettest"
	"github.com/softrdma/softrdma/test/testenv"
	"go.uber.org/goleak"
)

// nsTag starts the name of every namespace of this package: srm-<pid>-….
const nsTag = "srm"

var (
	// mckeyBin is the mckey binary built once in TestMain.
	mckeyBin string
	// skipReason, when set, makes every test skip (not root, no netns).
	skipReason string
	// nsPrefix starts the name of every namespace this process creates.
	// The PID lets a later run sweep namespaces of dead runs.
	nsPrefix = nettest.Prefix(nsTag)
	// artifacts keeps the pcaps of failed tests.
	artifacts = nettest.Artifacts{Fallback: "softrdma-multihost-artifacts", Kind: "pcap"}
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	testenv.ClearSoftRDMA()
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
		nettest.SweepStale(nsTag)
		skipReason = nettest.Probe(nsPrefix)
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
		cmd := exec.Command(nettest.GoTool(), "build", "-o", mckeyBin, "github.com/softrdma/softrdma/cmd/mckey")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "multihost: building mckey: %v\n%s", err, out)
			return 1
		}
	}
	code := m.Run()
	if skipReason == "" {
		nettest.RemoveOwn(nsPrefix) // normally a no-op: every test cleans up
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "multihost: goleak:", err)
			return 1
		}
	}
	return code
}

// requireEnv skips the test when the environment cannot run it.
func requireEnv(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		testenv.Require(t, "%s", skipReason)
	}
}
