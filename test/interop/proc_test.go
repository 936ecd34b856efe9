package interop

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is a process running inside a host namespace.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	done chan struct{}

	mu      sync.Mutex
	out     strings.Builder // stdout and stderr, interleaved
	changed chan struct{}   // closed and replaced on every write
	code    int             // exit code once done (-1 when killed by a signal)
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	p.out.Write(b)
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
	return len(b), nil
}

// output returns what the process printed so far.
func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// mckey starts softrdma's mckey in the softrdma namespace h0. It runs in
// its own process group, is killed after 150 s at the latest, and is killed
// (and its output logged) when the test ends.
func (l *lab) mckey(t *testing.T, args ...string) *proc {
	t.Helper()
	return startProc(t, l.h0, mckeyBin, args...)
}

// grhpeer starts the grhpeer helper in h0.
func (l *lab) grhpeer(t *testing.T, args ...string) *proc {
	t.Helper()
	return startProc(t, l.h0, grhpeerBin, args...)
}

func startProc(t *testing.T, ns, bin string, args ...string) *proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, bin}, args...)...)
	p := &proc{t: t, cmd: cmd, done: make(chan struct{}), changed: make(chan struct{}), code: -1}
	p.name = ns[strings.LastIndexByte(ns, '-')+1:] + "$ " + filepath.Base(bin) + " " + strings.Join(args, " ")
	cmd.Stdout, cmd.Stderr = p, p
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start %s: %v", p.name, err)
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
		p.kill()
		t.Logf("%s\n%s", p.name, indent(p.output()))
	})
	return p
}

// kill kills the process group and waits for the process.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.t.Errorf("%s: not gone 10s after SIGKILL", p.name)
	}
}

// waitLine waits until the output contains a line equal to line and fails
// the test when the process exits first or the timeout passes.
func (p *proc) waitLine(line string, timeout time.Duration) {
	p.t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		p.mu.Lock()
		has := hasLine(p.out.String(), line)
		ch := p.changed
		p.mu.Unlock()
		if has {
			return
		}
		select {
		case <-ch:
		case <-p.done:
			if hasLine(p.output(), line) {
				return
			}
			p.t.Fatalf("%s exited (status %d) without printing %q:\n%s", p.name, p.exitCode(), line, indent(p.output()))
		case <-timer.C:
			p.t.Fatalf("%s: no %q within %v:\n%s", p.name, line, timeout, indent(p.output()))
		}
	}
}

func (p *proc) exitCode() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.code
}

// wait waits for the process to exit and returns its exit status; on
// timeout it kills the process and fails the test.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.exitCode()
	case <-time.After(timeout):
		p.kill()
		p.t.Fatalf("%s: still running after %v; killed:\n%s", p.name, timeout, indent(p.output()))
		return -1
	}
}

// expectExit waits for the process and fails the test unless it exits
// with status want.
func (p *proc) expectExit(want int, timeout time.Duration) {
	p.t.Helper()
	if got := p.wait(timeout); got != want {
		p.t.Fatalf("%s: exit status %d, want %d:\n%s", p.name, got, want, indent(p.output()))
	}
}

// waitLinePrefix waits until the output has a line starting with prefix.
func (p *proc) waitLinePrefix(prefix string, timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, l := range strings.Split(p.output(), "\n") {
			if strings.HasPrefix(l, prefix) {
				return
			}
		}
		select {
		case <-p.done:
			p.t.Fatalf("%s exited (status %d) without a line %q…:\n%s", p.name, p.exitCode(), prefix, indent(p.output()))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s: no line %q… within %v:\n%s", p.name, prefix, timeout, indent(p.output()))
		}
	}
}

// exited reports whether the process has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
