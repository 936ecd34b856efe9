package pyverbs

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/test/testsm"
)

// dirVar carries the folder of the softrdma binary, its libraries and the
// suite's copy into the test's re-run in its network namespace.
const dirVar = "SOFTRDMA_TEST_PYVERBS_DIR"

// build builds softrdma and its libraries (softrdma exec -install) and
// copies the suite, once, outside the network namespace.
func build(t *testing.T) string {
	t.Helper()
	if d := os.Getenv(dirVar); d != "" {
		return d
	}
	if err := Available(); err != nil {
		testenv.Require(t, "%v", err)
	}
	d := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(d, "softrdma"), "github.com/softrdma/softrdma/cmd/softrdma").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/softrdma: %v\n%s", err, out)
	}
	if out, err := exec.CommandContext(ctx, filepath.Join(d, "softrdma"), "exec", "-install", filepath.Join(d, "lib")).CombinedOutput(); err != nil {
		t.Fatalf("softrdma exec -install: %v\n%s", err, out)
	}
	suite := filepath.Join(d, "tests")
	if err := os.Mkdir(suite, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Prepare(suite); err != nil {
		t.Fatal(err)
	}
	t.Setenv(dirVar, d)
	return d
}

// SlowEnv=1 runs TestPyverbsOnSoftrdma (.ci/run has a step of its own
// for it): 1.5–2 minutes, most of it the suite's 15 s barrier timeout in
// each of test_rdmacm's seven connection tests, whose passive side fails
// at once on softrdma (no rdma_listen).
const SlowEnv = "SOFTRDMA_TEST_PYVERBS"

// TestPyverbsOnSoftrdma runs rdma-core's tests (Modules) through softrdma
// exec on rxe_lo (RoCEv2), in a network namespace of its own with lo up,
// and holds each test's outcome to testdata/outcomes.md's column.
func TestPyverbsOnSoftrdma(t *testing.T) {
	if os.Getenv(SlowEnv) != "1" {
		t.Skipf("1.5–2 minutes (test_rdmacm's connection tests wait 15 s each): runs with %s=1 (a .ci/run step of its own)", SlowEnv)
	}
	d := build(t)
	if !testenv.InNetnsFor(t, 6*time.Minute) {
		return
	}
	runSuite(t, d, Softrdma, "rxe_lo")
}

// TestPyverbsOnSoftrdmaIB runs them on softib0, an InfiniBand port
// (SOFTRDMA_IB_PORTS=127.0.3.1) on the emulated subnet of a softsm the
// test runs (package ib/sm) on loopback, with OpenSM in charge under
// SOFTRDMA_TEST_SM=opensm (the same outcomes expected).
func TestPyverbsOnSoftrdmaIB(t *testing.T) {
	d := build(t)
	if !testenv.InNetns(t) {
		return
	}
	cfg := sm.Config{Listen: "127.0.0.1:0"}
	if !testsm.OnOpenSM() { // the raw SA port is softsm's SA
		cfg.SAListen = "127.0.0.1:0"
	}
	s, err := sm.New(testsm.SMConfig(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	testsm.WaitSMUp(t, s)
	runSuite(t, d, SoftrdmaIB, "softib0", "SOFTRDMA_SM="+s.FabricAddr().String(), "SOFTRDMA_IB_PORTS=127.0.3.1")
}

// runSuite runs the suite through softrdma exec on device dev with the
// environment's extra variables and compares its outcomes with side's
// column (or writes them there, WriteEnv=1).
func runSuite(t *testing.T, d string, side Side, dev string, env ...string) {
	t.Helper()
	suite := filepath.Join(d, "tests")
	results := filepath.Join(t.TempDir(), "results.txt")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, filepath.Join(d, "softrdma"), append([]string{"exec", "-libdir", filepath.Join(d, "lib"), "--", "/usr/bin/python3"},
		Args(suite, dev, 0, results)...)...)
	cmd.Dir = suite
	for _, kv := range testenv.CleanEnv(env...) {
		if !strings.HasPrefix(kv, WriteEnv+"=") && !strings.HasPrefix(kv, SlowEnv+"=") { // the test's, not softrdma's
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run() // exit status 1 when a test fails or errs: the table says which
	took := time.Since(start)
	b, rerr := os.ReadFile(results)
	if rerr != nil {
		t.Fatalf("%v (run: %v)\n%s", rerr, err, out.String())
	}
	t.Logf("the suite through softrdma exec on %s (%v, %.1fs); its stdout and stderr:\n%s", dev, err, took.Seconds(), out.String())
	res, perr := Parse(string(b), dev)
	if perr != nil {
		t.Fatalf("results: %v\n%s", perr, b)
	}
	diffs, werr := Check(side, res)
	if werr != nil {
		t.Fatal(werr)
	}
	if len(diffs) > 0 {
		t.Errorf("outcomes differ from testdata/outcomes.md's column %s (%s=1 rewrites it):\n\t%s\nresults:\n%s",
			side, WriteEnv, strings.Join(diffs, "\n\t"), b)
	}
	c := res.Counts()
	t.Logf("PYVERBS %s: %d tests in %.1fs: %d ok, %d skip, %d ERROR, %d FAIL", side, len(res), took.Seconds(), c["ok"], c["skip"], c["ERROR"], c["FAIL"])
}

// TestTable checks testdata/outcomes.md: every difference between the
// kernel's outcome and softrdma's has a reason, and no reason stands
// without one; softrdma never fails or errs but where the suite turns a
// refusal into an error (a reason that starts with SuiteErrs).
func TestTable(t *testing.T) {
	tab, err := Expected()
	if err != nil {
		t.Fatal(err)
	}
	if len(tab.Rows) == 0 {
		t.Fatal("testdata/outcomes.md: no rows")
	}
	for _, p := range tab.Problems() {
		t.Error("testdata/outcomes.md: " + p)
	}
	// softrdma skips what it does not do, as rxe does; a failure or an
	// error is allowed only where the reason says the suite itself errs on
	// a refusal (it turns no errno into a skip there).
	for _, r := range tab.Rows {
		for _, s := range []Side{Softrdma, SoftrdmaIB} {
			if o := r.Out[s]; (o == "FAIL" || o == "ERROR" || o == NotRun) && !strings.HasPrefix(r.Why, SuiteErrs) {
				t.Errorf("testdata/outcomes.md: %s: %s on %s (softrdma skips what it does not do, never fails, but where the reason starts %q)", r.Test, o, s, SuiteErrs)
			}
		}
	}
	t.Logf("testdata/outcomes.md:\n%s", tab.Summary())
}

func TestParse(t *testing.T) {
	const out = `test_a (tests.test_m.C.test_a) ... ok
test_b (tests.test_m.C.test_b) ... skipped 'Device rxe_lo doesn\'t have net interface'
setUpClass (tests.test_m.D) ... skipped "no D"
test_c (tests.test_m.C.test_c) ... FAIL
test_d (tests.test_m.C.test_d) ... ERROR

======================================================================
ERROR: test_d (tests.test_m.C.test_d)
----------------------------------------------------------------------
Traceback (most recent call last):
Exception: x ... ok
----------------------------------------------------------------------
Ran 5 tests in 0.1s

FAILED (failures=1, errors=1, skipped=2)
`
	r, err := Parse(out, "rxe_lo")
	if err != nil {
		t.Fatal(err)
	}
	want := Results{
		"test_m.C.test_a":     "ok",
		"test_m.C.test_b":     `skip: Device <dev> doesn\'t have net interface`,
		"test_m.D.setUpClass": "skip: no D",
		"test_m.C.test_c":     "FAIL",
		"test_m.C.test_d":     "ERROR",
	}
	if len(r) != len(want) {
		t.Fatalf("got %v, want %v", r, want)
	}
	for k, v := range want {
		if r[k] != v {
			t.Errorf("%s: %q, want %q", k, r[k], v)
		}
	}
	if _, err := Parse(strings.Split(out, "Ran ")[0], ""); err == nil {
		t.Error("a run without its summary parsed")
	}
	if _, err := Parse(strings.Replace(out, "Ran 5", "Ran 6", 1), ""); err == nil {
		t.Error("a count unlike the lines parsed")
	}

	tab := &Table{}
	tab.Update(Kernel, r)
	tab.Update(Softrdma, Results{"test_m.C.test_a": "ok", "test_m.C.test_c": "skip: a | b"})
	tab.Update(SoftrdmaIB, r)
	back, err := ParseTable("intro\n\n" + tab.Render())
	if err != nil {
		t.Fatal(err)
	}
	if d := back.Compare(Softrdma, Results{"test_m.C.test_a": "ok", "test_m.C.test_c": "skip: a | b"}); len(d) > 0 {
		t.Errorf("rendered and parsed back: %q", d)
	}
	if d := back.Compare(Kernel, r); len(d) > 0 {
		t.Errorf("rendered and parsed back: %q", d)
	}
	if p := back.Problems(); len(p) != 4 { // b, setUpClass, c, d differ without reasons
		t.Errorf("problems %q, want 4", p)
	}
}
