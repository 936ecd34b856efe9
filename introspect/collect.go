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

	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/provider/rxe"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// Collect returns a snapshot of the process: its devices, QPs, multicast
// groups, CM ids, event channels and counters. It is what the endpoint
// serves; a program may call it directly.
func Collect() *Snapshot {
	s := &Snapshot{PID: os.Getpid(), Time: time.Now().UTC(), Captures: rxe.ActiveCaptures()}
	if len(os.Args) > 0 {
		s.Command = filepath.Base(os.Args[0])
	}
	devs := rxe.Devices()
	slices.SortFunc(devs, func(a, b *rxe.Device) int { return cmp.Compare(a.Name(), b.Name()) })
	snaps := make([]rxe.DeviceSnapshot, len(devs))
	for i, d := range devs {
		snaps[i] = d.Snapshot()
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

	for _, ds := range snaps {
		s.Devices = append(s.Devices, device(ds, func(qpn uint32) uint64 { return owner[qpKey{ds.Name, qpn}] }))
	}
	// Devices of other providers (the emulated InfiniBand ports): what the
	// verbs seam tells.
	for _, vd := range verbs.DeviceList() {
		if _, ok := softverbs.DriverOf(vd).(*rxe.Device); !ok {
			s.Devices = append(s.Devices, otherDevice(softverbs.DriverOf(vd)))
		}
	}
	slices.SortFunc(s.Devices, func(a, b Device) int { return cmp.Compare(a.Name, b.Name) })
	var ibs []*ib.Device
	for _, vd := range verbs.DeviceList() {
		if p, ok := softverbs.DriverOf(vd).(*ib.Device); ok {
			ibs = append(ibs, p)
		}
	}
	s.Groups = groups(snaps, ibs, cm.IDs)
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

func device(ds rxe.DeviceSnapshot, owner func(uint32) uint64) Device {
	d := deviceFromAttr(ds.Name, "rxe", ds.Attr)
	d.Ifname, d.Ifindex, d.MAC = ds.Ifname, ds.Ifindex, ds.MAC.String()
	d.Usage = Usage{
		QPs:              len(ds.QPs),
		McastGroups:      len(ds.Groups),
		McastAttachments: ds.Attachments,
		IPMemberships:    len(ds.Memberships),
		RecvSockets:      ds.RecvSockets,
		SendSockets:      ds.SendSockets,
	}
	d.Counters = deviceCounters(ds.Counters)
	if ds.MAC == nil {
		d.MAC = "00:00:00:00:00:00"
	}
	d.Ports = []Port{port(ds.Port, ds.GIDs)}
	d.QPs = []QP{}
	for _, q := range ds.QPs {
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
			Counters:         qpCounters(q.Counters),
		}
		for _, g := range q.Groups {
			qp.Groups = append(qp.Groups, g.String())
		}
		d.QPs = append(d.QPs, qp)
	}
	return d
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

// otherDevice describes a device of another provider through the verbs
// seam, with the counters of an emulated InfiniBand port.
func otherDevice(drv softverbs.Driver) Device {
	d := deviceFromAttr(drv.Name(), "other", drv.Attr())
	d.QPs, d.Counters = []QP{}, Counters{}
	pa, err := drv.QueryPort(1)
	gids, _ := drv.GIDTable(1)
	if err == nil {
		d.Ports = []Port{port(pa, gids)}
	}
	if p, ok := drv.(*ib.Device); ok {
		d.Kind = "ib"
		for _, q := range p.QPs() {
			iq := QP{QPN: q.QPN, Type: "UD", State: q.State.String(), QKey: q.QKey, Port: 1,
				BlockSelfMcastLB: q.BlockSelfMcastLB, Groups: []string{}, Counters: Counters{}}
			for _, a := range q.Groups {
				iq.Groups = append(iq.Groups, fmt.Sprintf("%v (mlid 0x%x)", a.MGID, a.MLID))
			}
			d.QPs = append(d.QPs, iq)
		}
		c := p.Counters()
		d.Counters = Counters{
			"rcvd_pkts": c.RcvdPkts, "delivered": c.Delivered, "sent_pkts": c.SentPkts,
			"send_errors": c.SendErrors, "oversized_send_drops": c.OversizedSendDrops,
			"malformed_drops": c.MalformedDrops, "crc_errors": c.CRCErrors, "no_group_drops": c.NoGroupDrops,
			"no_qp_drops": c.NoQPDrops, "not_ready_drops": c.NotReadyDrops, "pkey_violations": c.PKeyViolations,
			"qkey_violations": c.QKeyViolations, "no_recv_wr_drops": c.NoRecvWRDrops, "other_drops": c.OtherDrops,
		}
	}
	return d
}

// groups merges the devices' verbs groups and IP memberships with the CM
// joins, one Group per device and MGID.
func groups(snaps []rxe.DeviceSnapshot, ibs []*ib.Device, ids []rdmacm.IDInfo) []Group {
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
	for _, ds := range snaps {
		for _, vg := range ds.Groups {
			g := get(ds.Name, vg.MGID)
			g.AttachedQPs = append(g.AttachedQPs, vg.QPNs...)
			set := map[uint32]bool{}
			for _, q := range vg.QPNs {
				set[q] = true
			}
			attached[key{ds.Name, vg.MGID}] = set
		}
		for _, ms := range ds.Memberships {
			g := get(ds.Name, wire.RoCEv2MGID(ms.Group))
			g.IPMembership = ms.Joined
			g.CMRefs = ms.CMRefs
		}
	}
	for _, p := range ibs {
		for _, ms := range p.Memberships() {
			g := get(p.Name(), ms.MGID)
			g.MLID, g.SAJoinState = ms.MLID, ms.JoinState
		}
		for _, q := range p.QPs() {
			for _, a := range q.Groups {
				k := key{p.Name(), a.MGID}
				g := get(p.Name(), a.MGID)
				g.AttachedQPs = append(g.AttachedQPs, q.QPN)
				if attached[k] == nil {
					attached[k] = map[uint32]bool{}
				}
				attached[k][q.QPN] = true
			}
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

func deviceCounters(c rxe.Counters) Counters {
	return Counters{
		"rcvd_pkts":            c.RcvdPkts,
		"rcvd_bytes":           c.RcvdBytes,
		"delivered":            c.Delivered,
		"sent_pkts":            c.SentPkts,
		"sent_bytes":           c.SentBytes,
		"send_errors":          c.SendErrors,
		"oversized_send_drops": c.OversizedSendDrops,
		"malformed_drops":      c.MalformedDrops,
		"truncated_drops":      c.TruncatedDrops,
		"tver_drops":           c.TVerDrops,
		"opcode_drops":         c.OpcodeDrops,
		"destqp0_drops":        c.DestQP0Drops,
		"oversized_recv_drops": c.OversizedRecvDrops,
		"icrc_errors":          c.ICRCErrors,
		"no_group_drops":       c.NoGroupDrops,
		"no_qp_drops":          c.NoQPDrops,
		"not_ready_drops":      c.NotReadyDrops,
		"pkey_violations":      c.PKeyViolations,
		"qkey_violations":      c.QKeyViolations,
		"self_loopback_drops":  c.SelfLoopbackDrops,
		"no_recv_wr_drops":     c.NoRecvWRDrops,
		"too_long_drops":       c.TooLongDrops,
		"cq_full_drops":        c.CQFullDrops,
	}
}

func qpCounters(c rxe.QPCounters) Counters {
	return Counters{
		"delivered":            c.Delivered,
		"sent_pkts":            c.SentPkts,
		"sent_bytes":           c.SentBytes,
		"send_errors":          c.SendErrors,
		"oversized_send_drops": c.OversizedSendDrops,
		"not_ready_drops":      c.NotReadyDrops,
		"pkey_violations":      c.PKeyViolations,
		"qkey_violations":      c.QKeyViolations,
		"self_loopback_drops":  c.SelfLoopbackDrops,
		"no_recv_wr_drops":     c.NoRecvWRDrops,
		"too_long_drops":       c.TooLongDrops,
		"cq_full_drops":        c.CQFullDrops,
	}
}
