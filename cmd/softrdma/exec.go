package main

// softrdma exec: runs an unmodified, dynamically linked C program on
// softrdma's devices, with softrdma's librdmacm.so.1 and libibverbs.so.1
// (the capi command, built by internal/capibuild) in place of rdma-core's.

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/softrdma/softrdma/internal/capibuild"
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
../lib/softrdma next to the softrdma binary, else built from the softrdma
source (the module of the current directory, or SOFTRDMA_SRC) into the
user's cache directory; building needs go, a C compiler and the
librdmacm-dev and libibverbs-dev headers. -install DIR builds them into DIR
(for a container image) and exits.`

func execCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: softrdma exec [-libdir DIR] [--] PROGRAM [ARGS...]\n       softrdma exec -install DIR\n%s\n\n", execAbout)
		fs.PrintDefaults()
	}
	libdir := fs.String("libdir", os.Getenv("SOFTRDMA_LIBDIR"), "`directory` of the libraries (built there if missing)")
	install := fs.String("install", "", "build the libraries into `DIR` and exit")
	verbose := fs.Bool("v", false, "say which libraries are used")
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
		if err := buildLibs(ctx, *install, stderr); err != nil {
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
	dir, err := findLibs(ctx, *libdir, stderr)
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
	env := withLibraryPath(os.Environ(), dir)
	// exec: PROGRAM takes over this process, so its exit status and the
	// signals sent to it (or that kill it) are seen by the caller as is.
	err = syscall.Exec(prog, fs.Args(), env)
	fmt.Fprintf(stderr, "softrdma exec: %s: %v\n", prog, err)
	return 126
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

// findLibs returns the directory of the libraries, building them when
// the place they should be has none.
func findLibs(ctx context.Context, libdir string, log io.Writer) (string, error) {
	if libdir != "" {
		if capibuild.Complete(libdir) {
			return libdir, nil
		}
		return libdir, buildLibs(ctx, libdir, log)
	}
	if exe, err := os.Executable(); err == nil {
		d := filepath.Join(filepath.Dir(exe), "..", "lib", "softrdma")
		if capibuild.Complete(d) {
			return d, nil
		}
	}
	src, err := moduleDir()
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(src))
	d := filepath.Join(cache, "softrdma", "capi", hex.EncodeToString(sum[:8]))
	// go build is incremental: an up-to-date source relinks only.
	return d, buildLibs(ctx, d, log)
}

// buildLibs builds the libraries into dir from the softrdma source.
func buildLibs(ctx context.Context, dir string, log io.Writer) error {
	src, err := moduleDir()
	if err != nil {
		return err
	}
	if err := capibuild.Build(ctx, dir, capibuild.Options{ModuleDir: src, Log: log}); err != nil {
		return fmt.Errorf("building the libraries: %w", err)
	}
	return nil
}

// moduleDir finds the softrdma source: SOFTRDMA_SRC, else the module of
// the current directory if it is softrdma's.
func moduleDir() (string, error) {
	if d := os.Getenv("SOFTRDMA_SRC"); d != "" {
		return d, nil
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("no libraries and no go command to build them (go env GOMOD: %v); give -libdir or SOFTRDMA_SRC", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull || !isSoftrdmaModule(gomod) {
		return "", fmt.Errorf("no libraries, and the current directory is not in the softrdma source to build them; give -libdir DIR or SOFTRDMA_SRC")
	}
	return filepath.Dir(gomod), nil
}

// isSoftrdmaModule tells whether go.mod declares softrdma's module.
func isSoftrdmaModule(gomod string) bool {
	f, err := os.Open(gomod)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.TrimSpace(m) == "github.com/softrdma/softrdma"
		}
	}
	return false
}
