package introspect

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/softrdma/softrdma/capture"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// Collect returns a snapshot of the process: its devices, QPs, multicast
// groups, CM ids, event channels and counters. It is what the endpoint
// serves; a program may call it directly. Devices are seen only through
// the verbs seam (Inspect, Counters), whatever their backend; the devices
// listed are those the process made (not every interface's, which
// verbs.DeviceList would create).
func Collect() *Snapshot {
	s := &Snapshot{PID: os.Getpid(), Time: time.Now().UTC(), Captures: activeCaptures()}
	if len(os.Args) > 0 {
		s.Command = filepath.Base(os.Args[0])
	}
	cm := rdmacm.Inspect()

	// QPs owned by CM ids, by device and QPN.
	type qpKey struct {
		dev string
		qpn uint32
	}
	owner := map[qpKey]uint64{}
	for _, id := range cm.IDs {
		if id.QPN != 0 {
			owner[qpKey{id.Device, id.QPN}] = id.Handle
		}
	}
	var reports []devReport
	for _, vd := range verbs.DefaultHost().Devices() {
		r, _ := vd.Inspect()
		dr := devReport{name: vd.Name(), r: r}
		s.Devices = append(s.Devices, device(vd, r, func(qpn uint32) uint64 { return owner[qpKey{vd.Name(), qpn}] }))
		reports = append(reports, dr)
	}
	slices.SortFunc(s.Devices, func(a, b Device) int { return cmp.Compare(a.Name, b.Name) })
	s.Groups = groups(reports, cm.IDs)
	for _, id := range cm.IDs {
		s.IDs = append(s.IDs, CMID{
			ID:            id.Handle,
			Channel:       id.Channel,
			PortSpace:     id.PortSpace.String(),
			State:         id.State,
			Sync:          id.Sync,
			Device:        id.Device,
			Src:           addrString(id.Src),
			Dst:           addrString(id.Dst),
			QPN:           id.QPN,
			QKey:          id.QKey,
			Joins:         len(id.Joins),
			EventsQueued:  id.EventsQueued,
			EventsUnacked: id.EventsUnacked,
		})
		s.CM.EventsUnacked += id.EventsUnacked
	}
	for _, ch := range cm.Channels {
		s.Channels = append(s.Channels, Channel{ID: ch.Handle, Queued: ch.Queued, IDs: ch.IDs, NonBlocking: ch.NonBlocking, Closed: ch.Closed})
		s.CM.EventQueueDepth += ch.Queued
	}
	s.CM.IDs = len(cm.IDs)
	s.CM.Joins, s.CM.JoinErrors = cm.Stats.Joins, cm.Stats.JoinErrors
	s.CM.Leaves, s.CM.AttachErrors = cm.Stats.Leaves, cm.Stats.AttachErrors
	return s
}

// devReport is one device's view, for the groups table.
type devReport struct {
	name string
	r    verbs.DeviceReport
}

// device converts a device's attributes, report and counters.
func device(vd *verbs.Device, r verbs.DeviceReport, owner func(uint32) uint64) Device {
	kind := r.Kind
	if kind == "" {
		kind = "other"
	}
	d := deviceFromAttr(vd.Name(), kind, vd.Ops().Attr())
	d.Ifname, d.Ifindex, d.MAC = r.Netdev.Name, r.Netdev.Index, r.Netdev.MAC
	for _, u := range r.Usage {
		switch u.Name {
		case "qps":
			d.Usage.QPs = u.Value
		case "mcast_groups":
			d.Usage.McastGroups = u.Value
		case "mcast_attachments":
			d.Usage.McastAttachments = u.Value
		case "ip_memberships":
			d.Usage.IPMemberships = u.Value
		case "recv_sockets":
			d.Usage.RecvSockets = u.Value
		case "send_sockets":
			d.Usage.SendSockets = u.Value
		case "sa_memberships":
			d.Usage.SAMemberships = u.Value
		}
	}
	d.Counters = Counters{}
	d.CounterSchema = []CounterInfo{}
	if schema, vals, ok := vd.Counters(); ok {
		for i, c := range schema {
			d.CounterSchema = append(d.CounterSchema, counterInfo(c))
			d.Counters[c.Name] = vals[i]
		}
	}
	if r.Port.State != 0 {
		d.Ports = []Port{port(r.Port, r.GIDs)}
	}
	d.QPs = []QP{}
	ib := r.Port.LinkLayer == verbs.LinkLayerInfiniBand
	for _, q := range r.QPs {
		qp := QP{
			QPN:              q.QPN,
			Type:             "UD",
			State:            q.State.String(),
			QKey:             q.QKey,
			Port:             int(q.Port),
			BlockSelfMcastLB: q.BlockSelfMcastLB,
			SrcPort:          q.SrcPort,
			Groups:           []string{},
			CMID:             owner(q.QPN),
			Counters:         Counters{},
		}
		for _, a := range q.Groups {
			if ib {
				qp.Groups = append(qp.Groups, fmt.Sprintf("%v (mlid 0x%x)", a.MGID, a.MLID))
			} else {
				qp.Groups = append(qp.Groups, a.MGID.String())
			}
		}
		for i, c := range d.CounterSchema {
			if c.Scope == "qp" && i < len(q.Counters) {
				qp.Counters[c.Name] = q.Counters[i]
			}
		}
		d.QPs = append(d.QPs, qp)
	}
	return d
}

// counterInfo converts one counter's description.
func counterInfo(c verbs.CounterDesc) CounterInfo {
	scope := "device"
	if c.Scope == verbs.ScopeQP {
		scope = "qp"
	}
	return CounterInfo{Name: c.Name, Help: c.Help, Scope: scope, Metric: c.Metric, Reason: c.Reason}
}

// port converts port 1's attributes and GID table.
func port(p verbs.PortAttr, gids []verbs.GIDEntry) Port {
	out := Port{
		Port:         1,
		State:        p.State.String(),
		StateNum:     int(p.State),
		MaxMTU:       p.MaxMTU.Bytes(),
		ActiveMTU:    p.ActiveMTU.Bytes(),
		NetdevMTU:    p.NetdevMTU,
		LinkLayer:    p.LinkLayer.String(),
		LID:          p.LID,
		SMLID:        p.SMLID,
		LMC:          p.LMC,
		GIDTableLen:  p.GIDTblLen,
		PKeyTableLen: p.PKeyTblLen,
		GIDs:         []GID{},
	}
	for _, g := range gids {
		out.GIDs = append(out.GIDs, GID{Index: g.Index, GID: g.GID.String(), Type: g.Type.String()})
	}
	return out
}

// deviceFromAttr fills the attributes every provider reports.
func deviceFromAttr(name, kind string, a verbs.DeviceAttr) Device {
	return Device{
		Name:         name,
		Kind:         kind,
		NodeGUID:     guidString(a.NodeGUID),
		SysImageGUID: guidString(a.SysImageGUID),
		VendorID:     a.VendorID,
		VendorPartID: a.VendorPartID,
		HWVer:        a.HWVer,
		FWVer:        a.FWVer,
		PhysPortCnt:  int(a.PhysPortCnt),
		Limits: Limits{
			MaxQP: a.MaxQP, MaxQPWR: a.MaxQPWR, MaxSGE: a.MaxSGE, MaxCQ: a.MaxCQ, MaxCQE: a.MaxCQE,
			MaxMR: a.MaxMR, MaxPD: a.MaxPD, MaxAH: a.MaxAH,
			MaxMcastGrp: a.MaxMcastGrp, MaxMcastQPAttach: a.MaxMcastQPAttach,
			MaxTotalMcastQPAttach: a.MaxTotalMcastQP, MaxInlineData: a.MaxInlineData,
		},
	}
}

// groups merges the devices' verbs groups and IP memberships with the CM
// joins, one Group per device and MGID.
func groups(devs []devReport, ids []rdmacm.IDInfo) []Group {
	type key struct {
		dev  string
		mgid verbs.GID
	}
	m := map[key]*Group{}
	get := func(dev string, mgid verbs.GID) *Group {
		k := key{dev, mgid}
		if g := m[k]; g != nil {
			return g
		}
		g := &Group{Device: dev, MGID: mgid.String(), AttachedQPs: []uint32{}, Joins: []Join{}}
		if a := mgid.Addr(); mgid.IsV4Mapped() || a.IsMulticast() {
			g.Addr = a.String()
		}
		m[k] = g
		return g
	}
	attached := map[key]map[uint32]bool{}
	for _, dr := range devs {
		for _, vg := range dr.r.Groups {
			g := get(dr.name, vg.MGID)
			g.AttachedQPs = append(g.AttachedQPs, vg.QPNs...)
			set := map[uint32]bool{}
			for _, q := range vg.QPNs {
				set[q] = true
			}
			attached[key{dr.name, vg.MGID}] = set
			g.IPMembership, g.CMRefs = vg.IPJoined, vg.CMRefs
			g.MLID, g.SAJoinState = vg.MLID, vg.SAJoinState
		}
	}
	for _, id := range ids {
		for _, j := range id.Joins {
			mgid := j.MGID
			if mgid.IsZero() {
				mgid = joinMGID(j.Addr)
			}
			g := get(id.Device, mgid)
			jn := Join{
				CMID:          id.Handle,
				Src:           addrString(id.Src),
				Addr:          addrString(j.Addr),
				JoinFlags:     rdmacm.MCJoinFlagFullMember,
				JoinType:      "full",
				State:         "pending",
				QPN:           id.QPN,
				MembershipRef: j.MembershipRef,
				EventsQueued:  j.EventsQueued,
				EventsUnacked: j.EventsUnacked,
			}
			if j.SendOnly {
				jn.JoinFlags, jn.JoinType = rdmacm.MCJoinFlagSendOnlyFullMember, "send-only"
			}
			if j.Joined {
				jn.State = "joined"
			}
			jn.Attached = id.QPN != 0 && attached[key{id.Device, mgid}][id.QPN]
			g.Joins = append(g.Joins, jn)
		}
	}
	out := make([]Group, 0, len(m))
	for _, g := range m {
		slices.SortStableFunc(g.Joins, func(a, b Join) int { return cmp.Compare(a.CMID, b.CMID) })
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b Group) int {
		if c := cmp.Compare(a.Device, b.Device); c != 0 {
			return c
		}
		ga, _ := wire.ParseGID(a.MGID)
		gb, _ := wire.ParseGID(b.MGID)
		return slices.Compare(ga[:], gb[:])
	})
	return out
}

// joinMGID is the MGID a RoCEv2 join of addr gets (for a join whose event
// was not retrieved yet); an AF_IB address carries its MGID.
func joinMGID(a net.Addr) verbs.GID {
	switch v := a.(type) {
	case *rdmacm.IBAddr:
		return v.GID
	case *net.UDPAddr:
		if ip, ok := netip.AddrFromSlice(v.IP); ok {
			return wire.RoCEv2MGID(ip.Unmap())
		}
	}
	return verbs.GID{}
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	if u, ok := a.(*net.UDPAddr); ok && u == nil {
		return ""
	}
	return a.String()
}

// guidString formats a GUID like ibv_devinfo: four groups of 4 hex digits.
func guidString(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff)
}

// activeCaptures is the number of packet captures running.
func activeCaptures() int { return capture.Active(nil) }
