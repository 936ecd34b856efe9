package capibuild

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tree writes a minimal softrdma source (go.mod, capi/) in a new
// directory of dir's.
func tree(t *testing.T, dir string) string {
	t.Helper()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(filepath.Join(src, "capi"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module "+ModulePath+"\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "capi", "capi.go"), []byte("package main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return src
}

// privateDir returns a new directory of the test's, mode 0755 whatever
// the umask.
func privateDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestCheckSource: a tree of the user's own is accepted (through a
// symbolic link, which is resolved; below the sticky /tmp); one that is
// not softrdma's, or has a path its group or others can write, is
// refused, naming the path.
func TestCheckSource(t *testing.T) {
	d := privateDir(t)
	src := tree(t, d)
	link := filepath.Join(d, "link")
	if err := os.Symlink(src, link); err != nil {
		t.Fatal(err)
	}
	got, err := CheckSource(link)
	if err != nil {
		t.Fatalf("CheckSource(%s): %v", link, err)
	}
	if want, _ := filepath.EvalSymlinks(src); got != want {
		t.Errorf("CheckSource(%s) = %s, want %s", link, got, want)
	}
	// .git is not read by the build.
	if err := os.MkdirAll(filepath.Join(src, ".git"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(src, ".git"), 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckSource(src); err != nil {
		t.Errorf("CheckSource with a writable .git: %v", err)
	}

	other := privateDir(t)
	if err := os.WriteFile(filepath.Join(other, "go.mod"), []byte("module example.com/other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckSource(other); err == nil || !strings.Contains(err.Error(), "not softrdma's source") {
		t.Errorf("CheckSource of another module: %v", err)
	}

	bad := filepath.Join(src, "verbs")
	if err := os.Mkdir(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(bad, 0o757); err != nil {
		t.Fatal(err)
	}
	_, err = CheckSource(src)
	var ue *UntrustedError
	if !errors.As(err, &ue) || ue.Path != bad {
		t.Errorf("CheckSource with %s world-writable: %v, want an UntrustedError naming it", bad, err)
	}
}

// TestCheckLibDir: a directory of the user's own is accepted; one its
// group or others can write, or holding a library they can, is refused.
func TestCheckLibDir(t *testing.T) {
	d := privateDir(t)
	lib := filepath.Join(d, "lib")
	if err := os.Mkdir(lib, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range append([]string{CapiLib}, ThinLibs...) {
		if err := os.WriteFile(filepath.Join(lib, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := CheckLibDir(lib); err != nil {
		t.Fatalf("CheckLibDir(%s): %v", lib, err)
	}
	p := filepath.Join(lib, ThinLibs[1])
	if err := os.Chmod(p, 0o666); err != nil {
		t.Fatal(err)
	}
	var ue *UntrustedError
	if _, err := CheckLibDir(lib); !errors.As(err, &ue) || ue.Path != p {
		t.Errorf("CheckLibDir with %s world-writable: %v", p, err)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o775); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckLibDir(lib); !errors.As(err, &ue) || ue.Path != d {
		t.Errorf("CheckLibDir below a group-writable %s: %v", d, err)
	}
	if err := os.Chmod(d, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckLibDir(lib); err != nil {
		t.Errorf("CheckLibDir below a sticky %s: %v", d, err)
	}
}
