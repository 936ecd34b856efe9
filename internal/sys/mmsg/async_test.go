package mmsg_test

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/internal/sys/rawudp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// loopback is the loopback address of a family.
func loopback(v6 bool) netip.Addr {
	if v6 {
		return netip.IPv6Loopback()
	}
	return netip.MustParseAddr("127.0.0.1")
}

// refusedConn returns a UDP socket on loopback connected to a port where
// nothing listened when it sent there, so that the kernel keeps
// ECONNREFUSED for it (the ICMP port unreachable that loopback answered
// with), and a socket bound to that port afterwards, whose datagrams the
// connected one takes. The connected socket is a rawudp.Conn with raw,
// else a net.UDPConn.
func refusedConn(t *testing.T, v6, raw bool) (c syscall.Conn, from *net.UDPConn) {
	t.Helper()
	network := map[bool]string{false: "udp4", true: "udp6"}[v6]
	lo := loopback(v6)
	// A port nothing listens on any more.
	tmp, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(lo, 0)))
	if err != nil {
		if v6 {
			t.Skipf("no IPv6 loopback: %v", err)
		}
		t.Fatal(err)
	}
	peer := tmp.LocalAddr().(*net.UDPAddr).AddrPort()
	tmp.Close()

	var sc syscall.Conn
	if raw {
		rc, err := rawudp.ListenUDP(network, netip.AddrPortFrom(lo, 0).String(), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rc.Close() })
		sc = rc
	} else {
		uc, err := mmsg.ListenUDP(network, netip.AddrPortFrom(lo, 0).String(), func(int) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { uc.Close() })
		sc = uc
	}
	rc, _ := sc.SyscallConn()
	var serr error
	rc.Control(func(fd uintptr) {
		var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: peer.Addr().As16(), Port: int(peer.Port())}
		if !v6 {
			sa = &unix.SockaddrInet4{Addr: peer.Addr().As4(), Port: int(peer.Port())}
		}
		if serr = unix.Connect(int(fd), sa); serr == nil {
			_, serr = unix.Write(int(fd), []byte("anyone there?"))
		}
	})
	if serr != nil {
		t.Fatal(serr)
	}
	waitPollErr(t, sc)

	from, err = net.ListenUDP(network, net.UDPAddrFromAddrPort(peer))
	if err != nil {
		t.Fatalf("the port again: %v", err)
	}
	t.Cleanup(func() { from.Close() })
	return sc, from
}

// waitPollErr waits until the socket has an error pending (POLLERR).
func waitPollErr(t *testing.T, c syscall.Conn) {
	t.Helper()
	rc, _ := c.SyscallConn()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var rev int16
		rc.Control(func(fd uintptr) {
			p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			unix.Poll(p, 10)
			rev = p[0].Revents
		})
		if rev&unix.POLLERR != 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no ICMP error on the connected socket")
		}
	}
}

// TestAsyncErrorServe: an error the kernel keeps for an ICMP message (a
// port unreachable, ECONNREFUSED on the next read) does not end Serve: it
// is counted and handed to OnAsyncError, and the datagrams sent after it
// are read. IPv4 and IPv6, on a net.UDPConn and a rawudp.Conn.
func TestAsyncErrorServe(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		for _, raw := range []bool{false, true} {
			name := map[bool]string{false: "IPv4", true: "IPv6"}[v6] + map[bool]string{false: "/net", true: "/rawudp"}[raw]
			t.Run(name, func(t *testing.T) {
				c, from := refusedConn(t, v6, raw)
				r, err := mmsg.NewPooledReader(c, mmsg.NewPool(func() *mmsg.Batch { return mmsg.NewBatch(4, 64, unix.SizeofSockaddrInet6, 0) }))
				if err != nil {
					t.Fatal(err)
				}
				var mu sync.Mutex
				var errs []syscall.Errno
				r.OnAsyncError(func(e syscall.Errno) {
					mu.Lock()
					errs = append(errs, e)
					mu.Unlock()
				})
				got := make(chan string, 16)
				done := make(chan error, 1)
				go func() {
					done <- r.Serve(func(n int) {
						for i := range n {
							b, _, _, _ := r.Datagram(i)
							got <- string(b)
						}
					})
				}()
				to := c.(interface{ LocalAddr() net.Addr }).LocalAddr().(*net.UDPAddr)
				for _, m := range []string{"one", "two", "three"} {
					if _, err := from.WriteToUDP([]byte(m), to); err != nil {
						t.Fatal(err)
					}
				}
				for _, want := range []string{"one", "two", "three"} {
					select {
					case m := <-got:
						if m != want {
							t.Fatalf("read %q, want %q", m, want)
						}
					case err := <-done:
						t.Fatalf("Serve ended: %v (async errors %d)", err, r.AsyncErrors())
					case <-time.After(5 * time.Second):
						t.Fatalf("%q not read", want)
					}
				}
				mu.Lock()
				if r.AsyncErrors() != 1 || len(errs) != 1 || errs[0] != unix.ECONNREFUSED {
					t.Errorf("async errors %d, handed %v; want 1, ECONNREFUSED", r.AsyncErrors(), errs)
				}
				mu.Unlock()
				c.(interface{ Close() error }).Close()
				if err := <-done; !errors.Is(err, net.ErrClosed) {
					t.Errorf("Serve after the close: %v", err)
				}
			})
		}
	}
}

// TestAsyncErrorRead: Read reads on past such an error as well.
func TestAsyncErrorRead(t *testing.T) {
	c, from := refusedConn(t, false, false)
	r, err := mmsg.NewReader(c, mmsg.NewBatch(4, 64, unix.SizeofSockaddrInet6, 0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := from.WriteToUDP([]byte("after"), c.(*net.UDPConn).LocalAddr().(*net.UDPAddr)); err != nil {
		t.Fatal(err)
	}
	c.(*net.UDPConn).SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := r.Read()
	if err != nil || n != 1 {
		t.Fatalf("Read: %d, %v", n, err)
	}
	if b, _, _, _ := r.Datagram(0); string(b) != "after" || r.AsyncErrors() != 1 {
		t.Errorf("read %q, async errors %d", b, r.AsyncErrors())
	}
}

// TestAsyncErrorSend: a send that such an error fails is made again
// (the error, not the datagram, was the news).
func TestAsyncErrorSend(t *testing.T) {
	c, from := refusedConn(t, false, false)
	b := mmsg.NewBatch(1, 4, 0, 0) // to the connected peer
	copy(b.Buf(0), "sent")
	s := mmsg.NewSender()
	rc, _ := c.SyscallConn()
	n, errno, err := s.Send(rc, b.Hdrs)
	if err != nil || errno != 0 || n != 1 || s.AsyncErrors() != 1 {
		t.Fatalf("Send: %d, errno %v, %v; async errors %d", n, errno, err, s.AsyncErrors())
	}
	from.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16)
	k, _, err := from.ReadFromUDP(buf)
	if err != nil || string(buf[:k]) != "sent" {
		t.Fatalf("read %q, %v", buf[:k], err)
	}
}

// TestAsyncError lists what is and is not such an error.
func TestAsyncError(t *testing.T) {
	for _, e := range []syscall.Errno{unix.ECONNREFUSED, unix.EHOSTUNREACH, unix.ENETUNREACH, unix.EHOSTDOWN, unix.ENETDOWN, unix.EPROTO, unix.ETIMEDOUT, unix.EMSGSIZE, unix.EACCES} {
		if !mmsg.AsyncError(e) {
			t.Errorf("%v: not async", e)
		}
	}
	for _, e := range []syscall.Errno{0, unix.EBADF, unix.EINVAL, unix.EFAULT, unix.ENOTSOCK, unix.EAGAIN, unix.ECONNRESET, unix.ENOTCONN} {
		if mmsg.AsyncError(e) {
			t.Errorf("%v: async", e)
		}
	}
}
