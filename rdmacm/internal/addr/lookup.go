package addr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
)

// The kinds of lookup failure, as getaddrinfo tells them apart (the RDMA
// CM turns them into its EAI codes).
var (
	// ErrNoName: the node is not known (EAI_NONAME).
	ErrNoName = errors.New("name not known")
	// ErrAgain: the name servers failed for now (EAI_AGAIN).
	ErrAgain = errors.New("temporary failure in name resolution")
	// ErrService: the service is not known for the protocol (EAI_SERVICE).
	ErrService = errors.New("service not known")
	// ErrAddrFamily: the node's address is not of the family asked for
	// (EAI_ADDRFAMILY).
	ErrAddrFamily = errors.New("address of another family")
)

// LookupService is getaddrinfo's service: "" is port 0, a number is taken
// modulo 2^16 (as glibc does), a name is looked up in /etc/services.
func LookupService(service, proto string) (uint16, error) {
	if service == "" {
		return 0, nil
	}
	if n, err := strconv.ParseUint(service, 10, 64); err == nil {
		return uint16(n), nil
	}
	p, err := net.LookupPort(proto, service)
	if err != nil {
		return 0, fmt.Errorf("service %q/%s: %w", service, proto, ErrService)
	}
	return uint16(p), nil
}

// LookupNode is getaddrinfo's node: "" is the wildcard (passive) or the
// loopback address, a numeric address is parsed, a name looked up unless
// numeric is set.
func LookupNode(node string, family int, passive, numeric bool) (netip.Addr, error) {
	if node == "" {
		switch {
		case passive && family == syscall.AF_INET6:
			return netip.IPv6Unspecified(), nil
		case passive:
			return netip.IPv4Unspecified(), nil
		case family == syscall.AF_INET:
			return netip.AddrFrom4([4]byte{127, 0, 0, 1}), nil
		}
		return netip.IPv6Loopback(), nil
	}
	if ip, err := netip.ParseAddr(node); err == nil {
		ip = ip.Unmap()
		if (family == syscall.AF_INET && !ip.Is4()) || (family == syscall.AF_INET6 && ip.Is4()) {
			return netip.Addr{}, fmt.Errorf("%s: %w", node, ErrAddrFamily)
		}
		return ip, nil
	}
	if numeric || strings.ContainsAny(node, ":%") {
		return netip.Addr{}, fmt.Errorf("%s is not a numeric address: %w", node, ErrNoName)
	}
	network := "ip"
	switch family {
	case syscall.AF_INET:
		network = "ip4"
	case syscall.AF_INET6:
		network = "ip6"
	}
	ips, err := net.DefaultResolver.LookupNetIP(context.Background(), network, node)
	if err != nil || len(ips) == 0 {
		kind := ErrNoName
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) && dnsErr.IsTemporary {
			kind = ErrAgain
		}
		return netip.Addr{}, fmt.Errorf("%s: %w", node, kind)
	}
	return ips[0].Unmap(), nil
}
