package sa

import (
	"slices"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// PathRecord queries (IBA 15.2.5.16), as OpenSM's osm_sa_path_record.c
// answers them on a subnet of one switch: every path is one hop, so there
// is one path between two ports, and a multicast path is the group's.
//
//	method      Get or GetTable; Set and Delete are dropped (OpenSM's set
//	            dispatcher has no PathRecord handler); class version ≠ 2 →
//	            0x0004
//	source      SGID (prefix fe80:: is the SM's; another prefix, or no such
//	            port → 0x0500), else SLID (no such port → 0x0300), else the
//	            requester's port
//	destination DGID: a port (as SGID), or a multicast group (no such group
//	            → 0x0500); else DLID: a port or a group's MLID (neither →
//	            0x0300); else every port (GetTable; Get → 0x0600)
//	partition   comp-masked P_Key: its base must be held by both ports (a
//	            group: its own) → no record
//	filters     comp-masked SL, MTU, Rate and PacketLifeTime (with their
//	            selectors) must be met by the path; on a multicast path also
//	            TClass, FlowLabel and HopLimit must be the group's → no
//	            record
//	Get         no record → 0x0300, more than one → 0x0400
//
// A unicast path: DLID/SLID of the ports, MTU and Rate the smaller of the
// two ports' (selector 2, exactly), SL 0, P_Key the requested one or
// 0xFFFF, PacketLifeTime 18 (OpenSM's default subnet timeout, selector 2),
// Reversible set, HopLimit, TClass, FlowLabel and QoSClass as requested
// (0 when not comp-masked), ServiceID echoed. A multicast path carries the
// group's MLID, Q_Key-independent fields (MTU, Rate, SL, P_Key, TClass,
// FlowLabel, HopLimit, PacketLifeTime) and is not reversible.

// pathPacketLifeTime is a unicast path's PacketLifeTime: OpenSM's default
// subnet timeout.
const pathPacketLifeTime = 18

// pathEnd is one end of a path: a port, or (destination only) a group.
type pathEnd struct {
	port  *Port
	group *group
}

// gid returns the end's GID: the port's, or the group's MGID.
func (s *SA) endGID(e pathEnd) wire.GID {
	if e.group != nil {
		return e.group.rec.MGID
	}
	return s.PortGID(e.port.GUID)
}

// pathRecord handles Get and GetTable of PathRecord.
func (s *SA) pathRecord(req mad.MAD, from From) []mad.MAD {
	switch req.Method() {
	case mad.MethodGet, mad.MethodGetTable:
	default:
		return nil
	}
	if req.ClassVersion() != mad.SAClassVersion {
		return errorReply(req, mad.StatusBadVersion)
	}
	comp := req.CompMask()
	q := req.PathRecord()
	var srcGUID uint64
	if comp&mad.PathCompSGID != 0 {
		g, _, st := s.portGUID(q.SGID())
		if st != 0 {
			return errorReply(req, uint16(st))
		}
		srcGUID = g
	}
	requester, drop := s.requester(from, srcGUID)
	if drop {
		return nil
	}
	var src *Port
	switch {
	case comp&mad.PathCompSGID != 0:
		if src = s.ports[srcGUID]; src == nil {
			return errorReply(req, mad.StatusInvalidGID)
		}
	case comp&mad.PathCompSLID != 0:
		guid, ok := s.byLID[q.SLID()]
		if !ok {
			return errorReply(req, mad.StatusNoRecords)
		}
		src = s.ports[guid]
	default:
		if src = requester; src == nil {
			return errorReply(req, mad.StatusInsufComps) // an anonymous raw request names no source
		}
	}
	var dsts []pathEnd
	switch {
	case comp&mad.PathCompDGID != 0:
		dgid := q.DGID()
		if dgid[0] == 0xFF {
			g := s.groups[dgid]
			if g == nil {
				return errorReply(req, mad.StatusInvalidGID)
			}
			dsts = []pathEnd{{group: g}}
			break
		}
		guid, _, st := s.portGUID(dgid)
		if st != 0 {
			return errorReply(req, uint16(st))
		}
		p := s.ports[guid]
		if p == nil {
			return errorReply(req, mad.StatusInvalidGID)
		}
		dsts = []pathEnd{{port: p}}
	case comp&mad.PathCompDLID != 0:
		if g := s.byMLID[q.DLID()]; g != nil {
			dsts = []pathEnd{{group: g}}
		} else if guid, ok := s.byLID[q.DLID()]; ok {
			dsts = []pathEnd{{port: s.ports[guid]}}
		} else {
			return errorReply(req, mad.StatusNoRecords)
		}
	default:
		if req.Method() == mad.MethodGet {
			return errorReply(req, mad.StatusInsufComps)
		}
		guids := make([]uint64, 0, len(s.ports))
		for g, p := range s.ports {
			if p.LID != 0 {
				guids = append(guids, g)
			}
		}
		slices.Sort(guids)
		for _, g := range guids {
			dsts = append(dsts, pathEnd{port: s.ports[g]})
		}
	}
	var out [][mad.PathRecordLen]byte
	for _, d := range dsts {
		if rec, ok := s.path(comp, q, src, d); ok {
			out = append(out, rec)
		}
	}
	if req.Method() == mad.MethodGet {
		switch {
		case len(out) > 1:
			return errorReply(req, mad.StatusTooManyRecords)
		case len(out) == 0:
			return errorReply(req, mad.StatusNoRecords)
		}
		r := respHeader(req, mad.PathRecordWords)
		copy(r.SAData(), out[0][:])
		return []mad.MAD{r}
	}
	var off uint16
	if len(out) > 0 {
		off = mad.PathRecordWords
	}
	data := make([]byte, 0, len(out)*mad.PathRecordLen)
	for i := range out {
		data = append(data, out[i][:]...)
	}
	return mad.RMPPSegments(respHeader(req, off), data)
}

// path builds the path from src to d, or reports that the request's
// comp-masked fields rule it out.
func (s *SA) path(comp uint64, q mad.PathRecord, src *Port, d pathEnd) (rec [mad.PathRecordLen]byte, ok bool) {
	if src.LID == 0 || (d.port != nil && d.port.LID == 0) {
		return rec, false // a port the SM has given no LID
	}
	r := mad.PathRecord(rec[:])
	if comp&mad.PathCompServiceID == mad.PathCompServiceID {
		r.SetServiceID(q.ServiceID())
	}
	r.SetSGID(s.PortGID(src.GUID))
	r.SetDGID(s.endGID(d))
	r.SetSLID(src.LID)
	if comp&mad.PathCompQoSClass != 0 {
		r.SetQoSClass(q.QoSClass())
	}
	r.SetMTUSelector(mad.SelExactly)
	r.SetRateSelector(mad.SelExactly)
	r.SetPacketLifeTimeSelector(mad.SelExactly)
	var pkey uint16
	if g := d.group; g != nil {
		if !hasPKey(src, g.rec.PKey) {
			return rec, false
		}
		if k := q.PKey(); comp&mad.PathCompPKey != 0 && (k&0x7FFF != g.rec.PKey&0x7FFF || (k|g.rec.PKey)&0x8000 == 0) {
			return rec, false
		}
		if comp&mad.PathCompTClass != 0 && q.TClass() != g.rec.TClass ||
			comp&mad.PathCompFlowLabel != 0 && q.FlowLabel() != g.rec.FlowLabel ||
			comp&mad.PathCompHopLimit != 0 && q.HopLimit() != g.rec.HopLimit {
			return rec, false
		}
		r.SetDLID(g.rec.MLID)
		r.SetTClass(g.rec.TClass)
		r.SetFlowLabel(g.rec.FlowLabel)
		r.SetHopLimit(g.rec.HopLimit)
		r.SetSL(g.rec.SL)
		r.SetMTU(g.rec.MTU)
		r.SetRate(g.rec.Rate)
		r.SetPacketLifeTime(g.rec.PacketLifeTime)
		pkey = g.rec.PKey
	} else {
		pkey = DefaultPKey
		if comp&mad.PathCompPKey != 0 {
			pkey = q.PKey()
			if pkey&0x7FFF == 0 || !hasPKey(src, pkey) || !hasPKey(d.port, pkey) {
				return rec, false
			}
		}
		r.SetDLID(d.port.LID)
		if comp&mad.PathCompTClass != 0 {
			r.SetTClass(q.TClass())
		}
		if comp&mad.PathCompFlowLabel != 0 {
			r.SetFlowLabel(q.FlowLabel())
		}
		if comp&mad.PathCompHopLimit != 0 {
			r.SetHopLimit(q.HopLimit())
		}
		r.SetReversible(true)
		r.SetMTU(min(src.MTU, d.port.MTU))
		rate := src.Rate
		if compareRates(d.port.Rate, rate) < 0 {
			rate = d.port.Rate
		}
		r.SetRate(rate)
		r.SetPacketLifeTime(pathPacketLifeTime)
	}
	r.SetPKey(pkey)
	if comp&mad.PathCompSL != 0 && q.SL() != r.SL() {
		return rec, false
	}
	if comp&mad.PathCompReversible != 0 && q.Reversible() && !r.Reversible() {
		return rec, false
	}
	if comp&mad.PathCompMTU != 0 && !selected(comp&mad.PathCompMTUSelector != 0, q.MTUSelector(), int(q.MTU()), int(r.MTU())) ||
		comp&mad.PathCompRate != 0 && !selected(comp&mad.PathCompRateSelector != 0, q.RateSelector(), mad.RateMbps(q.Rate()), mad.RateMbps(r.Rate())) ||
		comp&mad.PathCompPktLife != 0 && !selected(comp&mad.PathCompPktLifeSelector != 0, q.PacketLifeTimeSelector(), int(q.PacketLifeTime()), int(r.PacketLifeTime())) {
		return rec, false
	}
	return rec, true
}

// selected reports whether a path's value meets a requested one under the
// request's selector (exactly when none is comp-masked; 3, largest
// available, always).
func selected(hasSel bool, sel uint8, want, have int) bool {
	if !hasSel {
		sel = mad.SelExactly
	}
	switch sel {
	case mad.SelGreaterThan:
		return have > want
	case mad.SelLessThan:
		return have < want
	case mad.SelExactly:
		return have == want
	}
	return true
}
