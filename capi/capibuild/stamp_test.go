package capibuild

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// TestStamp: the stamp of a source changes when a file's content or
// modification time changes, or a file is added, and not otherwise;
// UpToDate accepts the stamp Build would write (writeStamp) with the
// three libraries there, and refuses a missing library, another source,
// another toolchain, and a stamp file others can write; a stamp taken
// without a go command (Toolchain "") matches one of any toolchain.
func TestStamp(t *testing.T) {
	dir := privateDir(t)
	src := tree(t, dir)
	o := Options{ModuleDir: src}
	stamp := func() Stamp {
		t.Helper()
		s, err := NewStamp(o)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s0 := stamp()
	if s0.Source == "" {
		t.Fatal("empty stamp")
	}
	if s1 := stamp(); s1 != s0 {
		t.Fatalf("the stamp of an unchanged tree changed: %v, then %v", s0, s1)
	}
	if real, s1, err := CheckSourceStamp(src, Options{}); err != nil || s1 != s0 || real != src {
		t.Fatalf("CheckSourceStamp: %s %v %v; NewStamp: %v", real, s1, err, s0)
	}
	f := filepath.Join(src, "capi", "capi.go")
	if err := os.WriteFile(f, []byte("package main\n// changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s2 := stamp()
	if s2.Source == s0.Source {
		t.Error("a file's new content left the stamp as it was")
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(f, old, old); err != nil {
		t.Fatal(err)
	}
	s3 := stamp()
	if s3.Source == s2.Source {
		t.Error("a file's new modification time left the stamp as it was")
	}
	if err := os.WriteFile(filepath.Join(src, "capi", "new.go"), []byte("package main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s4 := stamp()
	if s4.Source == s3.Source {
		t.Error("a new file left the stamp as it was")
	}
	if err := os.MkdirAll(filepath.Join(src, ".git", "objects"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, ".git", "objects", "x"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if s5 := stamp(); s5.Source != s4.Source {
		t.Error("a file in .git changed the stamp")
	}

	libs := filepath.Join(dir, "libs")
	if err := os.Mkdir(libs, 0o755); err != nil {
		t.Fatal(err)
	}
	s := stamp()
	if err := writeStamp(libs, s); err != nil {
		t.Fatal(err)
	}
	if UpToDate(libs, s) {
		t.Error("UpToDate without the libraries")
	}
	for _, l := range append([]string{CapiLib}, ThinLibs...) {
		if err := os.WriteFile(filepath.Join(libs, l), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if !UpToDate(libs, s) {
		t.Errorf("not UpToDate with the stamp written for it: %v", s)
	}
	if UpToDate(libs, Stamp{Source: "other", Toolchain: s.Toolchain}) {
		t.Error("UpToDate with another source")
	}
	if s.Toolchain != "" && UpToDate(libs, Stamp{Source: s.Source, Toolchain: "other"}) {
		t.Error("UpToDate with another toolchain")
	}
	if !UpToDate(libs, Stamp{Source: s.Source}) {
		t.Error("not UpToDate with no go command to rebuild with (Toolchain \"\") and the same source")
	}
	p := filepath.Join(libs, StampFile)
	if err := os.Chmod(p, 0o666); err != nil {
		t.Fatal(err)
	}
	if UpToDate(libs, s) {
		t.Error("UpToDate with a stamp file others can write")
	}
}

// BenchmarkNewStamp takes the stamp of softrdma's own source tree: what
// a softrdma exec with up-to-date libraries adds to its start.
func BenchmarkNewStamp(b *testing.B) {
	_, file, _, _ := runtime.Caller(0)
	src := filepath.Dir(filepath.Dir(filepath.Dir(file)))
	for b.Loop() {
		if _, err := NewStamp(Options{ModuleDir: src}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckSourceStamp checks softrdma's own source tree and takes
// its stamp, which is what a softrdma exec with up-to-date libraries in
// the cache does before it starts the program.
func BenchmarkCheckSourceStamp(b *testing.B) {
	_, file, _, _ := runtime.Caller(0)
	src := filepath.Dir(filepath.Dir(filepath.Dir(file)))
	for b.Loop() {
		if _, _, err := CheckSourceStamp(src, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
