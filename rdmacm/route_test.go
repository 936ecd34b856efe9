package rdmacm

import (
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// resolveRoute resolves an id bound to local to dst, address then route,
// and returns the route's event.
func resolveRoute(t *testing.T, ch *EventChannel, id *ID, dst any) *Event {
	t.Helper()
	var err error
	switch d := dst.(type) {
	case netip.Addr:
		err = id.ResolveAddr(id.SrcAddr(), UDPAddr(d), 2*time.Second)
	case *IBAddr:
		err = id.ResolveAddr(nil, d, 2*time.Second)
	}
	if err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, ch); ev.Ack() != nil || ev.Event != EventAddrResolved {
		t.Fatalf("address: %v %d", ev.Event, ev.Status)
	}
	if err := id.ResolveRoute(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	return nextEvent(t, ch)
}

// TestRouteRoCE: a RoCE route is built from the addresses, as the kernel's
// cma_resolve_iboe_route.
func TestRouteRoCE(t *testing.T) {
	ch, id := newID(t, PS_UDP)
	g := randGroup().AddrPort().Addr()
	ev := resolveRoute(t, ch, id, g)
	defer ev.Ack()
	if ev.Event != EventRouteResolved {
		t.Fatalf("%v %d", ev.Event, ev.Status)
	}
	r := id.Route()
	if len(r) != 1 {
		t.Fatalf("%d paths", len(r))
	}
	p := r[0]
	if p.SGID != verbs.GID(wire.GIDFromAddr(netip.MustParseAddr("127.0.0.1"))) || p.DGID != verbs.GID(wire.GIDFromAddr(g)) ||
		p.HopLimit != 64 || p.PKey != 0xFFFF || !p.Reversible || p.PacketLifeTime != 18 || p.MTU == 0 || p.DLID != 0 {
		t.Errorf("path %+v", p)
	}
}

// TestRouteIB: on InfiniBand the route is the SA's PathRecord: to the
// port's own GID (AF_IB) a unicast path with its LID, to a group the port
// is a member of its MLID; to a group it is not a member of, or that does
// not exist, ROUTE_ERROR -EINVAL and the id back in ADDR_RESOLVED (it can
// join).
func TestRouteIB(t *testing.T) {
	n := startSM(t, sm.Config{SendOnlySupport: true})
	dev := openPort(t, n, "127.0.0.2", ib.Config{})
	openPort(t, n, "127.0.0.3", ib.Config{})

	ch, id := ibID(t, "127.0.0.2", PS_UDP)
	ev := resolveRoute(t, ch, id, &IBAddr{GID: dev.PortGID(), PKey: 0xFFFF})
	ev.Ack()
	if ev.Event != EventRouteResolved || len(id.Route()) != 1 {
		t.Fatalf("own GID: %v %d, %d paths", ev.Event, ev.Status, len(id.Route()))
	}
	if p := id.Route()[0]; p.DLID != dev.LID() || p.SLID != dev.LID() || p.DGID != dev.PortGID() || p.MTU != mad.MTU2048 || !p.Reversible {
		t.Errorf("path %+v (LID %d)", p, dev.LID())
	}

	// A group that exists, of which the source port is a member (an
	// IPoIB join of 230.9.9.9 by another id of the port: the kernel maps
	// an IP group to its IPoIB MGID for the route); from a port that is
	// not a member, no path (OpenSM's rule for a multicast PathRecord
	// whose SGID is given).
	g := netip.MustParseAddr("230.9.9.9")
	jch, member := ibID(t, "127.0.0.2", PS_IPOIB)
	if err := member.JoinMulticast(UDPAddr(g), nil); err != nil {
		t.Fatal(err)
	}
	jev := nextEvent(t, jch)
	mlid := jev.Param.AHAttr.DLID
	jev.Ack()
	if jev.Event != EventMulticastJoin {
		t.Fatalf("join: %v %d", jev.Event, jev.Status)
	}
	ch2, id2 := ibID(t, "127.0.0.2", PS_UDP)
	ev = resolveRoute(t, ch2, id2, g)
	ev.Ack()
	if ev.Event != EventRouteResolved || len(id2.Route()) != 1 || id2.Route()[0].DLID != mlid || id2.Route()[0].Reversible {
		t.Fatalf("group route: %v %d %+v (MLID %#x)", ev.Event, ev.Status, id2.Route(), mlid)
	}
	och, other := ibID(t, "127.0.0.3", PS_UDP)
	ev = resolveRoute(t, och, other, g)
	ev.Ack()
	if ev.Event != EventRouteError || ev.Status != -int(syscall.EINVAL) {
		t.Errorf("group route from a non-member port: %v %d", ev.Event, ev.Status)
	}

	// No such group: ROUTE_ERROR, and the id joins all the same.
	ch3, id3 := ibID(t, "127.0.0.2", PS_UDP)
	ev = resolveRoute(t, ch3, id3, netip.MustParseAddr("230.8.8.8"))
	ev.Ack()
	if ev.Event != EventRouteError || ev.Status != -int(syscall.EINVAL) || len(id3.Route()) != 0 {
		t.Fatalf("missing group: %v %d %+v", ev.Event, ev.Status, id3.Route())
	}
	if err := id3.JoinMulticast(UDPAddr(netip.MustParseAddr("230.8.8.8")), nil); err != nil {
		t.Fatalf("join after ROUTE_ERROR: %v", err)
	}
	if ev := nextEvent(t, ch3); ev.Event != EventMulticastJoin {
		t.Errorf("join after ROUTE_ERROR: %v %d", ev.Event, ev.Status)
	} else {
		ev.Ack()
	}
}
