package conformance

import (
	// Every kind of device (RoCEv2, InfiniBand, the kernel's with the rdmacore tag).
	_ "github.com/softrdma/softrdma/provider/all"

	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/test/nettest"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/test/testsm"
	"github.com/softrdma/softrdma/verbs"
	"go.uber.org/goleak"
)

// nsTag starts the names of this package's namespaces.
const nsTag = "srconf"

var nsPrefix = nettest.Prefix(nsTag)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	testenv.OwnNetns() // lo to this package alone
	testenv.ClearSoftRDMA()
	nettest.SweepStale(nsTag)
	code := m.Run()
	if code == 0 {
		if err := checkReadmeTable(); err != nil {
			fmt.Fprintln(os.Stderr, "conformance:", err)
			code = 1
		}
	}
	verbs.DefaultHost().Close()
	nettest.RemoveOwn(nsPrefix)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "conformance: leaked goroutines:", err)
			code = 1
		}
	}
	return code
}

// routelessNetns returns a network namespace with lo and a veth of its
// own (routes only to loopback and the veth's /24), or why there is none;
// made once for every target's run (RemoveOwn removes it at the end).
var routelessNetns = sync.OnceValues(makeRoutelessNetns)

func makeRoutelessNetns() (name, why string) {
	if os.Geteuid() != 0 {
		return "", "needs root for a network namespace without routes"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "", "no iproute2: " + err.Error()
	}
	name = nsPrefix + "noroute"
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return "", fmt.Sprintf("ip netns add: %v: %s", err, out)
	}
	for _, c := range [][]string{
		{"link", "set", "lo", "up"},
		// A link whose peer has no address: nothing answers ARP on it.
		{"link", "add", "v0", "type", "veth", "peer", "name", "v1"},
		{"addr", "add", routelessSrc + "/24", "dev", "v0"},
		{"link", "set", "v0", "up"},
		{"link", "set", "v1", "up"},
	} {
		if out, err := exec.Command("ip", append([]string{"-n", name}, c...)...).CombinedOutput(); err != nil {
			return "", fmt.Sprintf("ip %v: %v: %s", c, err, out)
		}
	}
	return name, ""
}

// routelessSrc is the address of the routeless namespace's veth (its
// only route is its /24).
const routelessSrc = "10.79.0.1"

// startSubnet starts an in-process subnet manager (softsm's, with
// send-only join support, or OpenSM in charge under
// SOFTRDMA_TEST_SM=opensm: testsm.SMConfig) and opens an IB port of this
// process with IPoIB address local; both end with the test.
func startSubnet(t *testing.T, local netip.Addr) {
	t.Helper()
	s, err := sm.New(testsm.SMConfig(t, sm.Config{Listen: "127.0.0.1:0", SendOnlySupport: true}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	testsm.WaitSMUp(t, s)
	d, err := ib.Open(ib.Config{SM: s.FabricAddr().String(), Local: local, ActivateTimeout: testsm.OpenSMActivate})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
}
