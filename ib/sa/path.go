package sa

import (
	"slices"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// PathRecord queries (IBA 15.2.5.16), answered as OpenSM 3.3.23's
// osm_sa_path_record.c answers them on a subnet of one switch (every path
// one hop, one path between two ports), field by field as test/saoracle
// compares them with OpenSM under ibsim:
//
//	method      Get or GetTable; others are dropped; class version ≠ 2 →
//	            0x0004
//	checks      comp-masked MTU or Rate (with its selector) not a valid enum
//	            → 0x0200; one of ServiceID's two mask bits without the other
//	            → 0x0600
//	multicast   DGID a multicast GID: the group's path (no such group → no
//	            record); comp-masked DLID must be its MLID, SGID/SLID a
//	            member's, P_Key, SL, FlowLabel, HopLimit and TClass its own;
//	            the answer is the request with the group's DGID, MLID,
//	            TClass, P_Key, SL, FlowLabel, HopLimit (0xFF beyond link-local
//	            scope), MTU, Rate and PacketLifeTime (selectors "exactly"),
//	            NumbPath 1, Reversible and QoSClass 0
//	unicast     source SGID or SLID, destination DGID or DLID (a port the SA
//	            does not know, or a GID of another subnet prefix → no
//	            record), else every port; the requester, source and
//	            destination must share a partition, and a comp-masked P_Key
//	            must be held by both ends; comp-masked MTU, Rate and
//	            PacketLifeTime must be met under their selectors, and
//	            Reversible when asked for
//	Get         no record → 0x0300, more than one → 0x0400
//
// A unicast path: the ports' LIDs, the smaller MTU and Rate of the two
// ports (selector 2, exactly), SL as requested (0 when not comp-masked:
// OpenSM without QoS), P_Key the requested one or 0xFFFF, PacketLifeTime
// 18 (OpenSM's default subnet timeout; 0 on the path of a port to itself),
// Reversible set; ServiceID, TClass, NumbPath, QoSClass, FlowLabel and
// HopLimit 0 (OpenSM 3.3.23 fills none of them, whatever was asked).

// pathPacketLifeTime is a unicast path's PacketLifeTime: OpenSM's default
// subnet timeout.
const pathPacketLifeTime = 18

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
	if comp&mad.PathCompMTU != 0 && comp&mad.PathCompMTUSelector != 0 && !mad.ValidMTU(q.MTU()) ||
		comp&mad.PathCompRate != 0 && comp&mad.PathCompRateSelector != 0 && !mad.ValidRate(q.Rate()) {
		return errorReply(req, mad.StatusReqInvalid)
	}
	if sid := comp & mad.PathCompServiceID; sid != 0 && sid != mad.PathCompServiceID {
		return errorReply(req, mad.StatusInsufComps)
	}
	var reqGUID uint64
	if comp&mad.PathCompSGID != 0 {
		reqGUID, _, _ = s.portGUID(q.SGID())
	}
	requester, drop := s.requester(from, reqGUID)
	if drop {
		return nil
	}
	var out [][mad.PathRecordLen]byte
	if comp&mad.PathCompDGID != 0 && q.DGID()[0] == 0xFF {
		if rec, ok := s.multicastPath(comp, q); ok {
			out = append(out, rec)
		}
	} else {
		srcs, ok := s.pathEnds(comp&mad.PathCompSGID != 0, q.SGID(), comp&mad.PathCompSLID != 0, q.SLID())
		if !ok {
			return errorReply(req, mad.StatusNoRecords)
		}
		dsts, ok := s.pathEnds(comp&mad.PathCompDGID != 0, q.DGID(), comp&mad.PathCompDLID != 0, q.DLID())
		if !ok {
			return errorReply(req, mad.StatusNoRecords)
		}
	pairs:
		for _, src := range srcs {
			for _, dst := range dsts {
				if requester != nil && (!sharePKey(requester, src) || !sharePKey(requester, dst)) {
					continue
				}
				if rec, ok := unicastPath(comp, q, src, dst, s.PortGID(src.GUID), s.PortGID(dst.GUID)); ok {
					out = append(out, rec)
					if req.Method() == mad.MethodGet {
						break pairs
					}
				}
			}
		}
	}
	return recordsReply(req, mad.PathRecordWords, len(out), func(b []byte, i int) { copy(b, out[i][:]) })
}

// pathEnds returns the ports a path end may be: the port of the GID or of
// the LID when given (both must name the same port), else every port with
// a LID, by GUID; false when a given GID or LID names no port.
func (s *SA) pathEnds(hasGID bool, gid wire.GID, hasLID bool, lid uint16) ([]*Port, bool) {
	var p *Port
	if hasGID {
		guid, _, st := s.portGUID(gid)
		if st != 0 {
			return nil, false
		}
		if p = s.ports[guid]; p == nil {
			return nil, false
		}
	}
	if hasLID {
		guid, ok := s.byLID[lid]
		if !ok || (p != nil && p.GUID != guid) {
			return nil, false
		}
		p = s.ports[guid]
	}
	if p != nil {
		return []*Port{p}, true
	}
	guids := make([]uint64, 0, len(s.ports))
	for g, pp := range s.ports {
		if pp.LID != 0 {
			guids = append(guids, g)
		}
	}
	slices.Sort(guids)
	ports := make([]*Port, len(guids))
	for i, g := range guids {
		ports[i] = s.ports[g]
	}
	return ports, true
}

// unicastPath builds the path from src to dst, or reports that the
// request's comp-masked fields rule it out.
func unicastPath(comp uint64, q mad.PathRecord, src, dst *Port, sgid, dgid wire.GID) (rec [mad.PathRecordLen]byte, ok bool) {
	if src.LID == 0 || dst.LID == 0 || !sharePKey(src, dst) {
		return rec, false // a port the SM has given no LID, or no common partition
	}
	pkey := uint16(DefaultPKey)
	if comp&mad.PathCompPKey != 0 {
		pkey = q.PKey()
		if pkey&0x7FFF == 0 || !hasPKey(src, pkey) || !hasPKey(dst, pkey) {
			return rec, false
		}
	}
	r := mad.PathRecord(rec[:])
	r.SetSGID(sgid)
	r.SetDGID(dgid)
	r.SetSLID(src.LID)
	r.SetDLID(dst.LID)
	r.SetPKey(pkey)
	if comp&mad.PathCompSL != 0 {
		r.SetSL(q.SL())
	}
	r.SetReversible(true)
	r.SetMTUSelector(mad.SelExactly)
	r.SetMTU(min(src.MTU, dst.MTU))
	rate := src.Rate
	if compareRates(dst.Rate, rate) < 0 {
		rate = dst.Rate
	}
	r.SetRateSelector(mad.SelExactly)
	r.SetRate(rate)
	r.SetPacketLifeTimeSelector(mad.SelExactly)
	if src != dst {
		r.SetPacketLifeTime(pathPacketLifeTime)
	}
	if comp&mad.PathCompMTU != 0 && !mad.SelectorMet(comp&mad.PathCompMTUSelector != 0, q.MTUSelector(), int(q.MTU()), int(r.MTU())) ||
		comp&mad.PathCompRate != 0 && !mad.SelectorMet(comp&mad.PathCompRateSelector != 0, q.RateSelector(), mad.RateMbps(q.Rate()), mad.RateMbps(r.Rate())) ||
		comp&mad.PathCompPktLife != 0 && !mad.SelectorMet(comp&mad.PathCompPktLifeSelector != 0, q.PacketLifeTimeSelector(), int(q.PacketLifeTime()), int(r.PacketLifeTime())) {
		return rec, false
	}
	return rec, true
}

// multicastPath is OpenSM's pr_process_multicast: the path to the group
// of the request's DGID.
func (s *SA) multicastPath(comp uint64, q mad.PathRecord) (rec [mad.PathRecordLen]byte, ok bool) {
	g := s.groups[q.DGID()]
	if g == nil {
		return rec, false
	}
	gr := &g.rec
	if comp&mad.PathCompDLID != 0 && q.DLID() != gr.MLID {
		return rec, false
	}
	if comp&mad.PathCompSGID != 0 {
		guid, _, st := s.portGUID(q.SGID())
		if st != 0 || g.members[guid] == nil {
			return rec, false
		}
	}
	if comp&mad.PathCompSLID != 0 {
		guid, found := s.byLID[q.SLID()]
		if !found || g.members[guid] == nil {
			return rec, false
		}
	}
	if comp&mad.PathCompPKey != 0 && q.PKey() != gr.PKey ||
		comp&mad.PathCompSL != 0 && q.SL() != gr.SL ||
		comp&mad.PathCompFlowLabel != 0 && q.FlowLabel() != gr.FlowLabel ||
		comp&mad.PathCompHopLimit != 0 && q.HopLimit() != gr.HopLimit ||
		comp&mad.PathCompTClass != 0 && q.TClass() != gr.TClass {
		return rec, false
	}
	copy(rec[:], q)
	r := mad.PathRecord(rec[:])
	r.SetDGID(gr.MGID)
	r.SetDLID(gr.MLID)
	r.SetTClass(gr.TClass)
	r[49] = 1 // NumbPath 1, Reversible 0
	r.SetPKey(gr.PKey)
	r.SetMTUSelector(mad.SelExactly)
	r.SetMTU(gr.MTU)
	r.SetRateSelector(mad.SelExactly)
	r.SetRate(gr.Rate)
	r.SetPacketLifeTimeSelector(mad.SelExactly)
	r.SetPacketLifeTime(gr.PacketLifeTime)
	r.SetQoSClass(0)
	r.SetSL(gr.SL)
	hop := gr.HopLimit
	if gr.MGID[1]&0x0F != mad.ScopeLinkLocal {
		hop = 0xFF // OpenSM: hop limit not set in groups beyond the link
	}
	r[44] = 0 // RawTraffic 0, reserved 0
	r.SetFlowLabel(gr.FlowLabel)
	r.SetHopLimit(hop)
	return rec, true
}
