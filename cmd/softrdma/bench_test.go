package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/test/testsm"
)

// TestBenchQuick builds the binary and runs `softrdma bench -quick -json`
// (its receivers are the binary re-executed): every line is a JSON object,
// every part reports, and every case has a ratio. No timing is asserted.
func TestBenchQuick(t *testing.T) {
	testenv.RequireBench(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "softrdma")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := []string{"bench", "-quick", "-json"}
	kindsWanted := []string{"fanout", "icrc", "join", "groups", "qp", "allocs", "ib_fanout", "sa", "latency", "target"}
	if testsm.SM(t) == sm.ManagerOpenSM {
		// SOFTRDMA_TEST_SM=opensm: the parts that start a subnet manager,
		// OpenSM in charge (the others run in the softsm run).
		args = append(args, "-ib-sm", "opensm", "-parts", "ib,latency", "-lat-links", "ib")
		kindsWanted = []string{"ib_fanout", "sa", "latency", "target"}
	} else if testsm.OnViaSwitch() {
		// SOFTRDMA_TEST_SM=switch: the same parts, every packet through
		// softsm's switch.
		args = append(args, "-ib-via-switch", "-parts", "ib,latency", "-lat-links", "ib")
		kindsWanted = []string{"ib_fanout", "sa", "latency", "target"}
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	kinds := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var v map[string]any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		kind, _ := v["kind"].(string)
		kinds[kind]++
		if _, ok := v["ratio"].(float64); kind != "target" && !ok {
			t.Errorf("%s line without a ratio: %s", kind, sc.Text())
		}
	}
	for _, k := range kindsWanted {
		if kinds[k] == 0 {
			t.Errorf("no %q line in:\n%s", k, out)
		}
	}
}

// TestBenchTable checks the human-readable output of a run of one part,
// and that the receiver subcommand stays out of the usage.
func TestBenchTable(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"bench", "-quick", "-parts", "icrc"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"ICRC (per datagram", `{"kind":"icrc"`, "bench: done"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	run([]string{"help"}, &out, &errb)
	if !strings.Contains(out.String(), "bench") || strings.Contains(out.String(), rxCommand) {
		t.Errorf("usage:\n%s", out.String())
	}
	if code := run([]string{"bench", "-batch", "0"}, &out, &errb); code != 2 {
		t.Errorf("-batch 0: exit %d", code)
	}
	if code := run([]string{"bench", "-sizes", "9000"}, &out, &errb); code != 2 {
		t.Errorf("-sizes 9000: exit %d", code)
	}
	for _, bad := range [][]string{{"-rel-loss", "1001"}, {"-rel-sizes", "8"}, {"-rel-receivers", "0"}, {"-rel-pgm-rate", "0"}} {
		if code := run(append([]string{"bench", "-parts", "reliable"}, bad...), &out, &errb); code != 2 {
			t.Errorf("%v: exit %d", bad, code)
		}
	}
}

// TestBenchReliableQuick runs the reliable part with the softrdma peer
// (package mcast) and the udp ceiling, small: 2 receivers, 1 KiB, loss 0
// and 1 %: the softrdma peer delivers everything, in order, once.
func TestBenchReliableQuick(t *testing.T) {
	testenv.RequireBench(t)
	if os.Geteuid() != 0 {
		testenv.Require(t, "the reliable part needs root for its namespaces")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "softrdma")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "-json", "-parts", "reliable", "-rel-peers", "softrdma,udp",
		"-rel-receivers", "2", "-rel-sizes", "1024", "-rel-loss", "0,10", "-rel-count", "5000")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	cases := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var v struct {
			Kind, Peer, Err             string
			Lost, Reordered, Duplicated int
			Sent                        int
			LossPerMille                int `json:"loss_per_mille"`
		}
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if v.Kind != "reliable" || v.Peer != "softrdma" {
			continue
		}
		cases++
		if v.Err != "" || v.Sent != 5000 || v.Lost+v.Reordered+v.Duplicated != 0 {
			t.Errorf("softrdma at %d‰: %s", v.LossPerMille, sc.Text())
		}
	}
	if cases != 2 {
		t.Errorf("%d softrdma cases, want 2:\n%s\n%s", cases, out, stderr.String())
	}
}
