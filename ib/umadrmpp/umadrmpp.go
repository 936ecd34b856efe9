// Package umadrmpp builds softsm's RMPP layer for umad clients under
// ibsim's libumad2sim.so: a small C preload library (umad_rmpp.c,
// embedded) that plays the part of the kernel's MAD layer umad2sim lacks.
// OpenSM's libibumad leaves an RMPP-active answer (a GetTableResp) to the
// kernel to cut into segments, and a umad client such as saquery leaves
// their reassembly to it; under umad2sim nothing did, and ibsim's protocol
// carries 256 bytes a MAD, so an answer of more than one segment was cut.
//
// The library goes after libumad2sim.so in LD_PRELOAD (Preload). It
// interposes libibumad's umad_send (an RMPP-active MAD of an RMPP class is
// sent as kernel-framed RMPP DATA segments), umad_recv (segments are
// reassembled and acknowledged as the kernel's receiver does, ACKs are
// swallowed, the whole MAD is returned with the kernel's ENOSPC rule) and
// umad_poll, and read() as umad2sim's receiver thread calls it, to put
// back the last 32 bytes of each received segment, which umad2sim 0.10
// does not copy to its reader. The sender's window, ACK wait and
// retransmission are not emulated: every segment goes at once to softsm
// over a local socket, and softsm runs the protocol with the port. See
// the C file's comment and docs/opensm.md.
//
// Build compiles it with the system C compiler at run time; the Go build
// needs no cgo.
package umadrmpp

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

//go:embed c/umad_rmpp.c
var source []byte

// LibName is the file name Build gives the library.
const LibName = "libsoftsm-umad-rmpp.so"

// ErrNoCompiler reports that no C compiler was found: the library cannot
// be built (softsm then runs OpenSM without it).
var ErrNoCompiler = errors.New("umadrmpp: no C compiler")

// Build compiles the library into dir/LibName with the C compiler cc (""
// → $CC, else cc; it needs <infiniband/umad.h>, Debian's libibumad-dev)
// and returns its path. dir must exist and be safe from other users, as
// everything in it is loaded into OpenSM: owned by the effective user and
// writable by no one else, as every directory above it unless sticky
// (/tmp). A compiler that cannot be found gives an error wrapping
// ErrNoCompiler; a failed compilation gives the compiler's output.
func Build(ctx context.Context, dir, cc string) (string, error) {
	if cc == "" {
		cc = os.Getenv("CC")
	}
	if cc == "" {
		cc = "cc"
	}
	ccPath, err := exec.LookPath(cc)
	if err != nil {
		return "", fmt.Errorf("%w (%s): %v", ErrNoCompiler, cc, err)
	}
	real, err := checkDir(dir)
	if err != nil {
		return "", err
	}
	out := filepath.Join(real, LibName)
	tmp := out + ".tmp"
	cmd := exec.CommandContext(ctx, ccPath, "-shared", "-fPIC", "-O2", "-Wall", "-o", tmp, "-x", "c", "-", "-ldl", "-lpthread")
	cmd.Stdin = bytes.NewReader(source)
	cmd.Dir = real
	if b, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("umadrmpp: %s (needs libibumad-dev for <infiniband/umad.h>): %v: %s", cc, err, strings.TrimSpace(string(b)))
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("umadrmpp: %w", err)
	}
	if err := os.Rename(tmp, out); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("umadrmpp: %w", err)
	}
	return out, nil
}

// Preload returns the LD_PRELOAD value that runs a umad client under
// umad2sim with the library lib after it ("" lib: umad2sim alone).
func Preload(umad2sim, lib string) string {
	if lib == "" {
		return umad2sim
	}
	return umad2sim + ":" + lib
}

// checkDir resolves dir's symbolic links and checks that no other user
// can change what is in it: dir is a directory owned by the effective
// user (or root) and writable by no one else, and so is every directory
// above it, but one with the sticky bit (as /tmp) may be writable by
// others.
func checkDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("umadrmpp: %w", err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("umadrmpp: %w", err)
	}
	me := os.Geteuid()
	for p := real; ; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		if err != nil {
			return "", fmt.Errorf("umadrmpp: %w", err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		switch {
		case !fi.IsDir():
			return "", fmt.Errorf("umadrmpp: %s is not a directory", p)
		case !ok:
			return "", fmt.Errorf("umadrmpp: %s has no owner to check", p)
		case int(st.Uid) != me && st.Uid != 0:
			return "", fmt.Errorf("umadrmpp: %s is owned by uid %d, not by you (uid %d) or root", p, st.Uid, me)
		case fi.Mode().Perm()&0o022 != 0 && (p == real || fi.Mode()&fs.ModeSticky == 0):
			return "", fmt.Errorf("umadrmpp: %s is writable by its group or others (mode %v)", p, fi.Mode())
		}
		if p == filepath.Dir(p) {
			return real, nil
		}
	}
}
