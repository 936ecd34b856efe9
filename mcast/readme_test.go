package mcast_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/nettest"
	"github.com/softrdma/softrdma/test/testenv"
)

// TestREADMEQuickStart runs README's Go quick start as written: the first
// Go block of its section, as the main package of a module of its own
// that uses this checkout.
func TestREADMEQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	if !testenv.InNetns(t) {
		return
	}
	src, err := testenv.CodeBlock(filepath.Join("..", "README.md"), "## Quick start: a reliable group in Go (`mcast`)", "go")
	if err != nil {
		t.Fatal(err)
	}
	// A directory of this module that ./... patterns skip (a leading _).
	dir, err := os.MkdirTemp(".", "_quickstart")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, nettest.GoTool(), "run", "./"+filepath.Base(dir))
	cmd.Env = testenv.CleanEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "hello, group 127.0.0.1/0x") || !strings.HasSuffix(strings.TrimSpace(string(out)), "<nil>") {
		t.Fatalf("the quick start printed %q", out)
	}
	t.Logf("quick start: %s", out)
}
