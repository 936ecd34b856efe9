package rxe

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
	"pgregory.net/rapid"
)

// This file tests parseRxMeta, the receive path's reader of the source
// sockaddr and the control messages (IP_ORIGDSTADDR, IP_TTL, IP_TOS,
// IPV6_PKTINFO, IPV6_HOPLIMIT, IPV6_TCLASS, IPV6_FLOWINFO): a fuzz target
// against an independent reference walker, and a round trip of what the
// kernel hands a receiver.

// cmsgAlign rounds n up to the control message alignment (the size of a
// C long, as CMSG_ALIGN does).
func cmsgAlign(n int) int {
	const a = unix.SizeofCmsghdr - 8 // 8 on 64-bit (16-byte header), 4 on 32-bit (12-byte header)
	return (n + a - 1) &^ (a - 1)
}

// refRxMeta is the oracle: the sockaddr read by its C layout, the control
// messages walked as CMSG_FIRSTHDR/CMSG_NXTHDR define them (a header whose
// length is below the header size or past the buffer ends the walk), read
// with encoding/binary only; a later message of a kind replaces an earlier
// one, a message too short for its kind is ignored.
func refRxMeta(name, oob []byte, v6 bool) rxMeta {
	var m rxMeta
	if len(name) >= 8 { // sa_family, port (big endian), then the address
		m.srcPort = uint16(name[2])<<8 | uint16(name[3])
		switch {
		case !v6:
			var a [4]byte
			copy(a[:], name[4:8])
			m.src = netip.AddrFrom4(a)
		case len(name) >= 24: // sin6_flowinfo at 4, sin6_addr at 8
			var a [16]byte
			copy(a[:], name[8:24])
			m.src = netip.AddrFrom16(a)
		}
	}
	hdr := unix.SizeofCmsghdr
	for off := 0; len(oob)-off >= hdr; {
		var l uint64
		if hdr == 16 {
			l = binary.NativeEndian.Uint64(oob[off:])
		} else {
			l = uint64(binary.NativeEndian.Uint32(oob[off:]))
		}
		if l < uint64(hdr) || l > uint64(len(oob)-off) {
			break
		}
		lenField := 8
		if hdr != 16 {
			lenField = 4
		}
		level := int32(binary.NativeEndian.Uint32(oob[off+lenField:]))
		typ := int32(binary.NativeEndian.Uint32(oob[off+lenField+4:]))
		data := oob[off+cmsgAlign(hdr) : off+int(l)]
		u32 := func() uint32 { return binary.NativeEndian.Uint32(data) }
		switch {
		case level == unix.IPPROTO_IP && typ == unix.IP_ORIGDSTADDR && len(data) >= 8: // sin_family, sin_port, sin_addr
			m.dst = netip.AddrFrom4([4]byte{data[4], data[5], data[6], data[7]})
		case level == unix.IPPROTO_IP && typ == unix.IP_TTL && len(data) >= 4:
			m.ttl = uint8(u32())
		case level == unix.IPPROTO_IP && typ == unix.IP_TOS && len(data) >= 1:
			m.tos = data[0]
		case level == unix.IPPROTO_IPV6 && typ == unix.IPV6_PKTINFO && len(data) >= 20: // ipi6_addr, ipi6_ifindex
			var a [16]byte
			copy(a[:], data)
			m.dst = netip.AddrFrom16(a)
		case level == unix.IPPROTO_IPV6 && typ == unix.IPV6_HOPLIMIT && len(data) >= 4:
			m.ttl = uint8(u32())
		case level == unix.IPPROTO_IPV6 && typ == unix.IPV6_TCLASS && len(data) >= 4:
			m.tos = uint8(u32())
		case level == unix.IPPROTO_IPV6 && typ == ipv6FlowInfo && len(data) >= 4:
			m.flow = binary.BigEndian.Uint32(data) & 0xFFFFF
		}
		off += cmsgAlign(int(l))
	}
	return m
}

// rxCmsgs is what the kernel hands a receiver of one datagram.
type rxCmsgs struct {
	v6           bool
	src, dst     netip.Addr
	port         uint16
	ifindex      uint32
	ttl, tos     uint8
	flow         uint32 // IPv6 flow label (20 bits)
	order        []int  // the order of the messages (indexes into the kinds)
	noise        []int  // where unrelated messages go (before message i)
	truncateLast int    // bytes cut off the last message's data (MSG_CTRUNC)
}

// build returns the sockaddr and the control buffer of c in the kernel's
// receive format: IP_TOS as one byte, the others as a C int, IPV6_FLOWINFO
// as the big-endian flow word with the traffic class in it.
func (c rxCmsgs) build() (name, oob []byte) {
	if !c.v6 {
		name = make([]byte, unix.SizeofSockaddrInet4)
		binary.NativeEndian.PutUint16(name, unix.AF_INET)
		binary.BigEndian.PutUint16(name[2:], c.port)
		a := c.src.As4()
		copy(name[4:], a[:])
	} else {
		name = make([]byte, unix.SizeofSockaddrInet6)
		binary.NativeEndian.PutUint16(name, unix.AF_INET6)
		binary.BigEndian.PutUint16(name[2:], c.port)
		a := c.src.As16()
		copy(name[8:], a[:])
	}
	var kinds []func(b []byte) int
	if !c.v6 {
		kinds = []func(b []byte) int{
			func(b []byte) int {
				var sa [unix.SizeofSockaddrInet4]byte // IP_ORIGDSTADDR: a struct sockaddr_in
				binary.NativeEndian.PutUint16(sa[0:], unix.AF_INET)
				binary.BigEndian.PutUint16(sa[2:], 4791)
				d := c.dst.As4()
				copy(sa[4:8], d[:])
				return putCmsg(b, unix.IPPROTO_IP, unix.IP_ORIGDSTADDR, sa[:])
			},
			func(b []byte) int { return putCmsgInt(b, unix.IPPROTO_IP, unix.IP_TTL, int(c.ttl)) },
			func(b []byte) int { return putCmsg(b, unix.IPPROTO_IP, unix.IP_TOS, []byte{c.tos}) },
		}
	} else {
		kinds = []func(b []byte) int{
			func(b []byte) int {
				var pi [unix.SizeofInet6Pktinfo]byte
				d := c.dst.As16()
				copy(pi[:], d[:])
				binary.NativeEndian.PutUint32(pi[16:], c.ifindex)
				return putCmsg(b, unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, pi[:])
			},
			func(b []byte) int { return putCmsgInt(b, unix.IPPROTO_IPV6, unix.IPV6_HOPLIMIT, int(c.ttl)) },
			func(b []byte) int { return putCmsgInt(b, unix.IPPROTO_IPV6, unix.IPV6_TCLASS, int(c.tos)) },
			func(b []byte) int {
				var w [4]byte
				binary.BigEndian.PutUint32(w[:], uint32(c.tos)<<20|c.flow&0xFFFFF)
				return putCmsg(b, unix.IPPROTO_IPV6, ipv6FlowInfo, w[:])
			},
		}
	}
	noise := func(b []byte, i int) int {
		switch i % 3 {
		case 0: // SO_TIMESTAMPNS: a struct timespec
			return putCmsg(b, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, make([]byte, 16))
		case 1: // the other family's PKTINFO type number at an unrelated level
			return putCmsgInt(b, unix.SOL_SOCKET, unix.IP_PKTINFO, 0x7f000001)
		default: // SO_RXQ_OVFL: a drop count
			return putCmsgInt(b, unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 3)
		}
	}
	buf := make([]byte, 1024)
	n, last := 0, 0
	for pos, k := range c.order {
		for _, at := range c.noise {
			if at == pos {
				n += noise(buf[n:], at+pos)
			}
		}
		last = n
		n += kinds[k%len(kinds)](buf[n:])
	}
	if c.truncateLast > 0 && len(c.order) > 0 {
		// The kernel, out of control space, sets MSG_CTRUNC and writes
		// the last header with the shortened length.
		l := binary.NativeEndian.Uint64(buf[last:]) // 64-bit header
		l -= uint64(c.truncateLast)
		binary.NativeEndian.PutUint64(buf[last:], l)
		n = last + int(l)
	}
	return name, buf[:n]
}

// FuzzParseRxMeta feeds arbitrary sockaddrs and control buffers to
// parseRxMeta. It must never panic and must agree with refRxMeta; the
// result must not depend on what the rxMeta held before.
func FuzzParseRxMeta(f *testing.F) {
	seeds := []rxCmsgs{
		{src: netip.MustParseAddr("127.0.0.1"), dst: netip.MustParseAddr("239.1.2.3"), port: 49152, ifindex: 1, ttl: 1, tos: 0x68, order: []int{0, 1, 2}},
		{src: netip.MustParseAddr("10.1.2.3"), dst: netip.MustParseAddr("127.0.0.1"), port: 4791, ifindex: 7, ttl: 64, order: []int{2, 0, 1}, noise: []int{0, 2}},
		{v6: true, src: netip.MustParseAddr("::1"), dst: netip.MustParseAddr("ff12:401b::1"), port: 50000, ifindex: 1, ttl: 1, tos: 0x28, flow: 0xabcde, order: []int{0, 1, 2, 3}},
		{v6: true, src: netip.MustParseAddr("fe80::1"), dst: netip.MustParseAddr("::1"), port: 4791, ifindex: 3, ttl: 255, order: []int{3, 2, 1, 0}, noise: []int{1}},
		{src: netip.MustParseAddr("127.0.0.1"), dst: netip.MustParseAddr("239.1.2.3"), order: []int{1, 0}, truncateLast: 4},
		{v6: true, src: netip.MustParseAddr("::1"), dst: netip.MustParseAddr("ff02::1"), order: []int{1, 0}, truncateLast: 1},
	}
	for _, s := range seeds {
		name, oob := s.build()
		f.Add(name, oob, s.v6)
	}
	f.Add([]byte{}, []byte{}, false)
	f.Add([]byte{2, 0}, []byte{1, 2, 3}, true)
	f.Fuzz(func(t *testing.T, name, oob []byte, v6 bool) {
		// Exact-size copies: a read past either slice is a read past its
		// allocation (which -race's checkptr reports).
		name = append([]byte(nil), name...)
		oob = append([]byte(nil), oob...)
		want := refRxMeta(name, oob, v6)
		m := rxMeta{src: netip.MustParseAddr("192.0.2.1"), dst: netip.MustParseAddr("192.0.2.2"), srcPort: 9, ttl: 9, tos: 9, flow: 9}
		parseRxMeta(&m, name, oob, v6)
		if m != want {
			t.Fatalf("parseRxMeta = %+v, reference %+v", m, want)
		}
		if m.src.IsValid() && m.src.Is4() == v6 {
			t.Fatalf("v6=%v but source %v", v6, m.src)
		}
	})
}

// TestRxMetaRoundTrip: what the kernel hands a receiver (IPv4 and IPv6,
// unicast and multicast destinations, the messages in any order, unrelated
// messages between them, the last one truncated by MSG_CTRUNC) reads back
// as the datagram's addresses, port, TTL, TOS and flow label,
// without allocating.
func TestRxMetaRoundTrip(t *testing.T) {
	if unix.SizeofCmsghdr != 16 {
		t.Skip("the builder writes 64-bit control message headers")
	}
	rapid.Check(t, func(rt *rapid.T) {
		c := rxCmsgs{v6: rapid.Bool().Draw(rt, "v6")}
		addr := func(label string) netip.Addr {
			kind := rapid.IntRange(0, 2).Draw(rt, label+"kind") // unicast, multicast, loopback
			if !c.v6 {
				b := [4]byte(rapid.SliceOfN(rapid.Byte(), 4, 4).Draw(rt, label))
				switch kind {
				case 1:
					b[0] = 224 + b[0]%16
				case 2:
					b[0] = 127
				}
				return netip.AddrFrom4(b)
			}
			b := [16]byte(rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(rt, label))
			switch kind {
			case 1:
				b[0] = 0xff
			case 2:
				b = netip.IPv6Loopback().As16()
			}
			return netip.AddrFrom16(b)
		}
		c.src, c.dst = addr("src"), addr("dst")
		c.port = rapid.Uint16().Draw(rt, "port")
		c.ifindex = rapid.Uint32().Draw(rt, "ifindex")
		c.ttl, c.tos = rapid.Uint8().Draw(rt, "ttl"), rapid.Uint8().Draw(rt, "tos")
		c.flow = rapid.Uint32Range(0, 0xFFFFF).Draw(rt, "flow")
		kinds := 3
		if c.v6 {
			kinds = 4
		}
		c.order = rapid.Permutation(seq(kinds)).Draw(rt, "order")
		c.noise = rapid.SliceOfN(rapid.IntRange(0, kinds-1), 0, 3).Draw(rt, "noise")
		truncate := rapid.Bool().Draw(rt, "truncate")
		if truncate {
			c.truncateLast = rapid.IntRange(1, 4).Draw(rt, "cut")
		}
		name, oob := c.build()
		var m rxMeta
		parseRxMeta(&m, name, oob, c.v6)
		if m.src != c.src || m.srcPort != c.port {
			rt.Fatalf("source %v:%d, want %v:%d", m.src, m.srcPort, c.src, c.port)
		}
		got := func(k int) bool { return !truncate || c.order[len(c.order)-1] != k } // a truncated message is too short to read
		check := func(k int, ok bool, what string, g, w any) {
			if got(k) && !ok {
				rt.Fatalf("%s = %v, want %v", what, g, w)
			}
		}
		check(0, m.dst == c.dst, "dst", m.dst, c.dst)
		check(1, m.ttl == c.ttl, "ttl", m.ttl, c.ttl)
		if !c.v6 {
			check(2, m.tos == c.tos, "tos", m.tos, c.tos)
		} else {
			check(2, m.tos == c.tos, "tclass", m.tos, c.tos)
			check(3, m.flow == c.flow, "flow", m.flow, c.flow)
		}
		if m != refRxMeta(name, oob, c.v6) {
			rt.Fatalf("parseRxMeta %+v, reference %+v", m, refRxMeta(name, oob, c.v6))
		}
		if n := testing.AllocsPerRun(5, func() { parseRxMeta(&m, name, oob, c.v6) }); n != 0 {
			rt.Fatalf("%v allocations", n)
		}
	})
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}
