package mmsg

import (
	"encoding/binary"
	"net"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BenchmarkSyscallShape is what the shape of the RoCEv2 device's system
// calls costs in the kernel against a plain UDP program's: one 100-byte
// multicast datagram sent and received on loopback per operation, with
// raw system calls and nothing else, so that the difference is the
// kernel's alone (docs/performance.md, "What is left"). The device sends
// with sendmmsg, one message of three iovecs (headers, payload, pad and
// ICRC) and an IP_TTL control message; it receives with recvmmsg into a
// batch of 16 with IP_ORIGDSTADDR, IP_TTL and IP_TOS (the ICRC needs the
// destination, the GRH area the TTL and TOS). The baseline sends with
// sendto and receives with recvfrom. empty-* is a read that finds nothing
// (a busy poller's iteration):
//
//	go test -run '^$' -bench SyscallShape -count 8 ./internal/sys/mmsg
func BenchmarkSyscallShape(b *testing.B) {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		b.Skipf("no loopback interface: %v", err)
	}
	type sock struct{ r, s int }
	open := func(b *testing.B, port int, meta bool) sock {
		r, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { unix.Close(r) })
		opts := [][2]int{{unix.SOL_SOCKET, unix.SO_REUSEADDR}}
		if meta {
			opts = append(opts, [2]int{unix.IPPROTO_IP, unix.IP_RECVORIGDSTADDR}, [2]int{unix.IPPROTO_IP, unix.IP_RECVTTL}, [2]int{unix.IPPROTO_IP, unix.IP_RECVTOS})
		}
		for _, o := range opts {
			if err := unix.SetsockoptInt(r, o[0], o[1], 1); err != nil {
				b.Fatal(err)
			}
		}
		if err := unix.SetsockoptInt(r, unix.IPPROTO_IP, unix.IP_MULTICAST_ALL, 0); err != nil {
			b.Fatal(err)
		}
		if err := unix.Bind(r, &unix.SockaddrInet4{Port: port}); err != nil {
			b.Fatal(err)
		}
		if err := unix.SetsockoptIPMreqn(r, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP,
			&unix.IPMreqn{Multiaddr: [4]byte{239, 9, 7, 1}, Ifindex: int32(lo.Index)}); err != nil {
			b.Fatal(err)
		}
		s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { unix.Close(s) })
		if err := unix.SetsockoptIPMreqn(s, unix.IPPROTO_IP, unix.IP_MULTICAST_IF,
			&unix.IPMreqn{Address: [4]byte{127, 0, 0, 1}, Ifindex: int32(lo.Index)}); err != nil {
			b.Fatal(err)
		}
		return sock{r, s}
	}
	var dst unix.RawSockaddrInet4
	dst.Family = unix.AF_INET
	dst.Addr = [4]byte{239, 9, 7, 1}

	payload := make([]byte, 100)
	sendto := func(fd int) unix.Errno {
		_, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&payload[0])), uintptr(len(payload)),
			0, uintptr(unsafe.Pointer(&dst)), unix.SizeofSockaddrInet4)
		return e
	}
	// The device's send: headers, payload, pad and ICRC; IP_TTL.
	var hdr [40]byte
	var tail [4]byte
	var iov [3]unix.Iovec
	iov[0].Base, iov[1].Base, iov[2].Base = &hdr[0], &payload[0], &tail[0]
	iov[0].SetLen(len(hdr))
	iov[1].SetLen(len(payload) - len(hdr) - len(tail))
	iov[2].SetLen(len(tail))
	oob := make([]byte, unix.CmsgSpace(4))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = unix.IPPROTO_IP, unix.IP_TTL
	h.SetLen(unix.CmsgLen(4))
	binary.NativeEndian.PutUint32(oob[unix.CmsgLen(0):], 1)
	var smsg [1]unix.Mmsghdr
	smsg[0].Hdr.Name = (*byte)(unsafe.Pointer(&dst))
	smsg[0].Hdr.Namelen = unix.SizeofSockaddrInet4
	smsg[0].Hdr.Iov = &iov[0]
	smsg[0].Hdr.SetIovlen(len(iov))
	smsg[0].Hdr.Control = &oob[0]
	smsg[0].Hdr.SetControllen(len(oob))
	sendmmsg := func(fd int) unix.Errno {
		_, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&smsg[0])), 1, unix.MSG_DONTWAIT, 0, 0)
		return e
	}

	rbuf := make([]byte, 2048)
	recvfrom := func(fd int) (int, unix.Errno) {
		n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&rbuf[0])), uintptr(len(rbuf)), unix.MSG_DONTWAIT, 0, 0)
		return int(n), e
	}
	// The device's receive: a batch of 16 with room for three control
	// messages each (as provider/rxe's).
	batch := NewBatch(16, 2048, unix.SizeofSockaddrInet6, 128)
	recvmmsg := func(fd int) (int, unix.Errno) {
		batch.reset()
		n, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&batch.Hdrs[0])), uintptr(len(batch.Hdrs)), unix.MSG_DONTWAIT, 0, 0)
		return int(n), e
	}

	port := 47910
	for _, c := range []struct {
		name string
		send func(int) unix.Errno
		recv func(int) (int, unix.Errno)
		meta bool
	}{
		{"sendto+recvfrom", sendto, recvfrom, false},
		{"sendmmsg+recvfrom", sendmmsg, recvfrom, false},
		{"sendto+recvmmsg", sendto, recvmmsg, true},
		{"sendmmsg+recvmmsg", sendmmsg, recvmmsg, true},
	} {
		port++
		b.Run(c.name, func(b *testing.B) {
			s := open(b, port, c.meta)
			binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&dst.Port))[:], uint16(port))
			for b.Loop() {
				if e := c.send(s.s); e != 0 {
					b.Fatalf("send: %v", e)
				}
				if n, e := c.recv(s.r); e != 0 || n < 1 {
					b.Fatalf("receive: %d, %v", n, e)
				}
			}
		})
	}
	for _, c := range []struct {
		name string
		recv func(int) (int, unix.Errno)
		meta bool
	}{
		{"empty-recvfrom", recvfrom, false},
		{"empty-recvmmsg", recvmmsg, true},
	} {
		port++
		b.Run(c.name, func(b *testing.B) {
			s := open(b, port, c.meta)
			for b.Loop() {
				if _, e := c.recv(s.r); e != unix.EAGAIN {
					b.Fatalf("empty receive: %v", e)
				}
			}
		})
	}
}
