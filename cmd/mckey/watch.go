package main

// The group watch: a receiver whose device got nothing learns whether the
// group's datagrams reached this host on another interface, and which -b
// would have received them.
//
// A RoCEv2 device's receive sockets hold the group's membership on the
// device's interface only and take nothing that arrives elsewhere
// (IP_MULTICAST_ALL off), so the device cannot tell. While a receiver with
// --timeout waits, mckey holds one more socket: bound to the group's
// address and UDP 4791 (a reuseport group of its own, so it takes no
// unicast datagram from the devices), without a membership of its own and
// with IP_MULTICAST_ALL on, so that the kernel gives it a copy of every
// datagram for the group that an interface of this host accepts — where
// any socket or device holds the membership — with the interface it came
// on (IP_PKTINFO); it reads them only when the receiver timed out. It joins nothing: no IGMP or MLD report leaves the host
// because of it.

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/wire"
)

// groupWatch counts the datagrams for one group that reach this host, by
// the interface they arrive on. Nothing reads its socket while the
// receiver waits (the kernel queues what comes, up to the socket's
// buffer, and drops the rest): report reads what is queued.
type groupWatch struct {
	group netip.Addr
	conn  *net.UDPConn
	seen  map[int]*ifSeen // by ifindex
}

// ifSeen is what the watch saw on one interface.
type ifSeen struct {
	n    int
	from netip.Addr // the first datagram's source
}

// watchGroup starts watching group (an IP multicast address); nil when
// the socket cannot be had (the hint then says less).
func watchGroup(group netip.Addr) *groupWatch {
	group = group.Unmap()
	if !group.IsMulticast() {
		return nil
	}
	v6 := group.Is6()
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			opts := [][3]int{{unix.SOL_SOCKET, unix.SO_REUSEPORT, 1}}
			if v6 {
				opts = append(opts, [3]int{unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1}, [3]int{unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_ALL, 1})
			} else {
				opts = append(opts, [3]int{unix.IPPROTO_IP, unix.IP_PKTINFO, 1}, [3]int{unix.IPPROTO_IP, unix.IP_MULTICAST_ALL, 1})
			}
			for _, o := range opts {
				if serr = unix.SetsockoptInt(int(fd), o[0], o[1], o[2]); serr != nil {
					return
				}
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	network := "udp4"
	if v6 {
		network = "udp6"
	}
	pc, err := lc.ListenPacket(context.Background(), network, net.JoinHostPort(group.String(), strconv.Itoa(wire.UDPPort)))
	if err != nil {
		return nil
	}
	return &groupWatch{group: group, conn: pc.(*net.UDPConn), seen: map[int]*ifSeen{}}
}

// drain reads what the socket holds, without waiting, and counts it.
func (w *groupWatch) drain() {
	raw, err := w.conn.SyscallConn()
	if err != nil {
		return
	}
	v6 := w.group.Is6()
	var buf [64]byte
	var oob [128]byte
	var name [unix.SizeofSockaddrInet6]byte
	raw.Read(func(fd uintptr) bool {
		for {
			iov := unix.Iovec{Base: &buf[0]}
			iov.SetLen(len(buf))
			msg := unix.Msghdr{Name: &name[0], Namelen: uint32(len(name)), Iov: &iov, Iovlen: 1, Control: &oob[0]}
			msg.SetControllen(len(oob))
			_, _, e := unix.Syscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&msg)), unix.MSG_DONTWAIT)
			switch e {
			case 0:
			case unix.EINTR:
				continue
			default:
				return true // EAGAIN: all read (or an error: nothing more to read)
			}
			idx, ok := pktinfoIfindex(oob[:msg.Controllen], v6)
			if !ok {
				continue
			}
			s := w.seen[idx]
			if s == nil {
				s = &ifSeen{from: sourceOf(name[:msg.Namelen])}
				w.seen[idx] = s
			}
			s.n++
		}
	})
}

// sourceOf is the address of a struct sockaddr_in or sockaddr_in6.
func sourceOf(sa []byte) netip.Addr {
	switch {
	case len(sa) >= unix.SizeofSockaddrInet4 && binary.NativeEndian.Uint16(sa) == unix.AF_INET:
		return netip.AddrFrom4([4]byte(sa[4:8]))
	case len(sa) >= unix.SizeofSockaddrInet6 && binary.NativeEndian.Uint16(sa) == unix.AF_INET6:
		return netip.AddrFrom16([16]byte(sa[8:24])).Unmap()
	}
	return netip.Addr{}
}

// pktinfoIfindex returns the arrival interface of an IP_PKTINFO
// (struct in_pktinfo: ipi_ifindex first) or IPV6_PKTINFO (struct
// in6_pktinfo: the address, then ipi6_ifindex) control message.
func pktinfoIfindex(oob []byte, v6 bool) (int, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, false
	}
	for _, m := range msgs {
		switch {
		case !v6 && m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= 4:
			return int(int32(binary.NativeEndian.Uint32(m.Data))), true
		case v6 && m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_PKTINFO && len(m.Data) >= 20:
			return int(int32(binary.NativeEndian.Uint32(m.Data[16:]))), true
		}
	}
	return 0, false
}

// stop closes the watch.
func (w *groupWatch) stop() {
	if w != nil {
		w.conn.Close()
	}
}

// report describes what the watch saw on interfaces other than own (the
// receiving device's), for a receiver whose device got nothing: the
// interface, how many, from where, and the -b that would have received
// them; or that the host saw nothing for the group on any interface. ok
// is false when there is nothing to add (no watch).
func (w *groupWatch) report(own int) (string, bool) {
	if w == nil {
		return "", false
	}
	w.drain()
	idxs := make([]int, 0, len(w.seen))
	for i := range w.seen {
		if i != own {
			idxs = append(idxs, i)
		}
	}
	slices.Sort(idxs)
	if len(idxs) == 0 {
		if s := w.seen[own]; s != nil {
			return fmt.Sprintf("%d reached this host on the device's own interface %s (from %v) but not the device", s.n, ifName(own), s.from), true
		}
		return "nor did any datagram for it reach another interface of this host", true
	}
	i := idxs[0]
	s := w.seen[i]
	msg := fmt.Sprintf("%d reached this host on interface %s (from %v)", s.n, ifName(i), s.from)
	if b, ok := ifAddr(i, w.group.Is6()); ok {
		msg += fmt.Sprintf("; -b %s would have received them", b)
	}
	if len(idxs) > 1 {
		msg += fmt.Sprintf(" (and %d more interfaces saw some)", len(idxs)-1)
	}
	return msg, true
}

// ifName names interface idx.
func ifName(idx int) string {
	if ifi, err := net.InterfaceByIndex(idx); err == nil {
		return ifi.Name
	}
	return "ifindex " + strconv.Itoa(idx)
}

// ifAddr returns an address of interface idx of the group's family for
// -b: a global one first, else a link-local one with its zone.
func ifAddr(idx int, v6 bool) (string, bool) {
	ifi, err := net.InterfaceByIndex(idx)
	if err != nil {
		return "", false
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return "", false
	}
	var local string
	for _, a := range addrs {
		pfx, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := pfx.Addr()
		if ip.Is6() != v6 {
			continue
		}
		if ip.IsLinkLocalUnicast() {
			if local == "" {
				local = ip.WithZone(ifi.Name).String()
			}
			continue
		}
		return ip.String(), true
	}
	return local, local != ""
}
