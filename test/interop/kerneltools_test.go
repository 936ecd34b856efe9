package interop

import (
	"strings"
	"testing"
)

// TestKernelTools runs our rdmacore-built mckey in guest g1 with an
// introspection endpoint, joined to a group on the kernel's rxe0, and
// reads it with softrdma's operator tools in the guest: `softrdma
// devices` shows rxe0 with its port and GID, `softrdma stat` its sysfs
// counters under softrdma's names (sent_pkts) and the kernel's own
// (rdma_sends), and --json carries them all (duplicate_request, 0).
func TestKernelTools(t *testing.T) {
	l := needLab(t)
	note := report(t)
	g1 := l.guests[0]
	g := randGroups(1)[0]
	mck := g1.install(t, hostBuild(t, "mckey-rdmacore", "github.com/softrdma/softrdma/cmd/mckey"))
	tool := g1.install(t, hostBuild(t, "softrdma-rdmacore", "github.com/softrdma/softrdma/cmd/softrdma"))
	env := "SOFTRDMA_DEBUG_DIR=/tmp/srdebug "
	recv := g1.start(t, "mckey(rdmacore) with an endpoint",
		"mkdir -p -m 700 /tmp/srdebug && "+env+"SOFTRDMA_DEBUG_ADDR=unix exec timeout -s KILL 150 "+mck+
			" -m "+g.String()+" -b "+g1.addr.String()+" -C 1000 --timeout 120s")
	defer recv.kill()
	recv.waitLine(joinedLine(g), lineTimeout)

	// Traffic on rxe0: rdma-core's mckey in the same guest sends to the
	// group (rxe counts it whoever sends).
	g1.mckey(t, "-m", g.String(), "-b", g1.addr.String(), "-s", "-C", "4", "-S", "64").expectExit(0, exitTimeout)

	devices := g1.run(t, env+tool+" devices")
	for _, want := range []string{"rxe0", "PORT_ACTIVE", "::ffff:" + g1.addr.String()} {
		if !strings.Contains(devices, want) {
			t.Errorf("softrdma devices: no %q in\n%s", want, devices)
		}
	}
	// stat lists the counters that are not zero: the sends, under
	// softrdma's name (sent_pkts) and a kernel-only one (rdma_sends).
	stat := g1.run(t, env+tool+" stat")
	for _, want := range []string{"device rxe0", "sent_pkts", "rdma_sends"} {
		if !strings.Contains(stat, want) {
			t.Errorf("softrdma stat: no %q in\n%s", want, stat)
		}
	}
	js := g1.run(t, env+tool+" stat --json")
	if !strings.Contains(js, `"rxe0"`) || !strings.Contains(js, `"sent_pkts"`) || !strings.Contains(js, `"duplicate_request"`) {
		t.Errorf("softrdma stat --json:\n%s", js)
	}
	note.set("softrdma devices/stat/--json in %s show the kernel's rxe0 of our rdmacore mckey (port, GID, sysfs counters)", g1.name)
}
