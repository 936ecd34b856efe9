// Package pyverbs runs rdma-core's own Python tests (Debian's
// python3-pyverbs ships them, partly gzipped, in SuiteDir) on both sides
// and holds their outcomes to a checked-in table, test by test:
//
//   - on softrdma through `softrdma exec` (TestPyverbsOnSoftrdma in this
//     package: RoCEv2 on lo in a network namespace of its own);
//   - on the kernel's rxe with rdma-core's own libraries in a QEMU guest
//     (test/interop's TestPyverbs).
//
// testdata/outcomes.md lists every test of Modules with the kernel's
// outcome, softrdma's and, where they differ, why. A run whose outcomes
// differ from its column fails (progress and regressions both show);
// WriteEnv=1 rewrites the column of the side that ran and keeps the
// reasons. TestTable fails on a difference without a reason.
//
// It is meant for tests only.
package pyverbs

import (
	"bufio"
	"bytes"
	"compress/gzip"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
)

// SuiteDir is where python3-pyverbs installs rdma-core's tests.
const SuiteDir = "/usr/share/doc/rdma-core/tests"

// Modules are the suite's modules that run: those of what softrdma claims
// (devices, PD, MR, CQ, completion channels, extended CQs, addresses, UD
// QPs and the extended QP API, the RDMA CM) — the others test hardware
// features (mlx5, efa, DM, ODP, flow steering, tag matching …) that
// neither softrdma nor rxe has.
var Modules = []string{
	"test_device", "test_pd", "test_mr", "test_cq", "test_cq_events", "test_cqex",
	"test_addr", "test_qp", "test_qpex", "test_rdmacm",
}

// Runner is the file name of the runner Prepare writes beside the suite's
// run_tests.py (testdata/softrdma_run.py).
const Runner = "softrdma_run.py"

//go:embed testdata/softrdma_run.py
var runner []byte

// Available says why the suite cannot run here (nil when it can).
func Available() error {
	for _, f := range []string{
		filepath.Join(SuiteDir, "run_tests.py"),
		"/usr/lib/python3/dist-packages/pyverbs",
		"/usr/bin/python3",
	} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("no %s (apt-get install python3-pyverbs): %v", f, err)
		}
	}
	return nil
}

// Prepare copies the suite from SuiteDir into dir, gunzips what is
// gzipped, and adds the runner. Nothing is written under /usr.
func Prepare(dir string) error {
	ents, err := os.ReadDir(SuiteDir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(SuiteDir, e.Name()))
		if err != nil {
			return err
		}
		name := e.Name()
		if n, ok := strings.CutSuffix(name, ".gz"); ok {
			zr, err := gzip.NewReader(bytes.NewReader(b))
			if err != nil {
				return fmt.Errorf("%s: %v", name, err)
			}
			if b, err = io.ReadAll(zr); err != nil {
				return fmt.Errorf("%s: %v", name, err)
			}
			name = n
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, Runner), runner, 0o755)
}

// Args are the runner's arguments (after the interpreter): the suite in
// dir, device dev and its GID index gid (the IPv4 RoCEv2 one: without
// --gid the suite takes the first, rxe's fe80:: RoCEv1 GID, whose
// address path fails with ENETUNREACH where the link has no IPv6), the
// verbose lines to results, every module of Modules.
func Args(dir, dev string, gid int, results string) []string {
	return append([]string{filepath.Join(dir, Runner), "--results", results, "--dev", dev, "--gid", strconv.Itoa(gid), "-v"}, Modules...)
}

// Outcome is a test's outcome as unittest's verbose line gives it: "ok",
// "FAIL", "ERROR", "skip: <reason>" (the device's name in the reason
// written <dev>), "expected failure", "unexpected success", or NotRun.
type Outcome string

// NotRun is the outcome of a test without a verbose line.
const NotRun Outcome = "not run"

// Skipped reports whether o is a skip.
func (o Outcome) Skipped() bool { return strings.HasPrefix(string(o), "skip: ") }

// Results maps a test ("test_qp.QPTest.test_modify_ud_qp": its id without
// the suite's package "tests.") to its outcome.
type Results map[string]Outcome

// verbose matches a verbose line of TextTestRunner(descriptions=False):
// "name (id) ... outcome" (setUpClass lines: "setUpClass (tests.m.Class)").
var verbose = regexp.MustCompile(`^(\S+) \(([^()\s]+)\) \.\.\. (.*)$`)

// Parse reads the runner's results file: the verbose lines, then
// unittest's failure reports and its summary. dev is the device the run
// used (its name in skip reasons is written <dev>). It fails on a results
// file without unittest's "Ran N tests" line or with a count that is not
// the number of verbose lines.
func Parse(out, dev string) (Results, error) {
	r := Results{}
	ran := -1
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if n, ok := strings.CutPrefix(line, "Ran "); ok {
			if _, err := fmt.Sscanf(n, "%d test", &ran); err == nil {
				continue
			}
		}
		m := verbose.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		id := m[2]
		if !strings.HasSuffix(id, "."+m[1]) {
			id += "." + m[1] // setUpClass (tests.m.Class)
		}
		id = strings.TrimPrefix(id, "tests.")
		o, err := outcome(m[3], dev)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", id, err)
		}
		if _, ok := r[id]; ok {
			return nil, fmt.Errorf("%s: two verbose lines", id)
		}
		r[id] = o
	}
	if ran < 0 {
		return r, errors.New(`no "Ran N tests" line: the run did not finish`)
	}
	if ran != len(r) {
		return r, fmt.Errorf("unittest ran %d tests, %d verbose lines", ran, len(r))
	}
	return r, nil
}

func outcome(s, dev string) (Outcome, error) {
	switch s {
	case "ok", "FAIL", "ERROR", "expected failure", "unexpected success":
		return Outcome(s), nil
	}
	if q, ok := strings.CutPrefix(s, "skipped "); ok && len(q) >= 2 {
		// repr of a str: '…' or "…".
		reason := q[1 : len(q)-1]
		if dev != "" {
			reason = strings.ReplaceAll(reason, dev, "<dev>")
		}
		return Outcome("skip: " + reason), nil
	}
	return "", fmt.Errorf("outcome %q", s)
}

// Counts returns the number of tests per outcome kind ("ok", "skip",
// "FAIL", "ERROR" …).
func (r Results) Counts() map[string]int {
	c := map[string]int{}
	for _, o := range r {
		c[o.kind()]++
	}
	return c
}

func (o Outcome) kind() string {
	if o.Skipped() {
		return "skip"
	}
	return string(o)
}

// Side is a column of the table.
type Side int

const (
	Kernel     Side = iota // the kernel's rxe with rdma-core's libraries (QEMU guest)
	Softrdma               // softrdma through softrdma exec: RoCEv2, rxe_lo
	SoftrdmaIB             // softrdma through softrdma exec: an IB port on softsm's subnet, softib0
	sides
)

func (s Side) String() string {
	switch s {
	case Kernel:
		return "kernel (rxe0, rdma-core)"
	case Softrdma:
		return "softrdma (rxe_lo, RoCEv2)"
	}
	return "softrdma (softib0, IB subnet)"
}

// Row is a test's line of the table.
type Row struct {
	Test string
	Out  [sides]Outcome // by Side
	Why  string         // why the outcomes differ ("" when they do not)
}

func (r Row) differ() bool {
	return r.Out[Kernel] != r.Out[Softrdma] || r.Out[Kernel] != r.Out[SoftrdmaIB]
}

// Table is testdata/outcomes.md.
type Table struct {
	Rows []Row
}

//go:embed testdata/outcomes.md
var tableText string

const (
	tableHead = "| test | kernel (rxe0, rdma-core) | softrdma (rxe_lo, RoCEv2) | softrdma (softib0, IB subnet) | why they differ |"
	tableRule = "|---|---|---|---|---|"
	// WriteEnv=1 rewrites the column of the side that ran.
	WriteEnv = "SOFTRDMA_PYVERBS_WRITE_TABLE"
)

// Expected returns the checked-in table.
func Expected() (*Table, error) { return ParseTable(tableText) }

// ParseTable reads a table in testdata/outcomes.md's format.
func ParseTable(text string) (*Table, error) {
	t := &Table{}
	in := false
	seen := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		switch {
		case line == tableHead:
			in = true
			continue
		case !in || line == tableRule:
			continue
		case !strings.HasPrefix(line, "|"):
			in = false
			continue
		}
		cells := splitRow(line)
		if len(cells) != 2+int(sides) {
			return nil, fmt.Errorf("table row %q: %d cells, want %d", line, len(cells), 2+int(sides))
		}
		r := Row{Test: unquote(cells[0]), Why: cells[len(cells)-1]}
		for s := range sides {
			r.Out[s] = Outcome(unquote(cells[1+s]))
		}
		if seen[r.Test] {
			return nil, fmt.Errorf("table: %s twice", r.Test)
		}
		seen[r.Test] = true
		t.Rows = append(t.Rows, r)
	}
	return t, nil
}

// splitRow splits "| a | b \| c | d |" into its cells ("\|" is a pipe).
func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(strings.TrimSuffix(line, "|"), "|")
	var cells []string
	var b strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			b.WriteByte('|')
			i++
		case line[i] == '|':
			cells = append(cells, strings.TrimSpace(b.String()))
			b.Reset()
		default:
			b.WriteByte(line[i])
		}
	}
	return append(cells, strings.TrimSpace(b.String()))
}

func unquote(s string) string {
	if len(s) >= 2 && s[0] == '`' && s[len(s)-1] == '`' {
		return s[1 : len(s)-1]
	}
	if s == "—" {
		return string(NotRun)
	}
	return s
}

func cell(s string) string {
	return "`" + strings.ReplaceAll(s, "|", `\|`) + "`"
}

// Render writes the table's rows in testdata/outcomes.md's format, by test.
func (t *Table) Render() string {
	rows := append([]Row(nil), t.Rows...)
	sort.Slice(rows, func(i, j int) bool { return rows[i].Test < rows[j].Test })
	var b strings.Builder
	b.WriteString(tableHead + "\n" + tableRule + "\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s |", cell(r.Test))
		for _, o := range r.Out {
			fmt.Fprintf(&b, " %s |", cell(string(o)))
		}
		fmt.Fprintf(&b, " %s |\n", strings.ReplaceAll(r.Why, "|", `\|`))
	}
	return b.String()
}

// Compare returns how results differ from the table's column of side, one
// line per test (nil: they agree).
func (t *Table) Compare(side Side, res Results) []string {
	var d []string
	known := map[string]bool{}
	for _, r := range t.Rows {
		known[r.Test] = true
		got, ok := res[r.Test]
		if !ok {
			got = NotRun
		}
		if want := r.Out[side]; got != want {
			d = append(d, fmt.Sprintf("%s: %s, table %s", r.Test, got, want))
		}
	}
	var extra []string
	for id := range res {
		if !known[id] {
			extra = append(extra, fmt.Sprintf("%s: %s, not in the table", id, res[id]))
		}
	}
	sort.Strings(extra)
	return append(d, extra...)
}

// Update sets the column of side to results (tests that did not run: NotRun;
// new tests get a row, not run on the other side).
func (t *Table) Update(side Side, res Results) {
	seen := map[string]bool{}
	for i := range t.Rows {
		r := &t.Rows[i]
		seen[r.Test] = true
		o, ok := res[r.Test]
		if !ok {
			o = NotRun
		}
		r.Out[side] = o
	}
	for id, o := range res {
		if seen[id] {
			continue
		}
		r := Row{Test: id, Out: [sides]Outcome{NotRun, NotRun, NotRun}}
		r.Out[side] = o
		t.Rows = append(t.Rows, r)
	}
	// Rows not run on either side are gone.
	rows := t.Rows[:0]
	for _, r := range t.Rows {
		if r.Out != [sides]Outcome{NotRun, NotRun, NotRun} {
			rows = append(rows, r)
		}
	}
	t.Rows = rows
}

// SuiteErrs starts the reason of a row where softrdma may fail or err:
// the suite turns softrdma's refusal into an error, not a skip (the
// test_rdmacm connection tests exit on any errno of rdma_listen).
const SuiteErrs = "the suite errs: "

// Problems returns the table's rows that break its rules: outcomes that
// differ between the columns without a reason, a reason where they do not.
func (t *Table) Problems() []string {
	var p []string
	for _, r := range t.Rows {
		switch {
		case r.differ() && r.Why == "":
			p = append(p, fmt.Sprintf("%s: kernel %s, softrdma %s, on IB %s: no reason given", r.Test, r.Out[Kernel], r.Out[Softrdma], r.Out[SoftrdmaIB]))
		case !r.differ() && r.Why != "":
			p = append(p, fmt.Sprintf("%s: %s everywhere, yet a reason (%q): remove it", r.Test, r.Out[Kernel], r.Why))
		}
	}
	return p
}

// Counts returns the number of tests per outcome kind ("ok", "skip",
// "FAIL", "ERROR", "not run" …) of a column.
func (t *Table) Counts(side Side) map[string]int {
	c := map[string]int{}
	for _, r := range t.Rows {
		c[r.Out[side].kind()]++
	}
	return c
}

// Summary is one line of counts per side and the number of differences.
func (t *Table) Summary() string {
	var b strings.Builder
	for s := range sides {
		c := t.Counts(s)
		keys := make([]string, 0, len(c))
		for k := range c {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(&b, "%s:", s)
		for _, k := range keys {
			fmt.Fprintf(&b, " %s %d", k, c[k])
		}
		b.WriteString("\n")
	}
	n := 0
	for _, r := range t.Rows {
		if r.differ() {
			n++
		}
	}
	fmt.Fprintf(&b, "%d tests, %d differ\n", len(t.Rows), n)
	return b.String()
}

// TablePath is testdata/outcomes.md in the source tree.
func TablePath() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "testdata", "outcomes.md")
}

// Check compares a run's results with the table's column of side and
// returns the differences; with WriteEnv=1 it rewrites the column in
// TablePath instead (and returns nothing but a write error).
func Check(side Side, res Results) ([]string, error) {
	t, err := Expected()
	if err != nil {
		return nil, err
	}
	d := t.Compare(side, res)
	if len(d) == 0 || os.Getenv(WriteEnv) != "1" {
		return d, nil
	}
	path := TablePath()
	old, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	// Reread the file: the other side may have rewritten it since the
	// embedded copy was compiled.
	if t, err = ParseTable(string(old)); err != nil {
		return nil, err
	}
	t.Update(side, res)
	i := strings.Index(string(old), tableHead)
	if i < 0 {
		return nil, fmt.Errorf("%s: no table", path)
	}
	return nil, os.WriteFile(path, []byte(string(old[:i])+t.Render()), 0o644)
}
