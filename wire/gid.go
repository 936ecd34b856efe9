package wire

import (
	"net/netip"
)

// GIDLen is the size of a GID in bytes.
const GIDLen = 16

// GID is a 128-bit InfiniBand/RoCE global identifier, in network order.
type GID [GIDLen]byte

// String formats the GID like inet_ntop(AF_INET6): IPv4-mapped GIDs print
// as ::ffff:a.b.c.d, others in compressed IPv6 form.
func (g GID) String() string {
	return netip.AddrFrom16(g).String()
}

// ParseGID parses a GID written as an IPv6 address (inet_pton AF_INET6).
func ParseGID(s string) (GID, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return GID{}, err
	}
	if !a.Is6() || a.Zone() != "" {
		return GID{}, errNotIPv6(s)
	}
	return a.As16(), nil
}

type errNotIPv6 string

func (e errNotIPv6) Error() string { return "wire: " + string(e) + " is not an IPv6-form GID" }

// IsZero reports whether every byte of the GID is zero.
func (g GID) IsZero() bool { return g == GID{} }

// IsV4Mapped reports whether the GID is an IPv4-mapped address ::ffff:a.b.c.d.
func (g GID) IsV4Mapped() bool {
	return netip.AddrFrom16(g).Is4In6()
}

// IsMulticast reports whether the GID is a multicast GID, as the kernel's
// rdma_is_multicast_addr: byte 0 is 0xFF, or it is IPv4-mapped and the IPv4
// address is in 224.0.0.0/4.
func (g GID) IsMulticast() bool {
	if g[0] == 0xff {
		return true
	}
	if g.IsV4Mapped() {
		return g[12]&0xf0 == 0xe0
	}
	return false
}

// Addr returns the IP address a RoCEv2 GID stands for: the IPv4 address of
// an IPv4-mapped GID, otherwise the GID as an IPv6 address.
func (g GID) Addr() netip.Addr {
	return netip.AddrFrom16(g).Unmap()
}

// GIDFromAddr returns the RoCEv2 GID of an IP address: IPv4 a.b.c.d maps to
// ::ffff:a.b.c.d, IPv6 addresses are used verbatim.
func GIDFromAddr(a netip.Addr) GID {
	if a.Is4() {
		return netip.AddrFrom16(a.As16()).As16()
	}
	return a.As16()
}

// RoCEv2MGID returns the MGID the RDMA CM uses for a RoCEv2 multicast group
// (cma_iboe_set_mgid with a RoCEv2 GID type): an IPv4 group maps to
// ::ffff:a.b.c.d, an IPv6 group is used verbatim.
func RoCEv2MGID(group netip.Addr) GID { return GIDFromAddr(group) }

// IPoIB MGID signatures (bytes 2-3 of an IPoIB-mapped MGID).
const (
	SigIPv4IPoIB  = 0x401b
	SigIPv6IPoIB  = 0x601b
	SigSAAssigned = 0xa01b
	// RDMA CM ids of port space UDP overwrite byte 3 with this value.
	UDPSignatureByte = 0x01
)

// IBMGID maps an IP multicast address to an InfiniBand MGID the way the
// RDMA CM does (cma_set_mgid with ip_ib_mc_map / ipv6_ib_mc_map): scope and
// P_Key come from the IPoIB broadcast address (default scope 2, P_Key
// 0xffff); udp selects the RDMA_PS_UDP signature (byte 3 = 0x01).
// An IPv6 address of the form ff1x:a01b::/32 (SA-assigned MGID) is returned
// verbatim; the zero address gives the zero MGID (the SA assigns one).
func IBMGID(a netip.Addr, pkey uint16, scope uint8, udp bool) GID {
	var m GID
	a = a.Unmap()
	if !a.IsValid() || a.IsUnspecified() || a.IsLoopback() {
		return m
	}
	if a.Is6() {
		b := a.As16()
		if b[0] == 0xff && b[1]&0xf0 == 0x10 && b[2] == 0xa0 && b[3] == 0x1b {
			return b
		}
		m[0], m[1], m[2], m[3] = 0xff, 0x10|scope&0x0f, 0x60, 0x1b
		m[4], m[5] = byte(pkey>>8), byte(pkey)
		copy(m[6:], b[6:])
	} else {
		b := a.As4()
		m[0], m[1], m[2], m[3] = 0xff, 0x10|scope&0x0f, 0x40, 0x1b
		m[4], m[5] = byte(pkey>>8), byte(pkey)
		m[12], m[13], m[14], m[15] = b[0]&0x0f, b[1], b[2], b[3]
	}
	if udp {
		m[3] = UDPSignatureByte
	}
	return m
}

// IsSAAssignedMGID reports whether g has the form ff1x:a01b::/32.
func IsSAAssignedMGID(g GID) bool {
	return g[0] == 0xff && g[1]&0xf0 == 0x10 && g[2] == 0xa0 && g[3] == 0x1b
}
