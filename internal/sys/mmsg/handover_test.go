package mmsg_test

import (
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/internal/sys/rawudp"
)

// TestReadNowHandsOverEverything: a consumer's ReadNow reads one batch (a
// socket that can leave the netpoller), but when Serve's goroutine found
// the read lock held meanwhile and went back to the netpoller, the holder
// reads until the socket is empty: Serve, woken by no new datagram, would
// leave the rest unread until the next one came. (Found by a C program
// with a completion channel, cmd/softrdma's TestExecThreads: a poller's
// ibv_poll_cq reads on an empty CQ with ReadNow; messages sent and
// completed stayed unread in the socket for as long as no other came.)
func TestReadNowHandsOverEverything(t *testing.T) {
	rc, err := rawudp.ListenUDP("udp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	const batch = 4
	r, err := mmsg.NewReader(rc, mmsg.NewBatch(batch, 256, unix.SizeofSockaddrInet6, 0))
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	gate := make(chan struct{})
	var first atomic.Bool
	served := make(chan struct{})
	go func() {
		defer close(served)
		r.Serve(func(n int) {
			if !first.Swap(true) {
				<-gate // the consumer's first batch holds the read lock
			}
			handled.Add(int64(n))
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
	send := func(k int) {
		for range k {
			if _, err := sc.WriteToUDPAddrPort([]byte("x"), to); err != nil {
				t.Fatal(err)
			}
		}
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("timeout: %s (%d datagrams handled)", what, handled.Load())
			}
			time.Sleep(time.Millisecond)
		}
	}
	wait("Serve runs", r.Serving)

	// The lease of a Progress keeps Serve's goroutine asleep: the first
	// datagram is the consumer's, whose ReadNow then holds the read lock
	// in the handler.
	r.Progress()
	send(1)
	consumer := make(chan struct{})
	go func() {
		defer close(consumer)
		for !first.Load() {
			r.ReadNow()
		}
	}()
	wait("the consumer reads the first datagram", first.Load)
	// Three batches more; the lease ends, Serve's goroutine is woken,
	// finds the lock held and leaves the socket to the holder.
	send(3 * batch)
	wait("Serve's goroutine leaves the socket to the holder", r.HandedOver)
	close(gate)
	<-consumer
	wait("every datagram read", func() bool { return handled.Load() == 1+3*batch })
}
