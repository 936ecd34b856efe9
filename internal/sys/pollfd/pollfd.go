// Package pollfd waits for a non-blocking file descriptor in Go's
// netpoller with a context: the pattern of the completion channels (an
// eventfd, an ibv_comp_channel) whose events a goroutine waits for without
// blocking an OS thread.
package pollfd

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// past is a deadline that has passed: it ends a pending read.
var past = time.Unix(1, 0)

// Read calls try with the fd each time f is readable until try reports
// done; it returns ctx.Err() when ctx ends first and EBADF when f is
// closed. rc is f's SyscallConn.
func Read(ctx context.Context, f *os.File, rc syscall.RawConn, try func(fd uintptr) (done bool)) error {
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(past) })
	err := rc.Read(try)
	if !stop() {
		_ = f.SetReadDeadline(time.Time{})
	}
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, os.ErrClosed):
		return syscall.EBADF
	}
	return err
}

// Wait2 blocks the calling thread in ppoll until fd or kick is readable
// or timeout passes (nil: no timeout), and reports which were readable.
// A signal (the Go runtime's preemption among them) does not end it
// early: ppoll is called again with what the kernel left of timeout.
func Wait2(fd, kick int, timeout *unix.Timespec) (ready, kicked bool) {
	fds := [2]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(kick), Events: unix.POLLIN}}
	for {
		_, _, e := unix.Syscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), 2, uintptr(unsafe.Pointer(timeout)), 0, 0, 0)
		if e != unix.EINTR {
			return fds[0].Revents != 0, fds[1].Revents != 0
		}
	}
}
