package rxe

import (
	"slices"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// InspectTransport adds the RoCEv2 side to the core's view of the device
// (softverbs.TransportInspector): the interface, the IP multicast
// memberships (with the RDMA CM's references) and the sockets.
func (d *Device) InspectTransport(r *verbs.DeviceReport) {
	info := d.info.Load()
	r.Kind = "rxe"
	r.Netdev = verbs.NetdevReport{Name: info.name, Index: d.ifindex, MAC: "00:00:00:00:00:00"}
	if info.mac != nil {
		r.Netdev.MAC = info.mac.String()
	}
	d.mu.Lock()
	for _, m := range d.mships {
		gid := wire.RoCEv2MGID(m.addr)
		i := slices.IndexFunc(r.Groups, func(g verbs.GroupReport) bool { return g.MGID == gid })
		if i < 0 {
			r.Groups = append(r.Groups, verbs.GroupReport{MGID: gid})
			i = len(r.Groups) - 1
		}
		g := &r.Groups[i]
		g.IPGroup, g.IPJoined, g.CMRefs = m.addr, m.sock != nil, m.cmRefs
	}
	send := 0
	for _, b := range d.blocks {
		send++
		if b.conn6 != nil {
			send++
		}
	}
	r.Usage = append(r.Usage,
		verbs.UsageCount{Name: "ip_memberships", Value: len(d.mships)},
		verbs.UsageCount{Name: "recv_sockets", Value: len(d.rsocks)},
		verbs.UsageCount{Name: "send_sockets", Value: send})
	d.mu.Unlock()
	slices.SortFunc(r.Groups, func(a, b verbs.GroupReport) int { return slices.Compare(a.MGID[:], b.MGID[:]) })
}
