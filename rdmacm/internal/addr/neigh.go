// Package addr is the RDMA CM's address resolution, the kernel's
// drivers/infiniband/core/addr.c: the source address a route gives a
// destination, and the neighbour a unicast destination needs before it
// counts as resolved. It asks the kernel through netlink, in the network
// namespace of the calling thread (or of the handle given).
package addr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ResolveNeighbour is the neighbour half of the kernel's address
// resolution (addr.c): rdma_resolve_addr of a unicast destination reports
// ADDR_RESOLVED only once the next hop's link-layer address is known, and
// ADDR_ERROR -ETIMEDOUT when the timeout passes first. The next hop is the
// route's gateway or the destination itself; with no route, a destination
// is taken to be on the link of the bound source (as the kernel's route
// lookup does for a socket bound to a device). A loopback or NOARP link
// needs no neighbour. Resolution is started as the kernel starts it for a
// packet (a neighbour "use", NTF_USE) and watched in the neighbour table;
// without the privilege to start it, an entry the kernel has or makes
// still counts.
// h is a netlink handle of the network namespace of the resolving call.
func ResolveNeighbour(ctx context.Context, h *netlink.Handle, src, dst netip.Addr, timeout time.Duration) error {
	link, hop, err := nextHop(h, src, dst)
	if err != nil {
		return err
	}
	l, err := h.LinkByIndex(link)
	if err != nil {
		return fmt.Errorf("link %d: %v: %w", link, err, syscall.ENODEV)
	}
	if a := l.Attrs(); a.Flags&net.FlagLoopback != 0 || a.RawFlags&unix.IFF_NOARP != 0 {
		return nil
	}
	fam := netlink.FAMILY_V4
	if hop.Is6() {
		fam = netlink.FAMILY_V6
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for started := false; ; {
		if known(h, link, fam, hop) {
			return nil
		}
		if !started {
			started = true
			_ = h.NeighSet(&netlink.Neigh{LinkIndex: link, Family: fam, IP: hop.AsSlice(), Flags: netlink.NTF_USE})
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("no link-layer address for %v within %v: %w", hop, timeout, syscall.ETIMEDOUT)
		case <-tick.C:
		}
	}
}

// nextHop returns the interface and next hop towards dst from src.
func nextHop(h *netlink.Handle, src, dst netip.Addr) (link int, hop netip.Addr, err error) {
	var opts netlink.RouteGetOptions
	if src.IsValid() && !src.IsUnspecified() {
		opts.SrcAddr = src.AsSlice()
	}
	routes, rerr := h.RouteGetWithOptions(dst.AsSlice(), &opts)
	if rerr == nil && len(routes) > 0 {
		r := routes[0]
		hop = dst
		if gw, ok := netip.AddrFromSlice(r.Gw); ok && gw.IsValid() && !gw.IsUnspecified() {
			hop = gw.Unmap()
		}
		return r.LinkIndex, hop, nil
	}
	// No route: on the bound source's link.
	if src.IsValid() && !src.IsUnspecified() {
		addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
		if err == nil {
			for _, a := range addrs {
				if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == src.Unmap() {
					return a.LinkIndex, dst, nil
				}
			}
		}
	}
	if rerr == nil {
		rerr = syscall.ENETUNREACH
	}
	var errno syscall.Errno
	if !errors.As(rerr, &errno) {
		rerr = fmt.Errorf("%v: %w", rerr, syscall.ENETUNREACH)
	}
	return 0, netip.Addr{}, rerr
}

// known reports whether the neighbour table has a usable link-layer
// address for ip on the link.
func known(h *netlink.Handle, link, fam int, ip netip.Addr) bool {
	ns, err := h.NeighList(link, fam)
	if err != nil {
		return false
	}
	const usable = unix.NUD_REACHABLE | unix.NUD_STALE | unix.NUD_DELAY | unix.NUD_PROBE | unix.NUD_PERMANENT | unix.NUD_NOARP
	for _, n := range ns {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip.Unmap() && n.State&usable != 0 {
			return true
		}
	}
	return false
}
