package interop

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/softrdma/softrdma/test/nettest"
)

// Our mckey built with the rdmacore tag runs in a guest on the kernel's
// rxe (librdmacm + libibverbs), against rdma-core's C mckey in the other
// guest and softrdma's mckey on the host.

var (
	kernelBuild struct {
		once sync.Once
		dir  string
		err  error
	}
)

// hostBuild builds a package with the rdmacore tag once per run (cgo,
// linked against the host's librdmacm/libibverbs: Debian 12's, as in the
// guests) and returns the binary.
func hostBuild(t *testing.T, name string, args ...string) string {
	t.Helper()
	kernelBuild.once.Do(func() {
		kernelBuild.dir, kernelBuild.err = os.MkdirTemp("", "softrdma-interop-kbin-")
	})
	if kernelBuild.err != nil {
		t.Fatal(kernelBuild.err)
	}
	out := filepath.Join(kernelBuild.dir, name)
	if _, err := os.Stat(out); err == nil {
		return out
	}
	cmd := exec.Command(nettest.GoTool(), append([]string{"build", "-tags", "rdmacore", "-o", out + ".tmp"}, args...)...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags rdmacore %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	if err := os.Rename(out+".tmp", out); err != nil {
		t.Fatal(err)
	}
	return out
}

// install copies a host binary into the guest's share and returns its
// path in the guest.
func (g *guest) install(t *testing.T, bin string) string {
	t.Helper()
	name := filepath.Base(bin)
	dst := filepath.Join(g.share, "bin", name)
	if _, err := os.Stat(dst); err == nil {
		return "/ctl/bin/" + name
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := nettest.CopyFile(dst+".tmp", bin); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst+".tmp", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dst+".tmp", dst); err != nil {
		t.Fatal(err)
	}
	return "/ctl/bin/" + name
}

// kmckey starts our rdmacore-built mckey in the guest, like g.mckey.
func (g *guest) kmckey(t *testing.T, args ...string) *gcmd {
	t.Helper()
	bin := g.install(t, hostBuild(t, "mckey-rdmacore", "github.com/softrdma/softrdma/cmd/mckey"))
	return g.start(t, "mckey(rdmacore) "+strings.Join(args, " "),
		"exec timeout -s KILL 150 "+bin+" "+strings.Join(args, " "))
}

// stdout returns a finished command's standard output.
func (c *gcmd) stdout() string {
	b, _ := os.ReadFile(c.path(".out"))
	return string(b)
}

// sameLines compares two mckey outputs line by line, the group written
// as GROUP.
func sameLines(t *testing.T, what, ours, theirs string, ourGroup, theirGroup netip.Addr) {
	t.Helper()
	a := strings.ReplaceAll(ours, ourGroup.String(), "GROUP")
	b := strings.ReplaceAll(theirs, theirGroup.String(), "GROUP")
	if a != b {
		t.Errorf("%s: our mckey (rdmacore) printed\n%s\nrdma-core's mckey printed\n%s", what, nettest.Indent(a), nettest.Indent(b))
	}
}

// TestKernelMckey: every direction between our mckey on the kernel's rxe
// (g1), rdma-core's mckey (g2) and softrdma's mckey (host); g1's rxe
// counters show that the kernel carried our traffic, and our mckey prints
// what rdma-core's prints with the same arguments.
func TestKernelMckey(t *testing.T) {
	l := needLab(t)
	g1, g2 := l.guests[0], l.guests[1]
	const n, size = 8, 200
	count, sz := fmt.Sprint(n), fmt.Sprint(size)

	t.Run("rdma-core-to-ours", func(t *testing.T) {
		note := report(t)
		g := randGroups(1)[0]
		rcvd := g1.counter(t, "rcvd_pkts")
		recv := g1.kmckey(t, "-m", g.String(), "-b", g1.addr.String(), "-C", count, "-S", sz)
		recv.waitLine(joinedLine(g), lineTimeout)
		l.waitMDB(t, g, g1.port, true, wireTimeout)
		l.waitQuerier()
		send := g2.mckey(t, "-m", g.String(), "-b", g2.addr.String(), "-s", "-C", count, "-S", sz)
		send.expectExit(0, exitTimeout)
		recv.expectExit(0, exitTimeout)
		if d := g1.counter(t, "rcvd_pkts") - rcvd; d < n {
			t.Errorf("%s rxe0 rcvd_pkts +%d, want ≥ %d: the kernel did not carry the traffic", g1.name, d, n)
		}
		// The same receiver arguments in g1 with rdma-core's mckey.
		g0 := randGroups(1)[0]
		crecv := g1.mckey(t, "-m", g0.String(), "-b", g1.addr.String(), "-C", count, "-S", sz)
		crecv.waitLine(joinedLine(g0), lineTimeout)
		l.waitMDB(t, g0, g1.port, true, wireTimeout)
		g2.mckey(t, "-m", g0.String(), "-b", g2.addr.String(), "-s", "-C", count, "-S", sz).expectExit(0, exitTimeout)
		crecv.expectExit(0, exitTimeout)
		sameLines(t, "receiver", recv.stdout(), crecv.stdout(), g, g0)
		note.set("rdma-core mckey g2 → our mckey (rdmacore) g1: %d×%dB, rcvd_pkts counted, same lines as rdma-core's receiver", n, size)
	})

	t.Run("softrdma-to-ours", func(t *testing.T) {
		note := report(t)
		g := randGroups(1)[0]
		rcvd := g1.counter(t, "rcvd_pkts")
		recv := g1.kmckey(t, "-m", g.String(), "-b", g1.addr.String(), "-C", count, "-S", sz)
		recv.waitLine(joinedLine(g), lineTimeout)
		l.waitMDB(t, g, g1.port, true, wireTimeout)
		l.waitQuerier()
		send := l.mckey(t, "-m", g.String(), "-b", l.hostAddr.String(), "-s", "-C", count, "-S", sz)
		send.ExpectExit(0, exitTimeout)
		recv.expectExit(0, exitTimeout)
		if d := g1.counter(t, "rcvd_pkts") - rcvd; d < n {
			t.Errorf("%s rxe0 rcvd_pkts +%d, want ≥ %d", g1.name, d, n)
		}
		note.set("softrdma mckey host → our mckey (rdmacore) g1: %d×%dB", n, size)
	})

	t.Run("ours-to-rdma-core-and-softrdma", func(t *testing.T) {
		note := report(t)
		g := randGroups(1)[0]
		crecv := g2.mckey(t, "-m", g.String(), "-b", g2.addr.String(), "-C", count, "-S", sz)
		srecv := l.mckey(t, "-m", g.String(), "-b", l.hostAddr.String(), "-C", count, "-S", sz, "--timeout", "60s", "--join-pause", "1s")
		crecv.waitLine(joinedLine(g), lineTimeout)
		srecv.WaitLine(joinedLine(g), lineTimeout)
		l.waitMDB(t, g, g2.port, true, wireTimeout)
		l.waitMDB(t, g, l.hostPort, true, wireTimeout)
		l.waitQuerier()
		sent := g1.counter(t, "sent_pkts")
		send := g1.kmckey(t, "-m", g.String(), "-b", g1.addr.String(), "-s", "-C", count, "-S", sz)
		send.expectExit(0, exitTimeout)
		crecv.expectExit(0, exitTimeout)
		srecv.ExpectExit(0, exitTimeout)
		if d := g1.counter(t, "sent_pkts") - sent; d < n {
			t.Errorf("%s rxe0 sent_pkts +%d, want ≥ %d: the kernel did not send our traffic", g1.name, d, n)
		}
		// The same sender arguments in g1 with rdma-core's mckey, to a
		// receiver in g2.
		g0 := randGroups(1)[0]
		r0 := g2.mckey(t, "-m", g0.String(), "-b", g2.addr.String(), "-C", count, "-S", sz)
		r0.waitLine(joinedLine(g0), lineTimeout)
		l.waitMDB(t, g0, g2.port, true, wireTimeout)
		csend := g1.mckey(t, "-m", g0.String(), "-b", g1.addr.String(), "-s", "-C", count, "-S", sz)
		csend.expectExit(0, exitTimeout)
		r0.expectExit(0, exitTimeout)
		sameLines(t, "sender", send.stdout(), csend.stdout(), g, g0)
		note.set("our mckey (rdmacore) g1 → rdma-core mckey g2 and softrdma mckey host: %d×%dB each, sent_pkts counted, same lines as rdma-core's sender", n, size)
	})
}

// roceV2Index is a shell command printing the index of rxe0's RoCE v2
// GID of the IPv4 address.
const roceV2Index = `cd /sys/class/infiniband/rxe0/ports/1 && for f in gids/*; do i=${f#gids/}; ` +
	`case "$(cat $f)" in 0000:0000:0000:0000:0000:ffff:*) [ "$(cat gid_attrs/types/$i 2>/dev/null)" = "RoCE v2" ] && echo $i && break;; esac; done`

// TestKernelSendCost measures the data path's cost per message on the
// kernel's rxe against rdma-core's ib_send_bw -c UD in the same guest: n
// UD sends of 64 bytes, a window of outstanding sends, completions
// busy-polled (provider/rdmacore's TestSendCost, built without the race
// detector, to a multicast group; ib_send_bw to its server in g2). It
// asserts that both runs complete; the figures and their ratio are for
// the closing note, not a pass mark (a TCG guest is slow and noisy).
// rdma-core's mckey is no reference here: its sender exits right after
// posting its sends unsignaled, before rxe has sent them all.
func TestKernelSendCost(t *testing.T) {
	l := needLab(t)
	note := report(t)
	g1, g2 := l.guests[0], l.guests[1]
	const n = 20000
	bin := buildGoTestRace(t, "./provider/rdmacore", false)
	out, rc := g1.runGoTest(t, bin, []string{fmt.Sprintf("SOFTRDMA_RDMACORE_SEND_COST=%d", n)}, "-test.v", "-test.run", "^TestSendCost$")
	var oursWall, oursCPU float64
	for _, line := range strings.Split(out, "\n") {
		var nn int
		if _, err := fmt.Sscanf(line, "SENDCOST n=%d wall_ns=%g cpu_ns=%g", &nn, &oursWall, &oursCPU); err == nil {
			break
		}
	}
	if rc != 0 || oursWall == 0 {
		t.Fatalf("TestSendCost in %s: exit status %d:\n%s", g1.name, rc, nettest.Indent(out))
	}
	t.Logf("ours: %.0f ns wall, %.0f ns CPU per message", oursWall, oursCPU)

	perf := fmt.Sprintf("ib_send_bw -c UD -d rxe0 -x $(%s) -s 64 -n %d", roceV2Index, n)
	c := runPerftest(t, g1, g2, "ib_send_bw", "exec timeout -s KILL 200 stdbuf -oL "+perf,
		"exec bash -c \"TIMEFORMAT='TIMES %3R %3U %3S'; time timeout -s KILL 200 "+perf+" "+g2.addr.String()+"\"")
	var real, user, sys float64
	mpps := perftest64(c.stdout()) // #bytes #iterations BW peak BW average MsgRate[Mpps]
	errb, _ := os.ReadFile(c.path(".err"))
	for _, line := range strings.Split(string(errb), "\n") {
		if _, err := fmt.Sscanf(line, "TIMES %g %g %g", &real, &user, &sys); err == nil {
			break
		}
	}
	if mpps == 0 {
		t.Fatalf("no ib_send_bw result line:\n%s", c.output())
	}
	cWall := 1e3 / mpps
	cCPU := (user + sys) * 1e9 / n // includes its setup and handshake
	note.set("UD send cost per 64B message on %s's rxe0 (TCG guest, %d sends): ours %.0f ns wall / %.0f ns CPU; ib_send_bw -c UD %.0f ns wall (%.3f Mpps) / %.0f ns CPU (whole process); wall ratio %.2fx",
		g1.name, n, oursWall, oursCPU, cWall, mpps, cCPU, oursWall/cWall)
}

// runPerftest runs one of perftest's tools: its server (srvScript) in g2
// until it waits for its client, then the client (cliScript, against
// g2) in g1; it returns the client once both exited, the client with
// status 0.
func runPerftest(t *testing.T, g1, g2 *guest, name, srvScript, cliScript string) *gcmd {
	t.Helper()
	srv := g2.start(t, name+" server", srvScript)
	if err := srv.poll(lineTimeout, func() bool {
		b, _ := os.ReadFile(srv.path(".out"))
		return strings.Contains(string(b), "Waiting for client")
	}); err != nil {
		t.Fatalf("%s server not ready: %v\n%s", name, err, srv.output())
	}
	c := g1.start(t, name+" client", cliScript)
	if rc := c.wait(exitTimeout * 2); rc != 0 {
		t.Fatalf("%s: exit status %d:\n%s", c.name, rc, nettest.Indent(c.output()))
	}
	srv.wait(exitTimeout)
	return c
}

// perftest64 returns the fifth figure of a perftest tool's result line for
// 64-byte messages (0 if there is none).
func perftest64(out string) float64 {
	for _, line := range strings.Split(out, "\n") {
		var bytes, iters int
		var a, b, v float64
		if _, err := fmt.Sscanf(line, "%d %d %g %g %g", &bytes, &iters, &a, &b, &v); err == nil && bytes == 64 {
			return v
		}
	}
	return 0
}
