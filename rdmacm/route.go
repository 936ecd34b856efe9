package rdmacm

import (
	"encoding/binary"
	"syscall"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/rdmacm/kernelcm"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// PathRecord is one path of an id's route (librdmacm's struct
// ibv_sa_path_rec, id->route.path_rec): on InfiniBand the SA's PathRecord,
// on RoCE the path the kernel's cma_resolve_iboe_route builds from the
// addresses. It is kernelcm.PathRecord, which both engines fill.
type PathRecord = kernelcm.PathRecord

// pathFromWire converts an SA PathRecord.
func pathFromWire(r mad.PathRecord) PathRecord {
	return PathRecord{
		ServiceID: r.ServiceID(), DGID: r.DGID(), SGID: r.SGID(), DLID: r.DLID(), SLID: r.SLID(),
		RawTraffic: r.RawTraffic(), FlowLabel: r.FlowLabel(), HopLimit: r.HopLimit(), TrafficClass: r.TClass(),
		Reversible: r.Reversible(), NumbPath: r.NumbPath(), PKey: r.PKey(), QoSClass: r.QoSClass(), SL: r.SL(),
		MTUSelector: r.MTUSelector(), MTU: r.MTU(), RateSelector: r.RateSelector(), Rate: r.Rate(),
		PacketLifeTimeSelector: r.PacketLifeTimeSelector(), PacketLifeTime: r.PacketLifeTime(), Preference: r.Preference(),
	}
}

// Route returns the paths of the id's route (id->route.path_rec, num_paths
// of them): what ResolveRoute found, or the primary path OptionIBPath set.
// Empty before the route is resolved, and for an InfiniBand destination
// softrdma knows no GID of (a unicast IP address: it has no IPoIB ARP).
func (id *ID) Route() []PathRecord {
	id.mu.Lock()
	defer id.mu.Unlock()
	return append([]PathRecord(nil), id.eng.addrs().route...)
}

// ibPathRecOffset is where struct ib_path_rec_data holds its 64-byte
// PathRecord, in the SA's wire format, after the flags and a reserved word.
const ibPathRecOffset = 8

// pathsFromIBPathData reads the primary bidirectional GMP paths of an
// OptionIBPath value (struct ib_path_rec_data[]).
func pathsFromIBPathData(val []byte) []PathRecord {
	var out []PathRecord
	for off := 0; off+sizeofPathRecData <= len(val); off += sizeofPathRecData {
		if binary.NativeEndian.Uint32(val[off:])&ibPathGMPPrimaryBidi == ibPathGMPPrimaryBidi {
			out = append(out, pathFromWire(mad.PathRecord(val[off+ibPathRecOffset:off+ibPathRecOffset+mad.PathRecordLen])))
		}
	}
	return out
}

// cmaIBOEPacketLifeTime is the kernel's CMA_IBOE_PACKET_LIFETIME.
const cmaIBOEPacketLifeTime = 18

// route is cma_resolve_iboe_route: a RoCE route is built from the id's
// addresses, its TOS and the port's MTU; SL 0 (no VLAN priority map), rate
// 0 (the port's current rate), LIDs 0.
func (p rocePort) route(e *softEngine) ([]PathRecord, func() ([]PathRecord, int)) {
	path := PathRecord{
		SGID: verbs.GID(wire.GIDFromAddr(e.src.ip.WithZone(""))), DGID: verbs.GID(wire.GIDFromAddr(e.dst.ip.WithZone(""))),
		HopLimit: 64, TrafficClass: e.tos, Reversible: true, PKey: 0xFFFF,
		MTUSelector: mad.SelExactly, RateSelector: mad.SelExactly,
		PacketLifeTimeSelector: mad.SelExactly, PacketLifeTime: cmaIBOEPacketLifeTime,
	}
	if pa, err := e.dev.ctx.QueryPort(1); err == nil {
		path.MTU = uint8(pa.ActiveMTU)
	}
	return []PathRecord{path}, nil
}

// route is cma_resolve_ib_route: the path comes from the SA (a PathRecord
// Get from the port's GID to the destination's, with the mask
// cma_query_ib_route uses), asked without the id's lock; its failure is a
// ROUTE_ERROR with the SA client's status (-EINVAL for an SA status,
// -ETIMEDOUT for silence). The destination's GID is the AF_IB address's,
// or for an IP group the IPoIB mapping the kernel's address resolution
// gives it (ip_ib_mc_map: the broadcast group's P_Key and scope); for a
// unicast IP destination softrdma knows no GID, and the route is resolved
// without a path.
func (p ibPort) route(e *softEngine) ([]PathRecord, func() ([]PathRecord, int)) {
	var dgid verbs.GID
	switch {
	case e.dst.family == afIB:
		dgid = e.dst.ib.GID
	case e.dst.ip.IsMulticast():
		bc, ok := p.sa.BroadcastGroup()
		if !ok {
			return nil, func() ([]PathRecord, int) { return nil, -int(syscall.EADDRNOTAVAIL) }
		}
		dgid = wire.IBMGID(e.dst.ip.WithZone("").Unmap(), binary.BigEndian.Uint16(bc.MGID[4:6]), bc.MGID[1]&0x0f, false)
	default:
		return nil, nil
	}
	sgid := p.sa.PortGID()
	tclass := e.tos
	agent := p.sa
	return nil, func() ([]PathRecord, int) {
		q := mad.PathRecord(make([]byte, mad.PathRecordLen))
		q.SetDGID(dgid)
		q.SetSGID(sgid)
		q.SetTClass(tclass)
		q.SetPKey(0xFFFF)
		q.SetNumbPath(1)
		q.SetReversible(true)
		rec, err := agent.QueryPath(q, mad.PathCompDGID|mad.PathCompSGID|mad.PathCompTClass|mad.PathCompPKey|mad.PathCompNumbPath|mad.PathCompReversible)
		if err != nil {
			return nil, -int(verbs.ErrnoOf(err))
		}
		return []PathRecord{pathFromWire(rec)}, 0
	}
}

// route: a device without a port of the CM's has no route to build.
func (noPort) route(*softEngine) ([]PathRecord, func() ([]PathRecord, int)) { return nil, nil }
