package interop

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/nettest"
	"github.com/softrdma/softrdma/test/testenv"
)

// nsTag starts the name of every namespace of this package: sri-<pid>-….
const nsTag = "sri"

var (
	// mckeyBin is softrdma's mckey, built once in TestMain.
	mckeyBin string
	// grhpeerBin is the receiver that prints whole completions (./grhpeer).
	grhpeerBin string
	// imageDir is the guest image ($SOFTRDMA_INTEROP_IMAGE).
	imageDir string
	// skipReason, when set, makes every test skip (or fail, when the
	// suite is required).
	skipReason string
	// required: SOFTRDMA_INTEROP_REQUIRE=1 turns a skip into a failure,
	// except when qemu cannot start at all (noQemu).
	required = os.Getenv("SOFTRDMA_INTEROP_REQUIRE") == "1"
	noQemu   bool
	// nsPrefix starts the name of every namespace this process creates;
	// the PID lets a later run sweep the namespaces of dead runs.
	nsPrefix = nettest.Prefix(nsTag)
	// artifacts keeps the files of failed cases.
	artifacts = nettest.Artifacts{Fallback: "softrdma-interop-artifacts", Kind: "artifact"}
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	testenv.ClearSoftRDMA()
	skipReason = checkPrereqs()
	var dir string
	if skipReason == "" {
		nettest.SweepStale(nsTag)
		var err error
		dir, err = os.MkdirTemp("", "softrdma-interop-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "interop:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		if mckeyBin = os.Getenv("SOFTRDMA_INTEROP_MCKEY"); mckeyBin == "" {
			mckeyBin = filepath.Join(dir, "mckey")
			cmd := exec.Command(nettest.GoTool(), "build", "-o", mckeyBin, "github.com/softrdma/softrdma/cmd/mckey")
			if out, err := cmd.CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "interop: building mckey: %v\n%s", err, out)
				return 1
			}
		}
	}
	if skipReason == "" {
		grhpeerBin = filepath.Join(dir, "grhpeer")
		cmd := exec.Command(nettest.GoTool(), "build", "-o", grhpeerBin, "github.com/softrdma/softrdma/test/interop/grhpeer")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "interop: building grhpeer: %v\n%s", err, out)
			return 1
		}
	}
	start := time.Now()
	code := m.Run()
	if theLab != nil {
		theLab.close(code != 0)
	}
	if skipReason == "" {
		nettest.RemoveOwn(nsPrefix)
	}
	printSummary(time.Since(start))
	return code
}

// checkPrereqs returns why the suite cannot run here ("" when it can).
func checkPrereqs() string {
	imageDir = os.Getenv("SOFTRDMA_INTEROP_IMAGE")
	if imageDir == "" {
		return "SOFTRDMA_INTEROP_IMAGE is not set: the interop suite runs through test/interop/run.sh, which builds the guest image"
	}
	for _, f := range []string{"vmlinuz", "initrd.img"} {
		if _, err := os.Stat(filepath.Join(imageDir, f)); err != nil {
			return fmt.Sprintf("guest image incomplete: %v (build it with test/interop/build-image.sh)", err)
		}
	}
	// qemu that cannot start at all is the one reason to skip even when
	// the suite is required.
	if out, err := exec.Command("qemu-system-x86_64", "-version").CombinedOutput(); err != nil {
		noQemu = true
		return fmt.Sprintf("qemu-system-x86_64 cannot start: %v %s", err, strings.TrimSpace(string(out)))
	}
	if os.Geteuid() != 0 {
		return "the interop suite needs root (network namespaces, taps, qemu), euid " + strconv.Itoa(os.Geteuid())
	}
	for _, tool := range []string{"ip", "bridge"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("%s not found: %v", tool, err)
		}
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return "no /dev/net/tun: " + err.Error()
	}
	return nettest.Probe(nsPrefix)
}

// requireEnv skips the test when the suite cannot run (fails it when the
// suite is required).
func requireEnv(t *testing.T) {
	t.Helper()
	if skipReason == "" {
		return
	}
	if required && !noQemu {
		t.Fatalf("interop suite required (SOFTRDMA_INTEROP_REQUIRE=1) but: %s", skipReason)
	}
	t.Skip(skipReason)
}

// Summary: one line per case, printed at the end of the run.

type caseResult struct {
	name   string
	status string
	dur    time.Duration
	note   string
}

var summary struct {
	sync.Mutex
	results []caseResult
}

// caseNote is the one-line description of a case's outcome.
type caseNote struct {
	mu   sync.Mutex
	text string
}

// report registers t for the summary and returns its note.
func report(t *testing.T) *caseNote {
	n := &caseNote{}
	start := time.Now()
	t.Cleanup(func() {
		status := "PASS"
		switch {
		case t.Failed():
			status = "FAIL"
		case t.Skipped():
			status = "SKIP"
		}
		n.mu.Lock()
		text := n.text
		n.mu.Unlock()
		summary.Lock()
		summary.results = append(summary.results, caseResult{t.Name(), status, time.Since(start), text})
		summary.Unlock()
	})
	return n
}

func (n *caseNote) set(format string, args ...any) {
	n.mu.Lock()
	n.text = fmt.Sprintf(format, args...)
	n.mu.Unlock()
}

func printSummary(total time.Duration) {
	summary.Lock()
	defer summary.Unlock()
	if len(summary.results) == 0 {
		return
	}
	rs := append([]caseResult(nil), summary.results...)
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].name < rs[j].name })
	var b strings.Builder
	fmt.Fprintf(&b, "\n== interop summary (%d cases, %.0fs)\n", len(rs), total.Seconds())
	if theLab != nil && theLab.bootNote != "" {
		fmt.Fprintf(&b, "interop: lab: %s\n", theLab.bootNote)
	}
	for _, r := range rs {
		fmt.Fprintf(&b, "interop: %s %6.1fs %s", r.status, r.dur.Seconds(), r.name)
		if r.note != "" {
			fmt.Fprintf(&b, " — %s", r.note)
		}
		b.WriteByte('\n')
	}
	fmt.Print(b.String())
}
