// Package rawudp is a UDP socket that Go's netpoller watches for reading
// only.
//
// A socket opened with package net is registered in the netpoller for
// reading and writing (EPOLLIN|EPOLLOUT, edge-triggered), and the kernel
// signals a UDP socket writable each time it frees a sent datagram
// (sock_wfree → sk_write_space). A thread parked in the netpoller's
// epoll_wait then wakes for every datagram the process sends, finds no
// goroutine waiting to write, and parks again: in softrdma bench's fan-out,
// 21,000 such wake-ups a second cost the sending process 14–18 % of its CPU
// (perf: findRunnable → netpoll → epoll_pwait returning EPOLLOUT of the
// send socket). A C program with blocking sockets pays none of it.
//
// A Conn keeps the socket out of the netpoller. An epoll instance of its
// own watches the socket for EPOLLIN only, and that epoll descriptor — which
// is readable while the socket is — sits in the netpoller instead: readers
// park in the netpoller as with package net, and the socket's writability
// wakes nobody. A writer that finds the send buffer full (EAGAIN, which a
// busy NIC queue can cause) waits for room in poll(2) on its own thread.
//
// Linux only.
package rawudp

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
)

// writeWaitMS bounds one poll(2) wait for send room, so that Close, which
// waits for the writers, is never held up for long.
const writeWaitMS = 10

// Conn is a UDP socket whose readers wait in Go's netpoller and whose
// writers never make it wake. Its SyscallConn's Read, Write and Control
// hand the callbacks the socket's descriptor. Safe for concurrent use.
type Conn struct {
	fd    int
	v6    bool // an AF_INET6 socket
	local *net.UDPAddr
	ep    *os.File        // epoll instance watching fd for EPOLLIN, in the netpoller
	eprc  syscall.RawConn // ep's

	// mu is held shared while a Write or Control uses fd, and exclusively
	// by Close before it closes fd. Reads use fd inside ep's RawConn.Read,
	// which closing ep waits for.
	mu      sync.RWMutex
	closing atomic.Bool // set first by Close: writers waiting for room give up

	asyncErrs atomic.Uint64 // async errors WriteToUDPAddrPort went past (AsyncErrors)

	rmu sync.Mutex            // one Read at a time (the netpoller has one reader slot)
	rf  func(fd uintptr) bool // the current Read's callback
	rcb func(_ uintptr) bool  // c.readCallback, bound once: no allocation per Read

	imu        sync.Mutex // one SetReadInterest at a time
	iev        unix.EpollEvent
	ierr       syscall.Errno
	interestFn func(epfd uintptr) // c.setInterest, bound once
}

// ListenUDP opens a UDP socket of network "udp4", "udp6" or "udp" bound to
// addr (an IP literal and port, as net.ResolveUDPAddr takes), running
// setup on the descriptor before bind (to set socket options). As with
// package net, "udp" on a wildcard address is an IPv6 socket that takes
// IPv4 too (IPV6_V6ONLY 0), or an IPv4 one where IPv6 is unavailable.
func ListenUDP(network, addr string, setup func(fd int) error) (*Conn, error) {
	ua, err := net.ResolveUDPAddr(network, addr)
	if err != nil {
		return nil, err
	}
	if network == "udp" {
		switch {
		case ua.IP != nil && !ua.IP.IsUnspecified() && ua.IP.To4() != nil:
			network = "udp4"
		case ua.IP != nil && !ua.IP.IsUnspecified():
			network = "udp6"
		default:
			c, err := ListenUDP("udp6", "[::]:"+strconv.Itoa(ua.Port), func(fd int) error {
				if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
					return err
				}
				if setup != nil {
					return setup(fd)
				}
				return nil
			})
			if err == nil {
				return c, nil
			}
			if !errors.Is(err, unix.EAFNOSUPPORT) {
				return nil, err
			}
			network = "udp4"
		}
	}
	fam := unix.AF_INET
	var sa unix.Sockaddr
	switch network {
	case "udp4":
		a := &unix.SockaddrInet4{Port: ua.Port}
		if ip := ua.IP.To4(); ip != nil {
			copy(a.Addr[:], ip)
		}
		sa = a
	case "udp6":
		fam = unix.AF_INET6
		a := &unix.SockaddrInet6{Port: ua.Port}
		copy(a.Addr[:], ua.IP.To16())
		sa = a
	default:
		return nil, &net.OpError{Op: "listen", Net: network, Err: net.UnknownNetworkError(network)}
	}
	opErr := func(op string, err error) error {
		return &net.OpError{Op: "listen", Net: network, Addr: ua, Err: os.NewSyscallError(op, err)}
	}
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, opErr("socket", err)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
		}
	}()
	if setup != nil {
		if err := setup(fd); err != nil {
			return nil, err
		}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return nil, opErr("bind", err)
	}
	bound, err := unix.Getsockname(fd)
	if err != nil {
		return nil, opErr("getsockname", err)
	}
	c := &Conn{fd: fd, v6: fam == unix.AF_INET6}
	switch a := bound.(type) {
	case *unix.SockaddrInet4:
		c.local = &net.UDPAddr{IP: net.IP(a.Addr[:]), Port: a.Port} // 4 bytes, as package net's
	case *unix.SockaddrInet6:
		c.local = &net.UDPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}
	}
	if op, err := c.watch(); err != nil {
		return nil, opErr(op, err)
	}
	ok = true
	return c, nil
}

// NewConn makes a Conn of fd, a non-blocking socket of any kind (a
// connected unix SOCK_SEQPACKET socket, say) whose reads should leave the
// netpoller as a UDP socket's can: Read, Control, Write, SetReadInterest
// and Close work as on a UDP socket (not WriteToUDPAddrPort; LocalAddr is
// nil). The Conn owns fd from then on, also on an error (closed).
func NewConn(fd int) (*Conn, error) {
	c := &Conn{fd: fd}
	if op, err := c.watch(); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError(op, err)
	}
	return c, nil
}

// watch makes the epoll instance that watches c.fd for reading and puts
// it into the netpoller; on an error it names the failed call.
func (c *Conn) watch() (string, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return "epoll_create1", err
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(c.fd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
		unix.Close(epfd)
		return "epoll_ctl", err
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return "fcntl", err
	}
	// A non-blocking descriptor handed to os.NewFile goes into the
	// netpoller.
	c.ep = os.NewFile(uintptr(epfd), "rawudp-epoll")
	if c.eprc, err = c.ep.SyscallConn(); err != nil {
		c.ep.Close()
		return "", err
	}
	c.rcb = c.readCallback
	c.interestFn = c.setInterest
	return "", nil
}

// LocalAddr returns the address the socket is bound to.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// SyscallConn returns the socket's raw connection (syscall.Conn).
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return rawConn{c}, nil }

// Close closes the socket. It waits for callbacks in progress; a Read
// parked in the netpoller returns net.ErrClosed, and so does every write
// from now on — also one a Read callback makes while Close waits for it
// (a reader that answers what it reads, inside mmsg.Reader.Serve).
func (c *Conn) Close() error {
	if c.closing.Swap(true) {
		return net.ErrClosed
	}
	// Closing the epoll file wakes a parked reader and waits for a
	// callback in progress to return.
	c.ep.Close()
	// Then wait for writers (a writer waiting for room sees closing
	// within writeWaitMS) and Control callbacks, and keep them out until
	// fd is closed.
	c.mu.Lock()
	defer c.mu.Unlock()
	return unix.Close(c.fd)
}

// WriteToUDPAddrPort sends b to addr in one datagram, waiting for room in
// the send buffer as Write does; it allocates nothing. An error the
// kernel kept for an ICMP message (mmsg.AsyncError) does not fail it: it
// is counted (AsyncErrors) and the datagram sent. An IPv6 socket
// sends to an IPv4 address as IPv4-mapped, an IPv4 socket to an
// IPv4-mapped one as IPv4.
func (c *Conn) WriteToUDPAddrPort(b []byte, addr netip.AddrPort) (int, error) {
	ip := addr.Addr()
	switch {
	case !c.v6 && ip.Unmap().Is4():
		ip = ip.Unmap()
	case c.v6 && ip.Is4():
		ip = netip.AddrFrom16(ip.As16())
	case c.v6 && ip.IsValid():
	default:
		return 0, &net.OpError{Op: "write", Net: "udp", Addr: net.UDPAddrFromAddrPort(addr), Err: unix.EAFNOSUPPORT}
	}
	var sa [unix.SizeofSockaddrInet6]byte
	saLen := uintptr(mmsg.PutAddrPort(sa[:], netip.AddrPortFrom(ip, addr.Port())))
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	async := false
	for {
		if c.closing.Load() {
			return 0, net.ErrClosed
		}
		// Raw: with MSG_DONTWAIT it never blocks (see mmsg's sendmmsg).
		n, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(c.fd), uintptr(p), uintptr(len(b)), unix.MSG_DONTWAIT, uintptr(unsafe.Pointer(&sa[0])), saLen)
		switch {
		case e == 0:
			return int(n), nil
		case e == unix.EAGAIN:
			c.waitRoom()
		case e == unix.EINTR:
		case mmsg.AsyncError(e) && !async:
			// An error kept for an ICMP message failed the send before
			// anything was sent, and is cleared: once more (a second
			// one is the datagram's own).
			async = true
			c.asyncErrs.Add(1)
		default:
			return 0, &net.OpError{Op: "write", Net: "udp", Addr: net.UDPAddrFromAddrPort(addr), Err: os.NewSyscallError("sendto", e)}
		}
	}
}

// AsyncErrors returns how many errors kept for ICMP messages
// (mmsg.AsyncError) failed a WriteToUDPAddrPort that then sent again.
func (c *Conn) AsyncErrors() uint64 { return c.asyncErrs.Load() }

// SetReadBuffer sets the socket's receive buffer (SO_RCVBUF), as
// net.UDPConn's does.
func (c *Conn) SetReadBuffer(bytes int) error {
	rc, _ := c.SyscallConn()
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, bytes) }); err != nil {
		return err
	}
	return os.NewSyscallError("setsockopt", serr)
}

// SetReadInterest takes the socket's readability out of the netpoller (on
// false) or puts it back (on true). While it is out, a datagram wakes no
// goroutine parked in Read — nor the netpoller's thread: for a consumer
// that waits for the socket on its own thread and reads it itself
// (mmsg.Reader.Wait). Putting it back does not wake the parked reader for
// the datagrams that came meanwhile: the caller reads them. It allocates
// nothing; not to be called inside a Control callback.
func (c *Conn) SetReadInterest(on bool) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closing.Load() {
		return net.ErrClosed
	}
	c.imu.Lock()
	defer c.imu.Unlock()
	c.iev = unix.EpollEvent{Fd: int32(c.fd)}
	if on {
		c.iev.Events = unix.EPOLLIN
	}
	if err := c.eprc.Control(c.interestFn); err != nil {
		return net.ErrClosed
	}
	if c.ierr != 0 {
		return os.NewSyscallError("epoll_ctl", c.ierr)
	}
	return nil
}

// setInterest is SetReadInterest's Control callback on the epoll
// descriptor (c.imu held). Raw: epoll_ctl never blocks (see mmsg's
// recvmmsg).
func (c *Conn) setInterest(epfd uintptr) {
	_, _, c.ierr = unix.RawSyscall6(unix.SYS_EPOLL_CTL, epfd, unix.EPOLL_CTL_MOD, uintptr(c.fd), uintptr(unsafe.Pointer(&c.iev)), 0, 0)
}

// waitRoom waits up to writeWaitMS for room in the send buffer (c.mu is
// held shared).
func (c *Conn) waitRoom() {
	pfd := [1]unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLOUT}}
	unix.Poll(pfd[:], writeWaitMS) // EINTR or not: the caller tries again
}

func (c *Conn) readCallback(uintptr) bool { return c.rf(uintptr(c.fd)) }

// rawConn is the syscall.RawConn of a Conn.
type rawConn struct{ c *Conn }

// Control calls f with the socket's descriptor.
func (r rawConn) Control(f func(fd uintptr)) error {
	c := r.c
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closing.Load() {
		return net.ErrClosed
	}
	f(uintptr(c.fd))
	return nil
}

// Read calls f with the socket's descriptor until f reports done, parking
// in the netpoller until the socket is readable each time f reports not
// done (f found nothing to read: EAGAIN).
func (r rawConn) Read(f func(fd uintptr) bool) error {
	c := r.c
	c.rmu.Lock()
	defer c.rmu.Unlock()
	c.rf = f
	err := c.eprc.Read(c.rcb)
	c.rf = nil
	if err != nil && (errors.Is(err, os.ErrClosed) || c.closing.Load()) {
		return net.ErrClosed
	}
	return err
}

// Write calls f with the socket's descriptor until f reports done,
// waiting in poll(2) for room in the send buffer each time f reports not
// done (EAGAIN).
func (r rawConn) Write(f func(fd uintptr) bool) error {
	c := r.c
	c.mu.RLock()
	defer c.mu.RUnlock()
	for {
		if c.closing.Load() {
			return net.ErrClosed
		}
		if f(uintptr(c.fd)) {
			return nil
		}
		c.waitRoom()
	}
}
