package interop

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/nettest"
	"github.com/softrdma/softrdma/test/testenv"
)

// Go test binaries run in a guest: built on the host (go test -c) into the
// guest's 9p share and run from /ctl/bin.

const (
	// goTestTimeout bounds one test binary's run in a guest (TCG, -race).
	goTestTimeout = 8 * time.Minute
	// goTestRace builds the guest's test binaries with the race detector;
	// the 512 MB guests run them.
	goTestRace = true
)

// goTestBuildFlags are the flags of every guest test binary: the build tag
// of the rdma-core backend (cgo, linked against the guest's libibverbs and
// librdmacm, Debian 12 like the host) and the race detector.
func goTestBuildFlags() []string { return goTestFlags(goTestRace) }

// goTestFlags are the build flags of a guest test binary with or without
// the race detector (measurements run without it).
func goTestFlags(race bool) []string {
	fl := []string{"-tags", "rdmacore"}
	if race {
		fl = append(fl, "-race")
	}
	return fl
}

// goTestBins caches the binaries built in this process, by package.
var goTestBins struct {
	sync.Mutex
	m map[string]string
}

// buildGoTest builds the test binary of pkg (a path relative to the
// module root, e.g. ./provider/rdmacore, or an import path) once per
// process, in the lab's work folder, and returns its path.
func buildGoTest(t *testing.T, pkg string) string {
	t.Helper()
	return buildGoTestRace(t, pkg, goTestRace)
}

// buildGoTestRace is buildGoTest with or without the race detector.
func buildGoTestRace(t *testing.T, pkg string, race bool) string {
	t.Helper()
	key := pkg
	if !race {
		key += " norace"
	}
	goTestBins.Lock()
	defer goTestBins.Unlock()
	if p := goTestBins.m[key]; p != "" {
		return p
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(theLab.dir, "gotest-") // removed with the lab
	if err != nil {
		t.Fatal(err)
	}
	name := filepath.Base(pkg)
	if !race {
		name += "-norace"
	}
	bin := filepath.Join(dir, name+".test")
	args := append([]string{"test", "-c"}, goTestFlags(race)...)
	args = append(args, "-o", bin, pkg)
	cmd := exec.Command(nettest.GoTool(), args...)
	cmd.Dir = root
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("built %s (%s) in %.1fs", bin, strings.Join(goTestFlags(race), " "), time.Since(start).Seconds())
	if goTestBins.m == nil {
		goTestBins.m = map[string]string{}
	}
	goTestBins.m[key] = bin
	return bin
}

// goTest builds pkg's test binary on the host (go test -c -tags rdmacore
// -race), puts it into the guest's share as bin/<name>.test and runs it
// there (/ctl/bin/<name>.test args…, in /tmp, stderr into stdout). It
// returns the output and the exit status; it fails the test only when the
// binary cannot be built or copied, or does not exit within goTestTimeout.
func (g *guest) goTest(t *testing.T, pkg string, args ...string) (out string, rc int) {
	t.Helper()
	return g.goTestEnv(t, pkg, nil, args...)
}

// goTestEnv is goTest with environment variables (NAME=value) for the
// test binary.
func (g *guest) goTestEnv(t *testing.T, pkg string, env []string, args ...string) (out string, rc int) {
	t.Helper()
	return g.runGoTest(t, buildGoTest(t, pkg), env, args...)
}

// runGoTest runs a built test binary in the guest (see goTest).
func (g *guest) runGoTest(t *testing.T, bin string, env []string, args ...string) (out string, rc int) {
	t.Helper()
	name := filepath.Base(bin)
	if err := os.MkdirAll(filepath.Join(g.share, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(g.share, "bin", name)
	if err := nettest.CopyFile(dst, bin); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	// The guest's namespace, with its interfaces, is the one the test
	// binary is to use: OwnNetns leaves it there.
	vars := []string{"'" + testenv.NetnsGiven + "'"}
	for _, e := range env {
		vars = append(vars, "'"+strings.ReplaceAll(e, "'", `'\''`)+"'")
	}
	script := "cd /tmp && exec env " + strings.Join(vars, " ") + " /ctl/bin/" + name + " " + strings.Join(quoted, " ") + " 2>&1"
	c := g.start(t, name+" "+strings.Join(args, " "), script)
	if err := c.poll(goTestTimeout, c.exited); err != nil {
		c.kill()
		t.Fatalf("%s: %v; killed:\n%s", c.name, err, nettest.Indent(c.output()))
	}
	rc, _ = c.rc()
	b, _ := os.ReadFile(c.path(".out"))
	return string(b), rc
}

var allocsLine = regexp.MustCompile(`PostRecv\+PostSend\+Poll: (\S+) allocations per message`)

// TestKernelVerbs runs provider/rdmacore's tests (the libibverbs backend)
// and provider/rdmacore/cm's (the librdmacm ids) in guest g1 against its
// kernel rxe0: they must pass, none skipped.
func TestKernelVerbs(t *testing.T) {
	l := needLab(t)
	note := report(t)
	g := l.guests[0]
	// TestSendCost is a measurement: TestKernelSendCost runs it.
	out, rc := g.goTest(t, "./provider/rdmacore", "-test.v", "-test.count=1", "-test.skip", "^(TestSendCost|TestDeviceAddedAgain|TestAsyncPortEvents)$")
	passed := strings.Count(out, "--- PASS")
	skipped := strings.Count(out, "--- SKIP")
	if rc != 0 || skipped > 0 || passed == 0 {
		t.Fatalf("%s: rdmacore.test: exit status %d, %d passed, %d skipped:\n%s", g, rc, passed, skipped, nettest.Indent(out))
	}
	allocs := "?"
	if m := allocsLine.FindStringSubmatch(out); m != nil {
		allocs = m[1]
	}
	// A device deleted and added again, in a process of its own (the
	// kernel's delete waits for the processes that hold the device open).
	readd, readdRC := g.goTestEnv(t, "./provider/rdmacore", []string{"SOFTRDMA_RDMACORE_READD=1"}, "-test.v", "-test.count=1", "-test.run", "^TestDeviceAddedAgain$")
	if readdRC != 0 || !strings.Contains(readd, "--- PASS: TestDeviceAddedAgain") {
		t.Fatalf("%s: TestDeviceAddedAgain: exit status %d:\n%s", g, readdRC, nettest.Indent(readd))
	}
	// A context's asynchronous events from its async_fd, on an rxe device
	// of a veth pair the test adds, in a process of its own; the device
	// is deleted once the process has ended (see readd above).
	async, asyncRC := g.goTestEnv(t, "./provider/rdmacore", []string{"SOFTRDMA_RDMACORE_ASYNC=1"}, "-test.v", "-test.count=1", "-test.run", "^TestAsyncPortEvents$")
	g.run(t, "rdma link delete rxeasync; ip link del sraasync; true")
	if asyncRC != 0 || !strings.Contains(async, "--- PASS: TestAsyncPortEvents") {
		t.Fatalf("%s: TestAsyncPortEvents: exit status %d:\n%s", g, asyncRC, nettest.Indent(async))
	}
	// The kernel CM's package (librdmacm ids' lifetimes).
	cmOut, cmRC := g.goTest(t, "./provider/rdmacore/cm", "-test.v", "-test.count=1")
	cmPassed, cmSkipped := strings.Count(cmOut, "--- PASS"), strings.Count(cmOut, "--- SKIP")
	if cmRC != 0 || cmSkipped > 0 || cmPassed == 0 {
		t.Fatalf("%s: cm.test: exit status %d, %d passed, %d skipped:\n%s", g, cmRC, cmPassed, cmSkipped, nettest.Indent(cmOut))
	}
	note.set("provider/rdmacore on %s's rxe0 (%s): %d tests passed, provider/rdmacore/cm %d; data path allocs/msg %s", g.name, strings.Join(goTestBuildFlags(), " "), passed, cmPassed, allocs)
}
