package bench

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file is the baseline: plain UDP multicast sockets driven with
// sendmmsg/recvmmsg, batch for batch like the device's own sockets.

// udpPort is the port the baseline uses: RoCEv2's, so that the kernel walks
// the same UDP hash slot for the baseline as for the device.
const udpPort = 4791

// rcvBuf is the receive buffer the baseline asks for, as the device does.
const rcvBuf = 4 << 20

func listen(network, addr string, setup func(fd int) error) (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = setup(int(fd)) }); err != nil {
			return err
		}
		return serr
	}}
	pc, err := lc.ListenPacket(context.Background(), network, addr)
	if err != nil {
		return nil, err
	}
	return pc.(*net.UDPConn), nil
}

// mmsgSender sends batches of equal datagrams to one group with sendmmsg.
type mmsgSender struct {
	conn  *net.UDPConn
	raw   syscall.RawConn
	hs    []unix.Mmsghdr
	iovs  []unix.Iovec
	bufs  [][]byte
	dst   unix.RawSockaddrInet4
	off   int
	errno syscall.Errno
	fn    func(fd uintptr) bool
}

// newMmsgSender opens a UDP socket sending to group:4791 out of the
// interface of src, batch datagrams of size bytes per call.
func newMmsgSender(src, group netip.Addr, ifindex, batch, size int) (*mmsgSender, error) {
	conn, err := listen("udp4", netip.AddrPortFrom(src, 0).String(), func(fd int) error {
		for _, o := range [][3]int{
			{unix.IPPROTO_IP, unix.IP_MULTICAST_LOOP, 1},
			{unix.IPPROTO_IP, unix.IP_MULTICAST_TTL, 64},
		} {
			if err := unix.SetsockoptInt(fd, o[0], o[1], o[2]); err != nil {
				return err
			}
		}
		return unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_MULTICAST_IF,
			&unix.IPMreqn{Address: src.As4(), Ifindex: int32(ifindex)})
	})
	if err != nil {
		return nil, err
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, err
	}
	s := &mmsgSender{conn: conn, raw: raw, hs: make([]unix.Mmsghdr, batch), iovs: make([]unix.Iovec, batch), bufs: make([][]byte, batch)}
	s.dst.Family = unix.AF_INET
	s.dst.Addr = group.As4()
	p := (*[2]byte)(unsafe.Pointer(&s.dst.Port))
	p[0], p[1] = udpPort>>8, udpPort&0xFF
	data := make([]byte, batch*size)
	for i := range s.hs {
		s.bufs[i] = data[i*size : (i+1)*size]
		for k := range s.bufs[i] {
			s.bufs[i][k] = byte(i + k)
		}
		s.iovs[i].Base = &s.bufs[i][0]
		s.iovs[i].SetLen(size)
		h := &s.hs[i].Hdr
		h.Name = (*byte)(unsafe.Pointer(&s.dst))
		h.Namelen = unix.SizeofSockaddrInet4
		h.Iov = &s.iovs[i]
		h.SetIovlen(1)
	}
	s.fn = s.sendmmsg
	return s, nil
}

func (s *mmsgSender) sendmmsg(fd uintptr) bool {
	n, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&s.hs[s.off])), uintptr(len(s.hs)-s.off), 0, 0, 0)
	if e == unix.EAGAIN {
		return false
	}
	s.errno = e
	if e == 0 {
		s.off += int(n)
	}
	return true
}

// send sends one batch and returns how many datagrams the kernel took.
func (s *mmsgSender) send() (int, error) {
	s.off = 0
	for s.off < len(s.hs) {
		if err := s.raw.Write(s.fn); err != nil {
			return s.off, err
		}
		if s.errno != 0 {
			if s.errno == unix.ENOBUFS || s.errno == unix.EINTR {
				continue
			}
			return s.off, s.errno
		}
	}
	return s.off, nil
}

func (s *mmsgSender) close() { s.conn.Close() }

// mmsgReceiver receives a group's datagrams with recvmmsg into buffers it
// allocates once, as the device's receive goroutine does.
type mmsgReceiver struct {
	conn  *net.UDPConn
	raw   syscall.RawConn
	hs    []unix.Mmsghdr
	iovs  []unix.Iovec
	bufs  [][]byte
	n     int
	errno syscall.Errno
	fn    func(fd uintptr) bool
}

// newMmsgReceiver opens a socket on 0.0.0.0:4791 with the device's socket
// options (SO_REUSEADDR, IP_MULTICAST_ALL=0, a 4 MiB receive buffer) and
// joins group on interface ifindex.
func newMmsgReceiver(group netip.Addr, ifindex, batch int) (*mmsgReceiver, error) {
	conn, err := listen("udp4", fmt.Sprintf("0.0.0.0:%d", udpPort), func(fd int) error {
		for _, o := range [][3]int{
			{unix.SOL_SOCKET, unix.SO_REUSEADDR, 1},
			{unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBuf},
			{unix.IPPROTO_IP, unix.IP_MULTICAST_ALL, 0},
		} {
			if err := unix.SetsockoptInt(fd, o[0], o[1], o[2]); err != nil {
				return err
			}
		}
		return unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP,
			&unix.IPMreqn{Multiaddr: group.As4(), Ifindex: int32(ifindex)})
	})
	if err != nil {
		return nil, err
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, err
	}
	const bufLen = 4096 + 128
	r := &mmsgReceiver{conn: conn, raw: raw, hs: make([]unix.Mmsghdr, batch), iovs: make([]unix.Iovec, batch), bufs: make([][]byte, batch)}
	data := make([]byte, batch*bufLen)
	for i := range r.hs {
		r.bufs[i] = data[i*bufLen : (i+1)*bufLen]
		r.iovs[i].Base = &r.bufs[i][0]
		r.iovs[i].SetLen(bufLen)
		r.hs[i].Hdr.Iov = &r.iovs[i]
		r.hs[i].Hdr.SetIovlen(1)
	}
	r.fn = r.recvmmsg
	return r, nil
}

func (r *mmsgReceiver) recvmmsg(fd uintptr) bool {
	n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.hs[0])), uintptr(len(r.hs)), unix.MSG_DONTWAIT, 0, 0)
	if e == unix.EAGAIN {
		return false
	}
	r.n, r.errno = int(n), e
	if e != 0 {
		r.n = 0
	}
	return true
}

// run receives until the socket is closed, adding to msgs and bytes after
// every batch through add.
func (r *mmsgReceiver) run(add func(msgs, bytes uint64)) {
	for {
		for i := range r.hs {
			r.hs[i].Len = 0
			r.hs[i].Hdr.Flags = 0
		}
		if err := r.raw.Read(r.fn); err != nil {
			return
		}
		if r.errno != 0 {
			if r.errno == unix.EINTR || r.errno == unix.ENOMEM || r.errno == unix.ENOBUFS {
				continue
			}
			return
		}
		var b uint64
		for i := 0; i < r.n; i++ {
			b += uint64(r.hs[i].Len)
		}
		add(uint64(r.n), b)
	}
}

func (r *mmsgReceiver) close() { r.conn.Close() }
