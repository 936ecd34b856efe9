package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrdma/softrdma/capi/capibuild"
	"github.com/softrdma/softrdma/test/testenv"
)

// execDirVar carries the directory of the softrdma binary and libraries
// the test built into the re-run of the test in its network namespace.
const execDirVar = "SOFTRDMA_TEST_EXEC_DIR"

// requireRDMACore skips (fails under CI) without Debian's rdma-core
// programs and headers.
func requireRDMACore(t *testing.T, progs ...string) {
	t.Helper()
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			testenv.Require(t, "no %s (apt-get install rdmacm-utils ibverbs-utils): %v", p, err)
		}
	}
	for _, h := range []string{"/usr/include/infiniband/verbs.h", "/usr/include/rdma/rdma_cma.h"} {
		if _, err := os.Stat(h); err != nil {
			testenv.Require(t, "no %s (apt-get install libibverbs-dev librdmacm-dev): %v", h, err)
		}
	}
	if _, err := exec.LookPath("cc"); err != nil {
		testenv.Require(t, "no C compiler: %v", err)
	}
}

// execBuild is the softrdma binary and libraries the tests share: built
// once per test process, removed by TestMain.
var execBuild struct {
	once sync.Once
	dir  string
	err  error
}

// execDir builds the softrdma binary and the libraries once for every
// test, outside the network namespaces (InNetns gives a re-run two
// minutes), and hands their directory to the re-runs in execDirVar.
func execDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv(execDirVar); d != "" {
		return d
	}
	execBuild.once.Do(func() {
		d, err := os.MkdirTemp("", "softrdma-exec-test-")
		if err != nil {
			execBuild.err = err
			return
		}
		execBuild.dir = d
		if out, err := exec.Command("go", "build", "-o", filepath.Join(d, "softrdma"), ".").CombinedOutput(); err != nil {
			execBuild.err = fmt.Errorf("build: %v\n%s", err, out)
			return
		}
		start := time.Now()
		if out, err := exec.Command(filepath.Join(d, "softrdma"), "exec", "-install", filepath.Join(d, "lib")).CombinedOutput(); err != nil {
			execBuild.err = fmt.Errorf("softrdma exec -install: %v\n%s", err, out)
			return
		}
		t.Logf("libraries built in %v", time.Since(start).Round(time.Millisecond))
		execBuild.err = os.Setenv(execDirVar, d) // for the re-runs in namespaces
	})
	if execBuild.err != nil {
		t.Fatal(execBuild.err)
	}
	return execBuild.dir
}

// lineWaiter collects a process's output and tells when a line appears.
type lineWaiter struct {
	mu    sync.Mutex
	lines []string
	cond  *sync.Cond
	done  bool
}

func newLineWaiter(r io.Reader) *lineWaiter {
	w := &lineWaiter{}
	w.cond = sync.NewCond(&w.mu)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			w.mu.Lock()
			w.lines = append(w.lines, sc.Text())
			w.cond.Broadcast()
			w.mu.Unlock()
		}
		w.mu.Lock()
		w.done = true
		w.cond.Broadcast()
		w.mu.Unlock()
	}()
	return w
}

// wait returns true once a line containing s was read, false if the
// output ended without one.
func (w *lineWaiter) wait(s string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := 0; ; i++ {
		for ; i < len(w.lines); i++ {
			if strings.Contains(w.lines[i], s) {
				return true
			}
		}
		if w.done {
			return false
		}
		w.cond.Wait()
		i--
	}
}

func (w *lineWaiter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lines, "\n")
}

// startExec starts softrdma exec -- PROGRAM ARGS with its stdout and
// stderr merged into a lineWaiter.
func startExec(t *testing.T, ctx context.Context, dir string, args ...string) (*exec.Cmd, *lineWaiter) {
	t.Helper()
	return startExecEnv(t, ctx, dir, nil, args...)
}

// startExecEnv is startExec with the variables env added to the
// program's environment (SOFTRDMA_SM=…).
func startExecEnv(t *testing.T, ctx context.Context, dir string, env []string, args ...string) (*exec.Cmd, *lineWaiter) {
	t.Helper()
	return startExecNS(t, ctx, dir, "", env, args...)
}

// startExecNS is startExecEnv in the named network namespace ns (ip netns
// exec), or in the test's own when ns is "".
func startExecNS(t *testing.T, ctx context.Context, dir, ns string, env []string, args ...string) (*exec.Cmd, *lineWaiter) {
	t.Helper()
	argv := append([]string{filepath.Join(dir, "softrdma"), "exec", "-libdir", filepath.Join(dir, "lib"), "--"}, args...)
	if ns != "" {
		argv = append([]string{"ip", "netns", "exec", ns}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = testenv.CleanEnv(env...)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	return cmd, newLineWaiter(pr)
}

// TestExecMckey runs Debian's unmodified mckey (rdmacm-utils, linked with
// rdma-core's librdmacm.so.1 and libibverbs.so.1) through softrdma exec as
// receiver and sender on RoCEv2 over lo: softrdma's libraries take the
// place of rdma-core's, the receiver gets every message and both exit 0.
func TestExecMckey(t *testing.T) {
	// stdbuf -oL: mckey's printf to a pipe would hold "joined" until exit.
	requireRDMACore(t, "mckey", "stdbuf")
	dir := execDir(t)
	if !testenv.InNetns(t) {
		return
	}
	if out, err := exec.Command("ip", "route", "add", "224.0.0.0/4", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("ip route add 224.0.0.0/4 dev lo: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const count = 20
	group := "239.23.0.1"
	recv, rout := startExec(t, ctx, dir, "stdbuf", "-oL", "mckey", "-m", group, "-b", "127.0.0.1", "-C", fmt.Sprint(count), "-S", "64")
	if !rout.wait("mckey: joined dgid: ::ffff:" + group) {
		recv.Wait()
		t.Fatalf("the receiver did not join:\n%s", rout)
	}
	send, sout := startExec(t, ctx, dir, "stdbuf", "-oL", "mckey", "-m", group, "-b", "127.0.0.1", "-s", "-C", fmt.Sprint(count), "-S", "64")
	serr := send.Wait()
	sout.wait("\x00") // the whole output
	rerr := recv.Wait()
	rout.wait("\x00")
	t.Logf("receiver:\n%s\nsender:\n%s", rout, sout)
	if serr != nil || rerr != nil {
		t.Fatalf("sender: %v, receiver: %v", serr, rerr)
	}
	checkMckeyRun(t, rout.String(), sout.String())
}

// TestExecDevinfo runs Debian's ibv_devinfo -v through softrdma exec: the
// loopback RoCEv2 device with its port and GIDs, and, with SOFTRDMA_SM and
// SOFTRDMA_IB_PORTS, an InfiniBand port of the emulated subnet with the
// LIDs softsm gave.
func TestExecDevinfo(t *testing.T) {
	requireRDMACore(t, "ibv_devinfo")
	dir := execDir(t)
	if !testenv.InNetns(t) {
		return
	}
	sm := startSM(t)
	for _, c := range []struct {
		name string
		env  []string
		want []string
	}{
		{"roce", nil, []string{"hca_id:\trxe_lo", "PORT_ACTIVE", "link_layer:\t\tEthernet", "::ffff:127.0.0.1, RoCE v2"}},
		{"ib", []string{sm, "SOFTRDMA_IB_PORTS=127.0.3.41"}, []string{"hca_id:\tsoftib0", "link_layer:\t\tInfiniBand",
			"sm_lid:\t\t\t1", "GID[  0]:\t\tfe80:0000:0000:0000:"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd, out := startExecEnv(t, ctx, dir, c.env, "ibv_devinfo", "-v")
			err := cmd.Wait()
			out.wait("\x00")
			if err != nil {
				t.Fatalf("ibv_devinfo -v: %v\n%s", err, out)
			}
			for _, want := range c.want {
				if !strings.Contains(out.String(), want) {
					t.Errorf("ibv_devinfo -v lacks %q:\n%s", want, out)
				}
			}
			if c.name == "ib" && !regexp.MustCompile(`port_lid:\t\t[1-9]`).MatchString(out.String()) {
				t.Errorf("the IB port has no LID:\n%s", out)
			}
		})
	}
}

// TestExecStubs checks the thin libraries: rdma-core's every symbol and
// version, each jumping to a function of libsoftrdma-capi.so.
func TestExecStubs(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	for _, lib := range capibuild.ThinLibs {
		out, err := exec.Command("readelf", "-W", "--dyn-syms", filepath.Join(dir, "lib", lib)).Output()
		if err != nil {
			testenv.Require(t, "readelf: %v", err)
		}
		have := map[string]bool{}
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) >= 8 && f[6] != "UND" {
				have[f[7]] = true
			}
		}
		for _, s := range capibuild.Symbols() {
			if s.Lib != lib {
				continue
			}
			at := "@"
			if s.Default {
				at = "@@"
			}
			if !have[s.Name+at+s.Version] {
				t.Errorf("%s lacks %s%s%s", lib, s.Name, at, s.Version)
			}
		}
	}
}

// checkMckeyRun checks the outputs of an mckey receiver and sender that
// ran through softrdma exec: both got through their transfers (mckey's
// receiver polls until it has every completion, so "data transfers
// complete" means every message arrived) and called nothing softrdma
// does not implement.
func checkMckeyRun(t *testing.T, rout, sout string) {
	t.Helper()
	for _, want := range []string{"receiving data transfers", "data transfers complete", "return status 0"} {
		if !strings.Contains(rout, want) {
			t.Errorf("receiver output lacks %q", want)
		}
	}
	for _, want := range []string{"initiating data transfers", "data transfers complete", "return status 0"} {
		if !strings.Contains(sout, want) {
			t.Errorf("sender output lacks %q", want)
		}
	}
	if strings.Contains(rout+sout, "not supported on softrdma") {
		t.Errorf("mckey called a call softrdma does not implement")
	}
}

// buildCTest compiles testdata/<name>.c against the distribution's headers
// into dir (once, before a test re-runs itself in its namespace) and
// returns the program's path.
func buildCTest(t *testing.T, dir, name string, libs ...string) string {
	t.Helper()
	prog := filepath.Join(dir, name)
	if _, err := os.Stat(prog); err == nil {
		return prog
	}
	args := append([]string{"-Wall", "-o", prog, filepath.Join("testdata", name+".c"), "-libverbs"}, libs...)
	if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
		t.Fatalf("cc %s.c: %v\n%s", name, err, out)
	}
	return prog
}
