package rdmacm

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"

	"github.com/softrdma/softrdma/rdmacm/internal/addr"
	"github.com/softrdma/softrdma/verbs"
)

// Flags of AddrInfo (RAI_*, rdma_cma.h).
const (
	// RAI_PASSIVE: the address is a local one to bind (SrcAddr), not a
	// destination (DstAddr); a missing node is the wildcard address.
	RAI_PASSIVE = 0x01
	// RAI_NUMERICHOST: the node is a numeric address; no name lookup.
	RAI_NUMERICHOST = 0x02
	// RAI_NOROUTE: no route lookup (librdmacm passes it to ibacm only).
	RAI_NOROUTE = 0x04
	// RAI_FAMILY: with AF_IB as Family and RAI_NUMERICHOST, the numeric
	// IPv6 node is turned into an AF_IB address (*IBAddr).
	RAI_FAMILY = 0x08
	// RAI_SA: look up IB service records through the SA (not supported:
	// see GetAddrInfo).
	RAI_SA = 0x10
	// RAI_DNS: with RAI_SA, resolve the node by DNS.
	RAI_DNS = 0x20
)

// AF_IB is the InfiniBand address family (27), for AddrInfo.Family.
const AF_IB = afIB

// AddrInfo is struct rdma_addrinfo: what GetAddrInfo resolved, and the
// hints given to it. A nil address stands for a zero ai_src_len or
// ai_dst_len.
type AddrInfo struct {
	Flags        int // RAI_*
	Family       int // syscall.AF_INET, syscall.AF_INET6, AF_IB or 0
	QPType       verbs.QPType
	PortSpace    PortSpace
	SrcAddr      net.Addr
	DstAddr      net.Addr
	SrcCanonName string
	DstCanonName string
	Route        []byte // path records (struct ib_path_data), for OptionIBPath
	Connect      []byte // private data of a connection
	Next         *AddrInfo
}

// AddrInfoError is a getaddrinfo(3) error code (EAI_*), the value
// rdma_getaddrinfo returns when the name lookup fails. GetAddrInfo's error
// wraps it together with an errno: EAI_NONAME and EAI_SERVICE → ENOENT,
// EAI_ADDRFAMILY and EAI_FAMILY → EAFNOSUPPORT, EAI_AGAIN → EAGAIN,
// EAI_SOCKTYPE → ESOCKTNOSUPPORT, EAI_FAIL → EIO, EAI_BADFLAGS → EINVAL.
type AddrInfoError int

// getaddrinfo error codes (glibc's values).
const (
	EAI_BADFLAGS   AddrInfoError = -1
	EAI_NONAME     AddrInfoError = -2
	EAI_AGAIN      AddrInfoError = -3
	EAI_FAIL       AddrInfoError = -4
	EAI_FAMILY     AddrInfoError = -6
	EAI_SOCKTYPE   AddrInfoError = -7
	EAI_SERVICE    AddrInfoError = -8
	EAI_ADDRFAMILY AddrInfoError = -9
)

// Error returns gai_strerror's text.
func (e AddrInfoError) Error() string {
	switch e {
	case EAI_BADFLAGS:
		return "Bad value for ai_flags"
	case EAI_NONAME:
		return "Name or service not known"
	case EAI_AGAIN:
		return "Temporary failure in name resolution"
	case EAI_FAIL:
		return "Non-recoverable failure in name resolution"
	case EAI_FAMILY:
		return "ai_family not supported"
	case EAI_SOCKTYPE:
		return "ai_socktype not supported"
	case EAI_SERVICE:
		return "Servname not supported for ai_socktype"
	case EAI_ADDRFAMILY:
		return "Address family for hostname not supported"
	}
	return fmt.Sprintf("getaddrinfo error %d", int(e))
}

// errno is the errno GetAddrInfo gives with the code.
func (e AddrInfoError) errno() syscall.Errno {
	switch e {
	case EAI_NONAME, EAI_SERVICE:
		return syscall.ENOENT
	case EAI_ADDRFAMILY, EAI_FAMILY:
		return syscall.EAFNOSUPPORT
	case EAI_AGAIN:
		return syscall.EAGAIN
	case EAI_BADFLAGS:
		return syscall.EINVAL
	case EAI_SOCKTYPE:
		return syscall.ESOCKTNOSUPPORT
	}
	return syscall.EIO
}

func eai(e AddrInfoError, format string, a ...any) error {
	return fmt.Errorf("%s: %w: %w", fmt.Sprintf(format, a...), e, e.errno())
}

// The IB service id masks of an AF_IB address made from an IP port space
// and port (RDMA_IB_IP_PS_MASK, RDMA_IB_IP_PORT_MASK).
const (
	ibIPPSMask   = 0xFFFFFFFFFFFF0000
	ibIPPortMask = 0x000000000000FFFF
)

// GetAddrInfo resolves a node (host name or numeric address) and service
// (port number or name) into an address to bind (RAI_PASSIVE in hints) or
// to resolve (rdma_getaddrinfo). "" stands for C's NULL node or service;
// a nil hints for none. As librdmacm, it asks getaddrinfo for the first
// address: the hints' family (AF_IB is asked as any family), socket type
// and protocol from the hints' QP type and port space; a missing node is
// the wildcard address with RAI_PASSIVE, else the loopback address; the
// result's QP type and port space are the hints', else those of the first
// answer's socket type and protocol (SOCK_STREAM and TCP when the hints
// give neither: RC, RDMA_PS_TCP). With RAI_FAMILY, AF_IB and
// RAI_NUMERICHOST the numeric IPv6 node becomes an *IBAddr (P_Key 0xFFFF,
// service id of the port space and port). Without node and service, the
// hints are the result. A hint SrcAddr is copied when the result has none.
//
// Errors: no node, service nor hints → EINVAL; RAI_SA with a node or
// RAI_DNS → EOPNOTSUPP; RAI_SA otherwise → ENOENT (softrdma has no SA
// service record lookup, as a host without InfiniBand ports); a failed
// lookup → its AddrInfoError (errors.As) with the errno listed there.
// Names are looked up with Go's resolver (/etc/hosts, then DNS), numeric
// nodes are parsed without a lookup.
func GetAddrInfo(node, service string, hints *AddrInfo) (_ *AddrInfo, err error) {
	defer wrapErr(&err, "rdma_getaddrinfo", nil)
	if node == "" && service == "" && hints == nil {
		return nil, syscall.EINVAL
	}
	if hints != nil && hints.Flags&RAI_SA != 0 {
		if node != "" || hints.Flags&RAI_DNS != 0 {
			return nil, fmt.Errorf("RAI_SA with a node or RAI_DNS: %w", syscall.EOPNOTSUPP)
		}
		if service == "" {
			return nil, fmt.Errorf("RAI_SA without a service: %w", syscall.EINVAL)
		}
		return nil, fmt.Errorf("no SA service records: %w", syscall.ENOENT)
	}
	h := hints
	if h == nil {
		h = &AddrInfo{}
	}
	rai := &AddrInfo{}
	if node != "" || service != "" {
		if err := lookupAI(rai, node, service, h); err != nil {
			return nil, err
		}
	} else {
		rai.Flags, rai.Family, rai.QPType, rai.PortSpace = h.Flags, h.Family, h.QPType, h.PortSpace
		rai.DstAddr = h.DstAddr
	}
	if rai.SrcAddr == nil && h.SrcAddr != nil {
		rai.SrcAddr = h.SrcAddr
	}
	return rai, nil
}

// FreeAddrInfo releases what GetAddrInfo returned (rdma_freeaddrinfo);
// in Go there is nothing to free.
func FreeAddrInfo(*AddrInfo) {}

// lookupAI is librdmacm's ucma_getaddrinfo: getaddrinfo with the hints
// converted, and its first answer converted back.
func lookupAI(rai *AddrInfo, node, service string, h *AddrInfo) error {
	passive := h.Flags&RAI_PASSIVE != 0
	family := h.Family
	if family == afIB {
		family = 0
	}
	if family != 0 && family != syscall.AF_INET && family != syscall.AF_INET6 {
		return eai(EAI_FAMILY, "family %d", family)
	}
	// ucma_convert_to_ai: the socket type and protocol of the hints.
	stream, dgram := false, false
	switch h.QPType {
	case verbs.QPTypeRC, verbs.QPTypeUC:
		stream = true
	case verbs.QPTypeUD:
		dgram = true
	}
	var proto string
	switch h.PortSpace {
	case PS_TCP:
		proto = "tcp"
	case PS_IPOIB, PS_UDP:
		proto = "udp"
	case PS_IB:
		switch {
		case stream:
			proto = "tcp"
		case dgram:
			proto = "udp"
		}
	}
	// The first answer's socket type: the hints', else SOCK_STREAM
	// (glibc answers every type, stream first); its protocol follows.
	if !stream && !dgram {
		switch proto {
		case "udp":
			dgram = true
		default:
			stream = true
		}
	}
	if proto == "" {
		proto = "tcp"
		if dgram {
			proto = "udp"
		}
	}
	if (stream && proto == "udp") || (dgram && proto == "tcp") {
		// A protocol the socket type cannot have (a TCP port space
		// with a UD QP type).
		return eai(EAI_SOCKTYPE, "%s over a %s QP", proto, h.QPType)
	}
	port, err := addr.LookupService(service, proto)
	if err != nil {
		return lookupErr(err)
	}
	ip, err := addr.LookupNode(node, family, passive, h.Flags&RAI_NUMERICHOST != 0)
	if err != nil {
		return lookupErr(err)
	}

	// ucma_convert_to_rai.
	rai.QPType = h.QPType
	if rai.QPType == 0 {
		rai.QPType = verbs.QPTypeRC
		if dgram {
			rai.QPType = verbs.QPTypeUD
		}
	}
	rai.PortSpace = h.PortSpace
	if rai.PortSpace == 0 {
		rai.PortSpace = PS_TCP
		if proto == "udp" {
			rai.PortSpace = PS_UDP
		}
	}
	var sa net.Addr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, port))
	rai.Family = syscall.AF_INET6
	if ip.Is4() {
		rai.Family = syscall.AF_INET
	}
	if h.Flags&RAI_FAMILY != 0 && h.Family == afIB && h.Flags&RAI_NUMERICHOST != 0 {
		if ip.Is4() {
			// C would read the sockaddr_in as a sockaddr_in6.
			return eai(EAI_FAMILY, "AF_IB from the IPv4 address %v", ip)
		}
		ib := &IBAddr{PKey: 0xFFFF, GID: verbs.GID(ip.As16())}
		ib.SID = uint64(rai.PortSpace)<<16 + uint64(port)
		if rai.PortSpace != 0 {
			ib.SIDMask = ibIPPSMask
		}
		if port != 0 {
			ib.SIDMask |= ibIPPortMask
		}
		if z := ip.Zone(); z != "" {
			if ifi, err := net.InterfaceByName(z); err == nil {
				ib.ScopeID = uint64(ifi.Index)
			} else if n, err := strconv.ParseUint(z, 10, 32); err == nil {
				ib.ScopeID = n
			}
		}
		sa, rai.Family = ib, afIB
	}
	if passive {
		rai.Flags = RAI_PASSIVE
		rai.SrcAddr = sa
	} else {
		rai.DstAddr = sa
	}
	return nil
}

// lookupErr turns a name or service lookup's failure into getaddrinfo's
// EAI code, keeping its message.
func lookupErr(err error) error {
	for _, m := range []struct {
		kind error
		code AddrInfoError
	}{{addr.ErrNoName, EAI_NONAME}, {addr.ErrAgain, EAI_AGAIN}, {addr.ErrService, EAI_SERVICE}, {addr.ErrAddrFamily, EAI_ADDRFAMILY}} {
		if errors.Is(err, m.kind) {
			return eai(m.code, "%v", err)
		}
	}
	return err
}
