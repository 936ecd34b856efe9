package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
)

// requirePerftest skips (fails under CI) without Debian's perftest.
func requirePerftest(t *testing.T, prog string) {
	t.Helper()
	requireRDMACore(t)
	if _, err := exec.LookPath(prog); err != nil {
		testenv.Require(t, "no %s (apt-get install perftest): %v", prog, err)
	}
}

// waitListen waits until a TCP socket of network namespace ns (the
// test's own when "") listens on port (perftest's server prints its banner
// before it listens).
func waitListen(ctx context.Context, ns string, port int) error {
	want := fmt.Sprintf(":%04X 00000000:0000 0A", port)
	for {
		var tables []byte
		if ns == "" {
			for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
				b, _ := os.ReadFile(f)
				tables = append(tables, b...)
			}
		} else {
			tables, _ = exec.CommandContext(ctx, "ip", "netns", "exec", ns, "cat", "/proc/net/tcp", "/proc/net/tcp6").Output()
		}
		if strings.Contains(string(tables), want) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nothing listens on port %d: %w", port, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// perftestLink is where a perftest pair runs: each side's device, GID
// index (-x; "" on InfiniBand, where perftest addresses by LID), network
// namespace and environment, and the server's address for the client.
type perftestLink struct {
	name           string
	srvDev, cliDev string
	gid            string
	srvNS, cliNS   string
	srvEnv, cliEnv []string
	srvAddr        string
	// mtu is the RoCEv2 or IB MTU of the link: perftest cuts UD messages
	// to it (lo's 65536-byte MTU gives 4096, a veth's 1500 gives 1024).
	mtu float64
}

// perftestLinks sets up the links every perftest test runs on: RoCEv2 over
// lo in the test's namespace, RoCEv2 across a veth pair between two
// namespaces (a host each), and the emulated InfiniBand subnet (softsm in
// the test; each side opens the port of its IPoIB address through
// SOFTRDMA_IB_PORTS, as a program that uses only verbs does).
func perftestLinks(t *testing.T) []perftestLink {
	t.Helper()
	nsA, nsB := vethPair(t, "srpt")
	sm := startSM(t)
	return []perftestLink{
		// rxe_lo: softrdma's RoCEv2 device on lo; GID index 0 is
		// ::ffff:127.0.0.1 (TestExecDevinfo).
		{name: "lo", srvDev: "rxe_lo", cliDev: "rxe_lo", gid: "0", srvAddr: "127.0.0.1", mtu: 4096},
		{name: "veth", srvDev: "rxe_srmkb", cliDev: "rxe_srmka", gid: "0", srvNS: nsB, cliNS: nsA, srvAddr: vethB, mtu: 1024},
		{name: "ib", srvDev: "softib0", cliDev: "softib0", srvAddr: "127.0.0.1", mtu: 2048,
			srvEnv: []string{sm, "SOFTRDMA_IB_PORTS=127.0.3.31"}, cliEnv: []string{sm, "SOFTRDMA_IB_PORTS=127.0.3.32"}},
	}
}

// runPerftest runs Debian's unmodified perftest program prog as server
// and client through softrdma exec on link, UD QPs, for a timed run (-D: a
// UD datagram lost on the way cannot hang a timed run, and the run's end
// comes from perftest's SIGALRM handler, which must not run on a
// goroutine's stack). It returns the result line each side printed under
// the header that has header in it.
func runPerftest(t *testing.T, dir string, link perftestLink, prog string, port int, header string) (server, client string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := func(dev string) []string {
		a := []string{"stdbuf", "-oL", prog, "-d", dev, "-c", "UD", "-D", "2", "-p", strconv.Itoa(port)}
		if link.gid != "" {
			a = append(a, "-x", link.gid)
		}
		return a
	}
	srv, sout := startExecNS(t, ctx, dir, link.srvNS, link.srvEnv, args(link.srvDev)...)
	if err := waitListen(ctx, link.srvNS, port); err != nil {
		srv.Process.Kill()
		srv.Wait()
		t.Fatalf("%s server: %v\n%s", prog, err, sout)
	}
	cli, cout := startExecNS(t, ctx, dir, link.cliNS, link.cliEnv, append(args(link.cliDev), link.srvAddr)...)
	cerr := cli.Wait()
	cout.wait("\x00")
	serr := srv.Wait()
	sout.wait("\x00")
	t.Logf("server:\n%s\nclient:\n%s", sout, cout)
	if cerr != nil || serr != nil {
		t.Fatalf("client: %v, server: %v", cerr, serr)
	}
	for side, out := range map[string]*lineWaiter{"server": sout, "client": cout} {
		if strings.Contains(out.String(), "not supported on softrdma") {
			t.Errorf("the %s called a call softrdma does not implement", side)
		}
	}
	return resultLine(t, sout.String(), header), resultLine(t, cout.String(), header)
}

// resultLine returns the line after perftest's result header.
func resultLine(t *testing.T, out, header string) string {
	t.Helper()
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if strings.Contains(l, header) && i+1 < len(lines) {
			return strings.TrimSpace(lines[i+1])
		}
	}
	t.Errorf("no result header %q in:\n%s", header, out)
	return ""
}

// fields parses a result line's numbers.
func fields(t *testing.T, line string, n int) []float64 {
	t.Helper()
	f := strings.Fields(line)
	if len(f) < n {
		t.Fatalf("result line %q: want %d numbers", line, n)
	}
	v := make([]float64, n)
	for i := range v {
		x, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			t.Fatalf("result line %q: %v", line, err)
		}
		v[i] = x
	}
	return v
}

// TestExecPerftestSendBW runs perftest's ib_send_bw -c UD (Debian's
// binary, unmodified) between two processes through softrdma exec, on
// RoCEv2 over lo and across a veth pair and on the emulated InfiniBand
// subnet: UD QPs made with ibv_create_qp and walked RESET→INIT→RTR→RTS by
// ibv_modify_qp with perftest's masks, AHs from the peer's GID (or LID),
// sends and receives through the context's ops; both sides finish and
// report a bandwidth above zero for messages of the link's MTU (perftest
// cuts UD messages to it).
func TestExecPerftestSendBW(t *testing.T) {
	requirePerftest(t, "ib_send_bw")
	dir := execDir(t)
	if !testenv.InNetns(t) {
		return
	}
	for i, link := range perftestLinks(t) {
		t.Run(link.name, func(t *testing.T) {
			srv, cli := runPerftest(t, dir, link, "ib_send_bw", 18523+2*i, "BW average[MB/sec]")
			size := link.mtu
			for side, l := range map[string]string{"server": srv, "client": cli} {
				v := fields(t, l, 5) // #bytes #iterations BW-peak BW-average MsgRate
				if v[0] != size || v[1] <= 0 || v[3] <= 0 || v[4] <= 0 {
					t.Errorf("%s: result %q: want %v-byte messages, iterations, a bandwidth and a message rate", side, l, size)
				}
			}
		})
	}
}

// TestExecPerftestSendLat runs perftest's ib_send_lat -c UD through
// softrdma exec on the same links: ping-pong over UD QPs, each side
// polling its CQ; both report an average latency.
func TestExecPerftestSendLat(t *testing.T) {
	requirePerftest(t, "ib_send_lat")
	dir := execDir(t)
	if !testenv.InNetns(t) {
		return
	}
	lat := regexp.MustCompile(`^\d+\s+\d+\s+[\d.]+\s+[\d.]+`)
	for i, link := range perftestLinks(t) {
		t.Run(link.name, func(t *testing.T) {
			srv, cli := runPerftest(t, dir, link, "ib_send_lat", 18524+2*i, "t_avg[usec]")
			for side, l := range map[string]string{"server": srv, "client": cli} {
				if !lat.MatchString(l) {
					t.Errorf("%s: result %q is no latency line", side, l)
					continue
				}
				v := fields(t, l, 4) // #bytes #iterations t_avg tps
				if v[0] != 2 || v[1] <= 0 || v[2] <= 0 || v[3] <= 0 {
					t.Errorf("%s: result %q: want 2-byte messages, iterations, a latency and a rate", side, l)
				}
			}
		})
	}
}

// TestExecBadInput compiles testdata/badinput.c against the distribution's
// headers and libraries and runs it through softrdma exec: NULL, freed
// and wrong objects, sizes and unsupported attributes (an RC QP, a
// comp_mask bit, IBV_QP_AV on a UD QP, a wrong option size) get
// rdma-core's errno and no crash; the calls this slice added (UD QPs
// through their states, ibv_query_qp, rdma_set_option, rdma_migrate_id,
// rdma_get_devices, rdma_get_local_addr, ibv_get_async_event) work; an
// unsupported call prints its one line on stderr once.
func TestExecBadInput(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	prog := buildCTest(t, dir, "badinput", "-lrdmacm")
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd, out := startExec(t, ctx, dir, prog)
	err := cmd.Wait()
	out.wait("\x00")
	t.Logf("badinput:\n%s", out)
	if err != nil {
		t.Fatalf("badinput: %v", err)
	}
	s := out.String()
	if !strings.Contains(s, "\nPASSED") || strings.Contains(s, "FAIL ") {
		t.Errorf("badinput did not pass")
	}
	if n := strings.Count(s, "ibv_create_qp with IBV_QPT_RC is not supported on softrdma's devices"); n != 1 {
		t.Errorf("the RC QP's line on stderr %d times, want once", n)
	}
}
