package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/capi/capibuild"
)

// pathWithoutGo is PATH without the directories that hold a go command.
func pathWithoutGo() string {
	var keep []string
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		if fi, err := os.Stat(filepath.Join(d, "go")); err == nil && !fi.IsDir() {
			continue
		}
		keep = append(keep, d)
	}
	return strings.Join(keep, string(filepath.ListSeparator))
}

// TestExecWarmStartRunsNoGo: softrdma exec builds the libraries into the
// user's cache directory the first time; the next start finds them up to
// date by their stamp and runs no go command: it succeeds with no go on
// PATH. A stamp that no longer matches the source makes the next start
// build again.
func TestExecWarmStartRunsNoGo(t *testing.T) {
	requireRDMACore(t)
	bin := buildSoftrdma(t)
	env := execEnv(t)
	run := func(path string) string {
		t.Helper()
		cmd := exec.Command(bin, "exec", "-v", "--", "true")
		cmd.Env = env
		if path != "" {
			cmd.Env = append(append([]string{}, env...), "PATH="+path)
		}
		start := time.Now()
		out, err := cmd.CombinedOutput()
		t.Logf("softrdma exec -v -- true (%v): %v\n%s", time.Since(start).Round(time.Millisecond), err, out)
		if err != nil {
			t.Fatalf("softrdma exec: %v", err)
		}
		return string(out)
	}
	if out := run(""); !strings.Contains(out, "building the libraries from") {
		t.Fatalf("the first start did not build the libraries")
	}
	noGo := pathWithoutGo()
	if _, err := exec.LookPath("go"); err == nil {
		if p, _ := exec.Command("sh", "-c", "PATH='"+noGo+"' command -v go").Output(); len(p) > 0 {
			t.Fatalf("PATH without go still finds %s", p)
		}
	}
	if out := run(noGo); !strings.Contains(out, "up to date") || strings.Contains(out, "building") {
		t.Errorf("the second start, with no go on PATH, did not find the libraries up to date")
	}
	if out := run(""); !strings.Contains(out, "up to date") || strings.Contains(out, "building") {
		t.Errorf("the third start, with go on PATH, did not find the libraries up to date")
	}
	stamps, _ := filepath.Glob(filepath.Join(envValue(env, "XDG_CACHE_HOME"), "softrdma", "capi", "*", capibuild.StampFile))
	if len(stamps) != 1 {
		t.Fatalf("stamp files in the cache: %v", stamps)
	}
	if err := os.WriteFile(stamps[0], []byte("source 00\ntoolchain 00\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := run(""); !strings.Contains(out, "building the libraries from") {
		t.Errorf("a stamp of another source did not make softrdma exec build again")
	}
}

// envValue returns the value of the last NAME=value of env.
func envValue(env []string, name string) string {
	v := ""
	for _, kv := range env {
		if s, ok := strings.CutPrefix(kv, name+"="); ok {
			v = s
		}
	}
	return v
}

// BenchmarkExecStart times `softrdma exec -- true` with the libraries
// built: "cache", from the user's cache directory, checked against the
// source (capibuild.UpToDate); "libdir", with -libdir, checked by nothing
// but CheckLibDir. Run:
//
//	go test -run '^$' -bench ExecStart -benchtime 30x ./cmd/softrdma/
func BenchmarkExecStart(b *testing.B) {
	if _, err := exec.LookPath("cc"); err != nil {
		b.Skipf("no C compiler: %v", err)
	}
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); err != nil {
		b.Skipf("no libibverbs-dev: %v", err)
	}
	bin := filepath.Join(b.TempDir(), "softrdma")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	cache := b.TempDir()
	env := append(os.Environ(), "XDG_CACHE_HOME="+cache)
	start := func(args ...string) {
		cmd := exec.Command(bin, append([]string{"exec"}, args...)...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("softrdma exec %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	start("--", "true") // builds
	dirs, _ := filepath.Glob(filepath.Join(cache, "softrdma", "capi", "*"))
	if len(dirs) != 1 {
		b.Fatalf("library directories in the cache: %v", dirs)
	}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"cache", []string{"--", "true"}},
		{"libdir", []string{"-libdir", dirs[0], "--", "true"}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				start(c.args...)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/start")
		})
	}
}
