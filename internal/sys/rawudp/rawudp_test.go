package rawudp

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func listen(t *testing.T) *Conn {
	t.Helper()
	c, err := ListenUDP("udp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func port(c *Conn) int { return c.LocalAddr().(*net.UDPAddr).Port }

// sendTo sends b from c to 127.0.0.1:p through the RawConn's Write.
func sendTo(t *testing.T, c *Conn, p int, b []byte) {
	t.Helper()
	rc, _ := c.SyscallConn()
	var serr error
	err := rc.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), b, 0, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: p})
		return serr != unix.EAGAIN
	})
	if err != nil || serr != nil {
		t.Fatalf("send: %v %v", err, serr)
	}
}

// readOne parks in Read until a datagram comes and returns it.
func readOne(c *Conn) ([]byte, error) {
	rc, _ := c.SyscallConn()
	buf := make([]byte, 64)
	n := 0
	var rerr error
	err := rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
		return rerr != unix.EAGAIN
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

func TestReadParksUntilADatagramComes(t *testing.T) {
	a, b := listen(t), listen(t)
	got := make(chan []byte)
	go func() {
		d, err := readOne(b)
		if err != nil {
			t.Error(err)
		}
		got <- d
	}()
	sendTo(t, a, port(b), []byte("hello"))
	if d := <-got; string(d) != "hello" {
		t.Fatalf("read %q", d)
	}
	// The next datagram, sent while nobody reads, is there for the next Read.
	sendTo(t, a, port(b), []byte("again"))
	if d, err := readOne(b); err != nil || string(d) != "again" {
		t.Fatalf("read %q, %v", d, err)
	}
}

// The point of the package: the epoll instance the netpoller watches does
// not report the socket writable, so sending wakes no parked thread; it
// reports it readable.
func TestSendingDoesNotSignalTheNetpoller(t *testing.T) {
	a, b := listen(t), listen(t)
	var ev [4]unix.EpollEvent
	epfd := int(a.ep.Fd())
	for range 100 {
		sendTo(t, a, port(b), []byte("x"))
	}
	if n, err := unix.EpollWait(epfd, ev[:], 0); n != 0 || err != nil {
		t.Fatalf("after sending, the epoll instance reports %d events (%v): %+v", n, err, ev[:max(n, 0)])
	}
	sendTo(t, b, port(a), []byte("y"))
	if n, err := unix.EpollWait(epfd, ev[:], 1000); n != 1 || err != nil || ev[0].Events&unix.EPOLLIN == 0 {
		t.Fatalf("a datagram to the socket: %d events (%v): %+v", n, err, ev[:max(n, 0)])
	}
}

func TestCloseEndsAParkedRead(t *testing.T) {
	c, err := ListenUDP("udp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() {
		_, err := readOne(c)
		done <- err
	}()
	// Wait until the reader holds the read slot (it parks right after).
	for c.rmu.TryLock() {
		c.rmu.Unlock()
		time.Sleep(time.Millisecond)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read after Close: %v, want net.ErrClosed", err)
	}
	if err := c.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	rc, _ := c.SyscallConn()
	if err := rc.Control(func(uintptr) {}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Control after Close: %v", err)
	}
	if err := rc.Write(func(uintptr) bool { return true }); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v", err)
	}
}

// A writer that finds no room waits and tries again, and Close ends the
// wait.
func TestWriteWaitsForRoomAndCloseEndsTheWait(t *testing.T) {
	c, err := ListenUDP("udp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	rc, _ := c.SyscallConn()
	tries := 0
	if err := rc.Write(func(uintptr) bool { tries++; return tries == 3 }); err != nil || tries != 3 {
		t.Fatalf("Write: %v after %d tries, want nil after 3", err, tries)
	}
	started := make(chan struct{})
	done := make(chan error)
	go func() {
		once := false
		done <- rc.Write(func(uintptr) bool {
			if !once {
				once = true
				close(started)
			}
			return false // never room
		})
	}()
	<-started
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write waiting at Close: %v, want net.ErrClosed", err)
	}
}

func TestListenUDP(t *testing.T) {
	// An IPv4 socket's address is an IPv4 AddrPort, as package net's.
	if ap := listen(t).LocalAddr().(*net.UDPAddr).AddrPort(); !ap.Addr().Is4() || ap.Addr() != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("IPv4 socket bound to %v", ap)
	}
	called := false
	c, err := ListenUDP("udp6", "[::1]:0", func(fd int) error {
		called = true
		return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1)
	})
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer c.Close()
	ap := c.LocalAddr().(*net.UDPAddr).AddrPort()
	if !called || ap.Addr() != netip.IPv6Loopback() || ap.Port() == 0 {
		t.Fatalf("bound to %v (setup called: %v)", ap, called)
	}
	want := errors.New("setup failed")
	if _, err := ListenUDP("udp4", "127.0.0.1:0", func(int) error { return want }); err != want {
		t.Fatalf("setup error: %v", err)
	}
	if _, err := ListenUDP("tcp", "127.0.0.1:0", nil); err == nil {
		t.Fatal("tcp: no error")
	}
}

func TestWriteToUDPAddrPort(t *testing.T) {
	a, b := listen(t), listen(t)
	to := b.LocalAddr().(*net.UDPAddr).AddrPort()
	if n, err := a.WriteToUDPAddrPort([]byte("four"), to); n != 4 || err != nil {
		t.Fatalf("WriteToUDPAddrPort: %d, %v", n, err)
	}
	if d, err := readOne(b); err != nil || string(d) != "four" {
		t.Fatalf("read %q, %v", d, err)
	}
	// An IPv4-mapped destination from an IPv4 socket goes as IPv4.
	mapped := netip.AddrPortFrom(netip.AddrFrom16(to.Addr().As16()), to.Port())
	if _, err := a.WriteToUDPAddrPort([]byte("m"), mapped); err != nil {
		t.Fatal(err)
	}
	if d, err := readOne(b); err != nil || string(d) != "m" {
		t.Fatalf("read %q, %v", d, err)
	}
	if _, err := a.WriteToUDPAddrPort([]byte("x"), netip.MustParseAddrPort("[::1]:9")); !errors.Is(err, unix.EAFNOSUPPORT) {
		t.Fatalf("IPv6 destination from an IPv4 socket: %v", err)
	}
	if allocs := testing.AllocsPerRun(100, func() { a.WriteToUDPAddrPort([]byte("z"), to) }); allocs != 0 {
		t.Errorf("WriteToUDPAddrPort allocates %.1f times", allocs)
	}
	a.Close()
	if _, err := a.WriteToUDPAddrPort([]byte("x"), to); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// "udp" on a wildcard address takes IPv4 datagrams too (dual stack), as
// package net's socket does.
func TestListenUDPDualStack(t *testing.T) {
	c, err := ListenUDP("udp", ":0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a := listen(t)
	p := c.LocalAddr().(*net.UDPAddr).Port
	if _, err := a.WriteToUDPAddrPort([]byte("v4"), netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(p))); err != nil {
		t.Fatal(err)
	}
	if d, err := readOne(c); err != nil || string(d) != "v4" {
		t.Fatalf("read %q, %v", d, err)
	}
	// It answers an IPv4 peer at its plain IPv4 address.
	if _, err := c.WriteToUDPAddrPort([]byte("back"), a.LocalAddr().(*net.UDPAddr).AddrPort()); err != nil {
		t.Fatal(err)
	}
	if d, err := readOne(a); err != nil || string(d) != "back" {
		t.Fatalf("read %q, %v", d, err)
	}
}

// A reader that writes from inside its Read callback (a switch answering
// what it reads) does not hold Close up: the write fails with
// net.ErrClosed and the callback returns.
func TestCloseWhileACallbackWrites(t *testing.T) {
	c, err := ListenUDP("udp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	a := listen(t)
	to := c.LocalAddr().(*net.UDPAddr).AddrPort()
	inCallback, closing := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		rc, _ := c.SyscallConn()
		var werr error
		rc.Read(func(uintptr) bool {
			close(inCallback)
			<-closing
			// Close has begun: it waits for this callback.
			for !c.closing.Load() {
				time.Sleep(time.Millisecond)
			}
			_, werr = c.WriteToUDPAddrPort([]byte("late"), a.LocalAddr().(*net.UDPAddr).AddrPort())
			return true
		})
		done <- werr
	}()
	a.WriteToUDPAddrPort([]byte("x"), to)
	<-inCallback
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	close(closing)
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write from the callback during Close: %v, want net.ErrClosed", err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// TestWriteAsyncError: an error the kernel keeps for an ICMP message (here
// the port unreachable loopback answers a datagram to a closed port with)
// does not fail the next WriteToUDPAddrPort: it is counted, and the
// datagram is sent.
func TestWriteAsyncError(t *testing.T) {
	c := listen(t)
	tmp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	peer := tmp.LocalAddr().(*net.UDPAddr).AddrPort()
	tmp.Close()
	rc, _ := c.SyscallConn()
	var serr error
	rc.Control(func(fd uintptr) {
		if serr = unix.Connect(int(fd), &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: int(peer.Port())}); serr == nil {
			_, serr = unix.Write(int(fd), []byte("anyone there?"))
		}
	})
	if serr != nil {
		t.Fatal(serr)
	}
	deadline := time.Now().Add(5 * time.Second)
	for pending := false; !pending; {
		rc.Control(func(fd uintptr) {
			p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			unix.Poll(p, 10)
			pending = p[0].Revents&unix.POLLERR != 0
		})
		if !pending && time.Now().After(deadline) {
			t.Fatal("no ICMP error on the connected socket")
		}
	}
	rx, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(peer))
	if err != nil {
		t.Fatalf("the port again: %v", err)
	}
	defer rx.Close()
	if _, err := c.WriteToUDPAddrPort([]byte("sent"), peer); err != nil || c.AsyncErrors() != 1 {
		t.Fatalf("write: %v; async errors %d", err, c.AsyncErrors())
	}
	rx.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16)
	n, _, err := rx.ReadFromUDP(buf)
	if err != nil || string(buf[:n]) != "sent" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
}
