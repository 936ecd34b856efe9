package rxe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/internal/sys/rawudp"
	"github.com/softrdma/softrdma/wire"
)

// This file holds every socket option and control message of the package:
// the UDP 4791 receive sockets, the send sockets and group memberships.

// ipv6FlowInfo is IPV6_FLOWINFO (linux/in6.h): deliver the flow label as a
// control message.
const ipv6FlowInfo = 11

// recvBufSize is the receive socket buffer the package asks for: as asked
// where the process may (SO_RCVBUFFORCE, CAP_NET_ADMIN), else up to the
// host's net.core.rmem_max (SO_RCVBUF). It is a limit, not memory taken:
// the kernel charges a socket only for what waits in it. What it buys is
// time: a receiver that the scheduler leaves off the CPU while a sender
// runs at full speed loses what overflows. In softrdma bench's bursts (250
// ms at full speed, 4096-byte datagrams, 1 to 4 receivers on 2 cores) a
// 4 MiB buffer lost 1–15 % of the datagrams; 16 MiB (about 8 ms of 4-KiB
// datagrams at 330k/s) lost 0–0.7 % until the receivers and the sender
// got faster, then up to 37–40 % in a case (plain UDP sockets alike);
// 64 MiB (about 30 ms) lost none in 48 runs of the 4096-byte cases.
const recvBufSize = 64 << 20

// sockopt is one setsockopt call; optional ones may fail (older kernels).
type sockopt struct {
	level, name, value int
	optional           bool
}

func setOpts(fd int, opts []sockopt) error {
	for _, o := range opts {
		if err := unix.SetsockoptInt(fd, o.level, o.name, o.value); err != nil && !o.optional {
			return fmt.Errorf("setsockopt(%d, %d, %d): %w", o.level, o.name, o.value, err)
		}
	}
	return nil
}

// openRecvConn opens a receive socket on UDP 4791 of the given family.
// It is a rawudp.Conn: out of Go's netpoller while a consumer reads it
// itself (mmsg.Reader.Wait and Progress), and never woken for
// writability.
//
// When another user's socket holds the port, the error (EADDRINUSE) names
// that user: devices sharing a network namespace must run as one user.
func openRecvConn(v6 bool) (*rawudp.Conn, error) {
	var conn *rawudp.Conn
	var err error
	if !v6 {
		conn, err = rawudp.ListenUDP("udp4", "0.0.0.0:"+strconv.Itoa(wire.UDPPort), recvSockSetup(false))
	} else {
		conn, err = rawudp.ListenUDP("udp6", "[::]:"+strconv.Itoa(wire.UDPPort), recvSockSetup(true))
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		err = reasonError{syscall.EADDRINUSE, fmt.Sprintf("UDP port %d is held by %s; the devices of one network namespace must all run as one user",
			wire.UDPPort, portHolders(wire.UDPPort))}
	}
	return conn, err
}

// reasonError is an errno told in words of its own (errors.Is finds the
// errno; the text is the reason only).
type reasonError struct {
	errno  syscall.Errno
	reason string
}

func (e reasonError) Error() string { return e.reason }
func (e reasonError) Unwrap() error { return e.errno }

// portHolders describes who holds UDP port (the owners of the sockets
// /proc/net/udp and udp6 list on it, other than this user).
func portHolders(port int) string {
	me := os.Geteuid()
	var uids []int
	for _, f := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(l)
			if len(fs) < 8 {
				continue
			}
			_, p, ok := strings.Cut(fs[1], ":")
			n, err1 := strconv.ParseUint(p, 16, 16)
			uid, err2 := strconv.Atoi(fs[7])
			if ok && err1 == nil && err2 == nil && int(n) == port && uid != me && !slices.Contains(uids, uid) {
				uids = append(uids, uid)
			}
		}
	}
	switch len(uids) {
	case 0:
		return "a socket that does not share it (not a softrdma device of this user)"
	case 1:
		return fmt.Sprintf("a socket of another user (uid %d)", uids[0])
	}
	return fmt.Sprintf("sockets of other users (uids %v)", uids)
}

// demuxGuard defeats a kernel shortcut that would misroute multicast
// among reuseport sockets. The kernel's early demultiplexing hands an IPv4
// multicast datagram that exactly one socket of the host wants straight
// to that socket, and a socket of a reuseport group (every device socket
// on 4791, of all processes of the user) is then swapped for one of the
// group chosen by the 4-tuple hash: the datagram lands on a socket that
// holds no membership of its group, often another process's (measured on
// Linux 6.18 between two namespaces: 7 of 20 datagrams on the wrong
// socket, none with net.ipv4.udp_early_demux=0). The kernel skips that
// shortcut when more than 10 sockets share the port's hash slot: the
// guard is 11 sockets on 4791 bound to 224.0.0.0, an address no datagram
// is ever sent to (no host joins the base address), so they never receive
// and never join the devices' reuseport group (another address). IPv6
// multicast takes no such shortcut.
type demuxGuard struct{ fds []int }

// demuxGuardSockets is how many sockets the guard holds: more than the
// 10 the kernel's early demultiplexing scans.
const demuxGuardSockets = 11

// openGuardLocked opens the device's guard unless it is open. Best effort:
// without it, multicast reaches every member while two or more sockets of
// the host want the group, as without SO_REUSEPORT.
func (d *Device) openGuardLocked() {
	if d.guard != nil {
		return
	}
	g := &demuxGuard{}
	for range demuxGuardSockets {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			break
		}
		err = setOpts(fd, []sockopt{
			{unix.SOL_SOCKET, unix.SO_REUSEPORT, 1, false},
			{unix.IPPROTO_IP, unix.IP_MULTICAST_ALL, 0, false},
			{unix.SOL_SOCKET, unix.SO_RCVBUF, 0, true},
		})
		if err == nil {
			err = unix.Bind(fd, &unix.SockaddrInet4{Port: wire.UDPPort, Addr: [4]byte{224, 0, 0, 0}})
		}
		if err != nil {
			unix.Close(fd)
			break
		}
		g.fds = append(g.fds, fd)
	}
	d.guard = g
}

// closeGuardIdleLocked closes the guard once the device has no IPv4
// socket on 4791 left.
func (d *Device) closeGuardIdleLocked() {
	if d.guard == nil {
		return
	}
	for _, s := range d.rsocks {
		if !s.v6 {
			return
		}
	}
	for _, s := range d.usocks {
		if !s.v6 {
			return
		}
	}
	for _, fd := range d.guard.fds {
		unix.Close(fd)
	}
	d.guard = nil
}

// recvSockSetup returns the setup of a receive socket of the given family
// (its options, set before bind).
func recvSockSetup(v6 bool) func(fd int) error {
	common := []sockopt{
		// SO_REUSEPORT, not SO_REUSEADDR: the kernel lets only sockets
		// of the same user share the port, so another user can neither
		// bind 4791 beside the devices (a more specific address would win
		// the unicast lookup) nor join their reuseport group.
		{unix.SOL_SOCKET, unix.SO_REUSEPORT, 1, false},
		{unix.SOL_SOCKET, unix.SO_RCVBUF, recvBufSize, true},
		{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, recvBufSize, true},
		// No SO_RXQ_OVFL: socket_drops asks the socket for its drop count
		// (SO_MEMINFO) when the counters are read, which a control
		// message with every datagram would cost 2 % of a 64-byte
		// datagram's receive to repeat.
	}
	if !v6 {
		return func(fd int) error {
			return setOpts(fd, append(common,
				sockopt{unix.IPPROTO_IP, unix.IP_MULTICAST_ALL, 0, false},
				// The destination address (the group) comes as
				// IP_ORIGDSTADDR, read from the IP header when the datagram
				// is received; IP_PKTINFO would cost a route lookup per
				// datagram and socket when the kernel queues it (in the
				// sender's context on loopback): 10 % of a 2-receiver
				// fan-out's rate, measured with softrdma bench.
				sockopt{unix.IPPROTO_IP, unix.IP_RECVORIGDSTADDR, 1, false},
				sockopt{unix.IPPROTO_IP, unix.IP_RECVTTL, 1, false},
				sockopt{unix.IPPROTO_IP, unix.IP_RECVTOS, 1, false},
			))
		}
	}
	return func(fd int) error {
		return setOpts(fd, append(common,
			sockopt{unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1, false},
			sockopt{unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_ALL, 0, true},
			sockopt{unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1, false},
			sockopt{unix.IPPROTO_IPV6, unix.IPV6_RECVHOPLIMIT, 1, false},
			sockopt{unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1, false},
			sockopt{unix.IPPROTO_IPV6, ipv6FlowInfo, 1, true},
			sockopt{unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_RX, 1, false},
		))
	}
}

// openSendConn opens a send socket of the given family on the wildcard
// address and an ephemeral port (exclusive on the host, which makes the
// port a unique QPN prefix), with multicast output on interface ifindex.
// src4 is the device's first IPv4 address, if any, for IP_MULTICAST_IF.
//
// The socket stays out of Go's netpoller for writing (rawudp): a send
// socket there would wake a parked netpoller thread for every datagram the
// kernel frees.
func openSendConn(v6 bool, ifindex int, src4 netip.Addr) (*rawudp.Conn, uint16, error) {
	var conn *rawudp.Conn
	var err error
	if !v6 {
		conn, err = rawudp.ListenUDP("udp4", "0.0.0.0:0", func(fd int) error {
			if err := setOpts(fd, []sockopt{
				{unix.SOL_SOCKET, unix.SO_NO_CHECK, 1, false},
				{unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO, false},
				{unix.IPPROTO_IP, unix.IP_MULTICAST_LOOP, 1, false},
				{unix.IPPROTO_IP, unix.IP_MULTICAST_TTL, 0, false},
				// Nothing reads it (hand-overs come over unix sockets):
				// what anyone sends to its port waits in the smallest
				// buffer the kernel allows, then is dropped.
				{unix.SOL_SOCKET, unix.SO_RCVBUF, 0, true},
			}); err != nil {
				return err
			}
			mreq := unix.IPMreqn{Ifindex: int32(ifindex)}
			if src4.Is4() {
				mreq.Address = src4.As4()
			}
			return unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_MULTICAST_IF, &mreq)
		})
	} else {
		conn, err = rawudp.ListenUDP("udp6", "[::]:0", func(fd int) error {
			return setOpts(fd, []sockopt{
				{unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1, false},
				{unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_TX, 1, false},
				{unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO, false},
				{unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_LOOP, 1, false},
				{unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_IF, ifindex, false},
			})
		})
	}
	if err != nil {
		return nil, 0, err
	}
	port := uint16(conn.LocalAddr().(*net.UDPAddr).Port)
	return conn, port, nil
}

// control runs f on the socket descriptor.
func control(conn syscall.Conn, f func(fd int) error) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// joinGroup adds the membership of group on interface ifindex to conn.
func joinGroup(conn syscall.Conn, group netip.Addr, ifindex int) error {
	return control(conn, func(fd int) error {
		if group.Is4() {
			m := unix.IPMreqn{Multiaddr: group.As4(), Ifindex: int32(ifindex)}
			return unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, &m)
		}
		m := unix.IPv6Mreq{Multiaddr: group.As16(), Interface: uint32(ifindex)}
		return unix.SetsockoptIPv6Mreq(fd, unix.IPPROTO_IPV6, unix.IPV6_JOIN_GROUP, &m)
	})
}

// leaveGroup drops the membership of group on interface ifindex from conn.
func leaveGroup(conn syscall.Conn, group netip.Addr, ifindex int) error {
	return control(conn, func(fd int) error {
		if group.Is4() {
			m := unix.IPMreqn{Multiaddr: group.As4(), Ifindex: int32(ifindex)}
			return unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_DROP_MEMBERSHIP, &m)
		}
		m := unix.IPv6Mreq{Multiaddr: group.As16(), Interface: uint32(ifindex)}
		return unix.SetsockoptIPv6Mreq(fd, unix.IPPROTO_IPV6, unix.IPV6_LEAVE_GROUP, &m)
	})
}

var maxMemberships = sync.OnceValue(func() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/igmp_max_memberships")
	if err != nil {
		return 20
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		return 20
	}
	return n
})

// membershipsPerSocket is how many groups one receive socket holds: the
// kernel's per-socket IGMP limit (net.ipv4.igmp_max_memberships, default
// 20), used for IPv6 too.
func membershipsPerSocket() int { return maxMemberships() }

// isSocketFull reports a per-socket membership limit error: ENOBUFS past
// igmp_max_memberships, ENOMEM when the socket's option memory
// (net.core.optmem_max) is exhausted, as for IPv6.
func isSocketFull(err error) bool { return errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.ENOMEM) }

// putCmsg writes one control message with the given data at b[0:] and
// returns its space. b must be 8-byte aligned at 0 and long enough.
func putCmsg(b []byte, level, typ int32, data []byte) int {
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level = level
	h.Type = typ
	h.SetLen(unix.CmsgLen(len(data)))
	off := unix.CmsgLen(0)
	copy(b[off:], data)
	sp := unix.CmsgSpace(len(data))
	clear(b[off+len(data) : sp])
	return sp
}

// putCmsgInt writes a control message carrying a C int.
func putCmsgInt(b []byte, level, typ int32, v int) int {
	var x [4]byte
	binary.NativeEndian.PutUint32(x[:], uint32(int32(v)))
	return putCmsg(b, level, typ, x[:])
}

// sendOOBSpace is the size of the control buffer of a send: IPV6_PKTINFO
// (the larger pktinfo) and two ints, as unix.CmsgSpace computes them.
const sendOOBSpace = (unix.SizeofCmsghdr+unix.SizeofInet6Pktinfo+7)&^7 + 2*((unix.SizeofCmsghdr+4+7)&^7)

// buildOOB4 writes IP_PKTINFO (source address and interface), IP_TTL
// (unless 0, which IP_TTL cannot express) and IP_TOS into b, leaving out
// what the send socket does anyway: the source and interface of a
// multicast datagram from the socket's multicast source address mcSrc
// (IP_MULTICAST_IF), and TOS 0. A datagram to a group from the device's
// first address thus carries IP_TTL alone, which the kernel reads from its
// stack buffer; the three together (80 bytes) cost it an allocation and a
// free per datagram (____sys_sendmsg copies more than 36 bytes of control
// data into sock_kmalloc'd memory).
func buildOOB4(b []byte, ifindex int, src, dst, mcSrc netip.Addr, ttl, tos uint8) []byte {
	n := 0
	if !dst.IsMulticast() || src != mcSrc {
		var pi [unix.SizeofInet4Pktinfo]byte
		binary.NativeEndian.PutUint32(pi[0:4], uint32(ifindex))
		s := src.As4()
		copy(pi[4:8], s[:])
		n += putCmsg(b, unix.IPPROTO_IP, unix.IP_PKTINFO, pi[:])
	}
	if ttl != 0 {
		n += putCmsgInt(b[n:], unix.IPPROTO_IP, unix.IP_TTL, int(ttl))
	}
	if tos != 0 {
		n += putCmsgInt(b[n:], unix.IPPROTO_IP, unix.IP_TOS, int(tos))
	}
	return b[:n]
}

// buildOOB6 writes IPV6_PKTINFO, IPV6_HOPLIMIT and IPV6_TCLASS into b.
func buildOOB6(b []byte, ifindex int, src netip.Addr, hop, tclass uint8) []byte {
	var pi [unix.SizeofInet6Pktinfo]byte
	s := src.As16()
	copy(pi[0:16], s[:])
	binary.NativeEndian.PutUint32(pi[16:20], uint32(ifindex))
	n := putCmsg(b, unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, pi[:])
	n += putCmsgInt(b[n:], unix.IPPROTO_IPV6, unix.IPV6_HOPLIMIT, int(hop))
	n += putCmsgInt(b[n:], unix.IPPROTO_IPV6, unix.IPV6_TCLASS, int(tclass))
	return b[:n]
}

// rxMeta is what the receive control messages and address tell about a
// datagram.
type rxMeta struct {
	src     netip.Addr
	srcPort uint16
	dst     netip.Addr
	ttl     uint8
	tos     uint8
	flow    uint32 // IPv6 flow label
}

// parseRxMeta fills m from a raw sockaddr and the control messages of a
// received datagram, without allocating.
func parseRxMeta(m *rxMeta, name []byte, oob []byte, v6 bool) {
	*m = rxMeta{}
	if len(name) >= 8 {
		m.srcPort = binary.BigEndian.Uint16(name[2:4])
		if !v6 {
			m.src = netip.AddrFrom4([4]byte(name[4:8]))
		} else if len(name) >= 24 {
			m.src = netip.AddrFrom16([16]byte(name[8:24]))
		}
	}
	// ParseOneSocketControlMessage reads a header without checking that
	// one fits: a shorter tail is not a message.
	for len(oob) >= unix.SizeofCmsghdr {
		h, data, rest, err := unix.ParseOneSocketControlMessage(oob)
		if err != nil {
			return
		}
		oob = rest
		switch {
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_ORIGDSTADDR && len(data) >= 8:
			m.dst = netip.AddrFrom4([4]byte(data[4:8])) // a struct sockaddr_in
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_TTL && len(data) >= 4:
			m.ttl = uint8(binary.NativeEndian.Uint32(data))
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_TOS && len(data) >= 1:
			m.tos = data[0]
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
			m.dst = netip.AddrFrom16([16]byte(data[0:16]))
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_HOPLIMIT && len(data) >= 4:
			m.ttl = uint8(binary.NativeEndian.Uint32(data))
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_TCLASS && len(data) >= 4:
			m.tos = uint8(binary.NativeEndian.Uint32(data))
		case h.Level == unix.IPPROTO_IPV6 && h.Type == ipv6FlowInfo && len(data) >= 4:
			m.flow = binary.BigEndian.Uint32(data) & 0xFFFFF
		}
	}
}

// RecvBatch is the number of datagrams a receive goroutine reads with one
// recvmmsg.
const RecvBatch = 16

const (
	readBatch  = RecvBatch
	readBufLen = 4096 + 128 // any RoCEv2 UD packet of a 4096-byte MTU
	readOOBLen = 256
)

// readBufs are the buffers of one recvmmsg batch, in one allocation.
type readBufs struct {
	mmsg.Batch
	hs    [readBatch]unix.Mmsghdr
	iovs  [readBatch]unix.Iovec
	names [readBatch * unix.SizeofSockaddrInet6]byte
	oobs  [readBatch * readOOBLen]byte
	data  [readBatch * readBufLen]byte
}

// readPool holds the buffers of recvmmsg batches. A receive socket's
// reader takes one from it and gives it back whenever the socket has
// nothing to read, so an idle socket (one of thousands holding
// memberships) holds none; under load a reader keeps its buffers.
var readPool = mmsg.NewPool(func() *mmsg.Batch {
	b := &readBufs{}
	b.Init(b.hs[:], b.iovs[:], b.data[:], b.names[:], b.oobs[:])
	return &b.Batch
})

// newBatchReader returns the recvmmsg reader of a receive socket.
func newBatchReader(conn syscall.Conn) (*mmsg.Reader, error) {
	return mmsg.NewPooledReader(conn, readPool)
}

// sockDrops returns the count of datagrams the kernel dropped on conn
// (SO_MEMINFO's SK_MEMINFO_DROPS, which SO_RXQ_OVFL would report); false
// when the socket cannot say (closed).
func sockDrops(conn syscall.Conn) (uint32, bool) {
	var v uint32
	ok := false
	control(conn, func(fd int) error {
		var mi [unix.SK_MEMINFO_VARS]uint32
		l := uint32(unsafe.Sizeof(mi))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_MEMINFO,
			uintptr(unsafe.Pointer(&mi[0])), uintptr(unsafe.Pointer(&l)), 0)
		if e == 0 && l > unix.SK_MEMINFO_DROPS*4 {
			v, ok = mi[unix.SK_MEMINFO_DROPS], true
		}
		return nil
	})
	return v, ok
}

// shutdownRead shuts a receive socket down for reading before it is
// closed: it wakes the consumers sleeping on it (mmsg.Reader.WaitReadable),
// whose sleep keeps it open, so that the close does not wait for them.
// Linux does this on an unconnected UDP socket too (and says ENOTCONN).
func shutdownRead(conn syscall.Conn) {
	if rc, err := conn.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RD) })
	}
}
