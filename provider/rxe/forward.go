package rxe

import (
	"encoding/binary"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/provider/softverbs"
)

// Unicast forwarding. Every device's receive sockets share UDP 4791 (with
// SO_REUSEADDR), and the kernel hands a unicast datagram to one of them,
// in whichever process. A QPN is (send socket port << 8) | index and the
// send socket's port is exclusive on the host, so the QPN names its owner:
// a device that reads a unicast datagram for a QPN whose port is not one of
// its send sockets' hands it to 127.0.0.1:<port>, the owner's IPv4 send
// socket, over loopback, prefixed with a header carrying what the owner
// needs to check and complete it (the IP-level fields a UDP socket reports
// as control messages). The owner reads its send sockets, accepts
// forwarded datagrams only from a loopback address, never forwards them
// again, and runs the same checks (ICRC over the original IP and UDP
// headers, QPN, P_Key, Q_Key) as for a datagram read on 4791.
//
// The wire stays plain RoCEv2 to port 4791; forwarding happens only
// between processes of one host (one network namespace).

// fwdMagic starts every forwarded datagram ("rxeF").
const fwdMagic = 0x72786546

// fwdVersion is the version of the forwarding header.
const fwdVersion = 1

// fwdHdrLen is the length of the forwarding header:
//
//	0  magic (4)      4  version (1)   5 flags (1: bit 0 IPv6)
//	6  TTL/hop limit  7  TOS/traffic class
//	8  source port (2)                 10 zero (2)
//	12 flow label (4)
//	16 source address (16; IPv4-mapped for IPv4)
//	32 destination address (16; IPv4-mapped for IPv4)
//
// Multi-byte fields are big-endian.
const fwdHdrLen = 48

const fwdFlagV6 = 1

// putFwdHdr writes the forwarding header of a datagram described by m.
func putFwdHdr(h *[fwdHdrLen]byte, m *rxMeta, v6 bool) {
	binary.BigEndian.PutUint32(h[0:4], fwdMagic)
	h[4] = fwdVersion
	h[5] = 0
	if v6 {
		h[5] = fwdFlagV6
	}
	h[6], h[7] = m.ttl, m.tos
	binary.BigEndian.PutUint16(h[8:10], m.srcPort)
	h[10], h[11] = 0, 0
	binary.BigEndian.PutUint32(h[12:16], m.flow)
	*(*[16]byte)(h[16:32]) = m.src.As16()
	*(*[16]byte)(h[32:48]) = m.dst.As16()
}

// parseFwdHdr reads the forwarding header at the start of b into m and
// returns the datagram after it; ok is false for anything a forwarder does
// not send: a short or unknown header, addresses of the wrong family, a
// multicast or unspecified destination.
func parseFwdHdr(m *rxMeta, b []byte) (rest []byte, v6, ok bool) {
	if len(b) < fwdHdrLen || binary.BigEndian.Uint32(b[0:4]) != fwdMagic || b[4] != fwdVersion ||
		b[5]&^fwdFlagV6 != 0 || b[10] != 0 || b[11] != 0 {
		return nil, false, false
	}
	v6 = b[5]&fwdFlagV6 != 0
	*m = rxMeta{
		ttl:     b[6],
		tos:     b[7],
		srcPort: binary.BigEndian.Uint16(b[8:10]),
		flow:    binary.BigEndian.Uint32(b[12:16]),
		src:     netip.AddrFrom16([16]byte(b[16:32])),
		dst:     netip.AddrFrom16([16]byte(b[32:48])),
	}
	if m.flow > 0xFFFFF {
		return nil, false, false
	}
	if !v6 {
		if !m.src.Is4In6() || !m.dst.Is4In6() {
			return nil, false, false
		}
		m.src, m.dst = m.src.Unmap(), m.dst.Unmap()
	} else if m.src.Is4In6() || m.dst.Is4In6() {
		return nil, false, false
	}
	if m.dst.IsMulticast() || m.dst.IsUnspecified() || m.src.IsUnspecified() || m.src.IsMulticast() {
		return nil, false, false
	}
	return b[fwdHdrLen:], v6, true
}

// fwdSock is a device's socket for forwarding: an IPv4 UDP socket on an
// ephemeral port of 127.0.0.1 (of the wildcard address while lo has none)
// with IP_RECVERR, so that a forward to a port nobody holds (a QPN no
// device of the host has) comes back as ECONNREFUSED on its error queue.
// Nothing else is read from it.
type fwdSock struct {
	conn *net.UDPConn
	raw  syscall.RawConn
}

// fwdErrQueue is the receive buffer of the forwarding socket, which holds
// the error queue between two reads.
const fwdErrQueue = 256 << 10

// openFwdSock opens the forwarding socket of a device.
func openFwdSock() (*fwdSock, error) {
	setup := func(fd int) error {
		return setOpts(fd, []sockopt{
			{unix.IPPROTO_IP, unix.IP_RECVERR, 1, false},
			{unix.SOL_SOCKET, unix.SO_RCVBUF, fwdErrQueue, true},
			{unix.SOL_SOCKET, unix.SO_SNDBUF, recvBufSize, true},
		})
	}
	conn, err := mmsg.ListenUDP("udp4", "127.0.0.1:0", setup)
	if err != nil {
		conn, err = mmsg.ListenUDP("udp4", "0.0.0.0:0", setup)
	}
	if err != nil {
		return nil, err
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &fwdSock{conn: conn, raw: raw}, nil
}

// openFwdLocked opens the device's forwarding socket unless it is open;
// d.mu is held. Without it, forwards are counted as dropped.
func (d *Device) openFwdLocked() {
	if d.fwd.Load() != nil {
		return
	}
	if fs, err := openFwdSock(); err == nil {
		d.fwd.Store(fs)
	}
}

// forwarder is a receive goroutine's scratch for forwarding: one
// sendmmsg message of two pieces (header, datagram) to 127.0.0.1:port and
// the buffers to read the socket's error queue. Nothing allocates.
type forwarder struct {
	hdr   [fwdHdrLen]byte
	iov   [2]unix.Iovec
	name  [unix.SizeofSockaddrInet4]byte
	msg   unix.Msghdr
	errno syscall.Errno // of the last sendmsg
	n     int           // forwards since the error queue was last read
	errs  int           // ECONNREFUSED read from the error queue by drainFn
	eh    unix.Msghdr
	eiov  unix.Iovec
	edata [64]byte
	eoob  [128]byte

	sendFn  func(fd uintptr) bool
	drainFn func(fd uintptr)
}

func (f *forwarder) init() {
	f.sendFn = f.sendmsg
	f.drainFn = f.drain
	binary.NativeEndian.PutUint16(f.name[0:2], unix.AF_INET)
	copy(f.name[4:8], []byte{127, 0, 0, 1})
	h := &f.msg
	h.Name = &f.name[0]
	h.Namelen = unix.SizeofSockaddrInet4
	h.Iov = &f.iov[0]
	h.SetIovlen(2)
}

// sendmsg is the RawConn.Write callback of a forward: one sendmsg that
// never waits (MSG_DONTWAIT; a full send buffer is a drop).
func (f *forwarder) sendmsg(fd uintptr) bool {
	_, _, f.errno = unix.RawSyscall(unix.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&f.msg)), unix.MSG_DONTWAIT)
	return true
}

// forward hands datagram b, described by r.meta, to the owner of port.
func (r *receiver) forward(b []byte, port uint16, v6 bool) {
	d := r.d
	fs := d.fwd.Load()
	if fs == nil || len(b)+fwdHdrLen > readBufLen {
		d.core.Count(softverbs.ForwardDrops, 1)
		return
	}
	r.burst.Release() // no lock held over the system call
	f := &r.fwd
	putFwdHdr(&f.hdr, &r.meta, v6)
	binary.BigEndian.PutUint16(f.name[2:4], port)
	f.iov[0].Base = &f.hdr[0]
	f.iov[0].SetLen(fwdHdrLen)
	f.iov[1].Base = &b[0]
	f.iov[1].SetLen(len(b))
	sent := false
	// ECONNREFUSED is the error of an earlier forward (IP_RECVERR sets the
	// socket's error, which the next send returns): read from the error
	// queue, it is counted there; this datagram is sent again, once.
	for try := 0; try < 2 && !sent; try++ {
		err := fs.raw.Write(f.sendFn)
		sent = err == nil && f.errno == 0
		if err != nil || f.errno != unix.ECONNREFUSED {
			break
		}
	}
	f.iov[1].Base = nil // keep no reference to the read buffer
	if !sent {
		d.core.Count(softverbs.ForwardDrops, 1)
		return
	}
	d.core.Count(softverbs.Forwarded, 1)
	f.n++
}

// drainErrors reads the forwarding socket's error queue after forwards
// and counts the refused ones (no socket holds the QPN's port).
func (r *receiver) drainErrors() {
	f := &r.fwd
	if f.n == 0 {
		return
	}
	f.n = 0
	fs := r.d.fwd.Load()
	if fs == nil {
		return
	}
	f.errs = 0
	fs.raw.Control(f.drainFn)
	if f.errs > 0 {
		r.d.core.Count(softverbs.NoOwnerDrops, uint64(f.errs))
	}
}

// drain is the RawConn.Control callback of drainErrors.
func (f *forwarder) drain(fd uintptr) {
	for {
		f.eiov.Base = &f.edata[0]
		f.eiov.SetLen(len(f.edata))
		f.eh = unix.Msghdr{Iov: &f.eiov, Control: &f.eoob[0]}
		f.eh.SetIovlen(1)
		f.eh.SetControllen(len(f.eoob))
		_, _, e := unix.RawSyscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&f.eh)), unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT)
		if e != 0 {
			return
		}
		oob := f.eoob[:min(int(f.eh.Controllen), len(f.eoob))]
		for len(oob) >= unix.SizeofCmsghdr {
			h, data, rest, err := unix.ParseOneSocketControlMessage(oob)
			if err != nil {
				break
			}
			oob = rest
			if h.Level == unix.IPPROTO_IP && h.Type == unix.IP_RECVERR && len(data) >= 4 &&
				syscall.Errno(binary.NativeEndian.Uint32(data[0:4])) == unix.ECONNREFUSED {
				f.errs++
			}
		}
	}
}

// handleForwarded checks and delivers a datagram another device of the
// host forwarded to one of this device's send sockets (r.blk): b is the
// forwarding header and the RoCEv2 datagram, name the sender's address.
// A forwarded datagram is never forwarded again.
func (r *receiver) handleForwarded(b, name []byte, trunc bool) {
	d := r.d
	d.core.Count(softverbs.RcvdForwarded, 1) // received: counted by handleBatch
	if trunc {
		d.core.Count(softverbs.OversizedRecvDrops, 1)
		return
	}
	// Only a local sender (loopback source) may forward; the kernel drops
	// a loopback source arriving on any other interface.
	if len(name) < 8 || binary.NativeEndian.Uint16(name[0:2]) != unix.AF_INET || name[4] != 127 {
		d.core.Count(softverbs.MalformedDrops, 1)
		return
	}
	m := &r.meta
	b, v6, ok := parseFwdHdr(m, b)
	if !ok {
		d.core.Count(softverbs.MalformedDrops, 1)
		return
	}
	if d.core.Tapping() {
		r.burst.Release() // a tap runs code of its own: no lock held
		d.captureMeta(v6, b, m)
	}
	if !r.parse(b) {
		return
	}
	r.checkDeliver(b, v6, true)
}
