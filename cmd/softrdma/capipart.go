package main

// softrdma bench's capi part: the cost of the C path (a C program through
// softrdma's libibverbs, softrdma exec) against the Go path (the same
// calls and traffic through the Go API), measured in one run, runs of
// each kind interleaved, medians compared.

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/bench"
)

//go:embed testdata/capibench.c
var capibenchC []byte

// PartCapi is the name of the part in -parts.
const partCapi = "capi"

// capiConfig is what the capi part measures.
type capiConfig struct {
	dev     string // the device of both paths (rxe_lo: RoCEv2 on lo)
	iters   int    // capibench's ITERS
	secs    int    // perftest's -D and the twin's run time
	repeats int    // runs of each kind
	libdir  string // the libraries ("": found or built as softrdma exec does)
	port    int    // the first TCP port of the perftest runs
}

// capiResult is one case of the capi part: the median cost per operation
// or message of each path, their ratio, and the median of the runs'
// ratios.
type capiResult struct {
	Kind  string  `json:"kind"` // "capi"
	Case  string  `json:"case"`
	Unit  string  `json:"unit"`
	C     float64 `json:"c"`
	Go    float64 `json:"go"`
	Ratio float64 `json:"ratio"` // C / Go, of the medians
	// PairRatio is the median of the runs' ratios (run i of C against
	// run i of Go, measured one after the other): steadier than Ratio
	// when the machine's load drifts during the part. The targets use it.
	PairRatio float64   `json:"pair_ratio"`
	CBest     float64   `json:"c_best"` // the lowest cost of a run
	GoBest    float64   `json:"go_best"`
	CRuns     []float64 `json:"c_runs"`
	GRuns     []float64 `json:"go_runs"`
}

// capiRatioMax is the target: the C path's cost per message at
// most 1.2 times the Go path's.
const capiRatioMax = 1.2

// runCapiPart measures the capi part and prints its table (to table, if
// not nil), its JSON lines and its targets.
func runCapiPart(ctx context.Context, cfg capiConfig, table, jsonw io.Writer, log io.Writer) error {
	tablef := func(format string, a ...any) {
		if table != nil {
			fmt.Fprintf(table, format, a...)
		}
	}
	emit := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(jsonw, "%s\n", b)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := findLibs(ctx, cfg.libdir, log)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "softrdma-capibench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "capibench.c")
	prog := filepath.Join(tmp, "capibench")
	if err := os.WriteFile(src, capibenchC, 0o644); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "cc", "-O2", "-Wall", "-o", prog, src, "-libverbs").CombinedOutput(); err != nil {
		return fmt.Errorf("cc capibench.c (needs libibverbs-dev): %v\n%s", err, out)
	}
	execArgs := func(args ...string) []string {
		return append([]string{exe, "exec", "-libdir", dir, "--"}, args...)
	}

	tablef("\nC programs through softrdma's libibverbs (softrdma exec) against the Go API, device %s, %d runs each, interleaved\n", cfg.dev, cfg.repeats)
	tablef("(C, Go: medians; C/Go: of the medians; per run: the median of the runs' ratios, which the targets use; best: the lowest)\n")
	tablef("  %-40s %14s %14s %8s %8s %14s %14s\n", "case", "C", "Go", "C/Go", "per run", "C best", "Go best")
	var results []capiResult
	add := func(r *capiResult) {
		r.Kind = "capi"
		r.C, r.Go = median(r.CRuns), median(r.GRuns)
		r.CBest, r.GoBest = slices.Min(r.CRuns), slices.Min(r.GRuns)
		if r.Go > 0 {
			r.Ratio = r.C / r.Go
		}
		var pairs []float64
		for i := range min(len(r.CRuns), len(r.GRuns)) {
			if r.GRuns[i] > 0 {
				pairs = append(pairs, r.CRuns[i]/r.GRuns[i])
			}
		}
		r.PairRatio = median(pairs)
		results = append(results, *r)
		tablef("  %-40s %11.1f %-2s %11.1f %-2s %8.2f %8.2f %11.1f %-2s %11.1f %-2s\n", r.Case, r.C, r.Unit, r.Go, r.Unit,
			r.Ratio, r.PairRatio, r.CBest, r.Unit, r.GoBest, r.Unit)
		emit(r)
	}

	// capibench.c and its Go twin, in one process each.
	micro := map[string]*capiResult{}
	var order []string
	for i := 0; i < cfg.repeats; i++ {
		for _, side := range []string{"c", "go"} {
			args := execArgs(prog, cfg.dev, strconv.Itoa(cfg.iters))
			if side == "go" {
				args = []string{exe, capiGoCommand, cfg.dev, strconv.Itoa(cfg.iters)}
			}
			out, err := runOut(ctx, args)
			if err != nil {
				return fmt.Errorf("capibench (%s): %w", side, err)
			}
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				f := strings.Fields(l)
				if len(f) != 3 {
					continue
				}
				v, err := strconv.ParseFloat(f[1], 64)
				if err != nil {
					continue
				}
				r := micro[f[0]]
				if r == nil {
					r = &capiResult{Case: "capibench " + f[0], Unit: "ns"}
					micro[f[0]] = r
					order = append(order, f[0])
				}
				if side == "c" {
					r.CRuns = append(r.CRuns, v)
				} else {
					r.GRuns = append(r.GRuns, v)
				}
			}
		}
	}
	for _, name := range order {
		add(micro[name])
	}

	// perftest through the libraries against its Go twin, between two
	// processes each.
	var lat, bw *capiResult
	perftest := ""
	for _, p := range []string{"ib_send_lat", "ib_send_bw"} {
		if _, err := exec.LookPath(p); err != nil {
			perftest = fmt.Sprintf("no %s (apt-get install perftest)", p)
		}
	}
	if perftest == "" {
		lat = &capiResult{Case: "ib_send_lat -c UD 2 B, t_avg", Unit: "us"}
		bw = &capiResult{Case: "ib_send_bw -c UD 4096 B, 1/msg rate", Unit: "us"}
		port := cfg.port
		secs := strconv.Itoa(cfg.secs)
		for i := 0; i < cfg.repeats; i++ {
			for _, mode := range []string{"lat", "bw"} {
				prog, size, header, col := "ib_send_lat", "2", "t_avg[usec]", 2
				if mode == "bw" {
					prog, size, header, col = "ib_send_bw", "4096", "MsgRate[Mpps]", 4
				}
				args := execArgs(prog, "-d", cfg.dev, "-x", "0", "-c", "UD", "-D", secs, "-p", strconv.Itoa(port))
				port++
				_, cout, err := runPair(ctx, args, append(slices.Clone(args), "127.0.0.1"), port-1)
				if err != nil {
					return fmt.Errorf("%s: %w", prog, err)
				}
				v, err := perftestValue(cout, header, col)
				if err != nil {
					return fmt.Errorf("%s: %w", prog, err)
				}
				gargs := []string{exe, udCommand, mode, cfg.dev, strconv.Itoa(port), size, secs}
				port++
				_, gout, err := runPair(ctx, gargs, append(slices.Clone(gargs), "127.0.0.1"), port-1)
				if err != nil {
					return fmt.Errorf("%s %s: %w", udCommand, mode, err)
				}
				f := strings.Fields(gout)
				if len(f) != 3 || f[0] != mode {
					return fmt.Errorf("%s %s printed %q", udCommand, mode, gout)
				}
				g, err := strconv.ParseFloat(f[1], 64)
				if err != nil || g <= 0 {
					return fmt.Errorf("%s %s printed %q", udCommand, mode, gout)
				}
				if mode == "lat" {
					lat.CRuns, lat.GRuns = append(lat.CRuns, v), append(lat.GRuns, g)
				} else {
					// Mpps and msg/s to µs per message.
					bw.CRuns, bw.GRuns = append(bw.CRuns, 1/v), append(bw.GRuns, 1e6/g)
				}
			}
		}
		add(lat)
		add(bw)
	}

	tablef("\ntargets\n")
	target := func(name string, r *capiResult) {
		t := bench.Target{Kind: "target", Name: name, Want: fmt.Sprintf("≤ %.1fx", capiRatioMax)}
		if r == nil {
			t.Unmeasured = perftest
		} else {
			t.Measured = fmt.Sprintf("%.2fx per run (medians C %.1f %s, Go %.1f %s)", r.PairRatio, r.C, r.Unit, r.Go, r.Unit)
			t.Met = r.PairRatio <= capiRatioMax
		}
		mark := "MET"
		switch {
		case t.Unmeasured != "":
			mark = "NOT MEASURED (" + t.Unmeasured + ")"
		case !t.Met:
			mark = "NOT MET"
		}
		tablef("  %-44s want %-9s measured %-40s %s\n", t.Name, t.Want, t.Measured, mark)
		emit(t)
	}
	target("C/Go per message, ib_send_lat -c UD", lat)
	target("C/Go per message, ib_send_bw -c UD", bw)
	return nil
}

// runOut runs args and returns its standard output.
func runOut(ctx context.Context, args []string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%v\n%s", err, stderr.String())
	}
	return string(out), nil
}

// runPair runs a server (which listens on TCP port) and then a client,
// and returns what each printed.
func runPair(ctx context.Context, server, client []string, port int) (string, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	srv := exec.CommandContext(ctx, server[0], server[1:]...)
	var sout, serr strings.Builder
	srv.Stdout, srv.Stderr = &sout, &serr
	if err := srv.Start(); err != nil {
		return "", "", err
	}
	if err := waitTCPListen(ctx, port); err != nil {
		srv.Process.Kill()
		srv.Wait()
		return "", "", fmt.Errorf("server: %v\n%s", err, serr.String())
	}
	cout, cerr := runOut(ctx, client)
	werr := srv.Wait()
	if cerr != nil {
		return sout.String(), cout, fmt.Errorf("client: %w", cerr)
	}
	if werr != nil {
		return sout.String(), cout, fmt.Errorf("server: %v\n%s", werr, serr.String())
	}
	return sout.String(), cout, nil
}

// waitTCPListen waits until a TCP socket of this network namespace
// listens on port.
func waitTCPListen(ctx context.Context, port int) error {
	want := fmt.Sprintf(":%04X 00000000:0000 0A", port)
	want6 := fmt.Sprintf(":%04X 00000000000000000000000000000000:0000 0A", port)
	for {
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			if b, err := os.ReadFile(f); err == nil && (strings.Contains(string(b), want) || strings.Contains(string(b), want6)) {
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

// perftestValue is column col of the line under perftest's result header.
func perftestValue(out, header string, col int) (float64, error) {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if strings.Contains(l, header) && i+1 < len(lines) {
			f := strings.Fields(lines[i+1])
			if len(f) <= col {
				break
			}
			v, err := strconv.ParseFloat(f[col], 64)
			if err != nil || v <= 0 {
				break
			}
			return v, nil
		}
	}
	return 0, errors.New("no result under " + header + " in:\n" + out)
}

// median of vs (0 for none).
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
