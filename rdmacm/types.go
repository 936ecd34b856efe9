package rdmacm

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/softrdma/softrdma/verbs"
)

// PortSpace is an RDMA CM port space (enum rdma_port_space); it decides the
// QP type of an id.
type PortSpace uint16

// Port spaces, with their C values.
const (
	PS_IPOIB PortSpace = 0x0002
	PS_TCP   PortSpace = 0x0106
	PS_UDP   PortSpace = 0x0111
	PS_IB    PortSpace = 0x013F
)

// String returns the C constant name.
func (ps PortSpace) String() string {
	switch ps {
	case PS_IPOIB:
		return "RDMA_PS_IPOIB"
	case PS_TCP:
		return "RDMA_PS_TCP"
	case PS_UDP:
		return "RDMA_PS_UDP"
	case PS_IB:
		return "RDMA_PS_IB"
	}
	return fmt.Sprintf("PortSpace(%#x)", uint16(ps))
}

// qpType is the QP type rdma_create_id picks for a port space.
func (ps PortSpace) qpType() verbs.QPType {
	switch ps {
	case PS_UDP, PS_IPOIB:
		return verbs.QPTypeUD
	}
	return verbs.QPTypeRC
}

// Well-known values.
const (
	// UDPQKey is the Q_Key of RDMA_PS_UDP ids and groups (RDMA_UDP_QKEY).
	UDPQKey = 0x01234567
	// IPoIBQKey is the default Q_Key of the IPoIB broadcast group (OpenSM).
	IPoIBQKey = 0x0B1B
	// MulticastQPN is the remote QPN of every multicast send.
	MulticastQPN = verbs.MulticastQPN
	// MaxPrivateData is RDMA_MAX_PRIVATE_DATA.
	MaxPrivateData = 256
)

// Extended join attributes (enum rdma_cm_join_mc_attr_mask).
const (
	JoinMCAttrAddress   uint32 = 1 << 0
	JoinMCAttrJoinFlags uint32 = 1 << 1
	JoinMCAttrReserved  uint32 = 1 << 2
)

// Join flags (enum rdma_cm_mc_join_flags): a value, not a bit set.
const (
	MCJoinFlagFullMember         uint32 = 0
	MCJoinFlagSendOnlyFullMember uint32 = 1
	MCJoinFlagReserved           uint32 = 2
)

// JoinMCAttrEx is struct rdma_cm_join_mc_attr_ex.
type JoinMCAttrEx struct {
	CompMask  uint32
	JoinFlags uint32
	Addr      net.Addr
}

// ENOTSUPP is the kernel-internal errno 524 that Linux leaks to userspace
// for a RoCEv2 join of a non-IP address.
const ENOTSUPP = syscall.Errno(524)

// IBAddr is an AF_IB socket address (struct sockaddr_ib): an unmapped
// InfiniBand address such as an MGID given to mckey -M.
type IBAddr struct {
	PKey     uint16
	FlowInfo uint32
	GID      verbs.GID
	SID      uint64
	SIDMask  uint64
	ScopeID  uint64
}

// Network returns "ib".
func (a *IBAddr) Network() string { return "ib" }

// String returns the GID in IPv6 form.
func (a *IBAddr) String() string { return a.GID.String() }

// sockaddr is a normalized socket address; == compares it the way
// librdmacm memcmp's sockaddrs (family, address, port, scope).
type sockaddr struct {
	family int
	ip     netip.Addr
	port   uint16
	ib     IBAddr
}

// toSockaddr converts a net.Addr: *net.UDPAddr, *net.TCPAddr, *net.IPAddr
// and *IBAddr are accepted; anything else (or nil) is EINVAL, like an
// unknown sa_family.
func toSockaddr(a net.Addr) (sockaddr, error) {
	var ip net.IP
	var port int
	var zone string
	switch v := a.(type) {
	case *net.UDPAddr:
		if v == nil {
			return sockaddr{}, syscall.EINVAL
		}
		ip, port, zone = v.IP, v.Port, v.Zone
	case *net.TCPAddr:
		if v == nil {
			return sockaddr{}, syscall.EINVAL
		}
		ip, port, zone = v.IP, v.Port, v.Zone
	case *net.IPAddr:
		if v == nil {
			return sockaddr{}, syscall.EINVAL
		}
		ip, zone = v.IP, v.Zone
	case *IBAddr:
		if v == nil {
			return sockaddr{}, syscall.EINVAL
		}
		return sockaddr{family: afIB, ib: *v}, nil
	default:
		return sockaddr{}, syscall.EINVAL
	}
	if port < 0 || port > 0xffff {
		return sockaddr{}, syscall.EINVAL
	}
	if ip4 := ip.To4(); ip4 != nil {
		return sockaddr{family: syscall.AF_INET, ip: netip.AddrFrom4([4]byte(ip4)), port: uint16(port)}, nil
	}
	if len(ip) == net.IPv6len {
		return sockaddr{family: syscall.AF_INET6, ip: netip.AddrFrom16([16]byte(ip)).WithZone(zone), port: uint16(port)}, nil
	}
	return sockaddr{}, syscall.EINVAL
}

// netAddr turns a sockaddr back into a net.Addr.
func (s sockaddr) netAddr() net.Addr {
	switch s.family {
	case afIB:
		ib := s.ib
		return &ib
	case syscall.AF_INET, syscall.AF_INET6:
		return net.UDPAddrFromAddrPort(netip.AddrPortFrom(s.ip, s.port))
	}
	return nil
}

func (s sockaddr) isIP() bool { return s.family == syscall.AF_INET || s.family == syscall.AF_INET6 }

// UDPAddr is a convenience for building a join or bind address.
func UDPAddr(a netip.Addr) *net.UDPAddr { return net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 0)) }

// afIB is AF_IB (27), the InfiniBand address family.
const afIB = 27
