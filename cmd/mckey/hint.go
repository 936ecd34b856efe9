package main

// Hints: rdma-core's mckey reports a failure as an errno or an event status
// only. softrdma's mckey prints those lines unchanged and adds, on stderr,
// one line that names the cause: the subnet manager SOFTRDMA_SM names, the
// interface the route lookup picked when -b is absent, or the reason the
// call's error carries (why).

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/softrdma/softrdma/verbs"
	"github.com/vishvananda/netlink"
)

// errNotSupp is the kernel's ENOTSUPP (524): an AF_IB address on a RoCE port.
const errNotSupp = syscall.Errno(524)

// bindHint explains a failed rdma_bind_addr of -b.
func (t *mckey) bindHint(err error) {
	if sm := os.Getenv("SOFTRDMA_SM"); sm != "" {
		switch {
		case errors.Is(err, syscall.ETIMEDOUT):
			fmt.Fprintf(t.errOut, "mckey: no subnet manager answered at SOFTRDMA_SM=%s (is softsm running and listening there?)\n", sm)
		case errors.Is(err, syscall.EINVAL):
			fmt.Fprintf(t.errOut, "mckey: SOFTRDMA_SM=%s: %v (SOFTRDMA_SM is softsm's fabric address, host:port)\n", sm, err)
		default:
			fmt.Fprintf(t.errOut, "mckey: -b %s as a port of the InfiniBand subnet at SOFTRDMA_SM=%s: %v\n", t.cfg.src, sm, err)
		}
		return
	}
	if errors.Is(err, syscall.EADDRNOTAVAIL) {
		fmt.Fprintf(t.errOut, "mckey: -b %s: no interface of this host has that address\n", t.cfg.src)
	}
}

// joinHint explains a failed join or unmapped-address setup.
func (t *mckey) joinHint(err error) {
	if t.cfg.unmapped && errors.Is(err, errNotSupp) && os.Getenv("SOFTRDMA_SM") == "" {
		fmt.Fprintf(t.errOut, "mckey: -M %s: an unmapped (AF_IB) group needs an InfiniBand port, and -b %s is on RoCE (SOFTRDMA_SM is unset)\n", t.cfg.dst, t.cfg.src)
		return
	}
	why(t.errOut, err)
}

// why prints, after rdma-core's perror-style line (which keeps only the
// errno), the cause softrdma knows of a failed call when the errno does
// not say it all: "mckey: rdma_join_multicast_ex 0.0.0.0:0: group address
// 0.0.0.0 is unspecified: invalid argument".
func why(w io.Writer, err error) {
	var e *verbs.Error
	if errors.As(err, &e) && e.Err != nil {
		fmt.Fprintf(w, "mckey: %v\n", err)
	}
}

// resolveHint explains a failed rdma_resolve_addr call: the kernel fails
// it when the route lookup finds no route.
func (t *mckey) resolveHint(err error) {
	if t.cfg.unmapped || !errors.Is(err, syscall.ENETUNREACH) {
		return
	}
	if t.cfg.src != "" {
		fmt.Fprintf(t.errOut, "mckey: no route to %s from -b %s\n", t.cfg.dst, t.cfg.src)
		return
	}
	fmt.Fprintf(t.errOut, "mckey: no -b: %s; name the local address with -b or the interface with --iface\n", routeOf(t.cfg.dst))
}

// addrErrorHint explains an ADDR_ERROR event of rdma_resolve_addr: without
// -b the RDMA CM takes the interface the kernel's route lookup picks for
// the group, as rdma-core does.
func (t *mckey) addrErrorHint(status int) {
	if t.cfg.src != "" {
		fmt.Fprintf(t.errOut, "mckey: resolving %s from -b %s failed: %s\n", t.cfg.dst, t.cfg.src, strerror(syscall.Errno(-status)))
		return
	}
	fmt.Fprintf(t.errOut, "mckey: no -b: %s; name the local address with -b or the interface with --iface\n", routeOf(t.cfg.dst))
}

// landedHint says, once, where an id landed without -b or --iface: the
// interface the route lookup picked and the id's address and device. A
// sender and a receiver on different devices never meet; this line is how
// a user sees it.
func (t *mckey) landedHint(n *node) {
	fmt.Fprintf(t.errOut, "mckey: no -b: %s; bound to %v on device %s\n", routeOf(t.cfg.dst), n.cm.SrcAddr(), n.cm.DeviceName())
}

// dropHint says, after a receive timeout with done of the messages in,
// what the device the receiver listened on dropped since its receives
// were posted, counter by counter (too_long_drops: messages larger than
// the receive buffers…), or that it dropped nothing: then the rest did
// not reach that device, and the line says where the group's datagrams
// went instead (RoCE: the group watch) or where an InfiniBand subnet
// loses them.
func (t *mckey) dropHint(n *node, done int) {
	dev := n.cm.Verbs().Device()
	addr := n.cm.SrcAddr().String()
	if u, ok := n.cm.SrcAddr().(*net.UDPAddr); ok {
		addr = u.IP.String()
	}
	schema, vals, ok := dev.Counters()
	if !ok || len(n.drops0) != len(vals) {
		return
	}
	var grew []string
	for i, c := range schema {
		if c.Reason != "" && vals[i] > n.drops0[i] {
			grew = append(grew, fmt.Sprintf("%s=%d", c.Name, vals[i]-n.drops0[i]))
		}
	}
	if len(grew) == 0 && t.cfg.sendOnly {
		fmt.Fprintf(t.errOut, "mckey: -o: a send-only full member receives nothing (its QP is not attached, its device not in the group)\n")
		return
	}
	if len(grew) > 0 {
		fmt.Fprintf(t.errOut, "mckey: device %s (bound to %s) dropped since the receives were posted: %s\n", dev.Name(), addr, strings.Join(grew, " "))
		return
	}
	what := fmt.Sprintf("no datagram for %s reached it", t.cfg.dst)
	if done > 0 {
		what = fmt.Sprintf("the other %d datagrams for %s did not reach it", t.cfg.messageCount-done, t.cfg.dst)
	}
	own := 0
	if r, ok := dev.Inspect(); ok {
		own = r.Netdev.Index
	}
	var why string
	switch seen, ok := t.watch.report(own); {
	case ok:
		why = seen
	case os.Getenv("SOFTRDMA_SM") != "":
		why = ibLossText
	default:
		why = "is the sender on this device (-b)?"
	}
	fmt.Fprintf(t.errOut, "mckey: device %s (bound to %s) dropped nothing: %s; %s\n", dev.Name(), addr, what, why)
}

// ibLossText says where the emulated IB subnet loses datagrams: it is
// flow controlled, so only where a port gives no credit for too long.
const ibLossText = "on the InfiniBand subnet the switch discards what waits longer than its head-of-queue lifetime for a port that gives no credit " +
	"(softsm -v names the port and counts), a sender's port what it sends directly and so waits (direct_discards, said by an mckey sender), " +
	"and what finds no credit for its link stall timeout (link_stall_drops, said by an mckey sender)"

// sendDrops are the drop counters of a sender's own datagrams: a send
// larger than the MTU, one an IB port's stalled link dropped, and one it
// discarded for a destination port it sends to directly. (The
// others count what a device receives, a sender's blocked loopback copies
// among them.)
var sendDrops = []string{"oversized_send_drops", "link_stall_drops", "direct_discards"}

// grewSince lists the send drop counters of n's device that grew since
// n.drops0 ("link_stall_drops=3"), and their sum.
func grewSince(n *node) (grew []string, total uint64) {
	schema, vals, ok := n.cm.Verbs().Device().Counters()
	if !ok || len(n.drops0) != len(vals) {
		return nil, 0
	}
	for i, c := range schema {
		if slices.Contains(sendDrops, c.Name) && vals[i] > n.drops0[i] {
			grew = append(grew, fmt.Sprintf("%s=%d", c.Name, vals[i]-n.drops0[i]))
			total += vals[i] - n.drops0[i]
		}
	}
	return grew, total
}

// sendDropHint says which sends the sender's device dropped after they
// completed: rdma-core's mckey posts them unsignaled and says "data
// transfers complete" all the same, as a datagram lost in the fabric
// completes with success. On the emulated IB subnet that is a port whose
// link found no credit for its stall timeout (link_stall_drops): the
// receivers behind the switch returned none.
func (t *mckey) sendDropHint() {
	for _, n := range t.nodes {
		if !n.connected {
			continue
		}
		grew, total := grewSince(n)
		if total == 0 {
			continue
		}
		addr := n.cm.SrcAddr().String()
		if u, ok := n.cm.SrcAddr().(*net.UDPAddr); ok {
			addr = u.IP.String()
		}
		fmt.Fprintf(t.errOut, "mckey: device %s (bound to %s) dropped %d of its %d sends to %s after they completed: %s\n",
			n.cm.Verbs().Device().Name(), addr, total, t.cfg.messageCount, t.cfg.dst, strings.Join(grew, " "))
	}
}

// startWatch starts the group watch of a receiver on RoCE that gives up
// after --timeout (once, for the first node): what it sees is told only
// then.
func (t *mckey) startWatch() {
	if t.watch != nil || t.cfg.timeout <= 0 || t.cfg.sendOnly || t.cfg.unmapped || os.Getenv("SOFTRDMA_SM") != "" {
		return
	}
	u, ok := t.dstAddr.(*net.UDPAddr)
	if !ok {
		return
	}
	if g, ok := netip.AddrFromSlice(u.IP); ok {
		t.watch = watchGroup(g)
	}
}

// routeOf describes what the kernel's route lookup picks for dst.
func routeOf(dst string) string {
	ip := net.ParseIP(dst)
	if ip == nil {
		return fmt.Sprintf("%s is not an IP address", dst)
	}
	routes, err := netlink.RouteGet(ip)
	if err != nil || len(routes) == 0 {
		return fmt.Sprintf("the route lookup for %s found no interface (%v)", dst, err)
	}
	r := routes[0]
	name := fmt.Sprintf("ifindex %d", r.LinkIndex)
	if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
		name = l.Attrs().Name
	}
	if r.Src == nil {
		return fmt.Sprintf("the route lookup for %s picked interface %s", dst, name)
	}
	return fmt.Sprintf("the route lookup for %s picked interface %s (source %v)", dst, name, r.Src)
}
