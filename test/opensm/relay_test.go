package opensm

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/rdmacm/saclient"
	"github.com/softrdma/softrdma/verbs"
)

// openSMPid returns the pid of the opensm this process started (the SM of
// the test runs in the test's process).
func openSMPid(t *testing.T) int {
	t.Helper()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(b)
		open, shut := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || shut < open || s[open+1:shut] != "opensm" {
			continue
		}
		fields := strings.Fields(s[shut+1:])
		if len(fields) < 2 || fields[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(s[:open]))
		return pid
	}
	t.Fatal("no opensm child of this process")
	return 0
}

// TestOpenSMRelayDrops: while OpenSM reads nothing (stopped, SIGSTOP),
// a port's SA MADs wait in softsm's relay queue; beyond
// sm.OpenSMRelayQueue of them they are dropped and counted in the SM's
// Stats.OpenSMRelayDrops; once OpenSM runs again the port's SA client is
// answered.
func TestOpenSMRelayDrops(t *testing.T) {
	prereqs(t)
	s, devs := startInCharge(t, 1)
	d := devs[0]
	pid := openSMPid(t)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	saOf := func() uint64 {
		for _, p := range s.Stats().Ports {
			if p.GUID == d.GUID() {
				return p.SARequests
			}
		}
		return 0
	}
	if st := s.Stats(); st.OpenSMRelayDrops != 0 {
		t.Fatalf("OpenSMRelayDrops %d before any drop", st.OpenSMRelayDrops)
	}
	// ClassPortInfo Gets, a few at a time (a port sends SA MADs without
	// credit, into the room the switch keeps for them), each batch seen
	// by the switch before the next.
	const n = sm.OpenSMRelayQueue + 512
	const batch = 8
	before := saOf()
	for sent := 0; sent < n; sent += batch {
		for i := range batch {
			m := mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, uint64(0x5eed_0000_0000)+uint64(sent+i), 0)
			if err := d.SendSA(m); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 10*time.Second, "the switch took the batch", func() (bool, string) {
			got := saOf() - before
			return got >= uint64(sent+batch), fmt.Sprintf("%d of %d SA MADs seen", got, sent+batch)
		})
	}
	drops := s.Stats().OpenSMRelayDrops
	t.Logf("OpenSM stopped: %d SA MADs from the port, %d of them dropped at the relay queue (%d wait in it)", n, drops, sm.OpenSMRelayQueue)
	// At most OpenSMRelayQueue wait; before they do, the relay goroutine
	// hands OpenSM's socket what the kernel takes of a stopped reader (a
	// socket buffer's worth, about 150 MADs measured) and then waits
	// (up to 1 s a MAD) for room. All the others are dropped and counted.
	if drops == 0 || drops > n-sm.OpenSMRelayQueue {
		t.Errorf("OpenSMRelayDrops %d of %d sent, want 1 to %d (the relay queue holds %d)", drops, n, n-sm.OpenSMRelayQueue, sm.OpenSMRelayQueue)
	}
	// The MAD the relay waits to hand the stopped OpenSM is dropped after
	// a second, and counted too; then the next one waits.
	waitFor(t, 10*time.Second, "a MAD OpenSM's socket took none of for a second counted", func() (bool, string) {
		now := s.Stats().OpenSMRelayDrops
		return now >= drops+2, fmt.Sprintf("OpenSMRelayDrops %d, %d before", now, drops)
	})
	drops = s.Stats().OpenSMRelayDrops
	resume()
	agent, ok := saclient.For(verbsDevice(t, d))
	if !ok {
		t.Fatal("no SA client for the port")
	}
	waitFor(t, 60*time.Second, "OpenSM answers the port again", func() (bool, string) {
		ans, err := agent.Query(mad.MethodGet, mad.AttrClassPortInfo, 0, nil)
		if err != nil {
			return false, err.Error()
		}
		return ans.Status() == 0 && ans.AttrID() == mad.AttrClassPortInfo, fmt.Sprintf("status %#x", ans.Status())
	})
	if after := s.Stats().OpenSMRelayDrops; after < drops {
		t.Errorf("OpenSMRelayDrops went from %d to %d", drops, after)
	}
}

// verbsDevice returns the verbs device of the IB port d.
func verbsDevice(t *testing.T, d *ib.Device) *verbs.Device {
	t.Helper()
	for _, v := range verbs.DefaultHost().Devices() {
		if v.Name() == d.Name() {
			return v
		}
	}
	t.Fatalf("no verbs device %s", d.Name())
	return nil
}

// TestOpenSMSADelay: with SADelay (softsm -sa-delay) a port's SA request
// reaches OpenSM only once the delay has passed, as softsm's own SA
// processes one only then: a ClassPortInfo Get is answered by OpenSM no
// sooner than the delay after it was sent, and answered whole.
func TestOpenSMSADelay(t *testing.T) {
	prereqs(t)
	const delay = 500 * time.Millisecond
	_, devs := startInChargeConfig(t, 1, sm.Config{Logf: t.Logf, SADelay: delay})
	agent, ok := saclient.For(verbsDevice(t, devs[0]))
	if !ok {
		t.Fatal("no SA client for the port")
	}
	for i := range 3 {
		start := time.Now()
		ans, err := agent.Query(mad.MethodGet, mad.AttrClassPortInfo, 0, nil)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		if ans.Status() != 0 || ans.AttrID() != mad.AttrClassPortInfo {
			t.Fatalf("query %d: status %#x, attribute %#x", i, ans.Status(), ans.AttrID())
		}
		t.Logf("query %d: OpenSM's ClassPortInfo after %v (SADelay %v)", i, took.Round(time.Millisecond), delay)
		if took < delay {
			t.Fatalf("query %d answered after %v, before the SA delay of %v", i, took, delay)
		}
	}
}
