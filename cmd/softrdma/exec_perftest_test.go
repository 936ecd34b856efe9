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

	"github.com/softrdma/softrdma/internal/harness/testenv"
)

// requirePerftest skips (fails under CI) without Debian's perftest.
func requirePerftest(t *testing.T, prog string) {
	t.Helper()
	requireRDMACore(t)
	if _, err := exec.LookPath(prog); err != nil {
		testenv.Require(t, "no %s (apt-get install perftest): %v", prog, err)
	}
}

// waitListen waits until a TCP socket of this network namespace listens
// on port (perftest's server prints its banner before it listens).
func waitListen(ctx context.Context, port int) error {
	want := fmt.Sprintf(":%04X 00000000:0000 0A", port)
	for {
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), want) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nothing listens on port %d: %w", port, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// runPerftest runs Debian's unmodified perftest program prog as server
// and client through softrdma exec on RoCEv2 over lo, UD QPs, for a timed
// run (-D: a UD datagram lost on the way cannot hang a timed run, and the
// run's end comes from perftest's SIGALRM handler, which must not run on
// a goroutine's stack). It returns the result line each side printed
// under the header that has header in it.
func runPerftest(t *testing.T, prog string, port int, header string, extra ...string) (server, client string) {
	t.Helper()
	dir := execDir(t)
	if !testenv.InNetns(t) {
		return "", ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// rxe_lo: softrdma's RoCEv2 device on lo, the only interface of the
	// namespace; GID index 0 is ::ffff:127.0.0.1 (TestExecDevinfo).
	args := append([]string{"stdbuf", "-oL", prog, "-d", "rxe_lo", "-x", "0", "-c", "UD", "-D", "2", "-p", strconv.Itoa(port)}, extra...)
	srv, sout := startExec(t, ctx, dir, args...)
	if err := waitListen(ctx, port); err != nil {
		srv.Process.Kill()
		srv.Wait()
		t.Fatalf("%s server: %v\n%s", prog, err, sout)
	}
	cli, cout := startExec(t, ctx, dir, append(args, "127.0.0.1")...)
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
// binary, unmodified) between two processes through softrdma exec: UD
// QPs made with ibv_create_qp and walked RESET→INIT→RTR→RTS by
// ibv_modify_qp with perftest's masks, AHs from the peer's GID, sends and
// receives through the context's ops; both sides finish and report a
// bandwidth above zero for 4096-byte messages (perftest cuts UD messages
// to the MTU).
func TestExecPerftestSendBW(t *testing.T) {
	requirePerftest(t, "ib_send_bw")
	srv, cli := runPerftest(t, "ib_send_bw", 18523, "BW average[MB/sec]")
	if srv == "" && cli == "" {
		return
	}
	for side, l := range map[string]string{"server": srv, "client": cli} {
		v := fields(t, l, 5) // #bytes #iterations BW-peak BW-average MsgRate
		if v[0] != 4096 || v[1] <= 0 || v[3] <= 0 || v[4] <= 0 {
			t.Errorf("%s: result %q: want 4096-byte messages, iterations, a bandwidth and a message rate", side, l)
		}
	}
}

// TestExecPerftestSendLat runs perftest's ib_send_lat -c UD through
// softrdma exec: ping-pong over UD QPs, each side polling its CQ; both
// report an average latency.
func TestExecPerftestSendLat(t *testing.T) {
	requirePerftest(t, "ib_send_lat")
	srv, cli := runPerftest(t, "ib_send_lat", 18524, "t_avg[usec]")
	if srv == "" && cli == "" {
		return
	}
	lat := regexp.MustCompile(`^\d+\s+\d+\s+[\d.]+\s+[\d.]+`)
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
