package bench

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"testing"
	"time"
)

// Environment of TestLatencyPeer.
const (
	latPeerEnv = "SOFTRDMA_LAT_PEER" // "ping" or "pong"
)

// TestLatencyPeer is one side of the latency part's ping-pong, for a run
// driven from outside this process (the interop suite runs it in two QEMU
// guests on the kernel's rxe, through the rdma-core backend, against
// rdma-core's ib_send_lat): SOFTRDMA_LAT_PEER=pong answers, on
// SOFTRDMA_LAT_GROUP2, what arrives on SOFTRDMA_LAT_GROUP until the
// pinger's stop message, printing "PONG READY" once joined; =ping makes
// SOFTRDMA_LAT_COUNT round trips (after 200 warm-up) to the opposite
// groups and prints "LATENCY n=… p50_ns=… p99_ns=… lost=…".
// SOFTRDMA_LAT_BIND is the local address, SOFTRDMA_LAT_WAIT block or poll,
// SOFTRDMA_LAT_MODE rdma (the default) or udp (plain UDP sockets with raw
// system calls, the baseline, on port SOFTRDMA_LAT_PORT if set).
// Both sides end with a "RUNTIME …" line: the Go runtime's cgo calls per
// round and its scheduling latencies over the run (runStats). With
// SOFTRDMA_LAT_CPUPROFILE=HZ (e.g. 1000) a side also profiles its CPU over
// the run at HZ samples a second and prints the profile (pprof's format,
// base64) on a last line "CPUPROFILE …", for a machine with no profiler
// of its own (the interop suite's TCG guests).
// Skipped without SOFTRDMA_LAT_PEER.
func TestLatencyPeer(t *testing.T) {
	role := os.Getenv(latPeerEnv)
	if role == "" {
		t.Skipf("one side of a ping-pong run from outside: set %s=ping|pong", latPeerEnv)
	}
	count, _ := strconv.Atoi(os.Getenv("SOFTRDMA_LAT_COUNT"))
	mode := os.Getenv("SOFTRDMA_LAT_MODE")
	if mode == "" {
		mode = "rdma"
	}
	port, _ := strconv.Atoi(os.Getenv("SOFTRDMA_LAT_PORT"))
	if hz, _ := strconv.Atoi(os.Getenv("SOFTRDMA_LAT_CPUPROFILE")); hz > 0 {
		var prof bytes.Buffer
		// Before StartCPUProfile, which then keeps this rate (and says
		// so on stderr): its own 100 Hz gives a few hundred samples in a
		// run under TCG.
		runtime.SetCPUProfileRate(hz)
		if err := pprof.StartCPUProfile(&prof); err != nil {
			t.Fatal(err)
		}
		defer func() {
			pprof.StopCPUProfile()
			fmt.Println("CPUPROFILE " + base64.StdEncoding.EncodeToString(prof.Bytes()))
		}()
	}
	req := rxRequest{Mode: mode, Port: uint16(port), Wait: os.Getenv("SOFTRDMA_LAT_WAIT"), Size: 64, Bind: os.Getenv("SOFTRDMA_LAT_BIND"),
		Group: os.Getenv("SOFTRDMA_LAT_GROUP"), Group2: os.Getenv("SOFTRDMA_LAT_GROUP2"), Count: count, Warmup: 200}
	switch role {
	case "pong":
		before := readRunStats()
		p, err := startPong(&req)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println("PONG READY")
		select {
		case <-p.done:
		case <-time.After(10 * time.Minute):
		}
		n, errs := p.stop()
		if errs != "" {
			t.Fatalf("pong: %s (after %d answers)", errs, n)
		}
		fmt.Printf("PONGS n=%d\n", n)
		fmt.Println(readRunStats().line("pong", before, n))
	case "ping":
		if count <= 0 {
			t.Fatal("SOFTRDMA_LAT_COUNT: no round trips")
		}
		before := readRunStats()
		rep := ping(&req)
		after := readRunStats()
		if rep.Err != "" {
			t.Fatalf("ping: %s", rep.Err)
		}
		rtts := slices.Clone(rep.RTTs)
		slices.Sort(rtts)
		if len(rtts) == 0 {
			t.Fatal("ping: no round trip")
		}
		fmt.Printf("LATENCY n=%d p50_ns=%d p99_ns=%d lost=%d\n", len(rtts), rtts[len(rtts)/2], rtts[len(rtts)*99/100], rep.Lost)
		// The whole run: set-up, warm-up and the stop message included.
		fmt.Println(after.line("ping", before, req.Warmup+count))
	default:
		t.Fatalf("%s=%q: want ping or pong", latPeerEnv, role)
	}
}
