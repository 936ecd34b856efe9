package introspect

import (
	"errors"
	"net"

	"golang.org/x/sys/unix"
)

// peerCred returns the credentials of the process at the other end of a
// Unix stream connection (SO_PEERCRED: for a connecting client, the
// process that called listen; for a server, the one that connected).
func peerCred(c net.Conn) (*unix.Ucred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, errors.New("not a Unix socket connection")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, gerr
}
