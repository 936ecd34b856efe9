// Package cconformance is the conformance suite's cases (test/conformance)
// as a C program of librdmacm and libibverbs calls (testdata/conformance.c),
// run three ways: on softrdma through `softrdma exec` and its drop-in
// libraries (TestOnSoftrdma, on loopback in a network namespace), on the
// kernel's rxe in a QEMU guest with rdma-core's own libraries, and both at
// once, compared line by line (test/interop's TestCConformance). The
// program prints one line per check:
//
//	<case> <check> <outcome>
//
// with nothing in it that depends on the host (no address, port or
// pointer), so that two runs print the same lines where the libraries
// behave the same. Compare tells the lines apart; the differences it
// accepts are Differences, each with its reason (docs/interop.md, "differences from Linux").
// testdata/kernel.txt is the guest's output, recorded: TestOnSoftrdma
// compares softrdma's run on the host with it, TestCConformance checks
// that the guest still prints it.
package cconformance

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

//go:embed testdata/conformance.c
var source []byte

// Kernel is what the program printed on the kernel's rxe (Debian 12's
// Linux 6.1 and rdma-core 44 in test/interop's guest).
//
//go:embed testdata/kernel.txt
var Kernel string

// Build compiles the program against the distribution's headers
// (libibverbs-dev, librdmacm-dev) into dir and returns its path.
func Build(ctx context.Context, dir string) (string, error) {
	src := filepath.Join(dir, "conformance.c")
	if err := os.WriteFile(src, source, 0o644); err != nil {
		return "", err
	}
	prog := filepath.Join(dir, "conformance")
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	out, err := exec.CommandContext(ctx, cc, "-Wall", "-O1", "-o", prog, src, "-lrdmacm", "-libverbs", "-lpthread").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s conformance.c: %v\n%s", cc, err, out)
	}
	return prog, nil
}

// Difference is a line whose outcome differs between softrdma and the
// kernel by design. Soft or Kernel "" means the run prints no such line.
type Difference struct {
	Key          string // "<case> <check>"
	Soft, Kernel string // the outcomes
	Why          string
}

// Differences are the lines in which softrdma's run differs from the
// kernel's, each documented in docs/kernel.md's table of conformance
// differences (the Go suite's) or under "Run a C program on softrdma".
var Differences = []Difference{
	{"ipv6-group-on-ipv4-id join", "call=OK event=RDMA_CM_EVENT_MULTICAST_JOIN status=0", "call=ENOTSUPP(524)",
		"IPv6 groups on an IPv4-bound RoCE id are softrdma's extension; the kernel's cma_iboe_join_multicast refuses them (docs/interop.md)"},
	{"block-self-mcast-lb create-qp", "OK", "EOPNOTSUPP",
		"softrdma supports IBV_QP_CREATE_BLOCK_SELF_MCAST_LB; rxe refuses it (docs/interop.md)"},
	{"passive-ep leave-waits-for-parked-event", "false", "true",
		"librdmacm's rdma_leave_multicast waits until every event of the join is acked, and a synchronous id's JOIN event stays parked in id->event, unacked, until the id's next call: a leave right after a synchronous join waits for good; softrdma acks the parked event in the leave (docs/interop.md)"},
}

// line is one output line split into its key and outcome.
type line struct{ key, outcome string }

func parse(out string) ([]line, error) {
	var ls []line
	seen := map[string]bool{}
	for _, s := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		f := strings.SplitN(s, " ", 3)
		if len(f) != 3 {
			return nil, fmt.Errorf("not a line of the program: %q", s)
		}
		k := f[0] + " " + f[1]
		if seen[k] {
			return nil, fmt.Errorf("line %q twice", k)
		}
		seen[k] = true
		ls = append(ls, line{k, f[2]})
	}
	return ls, nil
}

// Compare compares softrdma's output with the kernel's line by line and
// returns the differences Differences does not list, and those it lists
// that did not show (nil: the runs agree as documented). A run that did
// not reach its last line ("end done OK") is a difference too.
func Compare(soft, kernel string) []string {
	s, err := parse(soft)
	if err != nil {
		return []string{"softrdma: " + err.Error()}
	}
	k, err := parse(kernel)
	if err != nil {
		return []string{"kernel: " + err.Error()}
	}
	km := map[string]string{}
	for _, l := range k {
		km[l.key] = l.outcome
	}
	sm := map[string]string{}
	for _, l := range s {
		sm[l.key] = l.outcome
	}
	// Every key, in softrdma's order, then the kernel's others.
	var keys []string
	for _, l := range s {
		keys = append(keys, l.key)
	}
	for _, l := range k {
		if _, ok := sm[l.key]; !ok {
			keys = append(keys, l.key)
		}
	}
	known := map[string]Difference{}
	for _, d := range Differences {
		known[d.Key] = d
	}
	var bad []string
	shown := map[string]bool{}
	for _, key := range keys {
		so, ko := sm[key], km[key]
		if so == ko {
			continue
		}
		if d, ok := known[key]; ok && d.Soft == so && d.Kernel == ko {
			shown[key] = true
			continue
		}
		bad = append(bad, fmt.Sprintf("%s: softrdma %s, kernel %s", key, show(so), show(ko)))
	}
	for _, d := range Differences {
		if !shown[d.Key] {
			bad = append(bad, fmt.Sprintf("%s: the documented difference (softrdma %s, kernel %s) did not show: softrdma %s, kernel %s",
				d.Key, show(d.Soft), show(d.Kernel), show(sm[d.Key]), show(km[d.Key])))
		}
	}
	if sm["end done"] != "OK" {
		bad = append(bad, "softrdma: the run did not reach its end")
	}
	if km["end done"] != "OK" {
		bad = append(bad, "kernel: the run did not reach its end")
	}
	return bad
}

func show(o string) string {
	if o == "" {
		return "(no line)"
	}
	return "`" + o + "`"
}
