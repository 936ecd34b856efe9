package capibuild

import (
	"bufio"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// generatorSrc is the source of Trampolines and Build, as compiled into
// this softrdma: with symbols.txt, what the thin libraries are made of.
//
//go:embed capibuild.go
var generatorSrc string

// StampFile is the file Build writes next to the libraries: what they
// were built from (a Stamp), for UpToDate to compare with the source as
// it is now.
const StampFile = "softrdma-capi.stamp"

// stampEnv are the environment variables the go command, cgo or the C
// compiler read that can change what a build makes.
var stampEnv = []string{"GOOS", "GOARCH", "GOFLAGS", "GOAMD64", "GOARM64", "GOEXPERIMENT", "GOTOOLCHAIN", "GOROOT",
	"GOPATH", "CC", "CXX", "CGO_CFLAGS", "CGO_CPPFLAGS", "CGO_LDFLAGS", "CGO_CXXFLAGS", "PKG_CONFIG",
	"CPATH", "C_INCLUDE_PATH", "LIBRARY_PATH"}

// stampHeaders are the distribution's headers capi takes its C layouts
// from.
var stampHeaders = []string{"/usr/include/infiniband/verbs.h", "/usr/include/infiniband/verbs_api.h",
	"/usr/include/infiniband/ib_user_ioctl_verbs.h", "/usr/include/infiniband/ib.h", "/usr/include/rdma/rdma_cma.h",
	"/usr/include/rdma/rdma_verbs.h", "/usr/include/rdma/ib_user_verbs.h"}

// A Stamp is what the libraries Build makes from a source depend on, in
// two hashes: Source, of the source tree (every file's path, size,
// modification time and mode, and every directory's path, but .git's),
// of the environment variables the build reads, of the distribution's
// rdma-core headers, of GOOS and GOARCH, and of what this softrdma
// generates the thin libraries from (symbols.txt and capibuild.go); and
// Toolchain, of the go command and the C compiler Build would run (their
// paths, sizes and modification times, and the go command's
// GOROOT/VERSION). Computing it runs no command: a walk of the tree with
// lstat, a few milliseconds.
type Stamp struct {
	Source    string
	Toolchain string // "" when the go command is not found
}

// NewStamp returns the Stamp of the libraries Build(ctx, dir, o) would
// make now from o.ModuleDir, which must be a directory CheckSource
// accepted (CheckSourceStamp does both in one walk).
func NewStamp(o Options) (Stamp, error) {
	st := newStamper()
	err := filepath.WalkDir(o.ModuleDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".git" && p != o.ModuleDir {
			return filepath.SkipDir
		}
		var fi fs.FileInfo
		if d.Type()&fs.ModeSymlink != 0 {
			fi, err = os.Stat(p) // what the build reads
		} else {
			fi, err = d.Info()
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(o.ModuleDir, p)
		st.file(rel, fi)
		return nil
	})
	if err != nil {
		return Stamp{}, err
	}
	return st.finish(o)
}

// stamper hashes the files of a source tree (file), then the rest of a
// Stamp (finish).
type stamper struct {
	h   hash.Hash
	buf []byte
}

func newStamper() *stamper { return &stamper{h: sha256.New()} }

// file adds a path of the tree: a file's path, size, modification time
// and mode; a directory's path only (its files are what counts, not its
// mtime, which an entry added to .git or an editor's temporary file
// changes).
func (st *stamper) file(rel string, fi fs.FileInfo) {
	b := st.buf[:0]
	if fi.IsDir() {
		b = append(b, "dir "...)
		b = strconv.AppendQuote(b, rel)
	} else {
		b = append(b, "file "...)
		b = strconv.AppendQuote(b, rel)
		b = append(b, ' ')
		b = strconv.AppendInt(b, fi.Size(), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, fi.ModTime().UnixNano(), 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(fi.Mode()), 8)
	}
	b = append(b, '\n')
	st.h.Write(b)
	st.buf = b
}

// finish adds what is not in the tree and returns the Stamp.
func (st *stamper) finish(o Options) (Stamp, error) {
	o = o.withDefaults()
	h := st.h
	fmt.Fprintf(h, "goos %s goarch %s tags capi\n", runtime.GOOS, runtime.GOARCH)
	for _, k := range stampEnv {
		if v, ok := os.LookupEnv(k); ok {
			fmt.Fprintf(h, "env %s=%q\n", k, v)
		}
	}
	for _, p := range stampHeaders {
		statLine(h, "header", p)
	}
	// The thin libraries are this softrdma's Trampolines (generating
	// them would take longer than the whole walk of the tree).
	fmt.Fprintf(h, "thin %x %x\n", sha256.Sum256([]byte(symbolsTxt)), sha256.Sum256([]byte(generatorSrc)))
	s := Stamp{Source: hex.EncodeToString(h.Sum(nil))}
	if goPath, err := exec.LookPath(o.Go); err == nil {
		t := sha256.New()
		real := statLine(t, "go", goPath)
		if v, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(real)), "VERSION")); err == nil {
			fmt.Fprintf(t, "version %q\n", v)
		}
		if cc, err := exec.LookPath(o.CC); err == nil {
			statLine(t, "cc", cc)
		} else {
			fmt.Fprintf(t, "cc %q none\n", o.CC)
		}
		s.Toolchain = hex.EncodeToString(t.Sum(nil))
	}
	return s, nil
}

// statLine writes "<what> <path> <size> <mtime>" of path (its symbolic
// links resolved) to w and returns the resolved path.
func statLine(w io.Writer, what, path string) string {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		fmt.Fprintf(w, "%s %q none\n", what, path)
		return path
	}
	fi, err := os.Stat(real)
	if err != nil {
		fmt.Fprintf(w, "%s %q none\n", what, real)
		return real
	}
	fmt.Fprintf(w, "%s %q %d %d\n", what, real, fi.Size(), fi.ModTime().UnixNano())
	return real
}

// UpToDate tells whether dir holds the three libraries and a StampFile
// of the user's (owned by the effective user or root, not writable by
// group or others) that records s: the same Source, and the same
// Toolchain unless s has none (the go command is not found now, so the
// libraries could not be rebuilt, and the source is what they were built
// from).
func UpToDate(dir string, s Stamp) bool {
	if !Complete(dir) {
		return false
	}
	p := filepath.Join(dir, StampFile)
	fi, err := os.Lstat(p)
	if err != nil || !fi.Mode().IsRegular() || checkInfo(p, fi, false) != nil {
		return false
	}
	old, err := readStamp(p)
	if err != nil {
		return false
	}
	return old.Source == s.Source && (s.Toolchain == "" || old.Toolchain == s.Toolchain)
}

func readStamp(p string) (Stamp, error) {
	f, err := os.Open(p)
	if err != nil {
		return Stamp{}, err
	}
	defer f.Close()
	var s Stamp
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		switch k {
		case "source":
			s.Source = v
		case "toolchain":
			s.Toolchain = v
		}
	}
	if s.Source == "" {
		return Stamp{}, errors.New("no source line")
	}
	return s, sc.Err()
}

// writeStamp records s in dir's StampFile (through a rename, so that a
// reader sees the old file or the new one).
func writeStamp(dir string, s Stamp) error {
	p := filepath.Join(dir, StampFile)
	data := fmt.Sprintf("# what the libraries of this directory were built from (softrdma exec compares it with the source)\nsource %s\ntoolchain %s\n", s.Source, s.Toolchain)
	if err := os.WriteFile(p+".tmp", []byte(data), 0o644); err != nil {
		return err
	}
	return os.Rename(p+".tmp", p)
}
