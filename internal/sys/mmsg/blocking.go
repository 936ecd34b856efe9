package mmsg

import (
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/pollfd"
)

// Wait's blocking receive: the wait and the receive in one system call.
//
// A waiter that blocks in ppoll and then reads makes two system calls
// per wake-up where a plain socket program makes one, about 2 µs a
// message on the 2-core VM (measured in a ping-pong: 28 µs a round trip
// blocking in recvfrom, 32 with ppoll first). So the waiter that finds
// nobody reading the socket (it takes mu without waiting, and keeps it
// while it blocks: a poller that finds mu taken leaves what it came for to
// the holder, who is woken by that very datagram) blocks in recvmmsg
// itself. The socket is made blocking for it, once: every other receive
// and send on a rawudp socket passes MSG_DONTWAIT, and the socket is not
// in Go's netpoller itself (rawudp.Conn puts an epoll of its own there),
// so nothing else blocks. The wait is bounded by the socket's SO_RCVTIMEO,
// which also makes a signal end it with EINTR rather than restart it: the
// consumer's Kick ends it with one (pollfd.Kick), a shutdown(SHUT_RD) with
// an empty read.

// blockingLocked prepares fd for a blocking receive of at most timeout
// (r.mu held); false if it cannot block (then no waiter tries again).
func (r *Reader) blockingLocked(fd uintptr, timeout time.Duration) bool {
	if !r.blocking {
		if err := unix.SetNonblock(int(fd), false); err != nil {
			r.noBlock.Store(true)
			return false
		}
		r.blocking = true
	}
	// A receive timeout a little shorter than asked does (the consumer
	// waits again); one longer would oversleep a deadline.
	if r.rcvtimeo > timeout || r.rcvtimeo < timeout-timeout/8 {
		tv := unix.NsecToTimeval(int64(timeout))
		if err := unix.SetsockoptTimeval(int(fd), unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			r.noBlock.Store(true)
			return false
		}
		r.rcvtimeo = timeout
	}
	return true
}

// waitLocked is Wait's blocking receive (r.mu held, which it unlocks): it
// registers the thread with kick, blocks in recvmmsg, calls woke, hands
// what it read to Serve's handler, and reports whether kick rang.
func (r *Reader) waitLocked(fd uintptr, kick *pollfd.Kick, woke func()) (kicked bool) {
	runtime.LockOSThread()
	got := false
	kicked = kick.Register(&r.sl, int(fd))
	if !kicked {
		got = r.recvBlocking(fd)
	}
	if kick.Unregister(&r.sl) {
		kicked = true
		r.rcvtimeo = 0 // Ring cut it
	}
	runtime.UnlockOSThread()
	if woke != nil {
		woke()
	}
	if got {
		switch r.errno {
		case 0:
			r.serve(r.n)
		case unix.ENOMEM, unix.ENOBUFS: // transient
		default:
			if !r.async(r.errno) {
				r.fatal.Store(uint32(r.errno))
			}
		}
	}
	r.Release()
	r.mu.Unlock()
	if r.pending.Load() {
		r.progress(fd, false, false)
	}
	return kicked
}

// recvBlocking is one blocking recvmmsg into the batch (r.mu held): true
// if it read datagrams or failed with an error to deal with (r.n,
// r.errno), false on its timeout, a signal or a shutdown. A full batch
// leaves the rest to the next Wait or Progress, or the lease's end, as
// Progress does.
func (r *Reader) recvBlocking(fd uintptr) bool {
	b := r.batch()
	n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.Hdrs[0])),
		uintptr(len(b.Hdrs)), unix.MSG_WAITFORONE, 0, 0)
	switch e {
	case 0:
		if n == 1 && b.Hdrs[0].Len == 0 && b.Hdrs[0].Hdr.Namelen == 0 {
			return false // shut down: an empty read from nobody
		}
		r.n, r.errno = int(n), 0
		return n > 0
	case unix.EAGAIN, unix.EINTR:
		return false
	}
	r.n, r.errno = 0, e
	return true
}
