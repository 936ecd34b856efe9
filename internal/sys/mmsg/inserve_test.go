package mmsg_test

import (
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/internal/sys/rawudp"
)

// TestInServe: Serve's handler learns whether it runs on Serve's
// goroutine (a datagram Serve read) or on a consumer's (a datagram the
// consumer's ReadNow read while Serve sleeps under a Progress lease).
func TestInServe(t *testing.T) {
	rc, err := rawudp.ListenUDP("udp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := mmsg.NewReader(rc, mmsg.NewBatch(4, 256, unix.SizeofSockaddrInet6, 0))
	if err != nil {
		t.Fatal(err)
	}
	var byServe, byConsumer atomic.Int64
	served := make(chan struct{})
	go func() {
		defer close(served)
		r.Serve(func(n int) {
			// The oracle: the handler's own stack holds Serve's frame or
			// the consumer's Progress.
			buf := make([]byte, 8192)
			stack := string(buf[:runtime.Stack(buf, false)])
			onServe := strings.Contains(stack, "mmsg.(*Reader).Serve(")
			if r.InServe() != onServe {
				t.Errorf("InServe %v on the stack\n%s", r.InServe(), stack)
			}
			if onServe {
				byServe.Add(int64(n))
			} else {
				byConsumer.Add(int64(n))
			}
		})
	}()
	defer func() {
		rc.Close()
		<-served
	}()
	sc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	to := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(rc.LocalAddr().(*net.UDPAddr).Port))
	wait := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timeout: %s (by Serve %d, by the consumer %d)", what, byServe.Load(), byConsumer.Load())
			}
		}
	}
	wait("Serve runs", r.Serving)
	// Serve's goroutine reads a datagram that comes while nobody polls.
	if _, err := sc.WriteToUDPAddrPort([]byte("x"), to); err != nil {
		t.Fatal(err)
	}
	wait("Serve reads it", func() bool { return byServe.Load() == 1 })
	// A consumer's Progress reads what waits (under its lease Serve's
	// goroutine is not woken; if a slow machine lets the lease run out,
	// Serve may take one, and the consumer tries again).
	wait("the consumer reads one", func() bool {
		if _, err := sc.WriteToUDPAddrPort([]byte("y"), to); err != nil {
			t.Fatal(err)
		}
		r.Progress()
		return byConsumer.Load() >= 1
	})
	r.EndLease()
}
