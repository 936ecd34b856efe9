package pollfd_test

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/pollfd"
)

// blockingSocket returns a blocking UDP socket on 127.0.0.1 that nobody
// sends to, with a receive timeout of 10 s.
func blockingSocket(t *testing.T) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	tv := unix.Timeval{Sec: 10}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return fd
}

// TestKickEndsReceive: a thread registered with a Kick and blocked in a
// receive on a socket with a 10 s receive timeout returns long before it
// when the Kick rings — whether the ring comes while the thread is
// blocked (a signal ends the receive) or between its registration and its
// receive (the signal finds it in Go; the cut receive timeout ends the
// receive that follows), the race a signal alone would lose.
func TestKickEndsReceive(t *testing.T) {
	for _, early := range []bool{false, true} {
		fd := blockingSocket(t)
		k := &pollfd.Kick{Fd: -1}
		registered := make(chan struct{})
		rang := make(chan struct{})
		type result struct {
			rung bool
			err  error
			took time.Duration
		}
		done := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var s pollfd.Sleeper
			before := k.Register(&s, fd)
			close(registered)
			if early {
				<-rang
			}
			start := time.Now()
			var b [16]byte
			_, _, err := unix.Recvfrom(fd, b[:], 0)
			took := time.Since(start)
			done <- result{k.Unregister(&s) && !before, err, took}
		}()
		<-registered
		if !early {
			// Blocked, most likely; if not yet, this is the early case.
			time.Sleep(50 * time.Millisecond)
		}
		k.Ring()
		close(rang)
		select {
		case r := <-done:
			if !r.rung || r.err == nil {
				t.Errorf("early %v: Unregister says rung %v; the receive's error %v (want EINTR or EAGAIN)", early, r.rung, r.err)
			}
			t.Logf("early %v: the receive returned after %v: %v", early, r.took, r.err)
		case <-time.After(5 * time.Second):
			t.Fatalf("early %v: a rung Kick did not end the receive within 5 s (its timeout is 10 s)", early)
		}
	}
}

// TestKickMissed: a Kick rung with nobody registered tells the next
// registration, once.
func TestKickMissed(t *testing.T) {
	k := &pollfd.Kick{Fd: -1}
	var s pollfd.Sleeper
	k.Ring()
	if !k.Register(&s, -1) {
		t.Error("a registration after a ring with nobody registered: not told")
	}
	k.Unregister(&s)
	if k.Register(&s, -1) {
		t.Error("the second registration after one ring: told again")
	}
	if k.Unregister(&s) {
		t.Error("Unregister: rung, with no ring since Register")
	}
}
