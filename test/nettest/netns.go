package nettest

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netns"
)

// Prefix returns the prefix of the names of the namespaces this process
// creates: tag, "-", the PID, "-" (e.g. "srm-1234-"). The PID lets a later
// run sweep the namespaces of dead runs (SweepStale).
func Prefix(tag string) string {
	return fmt.Sprintf("%s-%d-", tag, os.Getpid())
}

// Names lists the named network namespaces (ip netns).
func Names() []string {
	ents, err := os.ReadDir("/run/netns")
	if err != nil {
		ents, _ = os.ReadDir("/var/run/netns")
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// SweepStale deletes the namespaces named tag-<pid>-… whose creating
// process is gone (a run that was killed before it could clean up), after
// killing whatever still runs inside them.
func SweepStale(tag string) {
	for _, name := range Names() {
		rest, ok := strings.CutPrefix(name, tag+"-")
		if !ok {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || err == syscall.EPERM {
			continue // its creator still runs
		}
		Delete(name)
	}
}

// RemoveOwn deletes every namespace whose name starts with prefix (see
// Prefix).
func RemoveOwn(prefix string) {
	for _, name := range Names() {
		if strings.HasPrefix(name, prefix) {
			Delete(name)
		}
	}
}

// Delete kills the processes inside a namespace and deletes it.
func Delete(name string) error {
	if out, err := exec.Command("ip", "netns", "pids", name).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del %s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Probe creates and deletes the namespace prefix+"probe" and returns why
// that failed ("" when it worked).
func Probe(prefix string) string {
	probe := prefix + "probe"
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		return fmt.Sprintf("ip netns add failed: %v: %s", err, strings.TrimSpace(string(out)))
	}
	_ = exec.Command("ip", "netns", "del", probe).Run()
	return ""
}

// InNetns runs fn on a locked OS thread that has entered the named
// namespace. Sockets fn opens stay in that namespace. The thread is thrown
// away if it cannot return to its original namespace.
func InNetns(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(name)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns %s: %w", name, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", name, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Stay locked: the thread exits with this goroutine.
			errc <- fmt.Errorf("setns back: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
