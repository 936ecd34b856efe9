package interop

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/test/nettest"
)

// cmckey starts Debian's mckey (rdmacm-utils, the same build as the
// guests') in h0 through softrdma exec: rdma-core's C program on
// softrdma's drop-in libraries and its RoCEv2 device on h0's eth0.
func (l *lab) cmckey(t *testing.T, args ...string) *nettest.Proc {
	t.Helper()
	mckey, err := exec.LookPath("mckey")
	if err != nil {
		if required {
			t.Fatalf("no mckey on the host (apt-get install rdmacm-utils): %v", err)
		}
		t.Skipf("no mckey on the host (apt-get install rdmacm-utils): %v", err)
	}
	bin, libdir, _ := softrdmaExec(t)
	return startProc(t, l.h0, bin, append([]string{"exec", "-libdir", libdir, "--", "stdbuf", "-oL", mckey}, args...)...)
}

// TestCMckey: rdma-core's C mckey in both places, unmodified — on the
// host through softrdma exec (softrdma's librdmacm/libibverbs), in g1 on
// the kernel's rxe with rdma-core's libraries — sends multicast both
// ways. Each receiver exits 0 only once it has every message; g1's rxe
// counters show the kernel carried them, and the host's receiver prints
// the lines the guest's receiver prints.
func TestCMckey(t *testing.T) {
	l := needLab(t)
	g1 := l.guests[0]
	const n, size = 8, 200
	count, sz := fmt.Sprint(n), fmt.Sprint(size)

	var guestRecv string // the guest receiver's lines, group written GROUP
	t.Run("host-to-guest", func(t *testing.T) {
		note := report(t)
		g := randGroups(1)[0]
		rcvd := g1.counter(t, "rcvd_pkts")
		recv := g1.mckey(t, "-m", g.String(), "-b", g1.addr.String(), "-C", count, "-S", sz)
		recv.waitLine(joinedLine(g), lineTimeout)
		l.waitMDB(t, g, g1.port, true, wireTimeout)
		l.waitQuerier()
		send := l.cmckey(t, "-m", g.String(), "-b", l.hostAddr.String(), "-s", "-C", count, "-S", sz)
		send.ExpectExit(0, exitTimeout)
		recv.expectExit(0, exitTimeout)
		if d := g1.counter(t, "rcvd_pkts") - rcvd; d < n {
			t.Errorf("%s rxe0 rcvd_pkts +%d, want ≥ %d: the kernel did not receive our traffic", g1.name, d, n)
		}
		guestRecv = replaceGroup(recv.stdout(), g)
		note.set("rdma-core mckey on softrdma (softrdma exec, host) → rdma-core mckey on rxe (%s): %d×%dB, rcvd_pkts counted", g1.name, n, size)
	})

	t.Run("guest-to-host", func(t *testing.T) {
		note := report(t)
		g := randGroups(1)[0]
		recv := l.cmckey(t, "-m", g.String(), "-b", l.hostAddr.String(), "-C", count, "-S", sz)
		recv.WaitLine(joinedLine(g), lineTimeout)
		l.waitMDB(t, g, l.hostPort, true, wireTimeout)
		l.waitQuerier()
		sent := g1.counter(t, "sent_pkts")
		send := g1.mckey(t, "-m", g.String(), "-b", g1.addr.String(), "-s", "-C", count, "-S", sz)
		send.expectExit(0, exitTimeout)
		recv.ExpectExit(0, exitTimeout)
		if d := g1.counter(t, "sent_pkts") - sent; d < n {
			t.Errorf("%s rxe0 sent_pkts +%d, want ≥ %d: the kernel did not send the traffic", g1.name, d, n)
		}
		if guestRecv != "" {
			if ours := replaceGroup(recv.Output(), g); ours != guestRecv {
				t.Errorf("the host's receiver printed\n%s\nthe guest's printed\n%s", nettest.Indent(ours), nettest.Indent(guestRecv))
			}
		}
		note.set("rdma-core mckey on rxe (%s) → rdma-core mckey on softrdma (softrdma exec, host): %d×%dB, sent_pkts counted, the receivers' lines alike", g1.name, n, size)
	})
}

// replaceGroup writes the group of an mckey output as GROUP.
func replaceGroup(out string, g netip.Addr) string {
	return strings.ReplaceAll(out, g.String(), "GROUP")
}
