package sm

import (
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/sma"
)

// TestManagerConfig: a manager other than softsm's or OpenSM is refused;
// OpenSM mode takes no raw SA port and says what is missing.
func TestManagerConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Listen: "127.0.0.1:0", Manager: "bogus"}, `manager "bogus"`},
		{Config{Listen: "127.0.0.1:0", Manager: ManagerOpenSM, SAListen: "127.0.0.1:0"}, "raw SA port"},
		{Config{Listen: "127.0.0.1:0", Manager: ManagerOpenSM, OpenSM: OpenSMConfig{Path: "/nonexistent/opensm"}}, "needs opensm (apt-get install opensm)"},
		{Config{Listen: "127.0.0.1:0", Manager: ManagerOpenSM, OpenSM: OpenSMConfig{Path: "/bin/sh", Umad2sim: "/nonexistent/libumad2sim.so"}}, "libumad2sim.so (apt-get install libumad2sim0)"},
	} {
		s, err := New(c.cfg)
		if err == nil {
			s.Close()
			t.Errorf("%+v: no error", c.cfg)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
	// The default manager is softsm's: no model, no OpenSM.
	s, err := New(Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Model() != nil || s.OpenSMUp() != nil || s.OpenSMDir() != "" {
		t.Fatal("softsm's own SM has OpenSM's parts")
	}
}

// TestStartLockedOutlivesThreads: a child whose parent-death signal is
// SIGKILL dies when the thread that started it ends (the control: a
// goroutine that starts it and ends locked to its thread), and one that
// startLocked started survives goroutines that take threads and end them
// (locked, never unlocked). OpenSM is started so.
func TestStartLockedOutlivesThreads(t *testing.T) {
	// churn takes threads with goroutines locked to them, the calling
	// goroutine's first (its next goroutine runs on its thread while it
	// waits), and ends them all.
	churn := func() {
		release := make(chan struct{})
		var wg sync.WaitGroup
		for range 16 {
			wg.Add(1)
			locked := make(chan struct{})
			go func() {
				defer wg.Done()
				runtime.LockOSThread()
				close(locked)
				<-release
			}()
			<-locked
		}
		close(release)
		wg.Wait()
	}
	sleeper := func() *exec.Cmd {
		cmd := exec.Command("sleep", "60")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		return cmd
	}
	// The control: a child started by a goroutine that then ends locked
	// to its thread (which the runtime then ends, unless it is the main
	// thread, which it never ends: then again) is killed.
	control := func() (killed bool) {
		ctl := sleeper()
		startc := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			startc <- ctl.Start()
		}()
		if err := <-startc; err != nil {
			t.Fatal(err)
		}
		exit := make(chan error, 1)
		go func() { exit <- ctl.Wait() }()
		select {
		case err := <-exit:
			if err == nil || !strings.Contains(err.Error(), "killed") {
				t.Fatalf("control: the child ended with %v, want killed", err)
			}
			return true
		case <-time.After(5 * time.Second):
			ctl.Process.Kill()
			<-exit
			return false
		}
	}
	killed := false
	for range 3 {
		if killed = control(); killed {
			break
		}
	}
	if !killed {
		t.Skip("control: three children outlived the threads that started them: this kernel does not send the parent-death signal at a thread's end")
	}

	// startLocked: the same churn leaves the child alive.
	var wg sync.WaitGroup
	exited := make(chan error, 1)
	cmd := sleeper()
	if err := startLocked(cmd, &wg, func(err error) { exited <- err }); err != nil {
		t.Fatal(err)
	}
	churn()
	churn()
	// The child is killed at once if at all; a second round of churn
	// after the first makes sure the first's thread ends were seen.
	select {
	case err := <-exited:
		t.Fatalf("the child of startLocked died with its starter's neighbours' threads: %v", err)
	default:
	}
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the child of startLocked is gone: %v", err)
	}
	cmd.Process.Kill()
	wg.Wait()
	if err := <-exited; err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("after Kill: %v", err)
	}
}

// TestQueueKeepsArrivalTables: a packet queued with OpenSM in charge
// keeps the tables in force when it arrived until it leaves the queue
// (a switch routes a packet at its arrival), and a packet of softsm's own
// SM keeps none.
func TestQueueKeepsArrivalTables(t *testing.T) {
	var q inQueue
	t1, t2 := &sma.Tables{}, &sma.Tables{}
	b1, b2, b3 := &[]byte{1}, &[]byte{2}, &[]byte{3}
	q.push(b1, t1)
	q.push(b2, t2)
	q.push(b3, nil)
	for i, want := range []*sma.Tables{t1, t2, nil} {
		if got := q.frontTables(); got != want {
			t.Fatalf("packet %d: tables %p, want %p", i, got, want)
		}
		q.pop()
	}
	var own inQueue
	own.push(b1, nil)
	if own.tabs != nil || own.frontTables() != nil {
		t.Fatal("softsm's own SM: tables kept")
	}
}
