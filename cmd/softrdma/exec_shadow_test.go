package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/test/testenv"
)

// TestExecWarnsGoShadow: the Go mckey (cmd/mckey, as go install puts it
// in GOBIN) first on PATH shadows a C mckey that comes later. softrdma
// exec -- mckey then prints one warning line that names the Go program
// and the C one it shadows (or says there is none), and runs the Go one
// as asked; with the C one first, or the Go one named by its path, it
// warns of nothing.
func TestExecWarnsGoShadow(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	goDir, cDir := t.TempDir(), t.TempDir()
	if err := os.Symlink(mckeyBin, filepath.Join(goDir, "mckey")); err != nil {
		t.Fatal(err)
	}
	// The C program: any program that is not a Go program of softrdma's.
	if err := os.WriteFile(filepath.Join(cDir, "mckey"), []byte("#!/bin/sh\necho c-mckey-stub\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(path string, args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(dir, "softrdma"), append([]string{"exec", "-libdir", filepath.Join(dir, "lib"), "--"}, args...)...)
		cmd.Env = testenv.CleanEnv("PATH=" + path)
		out, _ := cmd.CombinedOutput() // the Go mckey's -h exits 1
		t.Logf("PATH=%s softrdma exec -- %s:\n%s", path, strings.Join(args, " "), out)
		return string(out)
	}
	warnings := func(out string) int { return strings.Count(out, "softrdma exec: warning:") }
	goMckey := filepath.Join(goDir, "mckey")

	out := run(goDir+":"+cDir, "mckey", "-h")
	if warnings(out) != 1 || !strings.Contains(out, "mckey is "+goMckey+", the Go program github.com/softrdma/softrdma/cmd/mckey") ||
		!strings.Contains(out, "it shadows "+filepath.Join(cDir, "mckey")) {
		t.Errorf("Go mckey before the C one: want one warning naming both")
	}
	if !strings.Contains(out, "usage: mckey") {
		t.Errorf("the Go mckey did not run")
	}
	if out := run(goDir, "mckey", "-h"); warnings(out) != 1 || !strings.Contains(out, "no other mckey on PATH") {
		t.Errorf("Go mckey alone on PATH: want one warning saying there is no other")
	}
	if out := run(cDir+":"+goDir, "mckey"); warnings(out) != 0 || !strings.Contains(out, "c-mckey-stub") {
		t.Errorf("C mckey first on PATH: want it run, and no warning")
	}
	if out := run(goDir+":"+cDir, goMckey, "-h"); warnings(out) != 0 {
		t.Errorf("the Go mckey named by its path: want no warning")
	}
}
