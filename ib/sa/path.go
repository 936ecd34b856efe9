package sa

import (
	"cmp"
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

// pathRecord handles Get and GetTable of PathRecord: errors and the path
// to a group at once, unicast paths as a Query (query.go).
func (s *SA) pathRecord(req mad.MAD, from From) ([]mad.MAD, *Query) {
	switch req.Method() {
	case mad.MethodGet, mad.MethodGetTable:
	default:
		return nil, nil
	}
	if req.ClassVersion() != mad.SAClassVersion {
		return errorReply(req, mad.StatusBadVersion), nil
	}
	comp := req.CompMask()
	q := req.PathRecord()
	if comp&mad.PathCompMTU != 0 && comp&mad.PathCompMTUSelector != 0 && !mad.ValidMTU(q.MTU()) ||
		comp&mad.PathCompRate != 0 && comp&mad.PathCompRateSelector != 0 && !mad.ValidRate(q.Rate()) {
		return errorReply(req, mad.StatusReqInvalid), nil
	}
	if sid := comp & mad.PathCompServiceID; sid != 0 && sid != mad.PathCompServiceID {
		return errorReply(req, mad.StatusInsufComps), nil
	}
	var reqGUID uint64
	if comp&mad.PathCompSGID != 0 {
		reqGUID, _, _ = s.portGUID(q.SGID())
	}
	requester, drop := s.requester(from, reqGUID)
	if drop {
		return nil, nil
	}
	if comp&mad.PathCompDGID != 0 && q.DGID()[0] == 0xFF {
		var out [][mad.PathRecordLen]byte
		if rec, ok := s.multicastPath(comp, q); ok {
			out = append(out, rec)
		}
		return recordsReply(req, mad.PathRecordWords, len(out), func(b []byte, i int) { copy(b, out[i][:]) }), nil
	}
	srcs, srcAll, ok := s.pathEnds(comp&mad.PathCompSGID != 0, q.SGID(), comp&mad.PathCompSLID != 0, q.SLID())
	if !ok {
		return errorReply(req, mad.StatusNoRecords), nil
	}
	dsts, dstAll, ok := s.pathEnds(comp&mad.PathCompDGID != 0, q.DGID(), comp&mad.PathCompDLID != 0, q.DLID())
	if !ok {
		return errorReply(req, mad.StatusNoRecords), nil
	}
	// A GetTable examines every pair: one with more pairs than the work
	// bound is refused before anything is copied.
	nSrc, nDst := len(srcs), len(dsts)
	if srcAll {
		nSrc = len(s.byLID)
	}
	if dstAll {
		nDst = len(s.byLID)
	}
	qu := s.newQuery(req, queryPath)
	if req.Method() == mad.MethodGetTable && qu.work > 0 && nSrc*nDst > qu.work {
		return nil, qu.refuse()
	}
	if srcAll || dstAll {
		all := s.lidPorts()
		if srcAll {
			srcs = all
		}
		if dstAll {
			dsts = all
		}
	}
	qu.comp, qu.path, qu.requester = comp, append(mad.PathRecord(nil), q...), requester
	qu.srcs, qu.dsts, qu.sortSrcs, qu.sortDsts = srcs, dsts, srcAll, dstAll && !srcAll
	return nil, qu
}

// pathEnds returns the port a path end must be: the port of the GID or of
// the LID when given (both must name the same port); all when neither is
// given (every port with a LID: lidPorts); false when a given GID or LID
// names no port.
func (s *SA) pathEnds(hasGID bool, gid wire.GID, hasLID bool, lid uint16) (ports []*Port, all, ok bool) {
	var p *Port
	if hasGID {
		guid, _, st := s.portGUID(gid)
		if st != 0 {
			return nil, false, false
		}
		if p = s.ports[guid]; p == nil {
			return nil, false, false
		}
	}
	if hasLID {
		guid, ok := s.byLID[lid]
		if !ok || (p != nil && p.GUID != guid) {
			return nil, false, false
		}
		p = s.ports[guid]
	}
	if p != nil {
		return []*Port{p}, false, true
	}
	return nil, true, true
}

// lidPorts returns every port with a LID, unsorted (O(ports)). A Port is
// never changed once registered (AddPort registers a new one), so the
// slice may be read without the SA.
func (s *SA) lidPorts() []*Port {
	ports := make([]*Port, 0, len(s.byLID))
	for _, p := range s.ports {
		if p.LID != 0 {
			ports = append(ports, p)
		}
	}
	return ports
}

// buildPaths is Build of a unicast PathRecord query: every pair of ends,
// sources and destinations by GUID, each pair the requester may see
// (they share a partition) that the request's fields do not rule out. A
// Get takes the first path; a query examining more than q.work pairs, or
// a GetTable finding more than q.limit paths, is refused (0x0100).
func (q *Query) buildPaths() []mad.MAD {
	byGUID := func(a, b *Port) int { return cmp.Compare(a.GUID, b.GUID) }
	if q.sortSrcs {
		slices.SortFunc(q.srcs, byGUID)
	}
	if q.sortDsts {
		slices.SortFunc(q.dsts, byGUID)
	}
	get := q.req.Method() == mad.MethodGet
	var out [][mad.PathRecordLen]byte
	examined := 0
pairs:
	for _, src := range q.srcs {
		for _, dst := range q.dsts {
			if examined++; q.work > 0 && examined > q.work {
				return q.refuse().resps
			}
			if q.requester != nil && (!sharePKey(q.requester, src) || !sharePKey(q.requester, dst)) {
				continue
			}
			if rec, ok := unicastPath(q.comp, q.path, src, dst, prefixGID(q.prefix, src.GUID), prefixGID(q.prefix, dst.GUID)); ok {
				out = append(out, rec)
				if get {
					break pairs
				}
				if q.limit > 0 && len(out) > q.limit {
					return q.refuse().resps
				}
			}
		}
	}
	return recordsReply(q.req, mad.PathRecordWords, len(out), func(b []byte, i int) { copy(b, out[i][:]) })
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
