package addr

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
)

// RouteSource picks the interface and source address towards dst through
// the routing tables, as rdma_resolve_addr does without a source address.
func RouteSource(dst netip.Addr) (netip.Addr, error) {
	routes, err := netlink.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		if err == nil {
			err = syscall.ENETUNREACH
		}
		var errno syscall.Errno
		if !errors.As(err, &errno) {
			err = fmt.Errorf("%v: %w", err, syscall.ENETUNREACH)
		}
		return netip.Addr{}, err
	}
	r := routes[0]
	if src, ok := netip.AddrFromSlice(r.Src); ok && src.IsValid() && !src.IsUnspecified() {
		return src.Unmap(), nil
	}
	link, err := netlink.LinkByIndex(r.LinkIndex)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%v: %w", err, syscall.ENODEV)
	}
	fam := netlink.FAMILY_V4
	if dst.Is6() && !dst.Is4In6() {
		fam = netlink.FAMILY_V6
	}
	addrs, err := netlink.AddrList(link, fam)
	if err != nil || len(addrs) == 0 {
		return netip.Addr{}, fmt.Errorf("no address on %s: %w", link.Attrs().Name, syscall.EADDRNOTAVAIL)
	}
	a, _ := netip.AddrFromSlice(addrs[0].IP)
	return a.Unmap(), nil
}
