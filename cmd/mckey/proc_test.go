package main

// Process helpers of the loopback tests: the binaries are built once by
// TestMain; every process runs in its own process group, is killed on
// cleanup, and every wait on it has a timeout.

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/softrdma/softrdma/test/testenv"
)

// Paths of the binaries TestMain builds.
var (
	mckeyBin  string
	mcpeerBin string
)

// Timeouts of the helpers; generous, for a loaded 2-core machine under -race.
const (
	lineTimeout = 20 * time.Second // a process prints an expected line
	exitTimeout = 30 * time.Second // a process exits by itself
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	testenv.OwnNetns() // lo to this package alone
	testenv.ClearSoftRDMA()
	unscope, err := testenv.ScopeEndpoints() // the tools see this run's processes only
	if err != nil {
		fmt.Fprintln(os.Stderr, "mckey test:", err)
		return 1
	}
	defer unscope()
	dir, err := os.MkdirTemp("", "mckey-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "mckey test:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	args := []string{"build", "-o", dir}
	if raceEnabled {
		args = append(args, "-race") // a race in a child then fails its test (exit status 66)
	}
	args = append(args, ".", "../../test/testcmd/mcpeer")
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "mckey test: go %s: %v\n%s", strings.Join(args, " "), err, out)
		return 1
	}
	mckeyBin, mcpeerBin = filepath.Join(dir, "mckey"), filepath.Join(dir, "mcpeer")
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

// randomGroup returns a random IPv4 group in 239.0.0.0/8 (outside
// 239.255/16, where SSDP and friends live): tests of other packages run on
// the same host at the same time.
func randomGroup() string {
	return fmt.Sprintf("239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254))
}

// twoGroups returns two different random groups.
func twoGroups() (string, string) {
	g1 := randomGroup()
	for {
		if g2 := randomGroup(); g2 != g1 {
			return g1, g2
		}
	}
}

// proc is a started child process. Its stdout is read line by line by a
// goroutine; stderr is collected.
type proc struct {
	t      testing.TB
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr syncBuffer
	done   chan struct{} // closed once the process was waited for

	mu     sync.Mutex
	lines  []string      // every stdout line so far
	next   int           // the first line nextLine has not returned
	eof    bool          // stdout closed
	notify chan struct{} // closed and replaced when lines or eof change
	code   int           // exit status once done (-1: killed by a signal)
}

// start runs bin with args in its own process group. The process is killed
// (with its group) when the test ends; its output is logged if the test
// failed.
func start(t testing.TB, name, bin string, args ...string) *proc {
	t.Helper()
	return startEnv(t, name, nil, bin, args...)
}

// startEnv is start with env ("NAME=value") added to the child's
// environment, which is the test's less every SOFTRDMA_* variable.
func startEnv(t testing.TB, name string, env []string, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, done: make(chan struct{}), notify: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = testenv.CleanEnv(env...)
	if raceEnabled && os.Getenv("GORACE") == "" {
		// A race-built child sleeps 1s before a zero exit unless told otherwise.
		p.cmd.Env = append(p.cmd.Env, "GORACE=atexit_sleep_ms=100")
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.cmd.Stderr = &p.stderr
	p.cmd.WaitDelay = 5 * time.Second
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: start %s: %v", name, bin, err)
	}
	go p.read(stdout)
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				t.Errorf("%s: not reaped 10s after SIGKILL", name)
			}
		}
		if t.Failed() {
			t.Logf("%s %s\n  stdout: %q\n  stderr: %q\n  exit: %d",
				name, strings.Join(args, " "), p.allLines(), p.stderr.String(), p.code)
		}
	})
	return p
}

// read collects stdout lines until EOF, then waits for the process.
func (p *proc) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		p.mu.Lock()
		p.lines = append(p.lines, sc.Text())
		p.wakeLocked()
		p.mu.Unlock()
	}
	err := p.cmd.Wait()
	code := p.cmd.ProcessState.ExitCode()
	if err != nil && code == 0 {
		code = -1 // e.g. WaitDelay expired
	}
	p.mu.Lock()
	p.eof, p.code = true, code
	p.wakeLocked()
	p.mu.Unlock()
	close(p.done)
}

func (p *proc) wakeLocked() {
	close(p.notify)
	p.notify = make(chan struct{})
}

// nextLine returns the next stdout line not returned yet; false on EOF or
// when none arrives within timeout.
func (p *proc) nextLine(timeout time.Duration) (string, bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		if p.next < len(p.lines) {
			l := p.lines[p.next]
			p.next++
			p.mu.Unlock()
			return l, true
		}
		eof, ch := p.eof, p.notify
		p.mu.Unlock()
		if eof {
			return "", false
		}
		select {
		case <-ch:
		case <-deadline.C:
			return "", false
		}
	}
}

// waitLine skips stdout lines until one matches re and returns its
// submatches; the test fails on EOF or timeout.
func (p *proc) waitLine(re *regexp.Regexp, timeout time.Duration) []string {
	p.t.Helper()
	end := time.Now().Add(timeout)
	for {
		l, ok := p.nextLine(time.Until(end))
		if !ok {
			p.t.Fatalf("%s: no line matching %q within %v (stdout %q, stderr %q)",
				p.name, re, timeout, p.allLines(), p.stderr.String())
		}
		if m := re.FindStringSubmatch(l); m != nil {
			return m
		}
	}
}

// allLines returns a copy of every stdout line so far.
func (p *proc) allLines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// wait waits up to timeout for the process to exit by itself and returns
// its exit status; the test fails on timeout.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("%s: still running after %v (stdout %q, stderr %q)", p.name, timeout, p.allLines(), p.stderr.String())
	}
	return p.code
}

// syncBuffer is a bytes.Buffer safe for the writer goroutine of exec.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// lines splits collected output into lines (none for empty output).
func lines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// mckeyRun is the result of one mckey run.
type mckeyRun struct {
	stdout []string
	stderr []string
	code   int
}

// finish waits for the process to exit by itself and returns its output
// and exit status.
func (p *proc) finish() mckeyRun {
	p.t.Helper()
	code := p.wait(exitTimeout)
	return mckeyRun{stdout: p.allLines(), stderr: lines(p.stderr.String()), code: code}
}

// runMckey runs mckey to its end and returns its output and exit status.
func runMckey(t testing.TB, args ...string) mckeyRun {
	t.Helper()
	p := start(t, "mckey", mckeyBin, args...)
	p.stdin.Close()
	return p.finish()
}

// peer is a running mcpeer.
type peer struct {
	*proc
	qpn string // "0x…", as mcpeer prints it
}

var joinedQPN = regexp.MustCompile(`^joined qpn (0x[0-9a-f]+)$`)

// startPeer starts an mcpeer on group (bound to 127.0.0.1) and waits for
// its joined line.
func startPeer(t testing.TB, name, group string, extra ...string) *peer {
	t.Helper()
	args := append([]string{"-b", "127.0.0.1", "-m", group}, extra...)
	p := start(t, name, mcpeerBin, args...)
	m := p.waitLine(joinedQPN, lineTimeout)
	t.Cleanup(func() { p.stdin.Close() })
	return &peer{proc: p, qpn: m[1]}
}

// do sends one command line and returns the one-line answer; the test
// fails if none comes within timeout.
func (p *peer) do(cmd string, timeout time.Duration) string {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		p.t.Fatalf("%s: write %q: %v", p.name, cmd, err)
	}
	l, ok := p.nextLine(timeout)
	if !ok {
		p.t.Fatalf("%s: no answer to %q within %v (stderr %q)", p.name, cmd, timeout, p.stderr.String())
	}
	return l
}

// expect runs cmd and fails the test unless the answer is want.
func (p *peer) expect(cmd, want string) {
	p.t.Helper()
	if got := p.do(cmd, lineTimeout); got != want {
		p.t.Fatalf("%s: %q answered %q, want %q", p.name, cmd, got, want)
	}
}

// send makes the peer send n datagrams.
func (p *peer) send(n int) {
	p.t.Helper()
	p.expect(fmt.Sprintf("send %d", n), fmt.Sprintf("sent %d", n))
}

// recv waits for n datagrams, which must come from the given sources
// ("0xQPN:count" items in ascending QPN order).
func (p *peer) recv(n int, from ...string) {
	p.t.Helper()
	p.expect(fmt.Sprintf("recv %d 10s", n), fmt.Sprintf("recv %d from %s", n, strings.Join(from, ",")))
}

// quiet asserts that no datagram arrives within d.
func (p *peer) quiet(d time.Duration) {
	p.t.Helper()
	p.expect("quiet "+d.String(), "quiet ok")
}

// exit ends the peer with the exit command and checks its exit status.
func (p *peer) exit() {
	p.t.Helper()
	p.expect("exit", "bye")
	if code := p.wait(exitTimeout); code != 0 {
		p.t.Errorf("%s: exit status %d", p.name, code)
	}
}

// from formats one source count as mcpeer prints it.
func from(p *peer, n int) string { return fmt.Sprintf("%s:%d", p.qpn, n) }
