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

	"github.com/softrdma/softrdma/internal/nettest"
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

// timed runs a command in the guest under bash's time and returns its
// user+system CPU seconds and wall seconds; it fails the test unless the
// command exits 0.
func (g *guest) timed(t *testing.T, name, cmd string) (cpu, wall float64) {
	t.Helper()
	c := g.start(t, name, "exec bash -c \"TIMEFORMAT='TIMES %3R %3U %3S'; time "+cmd+"\"")
	if rc := c.wait(exitTimeout); rc != 0 {
		t.Fatalf("%s: exit status %d:\n%s", c.name, rc, nettest.Indent(c.output()))
	}
	b, _ := os.ReadFile(c.path(".err"))
	var r, u, s float64
	for _, line := range strings.Split(string(b), "\n") {
		if _, err := fmt.Sscanf(line, "TIMES %f %f %f", &r, &u, &s); err == nil {
			return u + s, r
		}
	}
	t.Fatalf("%s: no time line in stderr:\n%s", c.name, b)
	return 0, 0
}

// roceV2Index is a shell command printing the index of rxe0's RoCE v2
// GID of the IPv4 address.
const roceV2Index = `cd /sys/class/infiniband/rxe0/ports/1 && for f in gids/*; do i=${f#gids/}; ` +
	`case "$(cat $f)" in 0000:0000:0000:0000:0000:ffff:*) [ "$(cat gid_attrs/types/$i 2>/dev/null)" = "RoCE v2" ] && echo $i && break;; esac; done`

// TestKernelSendCost measures the CPU time per message of our mckey
// sender on the kernel's rxe against rdma-core's mckey with the same
// arguments in the same guest (each sender posts all its sends unsignaled,
// so the process time is the cost of posting them and of rxe's send
// path, which runs in the post's system call), and reports rdma-core's
// ib_send_bw -c UD message rate in this guest for scale. It asserts that
// every run completes and that the kernel sent every message; the figures
// are for the closing note, not a pass mark (a TCG guest is slow and
// noisy).
func TestKernelSendCost(t *testing.T) {
	l := needLab(t)
	note := report(t)
	g1, g2 := l.guests[0], l.guests[1]
	// mckey's CQ has 2×n entries: rxe's max_cqe is 32767.
	const n, size = 10000, 64
	bin := g1.install(t, hostBuild(t, "mckey-rdmacore", "github.com/softrdma/softrdma/cmd/mckey"))
	args := func(g netip.Addr) string {
		return fmt.Sprintf("-m %v -b %v -s -C %d -S %d", g, g1.addr, n, size)
	}
	best := map[string]float64{}
	for round := range 2 {
		for _, who := range []string{"rdma-core", "ours"} {
			prog := "mckey"
			if who == "ours" {
				prog = bin
			}
			g := randGroups(1)[0]
			sent := g1.counter(t, "sent_pkts")
			cpu, wall := g1.timed(t, fmt.Sprintf("%s sender round %d", who, round), prog+" "+args(g))
			if d := g1.counter(t, "sent_pkts") - sent; d < n {
				t.Errorf("%s sender: rxe0 sent_pkts +%d, want ≥ %d", who, d, n)
			}
			t.Logf("%s mckey sender: %d×%dB in %.3fs wall, %.3fs CPU: %.2f µs CPU per message", who, n, size, wall, cpu, cpu/n*1e6)
			if v, ok := best[who]; !ok || cpu < v {
				best[who] = cpu
			}
		}
	}
	// rdma-core's UD bandwidth test between the guests, for scale.
	srv := g2.start(t, "ib_send_bw server", "exec timeout -s KILL 120 ib_send_bw -c UD -d rxe0 -x $("+roceV2Index+") -s 64 -n 5000")
	var rate string
	err := srv.poll(lineTimeout, func() bool {
		b, _ := os.ReadFile(srv.path(".out"))
		return strings.Contains(string(b), "Waiting for client")
	})
	if err != nil {
		t.Fatalf("ib_send_bw server not ready: %v\n%s", err, srv.output())
	}
	out := g1.run(t, fmt.Sprintf("timeout -s KILL 120 ib_send_bw -c UD -d rxe0 -x $(%s) -s 64 -n 5000 %v", roceV2Index, g2.addr))
	srv.wait(exitTimeout)
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 5 && f[0] == "64" { // #bytes #iterations BW-peak BW-average MsgRate[Mpps]
			rate = f[4] + " Mpps"
		}
	}
	if rate == "" {
		t.Errorf("no ib_send_bw result line:\n%s", out)
	}
	ratio := best["ours"] / best["rdma-core"]
	note.set("sender CPU per message, %d×%dB, best of 2, kernel rxe in a TCG guest: rdma-core mckey %.2f µs, our mckey (rdmacore) %.2f µs (%.2f×); ib_send_bw -c UD 64B: %s",
		n, size, best["rdma-core"]/n*1e6, best["ours"]/n*1e6, ratio, rate)
}
