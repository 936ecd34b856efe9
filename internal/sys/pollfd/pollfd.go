// Package pollfd waits for a non-blocking file descriptor in Go's
// netpoller with a context: the pattern of the completion channels (an
// eventfd, an ibv_comp_channel) whose events a goroutine waits for without
// blocking an OS thread.
package pollfd

import (
	"context"
	"errors"
	"os"
	"sync"
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

// A Kick ends the waits of a consumer's threads: those that poll its
// eventfd (Fd) see it readable once it is written, and those blocked in a
// socket's receive (mmsg.Reader.Wait, where the wait and the receive are
// one system call) are registered and get a signal from Ring, which the
// writer calls after its write. The zero value with Fd set is ready.
//
// A signal that comes between a sleeper's registration and the start of
// its system call would be lost, so Ring first sets the socket's receive
// timeout (SO_RCVTIMEO) to the shortest there is: a receive that starts
// after Ring ends within a clock tick, and one that started before it is
// interrupted. (With a receive timeout set, a signal ends the receive with
// EINTR instead of restarting it; SIGURG is the Go runtime's own signal
// for preempting goroutines, which it ignores when it did not ask.)
type Kick struct {
	Fd int // the eventfd

	mu       sync.Mutex
	sleepers []*Sleeper
	missed   bool // rung with no sleeper registered: the next one returns at once
}

// A Sleeper is a thread blocked in a receive until a Kick rings.
type Sleeper struct {
	tid, fd int
	rung    bool // k.mu held
}

// Register registers the calling thread, which the caller has locked to
// its goroutine and which is about to block in a receive on fd (a socket
// with a receive timeout, held open until Unregister). It reports whether
// the kick rang with nobody registered since the last registration: the
// ring may have been for this caller, which should not block.
func (k *Kick) Register(s *Sleeper, fd int) (rung bool) {
	s.tid, s.fd, s.rung = unix.Gettid(), fd, false
	k.mu.Lock()
	rung, k.missed = k.missed, false
	k.sleepers = append(k.sleepers, s)
	k.mu.Unlock()
	return rung
}

// Unregister takes s out once its receive returned, and reports whether
// Ring found it: the kick rang, and s's socket's receive timeout was cut
// (the caller sets it again before its next blocking receive).
func (k *Kick) Unregister(s *Sleeper) (rung bool) {
	k.mu.Lock()
	for i, x := range k.sleepers {
		if x == s {
			last := len(k.sleepers) - 1
			k.sleepers[i], k.sleepers[last] = k.sleepers[last], nil
			k.sleepers = k.sleepers[:last]
			break
		}
	}
	k.mu.Unlock()
	return s.rung
}

// Ring ends the receives of the registered sleepers (call it after
// writing Fd). It makes raw system calls only, none of which blocks.
func (k *Kick) Ring() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.sleepers) == 0 {
		k.missed = true
		return
	}
	pid := unix.Getpid()
	tv := unix.Timeval{Usec: 1}
	for _, s := range k.sleepers {
		if s.rung {
			continue
		}
		s.rung = true
		unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(s.fd), unix.SOL_SOCKET, unix.SO_RCVTIMEO, uintptr(unsafe.Pointer(&tv)), unsafe.Sizeof(tv), 0)
		unix.RawSyscall(unix.SYS_TGKILL, uintptr(pid), uintptr(s.tid), uintptr(unix.SIGURG))
	}
}
