package nettest

import (
	"context"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is a process running inside a network namespace.
type Proc struct {
	Name string // "<host>$ <program> <args>", for messages

	t    testing.TB
	cmd  *exec.Cmd
	done chan struct{}

	mu      sync.Mutex
	out     strings.Builder // stdout and stderr, interleaved
	changed chan struct{}   // closed and replaced on every write
	code    int             // exit code once done (-1 when killed by a signal)
}

// Write collects the process's output.
func (p *Proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	p.out.Write(b)
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
	return len(b), nil
}

// Output returns what the process printed so far.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// StartProc starts bin with args in namespace ns (ip netns exec). The
// process runs in its own process group, is killed after maxRun at the
// latest, and is killed (and its output logged) when the test ends. Its
// Name is the part of ns after the last '-', "$ ", the base name of bin
// and the args.
func StartProc(t testing.TB, ns, bin string, maxRun time.Duration, args ...string) *Proc {
	t.Helper()
	p, _ := startProc(t, ns, bin, maxRun, false, args)
	return p
}

// StartProcStdin is StartProc with a pipe to the process's standard
// input, which it returns (closing it is the process's end of input).
func StartProcStdin(t testing.TB, ns, bin string, maxRun time.Duration, args ...string) (*Proc, io.WriteCloser) {
	t.Helper()
	return startProc(t, ns, bin, maxRun, true, args)
}

func startProc(t testing.TB, ns, bin string, maxRun time.Duration, stdin bool, args []string) (*Proc, io.WriteCloser) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), maxRun)
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, bin}, args...)...)
	p := &Proc{t: t, cmd: cmd, done: make(chan struct{}), changed: make(chan struct{}), code: -1}
	p.Name = ns[strings.LastIndexByte(ns, '-')+1:] + "$ " + filepath.Base(bin) + " " + strings.Join(args, " ")
	cmd.Stdout, cmd.Stderr = p, p
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var in io.WriteCloser
	if stdin {
		var err error
		if in, err = cmd.StdinPipe(); err != nil {
			cancel()
			t.Fatalf("start %s: %v", p.Name, err)
		}
	}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start %s: %v", p.Name, err)
	}
	go func() {
		defer cancel()
		_ = cmd.Wait()
		p.mu.Lock()
		p.code = cmd.ProcessState.ExitCode()
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Kill()
		t.Logf("%s\n%s", p.Name, Indent(p.Output()))
	})
	return p, in
}

// Indent indents every line of s by a tab, "\t(no output)" when s is
// empty; trailing newlines are dropped.
func Indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return "\t(no output)"
	}
	return "\t" + strings.ReplaceAll(s, "\n", "\n\t")
}

// HasLine reports whether out has a line equal to line.
func HasLine(out, line string) bool {
	for _, l := range strings.Split(out, "\n") {
		if l == line {
			return true
		}
	}
	return false
}

// Kill kills the process group and waits for the process.
func (p *Proc) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.t.Errorf("%s: not gone 10s after SIGKILL", p.Name)
	}
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// WaitLine waits until the output contains a line equal to line and fails
// the test when the process exits first or the timeout passes.
func (p *Proc) WaitLine(line string, timeout time.Duration) {
	p.t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		p.mu.Lock()
		has := HasLine(p.out.String(), line)
		ch := p.changed
		p.mu.Unlock()
		if has {
			return
		}
		select {
		case <-ch:
		case <-p.done:
			if HasLine(p.Output(), line) {
				return
			}
			p.t.Fatalf("%s exited (status %d) without printing %q:\n%s", p.Name, p.ExitCode(), line, Indent(p.Output()))
		case <-timer.C:
			p.t.Fatalf("%s: no %q within %v:\n%s", p.Name, line, timeout, Indent(p.Output()))
		}
	}
}

// WaitLinePrefix waits until the output has a line starting with prefix
// and fails the test when the process exits first or the timeout passes.
func (p *Proc) WaitLinePrefix(prefix string, timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, l := range strings.Split(p.Output(), "\n") {
			if strings.HasPrefix(l, prefix) {
				return
			}
		}
		select {
		case <-p.done:
			p.t.Fatalf("%s exited (status %d) without a line %q…:\n%s", p.Name, p.ExitCode(), prefix, Indent(p.Output()))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s: no line %q… within %v:\n%s", p.Name, prefix, timeout, Indent(p.Output()))
		}
	}
}

// ExitCode returns the exit status once the process has exited (-1 before,
// or when a signal killed it).
func (p *Proc) ExitCode() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.code
}

// Wait waits for the process to exit and returns its exit status; on
// timeout it kills the process and fails the test.
func (p *Proc) Wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.ExitCode()
	case <-time.After(timeout):
		p.Kill()
		p.t.Fatalf("%s: still running after %v; killed:\n%s", p.Name, timeout, Indent(p.Output()))
		return -1
	}
}

// ExpectExit waits for the process and fails the test unless it exits
// with status want.
func (p *Proc) ExpectExit(want int, timeout time.Duration) {
	p.t.Helper()
	if got := p.Wait(timeout); got != want {
		p.t.Fatalf("%s: exit status %d, want %d:\n%s", p.Name, got, want, Indent(p.Output()))
	}
}
