package sa

import (
	"encoding/binary"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// status is an SA MAD status; 0 is success.
type status uint16

// Handle processes one SA request MAD and returns the response MADs: one
// MAD for Get/Set/Delete and errors, one or more RMPP segments for a
// successful GetTable (see package mad). It returns nil when the request
// is dropped without an answer, as OpenSM's SA MAD controller
// (osm_sa_mad_ctrl.c) drops it: shorter than 256 bytes, base version ≠ 1,
// class ≠ SubnAdm, a response method, an RMPP ACK, STOP or ABORT (those
// belong to the RMPP sender, not the SA), a method other than
// Get/GetTable/Set/Delete, an attribute the SA does not serve, a Set or
// Delete of ClassPortInfo, or (over the fabric) a requester the SA does
// not know.
func (s *SA) Handle(req mad.MAD, from From) []mad.MAD {
	resps, q := s.Prepare(req, from)
	if q != nil {
		resps, _ = q.Build()
	}
	return resps
}

// Prepare is Handle in two steps, so that a query's answer, which may be
// large, is built without the SA: an answer it can give at once comes
// back as resps (nil: none, as Handle), a Get or GetTable of
// MCMemberRecord or PathRecord as a Query whose Build makes the answer
// (Broad tells the queries whose work grows with the subnet). Prepare copies what the query needs from the SA's state: at
// most every port or every group, and at most 4 × Config.MaxRecords
// group members. Build needs nothing of the SA: it may run on another
// goroutine while the SA goes on (it answers from the state Prepare saw).
func (s *SA) Prepare(req mad.MAD, from From) (resps []mad.MAD, q *Query) {
	if len(req) < mad.Len {
		return nil, nil
	}
	req = req[:mad.Len]
	if req.BaseVersion() != mad.BaseVersion || req.MgmtClass() != mad.ClassSubnAdm || req.IsResponse() {
		return nil, nil
	}
	if req.RMPPFlags()&mad.RMPPFlagActive != 0 && req.RMPPType() != mad.RMPPTypeData {
		return nil, nil
	}
	switch req.Method() {
	case mad.MethodGet, mad.MethodGetTable, mad.MethodSet, mad.MethodDelete:
	case mad.MethodGetMulti:
		// OpenSM (built with DUAL_SIDED_RMPP, as Debian's) hands
		// GetMulti to the attribute's handler, which refuses it.
	default:
		return nil, nil // ERR 1A05: unsupported method
	}
	switch req.AttrID() {
	case mad.AttrClassPortInfo:
		// ClassPortInfo is class-version independent: OpenSM answers a
		// version-1 Get as a version-2 one.
		if v := req.ClassVersion(); v != mad.SAClassVersion && v != 1 {
			return errorReply(req, mad.StatusBadVersion), nil
		}
		switch req.Method() {
		case mad.MethodGet:
			return []mad.MAD{s.classPortInfo(req)}, nil
		case mad.MethodGetTable, mad.MethodGetMulti:
			return errorReply(req, mad.StatusReqInvalid), nil // ERR 1403: not Get
		default:
			return nil, nil // Set/Delete go to OpenSM's set dispatcher, which has no ClassPortInfo handler
		}
	case mad.AttrMCMemberRecord:
		if req.ClassVersion() != mad.SAClassVersion {
			return errorReply(req, mad.StatusBadVersion), nil
		}
		return s.mcmr(req, from)
	case mad.AttrPathRecord:
		return s.pathRecord(req, from) // path.go
	default:
		return nil, nil // ERR 1A01: unsupported attribute
	}
}

// errorReply copies the request, sets the status, turns Set into GetResp,
// GetTable into GetTableResp with AttributeOffset 0, any other method into
// its response, and zeroes the SM_Key (C15-0.1.5), as OpenSM's
// osm_sa_send_error. The payload is the request's.
func errorReply(req mad.MAD, st uint16) []mad.MAD {
	r := mad.MAD(make([]byte, mad.Len))
	copy(r, req)
	r.SetStatus(st)
	switch req.Method() {
	case mad.MethodSet:
		r.SetMethod(mad.MethodGet)
	case mad.MethodGetTable:
		r.SetAttrOffset(0)
	}
	r.SetMethod(r.Method() | mad.MethodResp)
	r.SetSMKey(0)
	return []mad.MAD{r}
}

// respHeader returns a response MAD carrying the request's header (RMPP
// header cleared), method turned into its response (Set → GetResp),
// SM_Key 0 and the given AttributeOffset.
func respHeader(req mad.MAD, attrOffset uint16) mad.MAD {
	r := mad.MAD(make([]byte, mad.Len))
	copy(r[:mad.SAHeaderEnd], req[:mad.SAHeaderEnd])
	clear(r[mad.HeaderLen : mad.HeaderLen+mad.RMPPHeaderLen])
	m := req.Method()
	if m == mad.MethodSet {
		m = mad.MethodGet
	}
	r.SetMethod(m | mad.MethodResp)
	r.SetStatus(mad.StatusOK)
	r.SetSMKey(0)
	r.SetAttrOffset(attrOffset)
	return r
}

// classPortInfo answers Get(ClassPortInfo) as OpenSM's cpi_rcv_respond:
// the request's 56 header bytes are copied (class version, RMPP header
// and AttributeOffset as sent), the method turned into GetResp and the
// SM_Key zeroed; the ClassPortInfo itself says base version 1, class
// version 2.
func (s *SA) classPortInfo(req mad.MAD) mad.MAD {
	r := mad.MAD(make([]byte, mad.Len))
	copy(r[:mad.SAHeaderEnd], req[:mad.SAHeaderEnd])
	r.SetMethod(req.Method() | mad.MethodResp)
	r.SetSMKey(0)
	c := r.ClassPortInfo()
	c.SetBaseVersion(mad.BaseVersion)
	c.SetClassVersion(mad.SAClassVersion)
	c.SetCapabilityMask(mad.CapMaskUDMulticast)
	var cm2 uint32
	if s.cfg.SendOnlySupport {
		cm2 |= mad.CapMask2SendOnlyFullMember
	}
	c.SetCapabilityMask2(cm2)
	c.SetRespTimeValue(s.cfg.RespTimeValue)
	c.SetRedirectQP(mad.GSIQPN)
	c.SetRedirectQKey(mad.GSIQKey)
	c.SetTrapQKey(mad.GSIQKey)
	return r
}

func (s *SA) mcmr(req mad.MAD, from From) ([]mad.MAD, *Query) {
	comp := req.CompMask()
	rec := req.MCMemberRecord().Fields()
	switch req.Method() {
	case mad.MethodSet, mad.MethodDelete:
		if comp&mad.CompJoinRequired != mad.CompJoinRequired {
			return errorReply(req, mad.StatusInsufComps), nil
		}
	case mad.MethodGet, mad.MethodGetTable:
	default:
		return errorReply(req, mad.StatusUnsupportedMethodAttr), nil
	}
	if !mtuRateValid(comp, &rec) {
		return errorReply(req, mad.StatusReqInvalid), nil
	}
	var (
		resp mad.MCMemberFields
		st   status
		drop bool
	)
	switch req.Method() {
	case mad.MethodSet:
		var echo [len(group{}.echo)]byte
		copy(echo[:], req.SAData()[mad.MCMemberRecordEchoOffset:mad.MCMemberRecordStride])
		echo[0] &^= mad.MCMemberProxyJoinBit
		resp, st, drop = s.join(comp, rec, echo, from)
	case mad.MethodDelete:
		resp, st, drop = s.leave(rec, from)
	default:
		return nil, s.query(req, comp, rec, from)
	}
	if drop {
		return nil, nil
	}
	if st != 0 {
		return errorReply(req, uint16(st)), nil
	}
	r := respHeader(req, mad.MCMemberRecordWords)
	resp.MTUSelector, resp.RateSelector, resp.PacketLifeTimeSelector = mad.SelExactly, mad.SelExactly, mad.SelExactly
	r.MCMemberRecord().Encode(&resp)
	// OpenSM answers a copy of the received record: the ProxyJoin bit, the
	// reserved bits and bytes and the padding go back as they came.
	copy(r.SAData()[mad.MCMemberRecordEchoOffset:mad.MCMemberRecordStride], req.SAData()[mad.MCMemberRecordEchoOffset:mad.MCMemberRecordStride])
	return []mad.MAD{r}, nil
}

// mtuRateValid checks comp-masked MTU and Rate (each with its selector)
// against the enums.
func mtuRateValid(comp uint64, r *mad.MCMemberFields) bool {
	if comp&mad.CompMTUSelector != 0 && comp&mad.CompMTU != 0 && !mad.ValidMTU(r.MTU) {
		return false
	}
	if comp&mad.CompRateSelector != 0 && comp&mad.CompRate != 0 && !mad.ValidRate(r.Rate) {
		return false
	}
	return true
}

// portGUID normalizes the PortGID prefix (fe80:: means the SM's prefix)
// and returns the GUID, or 0x0500 for a foreign prefix.
func (s *SA) portGUID(gid wire.GID) (uint64, wire.GID, status) {
	prefix := binary.BigEndian.Uint64(gid[:8])
	if prefix == DefaultSubnetPrefix {
		prefix = s.prefix
	}
	if prefix != s.prefix {
		return 0, gid, mad.StatusInvalidGID
	}
	guid := binary.BigEndian.Uint64(gid[8:])
	return guid, s.PortGID(guid), 0
}

// requester resolves the requesting port: over the fabric the sender
// (unknown → drop), from the raw SA port the port of the record's PortGID
// (nil: anonymous).
func (s *SA) requester(from From, recGUID uint64) (p *Port, drop bool) {
	if from.Raw {
		return s.ports[recGUID], false
	}
	p = s.ports[from.GUID]
	return p, p == nil
}

// join handles Set(MCMemberRecord).
// echo is the request's bytes from ProxyJoin's byte on (group.echo).
func (s *SA) join(comp uint64, rec mad.MCMemberFields, echo [len(group{}.echo)]byte, from From) (mad.MCMemberFields, status, bool) {
	if !s.cfg.SendOnlySupport && rec.JoinState&mad.JoinSendOnlyFullMember != 0 {
		return rec, mad.StatusReqInvalid, false
	}
	guid, _, st := s.portGUID(rec.PortGID)
	if st != 0 {
		return rec, st, false
	}
	port := s.ports[guid]
	if port == nil {
		return rec, mad.StatusReqInvalid, false
	}
	reqPort, drop := s.requester(from, guid)
	if drop {
		return rec, 0, true
	}
	if reqPort == nil {
		reqPort = port
	}
	proxy := reqPort != port
	if proxy && !sharePKey(port, reqPort) {
		return rec, mad.StatusReqInvalid, false
	}
	if comp&mad.CompPKey != 0 && rec.PKey&0x7FFF == 0 {
		return rec, mad.StatusReqInvalid, false
	}
	js := rec.JoinState
	g := s.groups[rec.MGID]
	isNew := false
	if g == nil {
		if js&mad.JoinFullTypes == 0 {
			return rec, mad.StatusReqInvalid, false
		}
		if comp&mad.CompCreateRequired != mad.CompCreateRequired {
			return rec, mad.StatusInsufComps, false
		}
		if s.overQuota(guid, false) || s.overQuota(reqPort.GUID, true) || s.overSourceQuota(from.Source) {
			return rec, mad.StatusNoResources, false
		}
		var st status
		g, st = s.create(comp, rec, port)
		if st != 0 {
			return rec, st, false
		}
		g.creator = reqPort.GUID
		g.echo = echo
		s.created[reqPort.GUID]++
		if from.Source.IsValid() {
			g.source = from.Source
			s.bySource[from.Source]++
		}
		isNew = true
	} else if g.members[guid] == nil && s.overQuota(guid, false) {
		return rec, mad.StatusNoResources, false
	} else if !otherCompFieldsMatch(comp, &rec, &g.rec) {
		return rec, mad.StatusReqInvalid, false
	}
	fail := func() (mad.MCMemberFields, status, bool) {
		if isNew {
			s.cleanup(g)
		}
		return rec, mad.StatusReqInvalid, false
	}
	if !moreCompFieldsMatch(comp, &rec, &g.rec) || !portCapsOK(port, &g.rec) || js == 0 {
		return fail()
	}
	if !hasPKey(port, g.rec.PKey) {
		return fail()
	}
	m := g.members[guid]
	if !isNew && m != nil && !modifyAllowed(m, g, reqPort) {
		return rec, mad.StatusReqInvalid, false
	}
	if m == nil {
		m = s.addMember(g, guid, proxy)
	}
	prev := m.JoinState
	m.JoinState |= js
	if js&mad.JoinFullTypes != 0 && prev&mad.JoinFullTypes == 0 {
		g.full++
	}
	if isNew || m.JoinState != prev {
		s.version++
		s.changed[g.rec.MLID] = struct{}{}
	}
	resp := rec
	resp.MGID = g.rec.MGID
	resp.QKey = g.rec.QKey
	resp.MLID = g.rec.MLID
	resp.TClass = g.rec.TClass
	resp.PKey = g.rec.PKey
	resp.SL, resp.FlowLabel, resp.HopLimit = g.rec.SL, g.rec.FlowLabel, g.rec.HopLimit
	resp.MTU, resp.Rate, resp.PacketLifeTime = g.rec.MTU, g.rec.Rate, g.rec.PacketLifeTime
	resp.Scope = g.rec.Scope
	resp.JoinState = m.JoinState
	return resp, 0, false
}

// create makes a new group for a join (OpenSM mcmr_rcv_create_new_mgrp).
func (s *SA) create(comp uint64, rec mad.MCMemberFields, port *Port) (*group, status) {
	if rec.MGID.IsZero() {
		if !s.assignMGID(comp, &rec) {
			return nil, mad.StatusNoResources
		}
	} else if st := s.validateRequestedMGID(comp, &rec); st != 0 {
		return nil, st
	}
	if !realizable(comp, &rec, port) {
		return nil, mad.StatusReqInvalid
	}
	mlid := s.newMLID(rec.MLID)
	if mlid == 0 {
		return nil, mad.StatusNoResources
	}
	gr := rec
	gr.MLID = mlid
	gr.PortGID = wire.GID{}
	gr.JoinState = 0
	gr.ProxyJoin = false
	// The group keeps the requester's Scope nibble (OpenSM stores a copy of
	// the request), whatever the MGID's scope.
	gr.MTUSelector, gr.RateSelector, gr.PacketLifeTimeSelector = mad.SelExactly, mad.SelExactly, mad.SelExactly
	g := &group{rec: gr, members: make(map[uint64]*Member)}
	s.groups[gr.MGID] = g
	s.byMLID[mlid] = g
	return g, 0
}

// assignMGID builds ff1S:a01b:<subnet prefix> with the process-wide
// counter (host byte order, little-endian as on x86) over bytes 10..13, as
// OpenSM's build_new_mgid: first ff12:a01b:fe80::, then
// ff12:a01b:fe80::100:0:0. Scope is link-local unless comp-masked.
func (s *SA) assignMGID(comp uint64, rec *mad.MCMemberFields) bool {
	scope := uint8(mad.ScopeLinkLocal)
	if comp&mad.CompScope != 0 {
		scope = rec.Scope
	}
	m := &rec.MGID
	m[0], m[1], m[2], m[3] = 0xff, 0x10|scope&0x0F, 0xa0, 0x1b
	binary.BigEndian.PutUint64(m[4:12], s.prefix)
	for range 1000 {
		binary.LittleEndian.PutUint32(m[10:14], s.counter)
		s.counter++
		if s.groups[*m] == nil {
			return true
		}
	}
	return false
}

// validateRequestedMGID checks a requested non-zero MGID
// (validate_requested_mgid plus the IPoIB broadcast-group rule).
func (s *SA) validateRequestedMGID(comp uint64, rec *mad.MCMemberFields) status {
	m := rec.MGID
	if m[0] != 0xFF {
		return mad.StatusReqInvalid
	}
	sig := binary.BigEndian.Uint16(m[2:4])
	if sig == wire.SigIPv4IPoIB || sig == wire.SigIPv6IPoIB {
		bcast := BroadcastMGID
		bcast[1] = bcast[1]&0xF0 | m[1]&0x0F
		bcast[4], bcast[5] = m[4], m[5]
		if sig != wire.SigIPv4IPoIB || bcast != m {
			b := s.groups[bcast]
			if b == nil || !otherCompFieldsMatch(comp, rec, &b.rec) {
				return mad.StatusReqInvalid
			}
		}
		return 0
	}
	if m[1]&0xE0 != 0 {
		return mad.StatusReqInvalid
	}
	if sig == wire.SigSAAssigned && m[1]&0x0F == mad.ScopeLinkLocal {
		return mad.StatusReqInvalid
	}
	return 0
}

// realizable picks the group's MTU and Rate from the request's selectors
// and the creating port (mgrp_request_is_realizable).
func realizable(comp uint64, rec *mad.MCMemberFields, port *Port) bool {
	if comp&mad.CompMTU == 0 || comp&mad.CompMTUSelector == 0 || rec.MTUSelector == mad.SelLargest {
		rec.MTU = port.MTU
	} else {
		req := rec.MTU
		mtu := req
		switch rec.MTUSelector {
		case mad.SelGreaterThan:
			if req >= port.MTU {
				return false
			}
			mtu = port.MTU
		case mad.SelLessThan:
			if req > port.MTU {
				mtu = port.MTU
			} else {
				mtu--
			}
		}
		if !mad.ValidMTU(mtu) {
			return false
		}
		rec.MTU = mtu
	}
	if comp&mad.CompRate == 0 || comp&mad.CompRateSelector == 0 || rec.RateSelector == mad.SelLargest {
		rec.Rate = port.Rate
	} else {
		req := rec.Rate
		rate := req
		switch rec.RateSelector {
		case mad.SelGreaterThan:
			if compareRates(req, port.Rate) >= 0 {
				return false
			}
			rate = port.Rate
		case mad.SelLessThan:
			if compareRates(req, port.Rate) > 0 {
				rate = port.Rate
			} else {
				rate = prevRate(rate)
			}
		}
		if !mad.ValidRate(rate) {
			return false
		}
		rec.Rate = rate
	}
	return true
}

// newMLID honours a requested MLID in [0xC000, MaxMLID] that is free
// (whether or not the MLID component is set), else returns the lowest
// free one, or 0 when none is left; O(log n) (see mlids).
func (s *SA) newMLID(requested uint16) uint16 { return s.mlids.alloc(requested) }

// otherCompFieldsMatch compares the comp-masked Q_Key, P_Key (same base,
// one of the two full), TClass, SL, FlowLabel and HopLimit with a group's
// (validate_other_comp_fields).
func otherCompFieldsMatch(comp uint64, r, g *mad.MCMemberFields) bool {
	if comp&mad.CompQKey != 0 && r.QKey != g.QKey {
		return false
	}
	if comp&mad.CompPKey != 0 {
		if (r.PKey|g.PKey)&0x8000 == 0 || r.PKey&0x7FFF != g.PKey&0x7FFF {
			return false
		}
	}
	if comp&mad.CompTClass != 0 && r.TClass != g.TClass {
		return false
	}
	if comp&mad.CompSL != 0 && r.SL != g.SL {
		return false
	}
	if comp&mad.CompFlowLabel != 0 && r.FlowLabel != g.FlowLabel {
		return false
	}
	if comp&mad.CompHopLimit != 0 && r.HopLimit != g.HopLimit {
		return false
	}
	return true
}

// moreCompFieldsMatch checks comp-masked MTU/Rate selectors against the
// group's values (validate_more_comp_fields; selector 3 always matches).
func moreCompFieldsMatch(comp uint64, r, g *mad.MCMemberFields) bool {
	if comp&mad.CompMTUSelector != 0 {
		switch r.MTUSelector {
		case mad.SelGreaterThan:
			if g.MTU <= r.MTU {
				return false
			}
		case mad.SelLessThan:
			if g.MTU >= r.MTU {
				return false
			}
		case mad.SelExactly:
			if g.MTU != r.MTU {
				return false
			}
		}
	}
	if comp&mad.CompRateSelector != 0 {
		c := compareRates(g.Rate, r.Rate)
		switch r.RateSelector {
		case mad.SelGreaterThan:
			if c <= 0 {
				return false
			}
		case mad.SelLessThan:
			if c >= 0 {
				return false
			}
		case mad.SelExactly:
			if c != 0 {
				return false
			}
		}
	}
	return true
}

// portCapsOK checks that the port's MTU and rate reach the group's.
func portCapsOK(p *Port, g *mad.MCMemberFields) bool {
	return p.MTU >= g.MTU && compareRates(p.Rate, g.Rate) >= 0
}

// modifyAllowed is o15-0.2.1: without ProxyJoin only the port itself may
// modify its membership; with ProxyJoin any requester in the group's
// partition.
func modifyAllowed(m *Member, g *group, req *Port) bool {
	if !m.ProxyJoin {
		return req != nil && req.GUID == m.GUID
	}
	return hasPKey(req, g.rec.PKey)
}

// leave handles Delete(MCMemberRecord).
func (s *SA) leave(rec mad.MCMemberFields, from From) (mad.MCMemberFields, status, bool) {
	guid, _, st := s.portGUID(rec.PortGID)
	if st != 0 {
		return rec, st, false
	}
	g := s.groups[rec.MGID]
	if g == nil {
		return rec, mad.StatusReqInvalid, false
	}
	m := g.members[guid]
	js := rec.JoinState
	if m == nil || js&m.JoinState == 0 || js&^m.JoinState != 0 {
		return rec, mad.StatusReqInvalid, false
	}
	reqPort, drop := s.requester(from, guid)
	if drop {
		return rec, 0, true
	}
	if from.Raw && reqPort == nil {
		// The raw SA port speaks for the record's port even when it is no
		// longer registered.
		reqPort = &Port{GUID: guid, PKeys: []uint16{DefaultPKey}}
	}
	if !modifyAllowed(m, g, reqPort) {
		return rec, mad.StatusReqInvalid, false
	}
	resp := rec
	resp.Scope = g.rec.Scope
	mlid := g.rec.MLID
	resp.JoinState = s.removeBits(g, m, js)
	s.version++
	s.changed[mlid] = struct{}{}
	return resp, 0, false
}

// recordsReply answers a Get or GetTable that found n records, each words
// 8-byte words long, written by put: a Get takes exactly one (none 0x0300,
// more 0x0400), a GetTable travels RMPP (AttributeOffset 0 when empty).
func recordsReply(req mad.MAD, words uint16, n int, put func(b []byte, i int)) []mad.MAD {
	stride := int(words) * 8
	if req.Method() == mad.MethodGet {
		switch {
		case n > 1:
			return errorReply(req, mad.StatusTooManyRecords)
		case n == 0:
			return errorReply(req, mad.StatusNoRecords)
		}
		r := respHeader(req, words)
		put(r.SAData()[:stride], 0)
		return []mad.MAD{r}
	}
	var off uint16
	if n > 0 {
		off = words
	}
	data := make([]byte, n*stride)
	for i := range n {
		put(data[i*stride:(i+1)*stride], i)
	}
	return mad.RMPPSegments(respHeader(req, off), data)
}

// encodeRecord writes a query's record of a group into b (56 bytes):
// the fields, then the group's echo bytes (echo) (its creating request's reserved
// bits and bytes and padding, as OpenSM answers its copy of that request)
// beside the ProxyJoin bit.
func encodeRecord(b []byte, f *mad.MCMemberFields, echo *[mad.MCMemberRecordStride - mad.MCMemberRecordEchoOffset]byte) {
	mad.MCMemberRecord(b).Encode(f)
	e := b[mad.MCMemberRecordEchoOffset:mad.MCMemberRecordStride]
	proxy := e[0] & mad.MCMemberProxyJoinBit
	copy(e, echo[:])
	e[0] |= proxy
}
