package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/test/testenv"
)

// requireFile skips (fails in CI) when path is not there.
func requireFile(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		testenv.Require(t, "%s: %v", path, err)
	}
}

// cc compiles a C source with gcc and the given arguments into out.
func cc(t *testing.T, src, out string, args ...string) {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		testenv.Require(t, "no gcc: %v", err)
	}
	c := filepath.Join(t.TempDir(), "src.c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gcc, append([]string{"-o", out, c}, args...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, b)
	}
}

// TestLinkNote: softrdma exec warns about a statically linked program,
// notes a dynamically linked one that links neither librdmacm nor
// libibverbs (directly or through its libraries), and says nothing about
// a program that links one of them, directly (Debian's mckey,
// ibv_devinfo) or through a library of its own found by its RUNPATH, or
// about a script.
func TestLinkNote(t *testing.T) {
	dir := t.TempDir()

	t.Run("direct", func(t *testing.T) {
		for _, p := range []string{"/usr/bin/mckey", "/usr/bin/ibv_devinfo"} {
			requireFile(t, p)
			if w := linkNote(p, nil); w != "" {
				t.Errorf("%s: %q, want nothing", p, w)
			}
		}
	})
	t.Run("neither", func(t *testing.T) {
		p, err := exec.LookPath("true")
		if err != nil {
			t.Skip("no true on PATH")
		}
		w := linkNote(p, nil)
		if !strings.Contains(w, "note: true links neither librdmacm.so.1 nor libibverbs.so.1") {
			t.Errorf("%s: %q, want the note", p, w)
		}
	})
	t.Run("runners", func(t *testing.T) {
		// A shell, an interpreter or a wrapper runs what decides.
		for _, name := range []string{"sh", "python3", "stdbuf"} {
			p, err := exec.LookPath(name)
			if err != nil {
				continue
			}
			if w := linkNote(p, nil); w != "" {
				t.Errorf("%s: %q, want nothing", p, w)
			}
		}
		if !runsOthers("python3.11") || runsOthers("myprog") {
			t.Error("runsOthers: python3.11 is a runner, myprog is not")
		}
	})
	t.Run("static", func(t *testing.T) {
		p := filepath.Join(dir, "static")
		cc(t, "int main(void) { return 0; }\n", p, "-static")
		w := linkNote(p, nil)
		if !strings.Contains(w, "warning: static is statically linked") {
			t.Errorf("a static program: %q, want the warning", w)
		}
	})
	t.Run("through a library", func(t *testing.T) {
		requireFile(t, "/usr/include/infiniband/verbs.h")
		lib := filepath.Join(dir, "libwrap.so")
		cc(t, "#include <infiniband/verbs.h>\nint wrap_count(void) { int n; ibv_free_device_list(ibv_get_device_list(&n)); return n; }\n",
			lib, "-shared", "-fPIC", "-libverbs")
		p := filepath.Join(dir, "wrapped")
		cc(t, "int wrap_count(void);\nint main(void) { return wrap_count() < 0; }\n", p, "-L"+dir, "-lwrap", "-Wl,--enable-new-dtags,-rpath,$ORIGIN")
		if w := linkNote(p, nil); w != "" {
			t.Errorf("a program linking libibverbs through libwrap.so (RUNPATH $ORIGIN): %q, want nothing", w)
		}
		// Without the RUNPATH the library is found on LD_LIBRARY_PATH.
		q := filepath.Join(dir, "wrapped2")
		cc(t, "int wrap_count(void);\nint main(void) { return wrap_count() < 0; }\n", q, "-L"+dir, "-lwrap")
		if w := linkNote(q, []string{"LD_LIBRARY_PATH=/nonexistent:" + dir}); w != "" {
			t.Errorf("libwrap.so on LD_LIBRARY_PATH: %q, want nothing", w)
		}
		if w := linkNote(q, nil); w != "" {
			t.Errorf("libwrap.so not found: %q, want nothing (unknown is not a note)", w)
		}
	})
	t.Run("script", func(t *testing.T) {
		p := filepath.Join(dir, "script.sh")
		if err := os.WriteFile(p, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if w := linkNote(p, nil); w != "" {
			t.Errorf("a script: %q, want nothing", w)
		}
	})
}
