package introspect

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// listenUnix listens on a Unix socket at path whose mode is 0600 from the
// moment the name exists: the socket is bound and chmod'ed inside a fresh
// directory of mode 0700 next to path (nobody else can reach it there,
// whatever the umask), then hard-linked to path, which never replaces an
// existing file, and the private name is removed. A stale socket at path
// (nobody listening) is replaced; a live one gives EADDRINUSE, any other
// file EEXIST. Closing the listener removes path if it is still this
// socket. No process-wide state (umask) is touched.
func listenUnix(path string) (net.Listener, error) {
	if len(path) > maxSunPath {
		return nil, fmt.Errorf("socket path %s: %d bytes, at most %d: %w", path, len(path), maxSunPath, syscall.ENAMETOOLONG)
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".s")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	private := filepath.Join(dir, "s")
	if len(private) > maxSunPath {
		return nil, fmt.Errorf("socket path %s: the private name %s next to it is %d bytes, at most %d: %w", path, private, len(private), maxSunPath, syscall.ENAMETOOLONG)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: private, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		ln.Close()
		return nil, err
	}
	if err := os.Chmod(private, 0o600); err != nil {
		return fail(err)
	}
	if err := linkNoReplace(private, path); err != nil {
		return fail(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(err)
	}
	return &unixListener{UnixListener: ln, path: path, fi: fi}, nil
}

// maxSunPath is the longest path a Unix socket address holds
// (sizeof(sun_path) - 1).
const maxSunPath = 107

// linkNoReplace links the socket at private to path. An existing stale
// socket at path is removed and the link tried once more.
func linkNoReplace(private, path string) error {
	err := os.Link(private, path)
	if !errors.Is(err, syscall.EEXIST) {
		return err
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket: %w", path, syscall.EEXIST)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("%s: another process serves it: %w", path, syscall.EADDRINUSE)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("stale socket %s: %w", path, err)
	}
	if err := os.Link(private, path); errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("%s: created again while replacing a stale socket: %w", path, syscall.EADDRINUSE)
	} else if err != nil {
		return err
	}
	return nil
}

// unixListener is a Unix listener bound under a private name and
// published at path.
type unixListener struct {
	*net.UnixListener
	path string
	fi   os.FileInfo // the socket file, to remove only our own on Close
}

// Addr returns the published path.
func (l *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

// Close closes the listener and removes path if it is still this socket.
func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	if fi, serr := os.Lstat(l.path); serr == nil && os.SameFile(fi, l.fi) {
		os.Remove(l.path)
	}
	return err
}
