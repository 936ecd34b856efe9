package bench

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/internal/sys/rawudp"
)

// This file is the baseline: plain UDP multicast sockets driven with
// sendmmsg/recvmmsg, batch for batch like the device's own sockets (the
// same batching code, internal/sys/mmsg).

// udpPort is the port the baseline uses: RoCEv2's, so that the kernel walks
// the same UDP hash slot for the baseline as for the device.
const udpPort = 4791

// rcvBuf is the receive buffer the baseline asks for, as the device does
// (and in the same way: SO_RCVBUF, then SO_RCVBUFFORCE where permitted).
const rcvBuf = 64 << 20

// listen4 opens a udp4 socket bound to addr, sets the integer socket
// options opts ({level, name, value}) and then the IP option mreqOpt
// (IP_MULTICAST_IF, IP_ADD_MEMBERSHIP) to mreq.
func listen4(addr string, mreqOpt int, mreq unix.IPMreqn, opts ...[3]int) (*net.UDPConn, error) {
	return mmsg.ListenUDP("udp4", addr, setup4(mreqOpt, mreq, opts))
}

// setup4 returns the socket setup of listen4.
func setup4(mreqOpt int, mreq unix.IPMreqn, opts [][3]int) func(fd int) error {
	return func(fd int) error {
		for _, o := range opts {
			err := unix.SetsockoptInt(fd, o[0], o[1], o[2])
			if err != nil && !(o[0] == unix.SOL_SOCKET && o[1] == unix.SO_RCVBUFFORCE) { // EPERM unprivileged, as in the device
				return err
			}
		}
		return unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, mreqOpt, &mreq)
	}
}

// mmsgSender sends batches of equal datagrams to one group with sendmmsg.
type mmsgSender struct {
	conn *rawudp.Conn
	raw  syscall.RawConn
	b    *mmsg.Batch
	dst  unix.RawSockaddrInet4
	snd  *mmsg.Sender
}

// newMmsgSender opens a UDP socket sending to group:4791 out of the
// interface of src, batch datagrams of size bytes per call. Like the
// device's send sockets it stays out of Go's netpoller for writing
// (rawudp), which would wake a parked thread for every datagram sent.
func newMmsgSender(src, group netip.Addr, ifindex, batch, size int) (*mmsgSender, error) {
	conn, err := rawudp.ListenUDP("udp4", netip.AddrPortFrom(src, 0).String(), setup4(unix.IP_MULTICAST_IF,
		unix.IPMreqn{Address: src.As4(), Ifindex: int32(ifindex)},
		[][3]int{{unix.IPPROTO_IP, unix.IP_MULTICAST_LOOP, 1}, {unix.IPPROTO_IP, unix.IP_MULTICAST_TTL, 64}},
	))
	if err != nil {
		return nil, err
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, err
	}
	s := &mmsgSender{conn: conn, raw: raw, b: mmsg.NewBatch(batch, size, 0, 0), snd: mmsg.NewSender()}
	s.dst.Family = unix.AF_INET
	s.dst.Addr = group.As4()
	p := (*[2]byte)(unsafe.Pointer(&s.dst.Port))
	p[0], p[1] = udpPort>>8, udpPort&0xFF
	for i := range s.b.Hdrs {
		buf := s.b.Buf(i)
		for k := range buf {
			buf[k] = byte(i + k)
		}
		h := &s.b.Hdrs[i].Hdr
		h.Name = (*byte)(unsafe.Pointer(&s.dst))
		h.Namelen = unix.SizeofSockaddrInet4
	}
	return s, nil
}

// send sends one batch and returns how many datagrams the kernel took.
func (s *mmsgSender) send() (int, error) {
	hs := s.b.Hdrs
	off := 0
	for off < len(hs) {
		n, errno, err := s.snd.Send(s.raw, hs[off:])
		if err != nil {
			return off, err
		}
		if errno != 0 {
			if errno == unix.ENOBUFS || errno == unix.EINTR {
				continue
			}
			return off, errno
		}
		off += n
	}
	return off, nil
}

func (s *mmsgSender) close() { s.conn.Close() }

// mmsgReceiver receives a group's datagrams with recvmmsg into buffers it
// allocates once, as the device's receive goroutine does.
type mmsgReceiver struct {
	conn *net.UDPConn
	rd   *mmsg.Reader
}

// newMmsgReceiver opens a socket on 0.0.0.0:4791 with the device's socket
// options (SO_REUSEPORT, IP_MULTICAST_ALL=0, its receive buffer) and
// joins group on interface ifindex.
func newMmsgReceiver(group netip.Addr, ifindex, batch int) (*mmsgReceiver, error) {
	conn, err := listen4(fmt.Sprintf("0.0.0.0:%d", udpPort), unix.IP_ADD_MEMBERSHIP,
		unix.IPMreqn{Multiaddr: group.As4(), Ifindex: int32(ifindex)},
		[3]int{unix.SOL_SOCKET, unix.SO_REUSEPORT, 1},
		[3]int{unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBuf},
		[3]int{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBuf},
		[3]int{unix.IPPROTO_IP, unix.IP_MULTICAST_ALL, 0},
	)
	if err != nil {
		return nil, err
	}
	const bufLen = 4096 + 128
	rd, err := mmsg.NewReader(conn, mmsg.NewBatch(batch, bufLen, 0, 0))
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &mmsgReceiver{conn: conn, rd: rd}, nil
}

// run receives until the socket is closed, adding to msgs and bytes after
// every batch through add; it reads as the device does (mmsg.Reader.Serve).
func (r *mmsgReceiver) run(add func(msgs, bytes uint64)) {
	r.rd.Serve(func(n int) {
		var b uint64
		for i := range n {
			d, _, _, _ := r.rd.Datagram(i)
			b += uint64(len(d))
		}
		add(uint64(n), b)
	})
}

func (r *mmsgReceiver) close() { r.conn.Close() }
