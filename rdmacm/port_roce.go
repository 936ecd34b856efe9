package rdmacm

import (
	"fmt"
	"net/netip"
	"syscall"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
	"github.com/softrdma/softrdma/wire"
)

// rocePort is a RoCE port on a network interface (driver.NetdevPort):
// cma_iboe_join_multicast, IP group memberships, netdev events.
type rocePort struct {
	name string
	nd   driver.NetdevPort
}

// gidIndex finds the address's RoCEv2 GID in the port's GID table.
func (p rocePort) gidIndex(ctx *verbs.Context, a netip.Addr) (uint8, error) {
	tbl, err := ctx.QueryGIDTable(1)
	if err != nil {
		return 0, err
	}
	g := wire.GIDFromAddr(a.Unmap())
	for _, e := range tbl {
		if e.GID == g {
			return uint8(e.Index), nil
		}
	}
	return 0, fmt.Errorf("%v is not a GID of %s: %w", a, p.name, syscall.EADDRNOTAVAIL)
}

// ipoibQKey fails: a RoCE port has no IPoIB broadcast group (ENODEV, as
// Linux).
func (rocePort) ipoibQKey() (uint32, error) {
	return 0, fmt.Errorf("no IPoIB broadcast group on a RoCE port: %w", syscall.ENODEV)
}

// roceMembership is what a RoCE full-member join holds: a reference on
// the interface's IP membership of the group (IGMP/MLD report).
type roceMembership struct{ group netip.Addr }

// join is cma_iboe_join_multicast: the MGID is the group's RoCEv2 mapping,
// a full member takes a reference on the IP group membership, and the
// MULTICAST_JOIN event is queued at once.
func (p rocePort) join(e *softEngine, mc *mcJoin) error {
	id := e.id
	sa := mc.addr
	if !sa.isIP() {
		return ENOTSUPP
	}
	group := sa.ip.WithZone("").Unmap()
	if group.IsUnspecified() {
		return fmt.Errorf("group address %v is unspecified: %w", group, syscall.EINVAL)
	}
	if group.IsLoopback() {
		// Linux accepts it and yields MGID 0; softrdma refuses
		// (docs/interop.md, "differences from Linux").
		return fmt.Errorf("group address %v is a loopback address, which softrdma refuses (Linux joins it with MGID 0): %w", group, syscall.EINVAL)
	}
	if pa, err := e.dev.ctx.QueryPort(1); err != nil {
		return fmt.Errorf("port 1 of %s: %v: %w", p.name, err, syscall.ENODEV)
	} else if pa.State != verbs.PortActive {
		return fmt.Errorf("port 1 of %s is %v, not active (is its interface up, with a carrier?): %w", p.name, pa.State, syscall.ENODEV)
	}
	if e.qkey == 0 && id.ps != PS_IPOIB {
		e.defaultQKey()
	}
	// Linux takes the IP membership for any address (ip_mc_inc_group does
	// not check the range); a socket can only join real multicast groups.
	if !mc.sendOnly && group.IsMulticast() {
		if err := p.nd.IncGroup(group); err != nil {
			return err
		}
		mc.held, mc.netRef = roceMembership{group}, true
	}
	mgid := wire.RoCEv2MGID(group)
	id.queue(&Event{ID: id, Event: EventMulticastJoin, mc: mc, Param: UDParam{
		PrivateData: mc.context,
		QPNum:       MulticastQPN,
		QKey:        e.qkey,
		AHAttr: verbs.AHAttr{
			GRH:      verbs.GlobalRoute{DGID: mgid, SGIDIndex: e.sgidIdx, HopLimit: 64},
			IsGlobal: true,
			PortNum:  1,
		},
	}})
	return nil
}

// leave drops the join's reference on the IP group membership.
func (p rocePort) leave(mc *mcJoin) func() error {
	if m, ok := mc.held.(roceMembership); ok {
		p.nd.DecGroup(m.group)
	}
	mc.held, mc.netRef = nil, false
	return nil
}

// subscribe passes the interface's changes on as the CM's netdev events.
func (p rocePort) subscribe(fn func(driver.NetdevEvent)) (cancel func()) {
	return p.nd.WatchNetdev(fn)
}
