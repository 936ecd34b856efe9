package mmsg_test

import (
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/internal/sys/pollfd"
	"github.com/softrdma/softrdma/internal/sys/rawudp"
)

// served opens a rawudp socket on 127.0.0.1 (one that can leave the
// netpoller) with a Reader serving it; handled counts the datagrams its
// handler got. It returns a function that sends one datagram to it.
func served(t *testing.T) (r *mmsg.Reader, rc *rawudp.Conn, handled *atomic.Int64, send func()) {
	t.Helper()
	rc, err := rawudp.ListenUDP("udp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err = mmsg.NewReader(rc, mmsg.NewBatch(4, 256, unix.SizeofSockaddrInet6, 0))
	if err != nil {
		t.Fatal(err)
	}
	handled = new(atomic.Int64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Serve(func(n int) { handled.Add(int64(n)) })
	}()
	t.Cleanup(func() {
		rc.Close()
		<-done
	})
	sc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	to := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(rc.LocalAddr().(*net.UDPAddr).Port))
	return r, rc, handled, func() {
		if _, err := sc.WriteToUDPAddrPort([]byte("x"), to); err != nil {
			t.Fatal(err)
		}
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timeout: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// newKick returns a Kick on a new eventfd.
func newKick(t *testing.T) *pollfd.Kick {
	t.Helper()
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return &pollfd.Kick{Fd: fd}
}

// ring writes the kick's eventfd and rings it, as a completion channel
// does.
func ring(k *pollfd.Kick) {
	unix.Write(k.Fd, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	k.Ring()
}

// TestProgressAndWait: a consumer's Progress and Wait read the socket on
// its own goroutine, Wait ends on data, a kick or its timeout, and what
// arrives after the consumers went away is read by Serve when the lease
// ends (nothing waits unread).
func TestProgressAndWait(t *testing.T) {
	r, _, handled, send := served(t)
	send()
	eventually(t, "Serve reads the first datagram", func() bool { return handled.Load() == 1 })

	// Progress takes the socket from Serve (the lease): what is sent now
	// waits for the consumer, who reads it in Wait.
	r.Progress()
	send()
	kick := newKick(t)
	woke := false
	kicked, err := r.Wait(kick, 10*time.Second, func() { woke = true })
	if err != nil || kicked || !woke {
		t.Fatalf("Wait on data: kicked %v, err %v, woke %v", kicked, err, woke)
	}
	if n := handled.Load(); n != 2 {
		t.Fatalf("after Wait on data: %d datagrams handled, want 2", n)
	}

	// A kick ends a Wait without data (that the signal ends the blocked
	// receive itself, not its timeout, pollfd's TestKickEndsReceive shows).
	go func() {
		time.Sleep(20 * time.Millisecond)
		ring(kick)
	}()
	if kicked, err := r.Wait(kick, 10*time.Second, nil); err != nil || !kicked {
		t.Fatalf("Wait on a kick: kicked %v, err %v", kicked, err)
	}
	var b [8]byte
	unix.Read(kick.Fd, b[:])
	// A kick rung with nobody waiting ends the next Wait at once.
	ring(kick)
	if kicked, err := r.Wait(kick, 10*time.Second, nil); err != nil || !kicked {
		t.Fatalf("Wait after a kick: kicked %v, err %v", kicked, err)
	}
	unix.Read(kick.Fd, b[:])

	// A timeout ends it too.
	start := time.Now()
	if kicked, err := r.Wait(kick, 20*time.Millisecond, nil); err != nil || kicked {
		t.Fatalf("Wait timing out: kicked %v, err %v", kicked, err)
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Fatalf("Wait of 20ms returned after %v", d)
	}

	// Sent right after the last consumer left, during its lease: Serve
	// reads it once the lease ends.
	send()
	eventually(t, "Serve reads what came during the lease", func() bool { return handled.Load() == 3 })
	// And after it, at once as before.
	send()
	eventually(t, "Serve reads after the lease", func() bool { return handled.Load() == 4 })
}

// TestWaitWokenByShutdown: a socket shut down for reading wakes its
// waiter, so that the close that follows does not wait for it.
func TestWaitWokenByShutdown(t *testing.T) {
	r, rc, _, _ := served(t)
	kick := newKick(t)
	done := make(chan error, 1)
	go func() {
		_, err := r.Wait(kick, 10*time.Second, nil)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	raw, _ := rc.SyscallConn()
	raw.Control(func(fd uintptr) { unix.Shutdown(int(fd), unix.SHUT_RD) })
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a shutdown did not wake the waiter")
	}
	rc.Close()
	if _, err := r.Wait(kick, time.Second, nil); err == nil {
		t.Fatal("Wait on a closed socket: no error")
	}
}

// TestProgressAllocs: Progress on an empty socket allocates nothing (CQ.Poll
// calls it on every empty poll).
func TestProgressAllocs(t *testing.T) {
	r, _, _, _ := served(t)
	if a := testing.AllocsPerRun(200, r.Progress); a > 0 {
		t.Fatalf("%.1f allocations per Progress", a)
	}
}
