package rxe

import (
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/internal/sys/rawudp"
)

// progressInput is a socket on 127.0.0.1 served by an mmsg.Reader whose
// handler counts the datagrams it handled and those a consumer read (not
// Serve's goroutine), and marks the input active as a unicast receiver
// does.
type progressInput struct {
	x        *uinput
	handled  atomic.Int64
	consumer atomic.Int64
	to       netip.AddrPort
}

func newProgressInput(t *testing.T) *progressInput {
	t.Helper()
	rc, err := rawudp.ListenUDP("udp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	br, err := mmsg.NewReader(rc, mmsg.NewBatch(4, 64, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	p := &progressInput{x: &uinput{br: br}, to: rc.LocalAddr().(*net.UDPAddr).AddrPort()}
	done := make(chan struct{})
	go func() {
		defer close(done)
		br.Serve(func(n int) {
			p.x.last.Store(clock())
			if !br.InServe() {
				p.consumer.Add(int64(n))
			}
			p.handled.Add(int64(n))
		})
	}()
	t.Cleanup(func() {
		rc.Close()
		<-done
	})
	return p
}

// TestProgressReadsActiveUnicastInputs: a consumer's progress on one
// input (the Source of its CQ's last completion) also reads the device's
// unicast inputs that read something lately — in a ping-pong between two
// processes, the hand-over connection and the unicast socket on which its
// own datagrams wait to be handed over — and leaves the idle ones to their
// goroutines.
func TestProgressReadsActiveUnicastInputs(t *testing.T) {
	d := &Device{}
	own := newProgressInput(t)
	other := newProgressInput(t)
	d.addInputLocked(other.x)
	in := &devInput{own: own.x.br, d: d}

	tx, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	send := func() {
		if _, err := tx.WriteToUDPAddrPort([]byte("x"), other.to); err != nil {
			t.Fatal(err)
		}
	}
	waitHandled := func(want int64, poll bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); other.handled.Load() < want; {
			if time.Now().After(deadline) {
				t.Fatalf("%d datagrams handled, want %d", other.handled.Load(), want)
			}
			if poll {
				in.Progress()
			} else {
				time.Sleep(time.Millisecond)
			}
		}
	}

	// Idle (never read anything): the consumer's progress leaves it to
	// its goroutine.
	send()
	for range 3 {
		in.Progress()
	}
	waitHandled(1, false)
	if c := other.consumer.Load(); c != 0 {
		t.Fatalf("a consumer read an idle input (%d datagrams)", c)
	}

	// Active: a consumer polling in a loop reads it. Serve's goroutine may
	// still win a datagram (the lease lapses if the test's goroutine
	// stalls on a loaded host), but not all of them.
	var n int64 = 1
	for range 200 {
		send()
		n++
		waitHandled(n, true)
		if other.consumer.Load() > 0 {
			break
		}
	}
	if other.consumer.Load() == 0 {
		t.Fatalf("a consumer polling in a loop read none of %d datagrams of an active unicast input", n-1)
	}

	// Gone idle again (activeFor without a datagram): left alone.
	other.x.last.Store(clock() - int64(2*activeFor))
	c := other.consumer.Load()
	in.EndLease()
	send()
	n++
	for range 3 {
		in.Progress()
	}
	waitHandled(n, false)
	if got := other.consumer.Load(); got != c {
		t.Fatalf("a consumer read an input idle for %v", 2*activeFor)
	}
}
