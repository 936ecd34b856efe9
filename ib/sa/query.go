package sa

import (
	"cmp"
	"encoding/binary"
	"slices"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// Queries (Get and GetTable of MCMemberRecord and PathRecord) are answered
// in two steps (Broad says which may be large), so that the SA's caller need not hold its lock while a
// large answer is built: Prepare copies what the query needs (at most every
// port, or every group and at most WorkFactor × MaxRecords members), Build
// filters, sorts and encodes without the SA.
//
// Bounds (Config.MaxRecords, 0: none): a query that would answer more than
// MaxRecords records, or examine more than WorkFactor × MaxRecords
// candidates (pairs of path ends; members of the matching groups for a
// trusted MCMemberRecord query without PortGID), is answered with status
// 0x0100 (insufficient resources; OpenSM answers so when it cannot
// allocate an answer) and no record. A GetTable(PathRecord) without source
// or destination on a subnet of N ports is N×N pairs: above
// WorkFactor × MaxRecords it is refused before anything is copied.

// WorkFactor × Config.MaxRecords is the most candidates one query
// examines.
const WorkFactor = 4

// Query kinds.
const (
	queryMC = iota + 1
	queryPath
)

// Query is a Get or GetTable that Prepare took from the SA; Build answers
// it. A Query is used by one goroutine at a time and needs nothing of the
// SA.
type Query struct {
	req         mad.MAD
	kind        int
	limit, work int // Config.MaxRecords and WorkFactor × it (0: no bound)
	prefix      uint64
	// resps is the answer when Prepare decided it (done); tooLarge says it
	// is a refusal for the bounds.
	resps    []mad.MAD
	done     bool
	tooLarge bool
	// MCMemberRecord: the matching groups, the records found, and
	// whether the requester is trusted (sees members).
	mcGroups []mcGroup
	mc       []mcItem
	trusted  bool
	// PathRecord (unicast): the request, its component mask, the
	// requester (nil: anonymous) and the candidate ends (sorted by Build
	// when they are every port).
	comp               uint64
	path               mad.PathRecord
	requester          *Port
	srcs, dsts         []*Port
	sortSrcs, sortDsts bool
}

// mcGroup is a group an MCMemberRecord query found: its record and echo
// bytes (see group).
type mcGroup struct {
	rec  mad.MCMemberFields
	echo [mad.MCMemberRecordStride - mad.MCMemberRecordEchoOffset]byte
}

// mcItem is one record of an MCMemberRecord query: its group (an index
// into Query.mcGroups) and, when it is a member's record, the member.
type mcItem struct {
	group     int32
	hasMember bool
	member    Member
}

// Broad reports whether req is a query whose work grows with the subnet:
// a Get or GetTable of MCMemberRecord that does not name one group (MGID)
// and, when trusted, one member (PortGID); or of PathRecord that names
// neither a group (multicast DGID) nor both ends (SGID or SLID, DGID or
// DLID). Every other request costs O(1) work (one group, one member, one
// path) or is refused at once.
func (s *SA) Broad(req mad.MAD) bool {
	if len(req) < mad.Len || req.IsResponse() {
		return false
	}
	switch req.Method() {
	case mad.MethodGet, mad.MethodGetTable:
	default:
		return false
	}
	comp := req.CompMask()
	switch req.AttrID() {
	case mad.AttrMCMemberRecord:
		trusted := req.SMKey() != 0 && req.SMKey() == s.cfg.SMKey
		return comp&mad.CompMGID == 0 || trusted && comp&mad.CompPortGID == 0
	case mad.AttrPathRecord:
		if comp&mad.PathCompDGID != 0 && req.PathRecord().DGID()[0] == 0xFF {
			return false
		}
		return comp&(mad.PathCompSGID|mad.PathCompSLID) == 0 || comp&(mad.PathCompDGID|mad.PathCompDLID) == 0
	}
	return false
}

// ErrorReply is the SA's error answer to req with MAD status st: the
// request copied, the status set, the method turned into its response
// (Set into GetResp, GetTable into GetTableResp with AttributeOffset 0)
// and the SM_Key zeroed, as OpenSM's osm_sa_send_error.
func ErrorReply(req mad.MAD, st uint16) []mad.MAD { return errorReply(req, st) }

func (s *SA) newQuery(req mad.MAD, kind int) *Query {
	q := &Query{req: append(mad.MAD(nil), req[:mad.Len]...), kind: kind, prefix: s.prefix, limit: max(s.cfg.MaxRecords, 0)}
	q.work = WorkFactor * q.limit
	return q
}

// answer makes q an answer decided by Prepare.
func (q *Query) answer(resps []mad.MAD) *Query {
	q.resps, q.done = resps, true
	return q
}

// refuse makes q a refusal for the bounds: 0x0100, no record.
func (q *Query) refuse() *Query {
	q.tooLarge = true
	q.mcGroups, q.mc, q.srcs, q.dsts = nil, nil, nil, nil
	return q.answer(errorReply(q.req, mad.StatusNoResources))
}

// Build returns the query's answer MADs (nil: none, as Handle) and whether
// it is a refusal (0x0100) because the answer would exceed
// Config.MaxRecords records or WorkFactor × MaxRecords candidates.
func (q *Query) Build() (resps []mad.MAD, tooLarge bool) {
	if !q.done {
		switch q.kind {
		case queryMC:
			q.answer(q.buildMC())
		case queryPath:
			if r := q.buildPaths(); !q.done {
				q.answer(r)
			}
		}
	}
	return q.resps, q.tooLarge
}

// query handles Get/GetTable(MCMemberRecord) (mcmr_query_mgrp): it finds
// the records (O(groups) for the groups' fields, then at most q.work
// members of the matching groups, each copied once) and leaves their order
// and encoding to Build. A trusted query without PortGID and without a
// JoinState component answers every member of the matching groups: with
// more than q.limit of them it is refused before any is copied.
func (s *SA) query(req mad.MAD, comp uint64, rec mad.MCMemberFields, from From) *Query {
	q := s.newQuery(req, queryMC)
	recGUID := binary.BigEndian.Uint64(rec.PortGID[8:])
	reqPort, drop := s.requester(from, recGUID)
	if drop {
		return q.answer(nil)
	}
	q.trusted = req.SMKey() != 0 && req.SMKey() == s.cfg.SMKey
	var stateMask uint8
	if comp&mad.CompScope != 0 {
		stateMask |= 0xF0
	}
	if comp&mad.CompJoinState != 0 {
		stateMask |= 0x0F
	}
	reqState := rec.Scope<<4 | rec.JoinState&0x0F
	match := func(g *group) bool {
		switch {
		case comp&mad.CompMLID != 0 && rec.MLID != g.rec.MLID,
			!hasPKey(reqPort, g.rec.PKey) || !otherCompFieldsMatch(comp, &rec, &g.rec),
			comp&mad.CompProxyJoin != 0 && rec.ProxyJoin != g.rec.ProxyJoin,
			!moreCompFieldsMatch(comp, &rec, &g.rec):
			return false
		}
		// The scope is the group's: with no JoinState component the
		// state filter is decided here.
		return stateMask&0x0F != 0 || stateMask&reqState == stateMask&(g.rec.Scope<<4)
	}
	var groups []*group
	members := 0
	if comp&mad.CompMGID != 0 {
		if g := s.groups[rec.MGID]; g != nil && match(g) {
			groups, members = append(groups, g), len(g.members)
		}
	} else {
		for _, g := range s.groups {
			if match(g) {
				groups, members = append(groups, g), members+len(g.members)
			}
		}
	}
	get := req.Method() == mad.MethodGet
	perMember := q.trusted && comp&mad.CompPortGID == 0
	switch {
	case !perMember:
	case q.work > 0 && members > q.work,
		!get && q.limit > 0 && stateMask&0x0F == 0 && members > q.limit:
		return q.refuse()
	}
	n := len(groups)
	if perMember && stateMask&0x0F == 0 {
		n = members
	}
	if get {
		n = min(n, 2)
	}
	q.mcGroups = make([]mcGroup, 0, len(groups))
	q.mc = make([]mcItem, 0, n)
	// add takes a record; false: no more are needed (a Get found two: it
	// is answered 0x0400), or too many (refused).
	add := func(it mcItem) bool {
		q.mc = append(q.mc, it)
		if !get && q.limit > 0 && len(q.mc) > q.limit {
			q.refuse()
			return false
		}
		return !get || len(q.mc) < 2
	}
	for _, g := range groups {
		gi := int32(len(q.mcGroups))
		q.mcGroups = append(q.mcGroups, mcGroup{rec: g.rec, echo: g.echo})
		groupState := g.rec.Scope << 4
		if perMember {
			for _, m := range g.members {
				if stateMask&reqState != stateMask&(groupState|m.JoinState) {
					continue
				}
				if !add(mcItem{group: gi, member: *m, hasMember: true}) {
					return q
				}
			}
			continue
		}
		it := mcItem{group: gi}
		st := groupState
		if comp&mad.CompPortGID != 0 {
			m := g.members[recGUID]
			if m == nil {
				continue
			}
			st |= m.JoinState
			it.member, it.hasMember = *m, true
		}
		if stateMask&reqState != stateMask&st {
			continue
		}
		if !add(it) {
			return q
		}
	}
	return q
}

// buildMC is Build of an MCMemberRecord query: the records by MGID, then
// member GUID; PortGID, JoinState and ProxyJoin hidden from an untrusted
// requester.
func (q *Query) buildMC() []mad.MAD {
	out := q.mc
	slices.SortFunc(out, func(a, b mcItem) int {
		if a.group != b.group {
			ga, gb := &q.mcGroups[a.group].rec.MGID, &q.mcGroups[b.group].rec.MGID
			return bytesCompare(ga[:], gb[:])
		}
		return cmp.Compare(a.member.GUID, b.member.GUID)
	})
	return recordsReply(q.req, mad.MCMemberRecordWords, len(out), func(b []byte, i int) {
		it := &out[i]
		g := &q.mcGroups[it.group]
		r := g.rec
		if it.hasMember && q.trusted {
			r.PortGID, r.JoinState, r.ProxyJoin = it.member.PortGID, it.member.JoinState, it.member.ProxyJoin
		}
		encodeRecord(b, &r, &g.echo)
	})
}

// prefixGID is the GID of a port of the subnet prefix.
func prefixGID(prefix, guid uint64) wire.GID {
	var g wire.GID
	binary.BigEndian.PutUint64(g[:8], prefix)
	binary.BigEndian.PutUint64(g[8:], guid)
	return g
}
