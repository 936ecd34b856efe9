package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
)

// TestExecCapiStress runs testdata/capistress.c through softrdma exec: a
// chain with a bad WR fails on that WR (bad_wr) after the WRs before it
// were sent, for ibv_post_send and ibv_post_recv; then one thread posts
// chains of sends (some inline), one polls the receive CQ and reposts,
// one polls the send CQ (which only the first thread's posts fill, so
// ibv_poll_cq's early return on an empty CQ must see them): every message
// and every signaled completion arrives, in order.
func TestExecCapiStress(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	prog := buildCTest(t, dir, "capistress", "-lpthread")
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd, out := startExec(t, ctx, dir, prog, "rxe_lo")
	err := cmd.Wait()
	out.wait("\x00")
	t.Logf("capistress:\n%s", out)
	if err != nil {
		t.Fatalf("capistress: %v", err)
	}
	if s := out.String(); !strings.Contains(s, "\nPASSED") || strings.Contains(s, "FAIL") {
		t.Errorf("capistress did not pass")
	}
}

// TestBenchCapi runs `softrdma bench -parts capi -quick -json` on the
// libraries execDir built: capibench.c through them and its Go twin, and
// (with perftest) ib_send_lat and ib_send_bw -c UD against theirs; every
// case has both costs, their ratio and the runs' ratio, and both targets
// are judged. No
// timing is asserted.
func TestBenchCapi(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "softrdma"), "bench", "-parts", "capi", "-quick", "-json",
		"-capi-iters", "2000", "-capi-secs", "1", "-capi-libdir", filepath.Join(dir, "lib"))
	cmd.Env = testenv.CleanEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	perftest := true
	for _, p := range []string{"ib_send_lat", "ib_send_bw"} {
		if _, err := exec.LookPath(p); err != nil {
			perftest = false
		}
	}
	cases, targets := map[string]bool{}, 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var v struct {
			Kind, Case, Name, Measured, Unmeasured string
			C, Go, Ratio                           float64
			PairRatio                              float64 `json:"pair_ratio"`
		}
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		switch v.Kind {
		case "capi":
			cases[v.Case] = true
			if v.C <= 0 || v.Go <= 0 || v.Ratio <= 0 || v.PairRatio <= 0 {
				t.Errorf("case without both costs and a ratio: %s", sc.Text())
			}
		case "target":
			targets++
			if perftest && v.Unmeasured != "" {
				t.Errorf("target not measured with perftest installed: %s", sc.Text())
			}
		default:
			t.Errorf("unexpected line: %s", sc.Text())
		}
	}
	want := []string{"capibench poll_empty", "capibench post_send", "capibench post_recv", "capibench poll_full",
		"capibench pingpong", "capibench stream"}
	if perftest {
		want = append(want, "ib_send_lat -c UD 2 B, t_avg", "ib_send_bw -c UD 4096 B, 1/msg rate")
	}
	for _, c := range want {
		if !cases[c] {
			t.Errorf("no case %q in:\n%s", c, out)
		}
	}
	if targets != 2 {
		t.Errorf("%d target lines, want 2:\n%s", targets, out)
	}
}
