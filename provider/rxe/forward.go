package rxe

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/provider/softverbs"
)

// Unicast forwarding. Every device's receive sockets share UDP 4791 (with
// SO_REUSEPORT, which the kernel allows only among sockets of one user),
// and the kernel hands a unicast datagram to one of them, in whichever
// process of that user. A QPN is (send socket port << 8) | index and the
// send socket's port is exclusive on the host, so the QPN names its owner:
// a device that reads a unicast datagram for a QPN whose port is not one of
// its send sockets' hands it to the owner over the owner's hand-over
// socket for that port (handover.go: an abstract unix socket, of a process
// of this user, never a UDP port), prefixed with a header carrying what the owner
// needs to check and complete it (the IP-level fields a UDP socket reports
// as control messages). The owner accepts hand-overs only from processes
// of its user, never forwards them again, and runs the same checks (ICRC
// over the original IP and UDP headers, QPN, P_Key, Q_Key) as for a
// datagram read on 4791.
//
// The wire stays plain RoCEv2 to port 4791; forwarding happens only
// between processes of one user on one host (one network namespace).

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

// forwarder is a receive goroutine's scratch for forwarding: one sendmsg
// of two pieces (header, datagram) on a hand-over connection. Nothing
// allocates.
type forwarder struct {
	hdr   [fwdHdrLen]byte
	iov   [2]unix.Iovec
	msg   unix.Msghdr
	errno syscall.Errno // of the last sendmsg

	sendFn func(fd uintptr) bool
}

func (f *forwarder) init() {
	f.sendFn = f.sendmsg
	h := &f.msg
	h.Iov = &f.iov[0]
	h.SetIovlen(2)
}

// sendmsg is the RawConn.Write callback of a forward: one sendmsg that
// never waits (MSG_DONTWAIT; a full connection is a drop) and raises no
// SIGPIPE (MSG_NOSIGNAL; an owner gone is EPIPE).
func (f *forwarder) sendmsg(fd uintptr) bool {
	_, _, f.errno = unix.RawSyscall(unix.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&f.msg)), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
	return true
}

// forward hands datagram b, described by r.meta, to the device of this
// user that owns port (handover.go). Every datagram is counted once:
// forwarded, no_owner_drops (no device of this user holds the port, or
// none did at an attempt a moment ago: noowner.go) or forward_drops (the
// owner's connection is full, the hand-over is off, another user holds
// the port's hand-over socket: handover_errors too, or the attempts to
// connect to ports without an owner are used up for the moment).
func (r *receiver) forward(b []byte, port uint16, v6 bool) {
	d := r.d
	if len(b) > readBufLen {
		d.core.Count(softverbs.ForwardDrops, 1)
		return
	}
	if d.ho.ownerless(port) {
		// Found without an owner lately (noowner.go): dropped as
		// cheaply as any other datagram.
		d.core.Count(softverbs.NoOwnerDrops, 1)
		return
	}
	r.burst.Release() // no lock held over the system calls
	f := &r.fwd
	putFwdHdr(&f.hdr, &r.meta, v6)
	f.iov[0].Base = &f.hdr[0]
	f.iov[0].SetLen(fwdHdrLen)
	f.iov[1].Base = &b[0]
	f.iov[1].SetLen(len(b))
	defer func() { f.iov[1].Base = nil }() // keep no reference to the read buffer
	// A cached connection whose owner closed it (EPIPE, ECONNRESET) is
	// replaced once: the port may have a new owner.
	for try := 0; try < 2; try++ {
		hc, err := d.ho.conn(port)
		if err != nil {
			if noOwner(err) {
				d.core.Count(softverbs.NoOwnerDrops, 1)
			} else {
				if errors.Is(err, errForeignOwner) {
					d.handoverFailed("connect", err)
				}
				d.core.Count(softverbs.ForwardDrops, 1)
			}
			return
		}
		if err := hc.raw.Write(f.sendFn); err == nil && f.errno == 0 {
			d.core.Count(softverbs.Forwarded, 1)
			return
		}
		if f.errno != unix.EPIPE && f.errno != unix.ECONNRESET && f.errno != unix.ENOTCONN {
			break // EAGAIN: the owner does not keep up
		}
		d.ho.drop(port, hc)
	}
	d.core.Count(softverbs.ForwardDrops, 1)
}

// handleForwarded checks and delivers a datagram another device of this
// user handed over to one of this device's send blocks (r.blk) on a
// connection whose peer was checked when it was accepted: b is the
// forwarding header and the RoCEv2 datagram (counted received by the
// caller). A forwarded datagram is never forwarded again.
func (r *receiver) handleForwarded(b []byte, trunc bool) {
	d := r.d
	d.core.Count(softverbs.RcvdForwarded, 1)
	if trunc {
		d.core.Count(softverbs.OversizedRecvDrops, 1)
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
