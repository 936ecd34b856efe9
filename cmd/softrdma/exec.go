package main

// softrdma exec: runs an unmodified, dynamically linked C program on
// softrdma's devices, with softrdma's librdmacm.so.1 and libibverbs.so.1
// (the capi command, built by capi/capibuild) in place of rdma-core's.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/softrdma/softrdma/capi/capibuild"
)

func init() {
	commands["exec"] = command{
		summary: "run a C program (mckey, ibv_devinfo …) on softrdma's devices through drop-in librdmacm/libibverbs",
		run:     execCmd,
	}
}

const execAbout = `Runs PROGRAM with softrdma's librdmacm.so.1 and libibverbs.so.1 on the
loader's path (LD_LIBRARY_PATH), so that a program linked with rdma-core's
libraries uses softrdma's devices instead: its exit status and the signals
that end it are PROGRAM's own (softrdma execs it).

The libraries are taken from -libdir (or SOFTRDMA_LIBDIR), else from
../lib/softrdma next to the softrdma binary, else built into the user's
cache directory from the softrdma source: -src (or SOFTRDMA_SRC), else
the one this binary was built from (never the module of the current
directory); building needs go, a C compiler and the librdmacm-dev and
libibverbs-dev headers. They are built again only when the source, the
toolchain or the headers changed (a stamp next to them records the
files' sizes and modification times; checking it runs no command, so a
start with up-to-date libraries takes milliseconds). -install DIR
builds them into DIR (for a container image) and exits.

Only what no other user can change is built or loaded: the source (every
file and directory in it and every directory above it) and the directory
of the libraries (and every directory above it) must be owned by you or
root and not be writable by their group or others (a directory above may
be, if sticky, as /tmp is); else softrdma exec refuses, naming the path.`

func execCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: softrdma exec [-libdir DIR] [-src DIR] [--] PROGRAM [ARGS...]\n       softrdma exec [-src DIR] -install DIR\n%s\n\n", execAbout)
		fs.PrintDefaults()
	}
	libdir := fs.String("libdir", os.Getenv("SOFTRDMA_LIBDIR"), "`directory` of the libraries (built there if missing)")
	src := fs.String("src", os.Getenv("SOFTRDMA_SRC"), "softrdma's source `directory` to build the libraries from (default: the one this softrdma was built from)")
	install := fs.String("install", "", "build the libraries into `DIR` and exit")
	verbose := fs.Bool("v", false, "say which libraries are used")
	noView := noSysfsFlag(fs)
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	ctx := context.Background()
	if *install != "" {
		if fs.NArg() > 0 {
			fmt.Fprintf(stderr, "softrdma exec: -install takes no program\n")
			return 2
		}
		if err := buildLibs(ctx, *install, *src, stderr); err != nil {
			fmt.Fprintf(stderr, "softrdma exec: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "softrdma exec: %s, %s and %s in %s\n", capibuild.ThinLibs[0], capibuild.ThinLibs[1], capibuild.CapiLib, *install)
		return 0
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	note := io.Discard
	if *verbose {
		note = stderr
	}
	dir, err := findLibsFrom(ctx, *libdir, *src, stderr, note)
	if err != nil {
		fmt.Fprintf(stderr, "softrdma exec: %v\n", err)
		return 1
	}
	if *verbose {
		fmt.Fprintf(stderr, "softrdma exec: libraries from %s\n", dir)
	}
	prog, err := exec.LookPath(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "softrdma exec: %v\n", err)
		return 127
	}
	if w := goShadowWarning(fs.Arg(0), prog); w != "" {
		fmt.Fprintln(stderr, w) // e.g. cmd/mckey installed as mckey, before rdma-core's
	}
	env := withLibraryPath(os.Environ(), dir)
	if _, ours := softrdmaGoProgram(prog); !ours {
		if w := linkNote(prog, env); w != "" {
			fmt.Fprintln(stderr, w) // a static program, or one that does not link the libraries
		}
	}
	// PROGRAM takes over this process (sysfsview.go).
	return execProgram(prog, fs.Args(), env, *noView, stderr)
}

// withLibraryPath puts dir first on LD_LIBRARY_PATH.
func withLibraryPath(env []string, dir string) []string {
	out := make([]string, 0, len(env)+1)
	val := dir
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "LD_LIBRARY_PATH="); ok {
			if v != "" {
				val = dir + ":" + v
			}
			continue
		}
		out = append(out, kv)
	}
	return append(out, "LD_LIBRARY_PATH="+val)
}

// findLibs is findLibsFrom with the source SOFTRDMA_SRC names, if any.
func findLibs(ctx context.Context, libdir string, log io.Writer) (string, error) {
	return findLibsFrom(ctx, libdir, os.Getenv("SOFTRDMA_SRC"), log, io.Discard)
}

// findLibsFrom returns the directory of the libraries, building them from
// src (see sourceDir) when the place they should be has none, or, in the
// user's cache directory, when they are out of date: the source, or the
// toolchain, is not what their stamp records (capibuild.UpToDate, which
// runs no command: a start with up-to-date libraries takes milliseconds,
// not the seconds of a go build). The directory is checked before it
// goes on LD_LIBRARY_PATH (capibuild.CheckLibDir): no other user may be
// able to change it. What it decides is said on note.
func findLibsFrom(ctx context.Context, libdir, src string, log, note io.Writer) (string, error) {
	if libdir != "" {
		if _, err := os.Stat(libdir); err == nil {
			if _, err := checkedLibDir(libdir); err != nil {
				return "", err
			}
		}
		if !capibuild.Complete(libdir) {
			fmt.Fprintf(note, "softrdma exec: building the libraries into %s\n", libdir)
			if err := buildLibs(ctx, libdir, src, log); err != nil {
				return "", err
			}
		}
		return checkedLibDir(libdir)
	}
	if exe, err := os.Executable(); err == nil {
		d := filepath.Join(filepath.Dir(exe), "..", "lib", "softrdma")
		if capibuild.Complete(d) {
			return checkedLibDir(d)
		}
	}
	src, stamp, err := checkedSource(src, true)
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(src))
	d := filepath.Join(cache, "softrdma", "capi", hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(d, 0o700); err != nil {
		return "", err
	}
	if _, err := checkedLibDir(d); err != nil {
		return "", err
	}
	upToDate := func() bool { return capibuild.UpToDate(d, stamp) }
	if upToDate() {
		fmt.Fprintf(note, "softrdma exec: the libraries in %s are up to date with %s\n", d, src)
		return checkedLibDir(d)
	}
	// One build at a time: programs started together (a receiver and
	// its sender) wait for the first one's.
	unlock, err := lockDir(d)
	if err != nil {
		return "", err
	}
	defer unlock()
	if upToDate() {
		fmt.Fprintf(note, "softrdma exec: the libraries in %s are up to date with %s\n", d, src)
		return checkedLibDir(d)
	}
	fmt.Fprintf(note, "softrdma exec: building the libraries from %s into %s\n", src, d)
	if err := buildLibs(ctx, d, src, log); err != nil {
		return "", err
	}
	return checkedLibDir(d)
}

// lockDir takes an exclusive lock of the directory d (flock of d/.lock),
// waiting for another softrdma exec that holds it.
func lockDir(d string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(d, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", d, err)
	}
	return func() { f.Close() }, nil
}

// checkedLibDir returns dir, absolute and without symbolic links, if no
// other user can change the libraries in it.
func checkedLibDir(dir string) (string, error) {
	d, err := capibuild.CheckLibDir(dir)
	if err != nil {
		return "", fmt.Errorf("refusing to load the libraries of %s: %w", dir, err)
	}
	return d, nil
}

// buildLibs builds the libraries into dir from the softrdma source src
// (see sourceDir).
func buildLibs(ctx context.Context, dir, src string, log io.Writer) error {
	src, err := sourceDir(src)
	if err != nil {
		return err
	}
	if err := capibuild.Build(ctx, dir, capibuild.Options{ModuleDir: src, Log: log}); err != nil {
		return fmt.Errorf("building the libraries: %w", err)
	}
	return nil
}

// sourceDir returns the softrdma source to build the libraries from: the
// one named (-src, SOFTRDMA_SRC), else the one this binary was built
// from. Never the module of the current directory: a directory above it
// may be another user's. Either must pass capibuild.CheckSource.
func sourceDir(named string) (string, error) {
	src, _, err := checkedSource(named, false)
	return src, err
}

// checkedSource is sourceDir, and also returns the source's stamp if
// stamp is set (capibuild.CheckSourceStamp: the check and the stamp in
// one walk of the tree).
func checkedSource(named string, stamp bool) (string, capibuild.Stamp, error) {
	check := func(d string) (string, capibuild.Stamp, error) {
		if stamp {
			return capibuild.CheckSourceStamp(d, capibuild.Options{})
		}
		s, err := capibuild.CheckSource(d)
		return s, capibuild.Stamp{}, err
	}
	if named != "" {
		d, st, err := check(named)
		if err != nil {
			return "", st, fmt.Errorf("refusing the softrdma source %s: %w", named, err)
		}
		return d, st, nil
	}
	d, err := builtFrom()
	if err != nil {
		return "", capibuild.Stamp{}, err
	}
	s, st, err := check(d)
	if err != nil {
		return "", st, fmt.Errorf("no libraries, and the source this softrdma was built from cannot be built from: %w; give -libdir DIR, or -src DIR (SOFTRDMA_SRC)", err)
	}
	return s, st, nil
}

// builtFrom returns the directory of the module this binary was built
// from, as the compiler recorded this file's path (unless -trimpath).
func builtFrom() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return "", errors.New("no libraries, and this softrdma does not know the source it was built from (-trimpath); give -libdir DIR, or -src DIR (SOFTRDMA_SRC) to build them from")
	}
	// file is <module>/cmd/softrdma/exec.go.
	return filepath.Dir(filepath.Dir(filepath.Dir(file))), nil
}
