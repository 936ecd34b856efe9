package cconformance

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	testenv.OwnNetns() // lo to this package alone
	testenv.ClearSoftRDMA()
	goleak.VerifyTestMain(m)
}

// dirVar carries the folder of the softrdma binary, its libraries and the
// program into the test's re-run in its network namespace.
const dirVar = "SOFTRDMA_TEST_CCONFORMANCE_DIR"

// build builds softrdma, its libraries (softrdma exec -install) and the
// program once, outside the network namespace.
func build(t *testing.T) string {
	t.Helper()
	if d := os.Getenv(dirVar); d != "" {
		return d
	}
	for _, h := range []string{"/usr/include/infiniband/verbs.h", "/usr/include/rdma/rdma_cma.h"} {
		if _, err := os.Stat(h); err != nil {
			testenv.Require(t, "no %s (apt-get install libibverbs-dev librdmacm-dev): %v", h, err)
		}
	}
	if _, err := exec.LookPath("cc"); err != nil {
		testenv.Require(t, "no C compiler: %v", err)
	}
	d := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(d, "softrdma"), "github.com/softrdma/softrdma/cmd/softrdma").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/softrdma: %v\n%s", err, out)
	}
	if out, err := exec.CommandContext(ctx, filepath.Join(d, "softrdma"), "exec", "-install", filepath.Join(d, "lib")).CombinedOutput(); err != nil {
		t.Fatalf("softrdma exec -install: %v\n%s", err, out)
	}
	if _, err := Build(ctx, d); err != nil {
		t.Fatal(err)
	}
	t.Setenv(dirVar, d)
	return d
}

// TestOnSoftrdma runs the program through softrdma exec on RoCEv2 over
// lo, in a network namespace with a veth of its own (10.79.0.1/24, whose
// peer has no address: nothing answers ARP there) and no route to
// 192.0.2.1, and compares its lines with the kernel's recorded ones
// (testdata/kernel.txt): they must agree but for the documented
// Differences.
func TestOnSoftrdma(t *testing.T) {
	d := build(t)
	if !testenv.InNetns(t) {
		return
	}
	for _, c := range [][]string{
		{"link", "add", "v0", "type", "veth", "peer", "name", "v1"},
		{"addr", "add", "10.79.0.1/24", "dev", "v0"},
		{"link", "set", "v0", "up"},
		{"link", "set", "v1", "up"},
		{"route", "add", "224.0.0.0/4", "dev", "lo"},
	} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(d, "softrdma"), "exec", "-libdir", filepath.Join(d, "lib"), "--",
		filepath.Join(d, "conformance"), "-a", "127.0.0.1", "-u", "192.0.2.1", "-s", "10.79.0.1")
	cmd.Env = testenv.CleanEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if stderr.Len() > 0 {
		t.Logf("stderr:\n%s", stderr.String())
	}
	if err != nil {
		t.Fatalf("conformance through softrdma exec: %v\n%s", err, stdout.String())
	}
	if diffs := Compare(stdout.String(), Kernel); len(diffs) > 0 {
		t.Errorf("softrdma's lines differ from the kernel's (testdata/kernel.txt) beyond the documented differences:\n\t%s\nsoftrdma:\n%s",
			strings.Join(diffs, "\n\t"), stdout.String())
	}
}

// TestCompare checks Compare on made-up outputs.
func TestCompare(t *testing.T) {
	const rest, end = "a x OK\nb y EINVAL\n", "end done OK\n"
	var soft, kernel string // the documented differences' lines
	var absent []string     // each documented difference, not shown
	for _, d := range Differences {
		soft += d.Key + " " + d.Soft + "\n"
		kernel += d.Key + " " + d.Kernel + "\n"
		absent = append(absent, d.Key+": the documented difference")
	}
	for _, c := range []struct {
		name, soft, kernel string
		want               []string // substrings of the differences, in order
	}{
		{"documented", rest + soft + end, rest + kernel + end, nil},
		{"other outcome", "a x OK\nb y EBUSY\n" + soft + end, rest + kernel + end, []string{"b y: softrdma `EBUSY`, kernel `EINVAL`"}},
		{"line missing", "a x OK\n" + soft + end, rest + kernel + end, []string{"b y: softrdma (no line), kernel `EINVAL`"}},
		{"documented absent", rest + kernel + end, rest + kernel + end, absent},
		{"no end", rest + soft, rest + kernel + end, []string{"end done: softrdma (no line)", "softrdma: the run did not reach its end"}},
		{"not a line", "garbage\n", rest + kernel + end, []string{"softrdma: not a line"}},
		{"twice", rest + rest + soft + end, rest + kernel + end, []string{"softrdma: line \"a x\" twice"}},
	} {
		got := Compare(c.soft, c.kernel)
		if len(got) != len(c.want) {
			t.Errorf("%s: %d differences %q, want %d", c.name, len(got), got, len(c.want))
			continue
		}
		for i, w := range c.want {
			if !strings.Contains(got[i], w) {
				t.Errorf("%s: difference %d is %q, want it to contain %q", c.name, i, got[i], w)
			}
		}
	}
}
