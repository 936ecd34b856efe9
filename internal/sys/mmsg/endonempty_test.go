package mmsg_test

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
)

// TestEndOnEmpty: the reader of a SOCK_SEQPACKET connection hands over the
// datagrams queued before the peer closed it, then Serve ends with
// ECONNRESET instead of reading the end (an empty message) for ever.
func TestEndOnEmpty(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "seqpacket")
	conn, err := net.FileConn(f)
	f.Close()
	if err != nil {
		unix.Close(fds[1])
		t.Fatal(err)
	}
	defer conn.Close()
	r, err := mmsg.NewReader(conn.(*net.UnixConn), mmsg.NewBatch(8, 64, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	r.EndOnEmpty()
	for _, m := range []string{"one", "two", "three"} {
		if _, err := unix.Write(fds[1], []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	unix.Close(fds[1])
	var got atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- r.Serve(func(n int) {
			for i := 0; i < n; i++ {
				if b, _, _, _ := r.Datagram(i); len(b) == 0 {
					t.Errorf("datagram %d is empty", i)
				}
			}
			got.Add(int64(n))
		})
	}()
	select {
	case err := <-done:
		if !errors.Is(err, unix.ECONNRESET) {
			t.Fatalf("Serve returned %v, want ECONNRESET", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not end at the end of the connection")
	}
	if n := got.Load(); n != 3 {
		t.Fatalf("%d datagrams handled, want 3", n)
	}
}
