package unicast

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"go.uber.org/goleak"

	"github.com/softrdma/softrdma/test/nettest"
	"github.com/softrdma/softrdma/test/testenv"
)

// nsTag starts the name of every namespace of this package: sru-<pid>-….
const nsTag = "sru"

var (
	// mcreplyBin is the helper built once in TestMain.
	mcreplyBin string
	// skipReason, when set, makes every test skip (not root, no netns).
	skipReason string
	// nsPrefix starts the name of every namespace this process creates.
	nsPrefix = nettest.Prefix(nsTag)
	// artifacts keeps the pcaps of failed tests.
	artifacts = nettest.Artifacts{Fallback: "softrdma-unicast-artifacts", Kind: "pcap"}
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	testenv.OwnNetns() // lo to this package alone
	testenv.ClearSoftRDMA()
	switch {
	case os.Geteuid() != 0:
		skipReason = "the unicast tests need root to create network namespaces (euid " + strconv.Itoa(os.Geteuid()) + ")"
	default:
		if _, err := exec.LookPath("ip"); err != nil {
			skipReason = "iproute2 'ip' not found: " + err.Error()
		}
	}
	if skipReason == "" {
		nettest.SweepStale(nsTag)
		skipReason = nettest.Probe(nsPrefix)
	}
	if skipReason == "" {
		dir, err := os.MkdirTemp("", "softrdma-unicast-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "unicast:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		mcreplyBin = filepath.Join(dir, "mcreply")
		cmd := exec.Command(nettest.GoTool(), "build", "-o", mcreplyBin, "github.com/softrdma/softrdma/test/testcmd/mcreply")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "unicast: building mcreply: %v\n%s", err, out)
			return 1
		}
	}
	code := m.Run()
	if skipReason == "" {
		nettest.RemoveOwn(nsPrefix)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "unicast: goleak:", err)
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
