package interop

import (
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/test/nettest"
	"github.com/softrdma/softrdma/test/testenv"
)

// TestKernelLatency runs the latency part's multicast ping-pong
// (cmd/softrdma/internal/bench's TestLatencyPeer, built without the race detector)
// through the rdma-core backend on the kernel's rxe — ping in g1, pong in
// g2 — against the C path between the same guests: the same ping-pong in C
// on librdmacm (mcpingpong/mcpingpong.c), and rdma-core's ib_send_lat -c
// UD, for blocking waits (rdma_get_recv_comp; CQ events; ib_send_lat -e)
// and busy-polling. ib_send_lat prints half a round trip
// (t_typical, its median); ours are round trips, compared with twice it.
// The same ping-pong over plain UDP multicast sockets between the guests
// tells the multicast path's own cost (ib_send_lat is unicast); ours runs
// twice, with the guest's one P (one vCPU) and with GOMAXPROCS=2 (both
// peers alike). Each peer's RUNTIME line (cgo calls per round trip, the Go
// scheduler's latencies) is logged. SOFTRDMA_KERNELLAT_AB=1 runs
// kernelLatencyAB instead; SOFTRDMA_KERNELLAT_PROFILE=1 kernelLatencyProfile.
// It asserts that every run completes; the figures and ratios are for the
// closing note, not a pass mark (a TCG guest is slow and noisy).
func TestKernelLatency(t *testing.T) {
	l := needLab(t)
	note := report(t)
	g1, g2 := l.guests[0], l.guests[1]
	const n = 2000
	bin := buildGoTestRace(t, "./cmd/softrdma/internal/bench", false)
	ping, pong := g1.install(t, bin), g2.install(t, bin)
	peer := func(role, wait, bind, in, out string, extra ...string) string {
		env := []string{testenv.NetnsGiven, "SOFTRDMA_LAT_PEER=" + role, "SOFTRDMA_LAT_WAIT=" + wait, "SOFTRDMA_LAT_BIND=" + bind,
			"SOFTRDMA_LAT_GROUP=" + in, "SOFTRDMA_LAT_GROUP2=" + out}
		env = append(env, extra...)
		return "cd /tmp && exec timeout -s KILL 300 env " + strings.Join(env, " ")
	}
	// pingPong runs the ping-pong in mode (rdma, udp) and returns the
	// round trip's p50 and p99 in ns.
	pingPong := func(mode, wait string, extra ...string) (p50, p99 int64) {
		const a, b = "239.77.1.1", "239.77.1.2"
		// The UDP baseline on another port than 4791, which the guests'
		// rxe holds.
		m := strings.Join(append([]string{"SOFTRDMA_LAT_MODE=" + mode, "SOFTRDMA_LAT_PORT=4792"}, extra...), " ")
		p := g2.start(t, "pong "+mode+" "+wait, peer("pong", wait, g2.addr.String(), a, b, m)+" "+pong+" -test.run '^TestLatencyPeer$' -test.v 2>&1")
		p.waitLine("PONG READY", lineTimeout)
		c := g1.start(t, "ping "+mode+" "+wait, peer("ping", wait, g1.addr.String(), b, a, m, fmt.Sprintf("SOFTRDMA_LAT_COUNT=%d", n))+" "+ping+" -test.run '^TestLatencyPeer$' -test.v 2>&1")
		if rc := c.wait(exitTimeout * 3); rc != 0 {
			t.Fatalf("%s: exit status %d:\n%s", c.name, rc, nettest.Indent(c.output()))
		}
		if rc := p.wait(exitTimeout); rc != 0 {
			t.Fatalf("%s: exit status %d:\n%s", p.name, rc, nettest.Indent(p.output()))
		}
		var got, lost int64
		for _, line := range strings.Split(c.stdout(), "\n") {
			if _, err := fmt.Sscanf(line, "LATENCY n=%d p50_ns=%d p99_ns=%d lost=%d", &got, &p50, &p99, &lost); err == nil {
				break
			}
		}
		if got == 0 {
			t.Fatalf("no LATENCY line:\n%s", c.output())
		}
		// The Go runtime's view of both sides (cgo calls per round
		// trip, scheduling latencies): see bench's runStats; and their
		// CPU profiles, when asked for.
		for i, out := range []string{c.stdout(), p.stdout()} {
			for _, line := range strings.Split(out, "\n") {
				if strings.HasPrefix(line, "RUNTIME ") {
					t.Logf("%s %s %s: %s", mode, wait, strings.Join(extra, " "), line)
				}
				if b64, ok := strings.CutPrefix(line, "CPUPROFILE "); ok {
					logProfile(t, bin, fmt.Sprintf("%s %s %s %s", []string{"ping", "pong"}[i], mode, wait, strings.Join(extra, " ")), b64)
				}
			}
		}
		return p50, p99
	}
	// The C path: mcpingpong (this folder), the same multicast ping-pong
	// in C on librdmacm and libibverbs, built on the host against
	// Debian's headers and libraries, the guests' too.
	cbin := filepath.Join(theLab.dir, "mcpingpong")
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-o", cbin, "mcpingpong/mcpingpong.c", "-lrdmacm", "-libverbs").CombinedOutput(); err != nil {
		t.Fatalf("gcc mcpingpong.c: %v\n%s", err, out)
	}
	cping, cpong := g1.install(t, cbin), g2.install(t, cbin)
	cPingPong := func(wait string) (p50 int64) {
		e := ""
		if wait == "block" {
			e = " -e"
		}
		const a, b = "239.77.2.1", "239.77.2.2"
		p := g2.start(t, "mcpingpong pong "+wait, fmt.Sprintf("exec timeout -s KILL 300 stdbuf -oL %s -p -b %s -r %s -s %s%s", cpong, g2.addr, a, b, e))
		p.waitLine("PONG READY", lineTimeout)
		c := g1.start(t, "mcpingpong ping "+wait, fmt.Sprintf("exec timeout -s KILL 300 %s -b %s -r %s -s %s -n %d%s", cping, g1.addr, b, a, n, e))
		if rc := c.wait(exitTimeout * 3); rc != 0 {
			t.Fatalf("%s: exit status %d:\n%s", c.name, rc, nettest.Indent(c.output()))
		}
		if rc := p.wait(exitTimeout); rc != 0 {
			t.Fatalf("%s: exit status %d:\n%s", p.name, rc, nettest.Indent(p.output()))
		}
		var got, p99, lost int64
		for _, line := range strings.Split(c.stdout(), "\n") {
			if _, err := fmt.Sscanf(line, "LATENCY n=%d p50_ns=%d p99_ns=%d lost=%d", &got, &p50, &p99, &lost); err == nil {
				break
			}
		}
		if got == 0 {
			t.Fatalf("no LATENCY line:\n%s", c.output())
		}
		for _, out := range []string{c.stdout(), p.stdout()} {
			for _, line := range strings.Split(out, "\n") {
				if strings.HasPrefix(line, "CPU ") {
					t.Logf("mcpingpong %s: %s", wait, line)
				}
			}
		}
		return p50
	}
	if os.Getenv("SOFTRDMA_KERNELLAT_AB") != "" {
		kernelLatencyAB(t, pingPong, cPingPong)
		return
	}
	if os.Getenv("SOFTRDMA_KERNELLAT_PROFILE") != "" {
		kernelLatencyProfile(t, pingPong, cPingPong)
		return
	}
	var lines []string
	for _, wait := range []string{"block", "poll"} {
		p50, p99 := pingPong("rdma", wait)
		// With one vCPU a Go program has one P: a goroutine back from a
		// cgo call or a blocking system call waits for it when the
		// runtime handed it off meanwhile (slow under TCG). Two Ps show
		// that cost apart.
		g50, _ := pingPong("rdma", wait, "GOMAXPROCS=2")
		c50 := cPingPong(wait)
		u50, _ := pingPong("udp", wait)

		perf := fmt.Sprintf("ib_send_lat -c UD -d rxe0 -x $(%s) -s 64 -n %d", roceV2Index, n)
		if wait == "block" {
			perf += " -e"
		}
		cl := runPerftest(t, g1, g2, "ib_send_lat "+wait, "exec timeout -s KILL 200 stdbuf -oL "+perf,
			"exec timeout -s KILL 200 stdbuf -oL "+perf+" "+g2.addr.String())
		typical := perftest64(cl.stdout()) // #bytes #iterations t_min t_max t_typical
		if typical == 0 {
			t.Fatalf("no ib_send_lat result line:\n%s", cl.output())
		}
		cRTT := 2 * typical * 1e3
		line := fmt.Sprintf("%s: ours p50 %.1f µs (p99 %.1f), with GOMAXPROCS=2 %.1f µs, C (mcpingpong) p50 %.1f µs (ratio %.2fx, GOMAXPROCS=2 %.2fx), plain UDP multicast p50 %.1f µs (ratio %.2fx), ib_send_lat%s (unicast) 2×t_typical %.1f µs (ratio %.2fx)",
			wait, float64(p50)/1e3, float64(p99)/1e3, float64(g50)/1e3, float64(c50)/1e3, float64(p50)/float64(c50), float64(g50)/float64(c50), float64(u50)/1e3, float64(p50)/float64(u50),
			map[bool]string{true: " -e", false: ""}[wait == "block"], cRTT/1e3, float64(p50)/cRTT)
		t.Log(line)
		lines = append(lines, line)
	}
	note.set("multicast ping-pong round trip on rxe0 between %s and %s (TCG guests, 64 B): %s", g1.name, g2.name, strings.Join(lines, "; "))
}

// kernelLatencyAB compares the kernel backend's ways to wait, interleaved
// in one lab (the host is shared and noisy: runs minutes apart are not
// comparable): blocking, the default (PollWait, asleep in Go's netpoller
// with one P and in C with more), the verbs calls as before it
// (SOFTRDMA_RDMACORE_WAIT=verbs) and PollWait asleep the other way;
// busy-polling, a Poll that spins 10 µs in C (SOFTRDMA_RDMACORE_POLLSPIN)
// against one call into C per poll (the default, as before); each at
// GOMAXPROCS 1 and 2 on both peers, with the C ping-pong in every round,
// twice over.
func kernelLatencyAB(t *testing.T, pingPong func(mode, wait string, extra ...string) (int64, int64), cPingPong func(wait string) int64) {
	type variant struct {
		name string
		env  []string
	}
	for _, wait := range []string{"block", "poll"} {
		for round := 1; round <= 2; round++ {
			c50 := cPingPong(wait)
			t.Logf("AB %s round %d: C (mcpingpong) p50 %.1f µs", wait, round, float64(c50)/1e3)
			for _, procs := range []string{"GOMAXPROCS=1", "GOMAXPROCS=2"} {
				vs := []variant{{"fused", nil}, {"verbs (before)", []string{"SOFTRDMA_RDMACORE_WAIT=verbs", "SOFTRDMA_RDMACORE_POLLSPIN=0"}}}
				if wait == "poll" {
					vs[0] = variant{"spinning 10 µs in C", []string{"SOFTRDMA_RDMACORE_POLLSPIN=10us"}}
				}
				if wait == "block" && procs == "GOMAXPROCS=1" {
					vs = append(vs, variant{"fused, asleep in C", []string{"SOFTRDMA_RDMACORE_WAIT=thread"}})
				} else if wait == "block" {
					vs = append(vs, variant{"fused, asleep in the netpoller", []string{"SOFTRDMA_RDMACORE_WAIT=netpoll"}})
				}
				for _, v := range vs {
					p50, p99 := pingPong("rdma", wait, append([]string{procs}, v.env...)...)
					t.Logf("AB %s round %d: %s %s: p50 %.1f µs (%.2fx C), p99 %.1f µs", wait, round, procs, v.name,
						float64(p50)/1e3, float64(p50)/float64(c50), float64(p99)/1e3)
				}
			}
		}
	}
}

// kernelLatencyProfile profiles both Go peers' CPU (1000 samples a second
// of CPU time, SOFTRDMA_LAT_CPUPROFILE) in each wait and GOMAXPROCS, the
// kernel backend and Go's plain UDP ping-pong alike, with the C ping-pong
// before each pair: where Go's CPU per round trip goes in the guests, which
// have no profiler of their own. The profiles' top functions are logged.
func kernelLatencyProfile(t *testing.T, pingPong func(mode, wait string, extra ...string) (int64, int64), cPingPong func(wait string) int64) {
	for _, wait := range []string{"block", "poll"} {
		for _, procs := range []string{"GOMAXPROCS=1", "GOMAXPROCS=2"} {
			c50 := cPingPong(wait)
			for _, mode := range []string{"rdma", "udp"} {
				p50, _ := pingPong(mode, wait, procs, "SOFTRDMA_LAT_CPUPROFILE=1000")
				t.Logf("PROFILE %s %s %s: p50 %.1f µs (%.2fx C's %.1f µs)", mode, wait, procs, float64(p50)/1e3, float64(p50)/float64(c50), float64(c50)/1e3)
			}
		}
	}
}

// logProfile logs the top functions of a peer's CPU profile (pprof's
// format, base64) taken by the test binary bin.
func logProfile(t *testing.T, bin, name, b64 string) {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Errorf("%s: CPU profile: %v", name, err)
		return
	}
	f := filepath.Join(t.TempDir(), "cpu.pprof")
	if err := os.WriteFile(f, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, how := range []string{"-top", "-top -cum"} {
		args := append([]string{"tool", "pprof"}, strings.Fields(how)...)
		out, err := exec.Command(nettest.GoTool(), append(args, "-nodecount=30", bin, f)...).CombinedOutput()
		if err != nil {
			t.Errorf("%s: go tool pprof %s: %v\n%s", name, how, err, out)
			return
		}
		t.Logf("%s: pprof %s:\n%s", name, how, nettest.Indent(string(out)))
	}
}
