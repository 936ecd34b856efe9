package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/capi/capibuild"
	"github.com/softrdma/softrdma/test/testenv"
)

// otherUID owns the trees "another user" wrote (nobody).
const otherUID = 65534

// requireRoot skips (fails under CI) unless the test can chown a tree to
// another user.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Require(t, "needs root to chown a tree to another user (uid %d)", otherUID)
	}
}

// buildSoftrdma builds the softrdma binary (from this checkout, without
// -trimpath) into a directory of the test's.
func buildSoftrdma(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "softrdma")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// rogueTree writes, in dir, a module that names itself softrdma's, whose
// capi/ is a c-shared library with a C constructor that writes marker.
func rogueTree(t *testing.T, dir, marker string) {
	t.Helper()
	capi := filepath.Join(dir, "capi")
	if err := os.MkdirAll(capi, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module github.com/softrdma/softrdma\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	src := fmt.Sprintf(`package main

/*
#include <stdio.h>
int softrdma_forked = 0;
void softrdma_sig_restore(void) {}
__attribute__((constructor)) static void rogue(void) {
	FILE *f = fopen(%q, "w");
	if (f) { fputs("ran\n", f); fclose(f); }
}
*/
import "C"

func main() {}
`, marker)
	if err := os.WriteFile(filepath.Join(capi, "capi.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
}

// chownTree gives dir and everything in it to uid.
func chownTree(t *testing.T, dir string, uid int) {
	t.Helper()
	err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// execEnv is the environment of a softrdma exec a test runs: a cache
// directory of the test's own (the go command's build cache kept).
func execEnv(t *testing.T, extra ...string) []string {
	t.Helper()
	gocache, err := exec.Command("go", "env", "GOCACHE").Output()
	if err != nil {
		t.Fatalf("go env GOCACHE: %v", err)
	}
	return testenv.CleanEnv(append([]string{"XDG_CACHE_HOME=" + t.TempDir(), "GOCACHE=" + strings.TrimSpace(string(gocache))}, extra...)...)
}

// TestExecIgnoresModuleOfCwd: another user's module that names itself
// softrdma's, in a shared world-writable directory, with a capi/ whose C
// constructor writes a marker; softrdma exec run in a subdirectory of it
// builds from the source it was built from, never from that module, and
// the constructor does not run.
func TestExecIgnoresModuleOfCwd(t *testing.T) {
	requireRoot(t)
	requireRDMACore(t, "ibv_devinfo")
	bin := buildSoftrdma(t)
	top := t.TempDir()
	shared := filepath.Join(top, "shared")
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	rogue := filepath.Join(shared, "proj")
	marker := filepath.Join(top, "marker")
	rogueTree(t, rogue, marker)
	sub := filepath.Join(rogue, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	chownTree(t, rogue, otherUID)

	cmd := exec.Command(bin, "exec", "-v", "--", "ibv_devinfo", "-l")
	cmd.Dir = sub
	cmd.Env = execEnv(t)
	out, err := cmd.CombinedOutput()
	t.Logf("softrdma exec -v -- ibv_devinfo -l: %v\n%s", err, out)
	if _, serr := os.Stat(marker); serr == nil {
		t.Fatalf("the constructor of %s/capi ran: softrdma exec built and loaded the module of the current directory", rogue)
	}
	if strings.Contains(string(out), rogue) {
		t.Errorf("softrdma exec's output names %s: it used the module of the current directory", rogue)
	}
	if err != nil {
		t.Errorf("softrdma exec from its own source: %v", err)
	}
	if !strings.Contains(string(out), "libraries from ") {
		t.Errorf("no \"libraries from\" line (-v)")
	}
	for _, f := range []string{"go.mod", "capi/capi.go"} {
		if _, err := os.Stat(filepath.Join(rogue, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestExecSrcRefused: a source named with -src or SOFTRDMA_SRC that
// another user owns, or that its group or others can write (itself, a
// directory in it, or a directory above it), is refused with an error that
// names the offending path; nothing of it is built or loaded.
func TestExecSrcRefused(t *testing.T) {
	bin := buildSoftrdma(t)
	type tc struct {
		name  string
		root  bool   // needs root (chown)
		bad   string // the path the error must name, relative to the case's directory
		setup func(t *testing.T, tree string)
	}
	cases := []tc{
		{"owner", true, "tree", func(t *testing.T, tree string) { chownTree(t, tree, otherUID) }},
		{"capi-owner", true, "tree/capi/capi.go", func(t *testing.T, tree string) {
			if err := os.Lchown(filepath.Join(tree, "capi", "capi.go"), otherUID, otherUID); err != nil {
				t.Fatal(err)
			}
		}},
		{"capi-world-writable", false, "tree/capi", func(t *testing.T, tree string) {
			if err := os.Chmod(filepath.Join(tree, "capi"), 0o777); err != nil {
				t.Fatal(err)
			}
		}},
		{"gomod-group-writable", false, "tree/go.mod", func(t *testing.T, tree string) {
			if err := os.Chmod(filepath.Join(tree, "go.mod"), 0o664); err != nil {
				t.Fatal(err)
			}
		}},
		{"parent-writable", false, ".", func(t *testing.T, tree string) {
			if err := os.Chmod(filepath.Dir(tree), 0o777); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, c := range cases {
		for _, how := range []string{"flag", "env"} {
			t.Run(c.name+"/"+how, func(t *testing.T) {
				if c.root {
					requireRoot(t)
				}
				d := t.TempDir()
				if err := os.Chmod(d, 0o755); err != nil {
					t.Fatal(err)
				}
				tree := filepath.Join(d, "tree")
				marker := filepath.Join(t.TempDir(), "marker")
				rogueTree(t, tree, marker)
				c.setup(t, tree)
				args := []string{"exec", "--", "/bin/true"}
				env := execEnv(t)
				if how == "flag" {
					args = []string{"exec", "-src", tree, "--", "/bin/true"}
				} else {
					env = append(env, "SOFTRDMA_SRC="+tree)
				}
				cmd := exec.Command(bin, args...)
				cmd.Env = env
				out, err := cmd.CombinedOutput()
				t.Logf("softrdma %s: %v\n%s", strings.Join(args, " "), err, out)
				if err == nil {
					t.Fatalf("softrdma exec accepted the source %s", tree)
				}
				bad := filepath.Clean(filepath.Join(d, c.bad))
				if !strings.Contains(string(out), bad+":") && !strings.Contains(string(out), bad+" ") {
					t.Errorf("the error does not name %s", bad)
				}
				if _, err := os.Stat(marker); err == nil {
					t.Errorf("the constructor of %s/capi ran", tree)
				}
			})
		}
	}
}

// TestExecLibdirRefused: a -libdir or SOFTRDMA_LIBDIR that another user
// owns or that its group or others can write is never put on
// LD_LIBRARY_PATH: softrdma exec refuses it with an error that names it.
func TestExecLibdirRefused(t *testing.T) {
	bin := buildSoftrdma(t)
	for _, c := range []struct {
		name  string
		root  bool
		setup func(t *testing.T, lib string)
	}{
		{"world-writable", false, func(t *testing.T, lib string) {
			if err := os.Chmod(lib, 0o777); err != nil {
				t.Fatal(err)
			}
		}},
		{"group-writable", false, func(t *testing.T, lib string) {
			if err := os.Chmod(lib, 0o775); err != nil {
				t.Fatal(err)
			}
		}},
		{"owner", true, func(t *testing.T, lib string) { chownTree(t, lib, otherUID) }},
	} {
		for _, how := range []string{"flag", "env"} {
			t.Run(c.name+"/"+how, func(t *testing.T) {
				if c.root {
					requireRoot(t)
				}
				lib := filepath.Join(t.TempDir(), "lib")
				if err := os.Mkdir(lib, 0o755); err != nil {
					t.Fatal(err)
				}
				for _, f := range append([]string{capibuild.CapiLib}, capibuild.ThinLibs...) {
					if err := os.WriteFile(filepath.Join(lib, f), nil, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				c.setup(t, lib)
				args := []string{"exec", "-libdir", lib, "--", "/bin/true"}
				env := execEnv(t)
				if how == "env" {
					args = []string{"exec", "--", "/bin/true"}
					env = append(env, "SOFTRDMA_LIBDIR="+lib)
				}
				cmd := exec.Command(bin, args...)
				cmd.Env = env
				out, err := cmd.CombinedOutput()
				t.Logf("softrdma %s: %v\n%s", strings.Join(args, " "), err, out)
				if err == nil {
					t.Fatalf("softrdma exec put %s on LD_LIBRARY_PATH", lib)
				}
				if !strings.Contains(string(out), lib+":") && !strings.Contains(string(out), lib+" ") {
					t.Errorf("the error does not name %s", lib)
				}
			})
		}
	}
}
