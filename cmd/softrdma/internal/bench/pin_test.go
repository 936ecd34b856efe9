package bench

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestStartOn: a process started on a CPU runs there alone, and the CPU
// mask of the starting thread is back as it was.
func TestStartOn(t *testing.T) {
	_, cpu, ok := latCPUs()
	if !ok {
		t.Skip("this process may run on fewer than two CPUs: nothing to pin to")
	}
	cmd := exec.Command("grep", "Cpus_allowed_list", "/proc/self/status")
	var out strings.Builder
	cmd.Stdout = &out
	if err := startOn(cmd, cpu); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(out.String()), "Cpus_allowed_list:\t"+strconv.Itoa(cpu); got != want {
		t.Errorf("child: %q, want %q", got, want)
	}
	if a, b, ok := latCPUs(); !ok || b != cpu {
		t.Errorf("after startOn this thread may run on %d, %d (ok %v): its mask was not restored", a, b, ok)
	}
}
