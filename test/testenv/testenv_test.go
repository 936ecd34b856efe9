package testenv

import (
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestClearAndCleanEnv(t *testing.T) {
	t.Setenv("SOFTRDMA_SM", "127.0.0.1:4792")
	t.Setenv("SOFTRDMA_DEBUG_ADDR", "unix")
	t.Setenv("SOFTRDMA_LOG", "info")
	t.Setenv("SOFTRDMA_SOME_CHILD_MARKER", "kept")
	t.Setenv("NOT_SOFTRDMA_X", "kept")
	env := CleanEnv("SOFTRDMA_SM=10.0.0.1:4792")
	for _, kv := range env[:len(env)-2] {
		for _, v := range Vars {
			if len(kv) > len(v) && kv[:len(v)+1] == v+"=" {
				t.Errorf("CleanEnv kept %s", kv)
			}
		}
	}
	if env[len(env)-2] != ChildEnv || env[len(env)-1] != "SOFTRDMA_SM=10.0.0.1:4792" ||
		!slices.Contains(env, "NOT_SOFTRDMA_X=kept") || !slices.Contains(env, "SOFTRDMA_SOME_CHILD_MARKER=kept") {
		t.Errorf("CleanEnv: %q", env)
	}
	ClearSoftRDMA()
	for _, k := range Vars {
		if v, ok := os.LookupEnv(k); ok {
			t.Errorf("%s=%s after ClearSoftRDMA", k, v)
		}
	}
	if os.Getenv("NOT_SOFTRDMA_X") != "kept" || os.Getenv("SOFTRDMA_SOME_CHILD_MARKER") != "kept" {
		t.Error("ClearSoftRDMA removed another variable")
	}
}

// TestChildKeepsWhatItsParentSet: in a process whose environment a test
// prepared (ChildEnv), ClearSoftRDMA keeps SOFTRDMA_SM.
func TestChildKeepsWhatItsParentSet(t *testing.T) {
	t.Setenv("SOFTRDMA_TEST_CHILD", "1")
	t.Setenv("SOFTRDMA_SM", "127.0.0.1:4792")
	ClearSoftRDMA()
	if os.Getenv("SOFTRDMA_SM") != "127.0.0.1:4792" {
		t.Error("a child lost the SOFTRDMA_SM its parent set")
	}
}

// TestIsolated: where .ci/run says the tests run isolated, they do: lo is
// the only interface of the namespace and there is no default route, so
// nothing a test sends can leave the machine. It sends nothing itself.
// Elsewhere (a developer's machine) it skips.
func TestIsolated(t *testing.T) {
	if os.Getenv(IsolatedEnv) != "1" {
		t.Skipf("the tests run in the machine's own network namespace (%s=1 is .ci/run's isolated run)", IsolatedEnv)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback == 0 {
			t.Errorf("interface %s in the tests' namespace: a test could send out of it", ifc.Name)
		}
	}
	// Default routes: IPv4 (Iface Destination …, after a header line)
	// and IPv6 (destination, prefix length, …, device last).
	if b, err := os.ReadFile("/proc/net/route"); err == nil {
		for _, line := range strings.Split(string(b), "\n")[1:] {
			if fs := strings.Fields(line); len(fs) > 2 && fs[1] == "00000000" && fs[0] != "lo" {
				t.Errorf("an IPv4 default route via %s in the tests' namespace", fs[0])
			}
		}
	}
	if b, err := os.ReadFile("/proc/net/ipv6_route"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if fs := strings.Fields(line); len(fs) > 2 && fs[0] == strings.Repeat("0", 32) && fs[1] == "00" && fs[len(fs)-1] != "lo" {
				t.Errorf("an IPv6 default route via %s in the tests' namespace", fs[len(fs)-1])
			}
		}
	}
}

var sink, otherSink [][]byte

// TestAllocsInCalls: the allocations of f are counted, those of another
// goroutine allocating meanwhile are not.
func TestAllocsInCalls(t *testing.T) {
	if n := AllocsInCalls(100, func() { sink = append(sink[:0], make([]byte, 64)) }); n != 1 {
		t.Errorf("one allocation per call: counted %v", n)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				otherSink = append(otherSink[:0], make([]byte, 128))
				runtime.Gosched()
			}
		}
	}()
	x := 0
	n := AllocsInCalls(100, func() { x++; runtime.Gosched() })
	all := testing.AllocsPerRun(100, func() { x++; runtime.Gosched() })
	close(stop)
	t.Logf("testing.AllocsPerRun, which counts the other goroutine's too: %v", all)
	<-done
	if n != 0 {
		t.Errorf("no allocation in the calls, another goroutine allocating: counted %v", n)
	}
}
