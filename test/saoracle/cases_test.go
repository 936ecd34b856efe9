package saoracle

import (
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// oracleCase is one request, sent to both SAs in the same order (the
// cases build on each other's groups).
type oracleCase struct {
	name string
	// fromB sends the request from host B (over the fabric on softsm's
	// side); otherwise from A (softsm's raw SA port, which acts for the
	// record's port).
	fromB bool
	req   func() mad.MAD
}

// Groups of the cases (ff12: link-local, signature 0xabcd: an
// application's own MGID).
var (
	mgid1 = wire.GID{0xff, 0x12, 0xab, 0xcd, 15: 0x01}
	mgid2 = wire.GID{0xff, 0x12, 0xab, 0xcd, 15: 0x02}
	mgid3 = wire.GID{0xff, 0x12, 0xab, 0xcd, 15: 0x03}
	mgid4 = wire.GID{0xff, 0x15, 0xab, 0xcd, 15: 0x04} // site-local
	mgid5 = wire.GID{0xff, 0x12, 0xab, 0xcd, 15: 0x05}
	none  = wire.GID{0xff, 0x12, 0xab, 0xcd, 15: 0xee}
)

const qkey = 0x00012345

// mcmr builds an MCMemberRecord request: the fields of f, mask comp.
func mcmr(method uint8, comp uint64, f mad.MCMemberFields) mad.MAD {
	m := mad.NewSARequest(method, mad.AttrMCMemberRecord, 0, comp)
	m.MCMemberRecord().Encode(&f)
	return m
}

// pr builds a PathRecord request: mask comp, the record filled by set.
func pr(method uint8, comp uint64, set func(mad.PathRecord)) func() mad.MAD {
	return func() mad.MAD {
		m := mad.NewSARequest(method, mad.AttrPathRecord, 0, comp)
		set(m.PathRecord())
		return m
	}
}

// cmaPath is the mask of the kernel's cma_query_ib_route for an IPv4 id
// without TOS (its QoSClass bit aside).
const cmaPath = mad.PathCompDGID | mad.PathCompSGID | mad.PathCompTClass | mad.PathCompPKey | mad.PathCompNumbPath | mad.PathCompReversible

// cmaRec fills the record cma_query_ib_route sends.
func cmaRec(r mad.PathRecord, sgid, dgid wire.GID) {
	r.SetSGID(sgid)
	r.SetDGID(dgid)
	r.SetPKey(0xFFFF)
	r.SetNumbPath(1)
	r.SetReversible(true)
}

// join is a PS_UDP-style record (what the RDMA CM sends) for port guid.
func (e caseEnv) join(mgid wire.GID, guid uint64, js uint8) mad.MCMemberFields {
	return mad.MCMemberFields{MGID: mgid, PortGID: e.gid(guid), QKey: qkey, PKey: 0xFFFF, JoinState: js}
}

func cases(e caseEnv) []oracleCase {
	cpi := func(method uint8, version uint8) func() mad.MAD {
		return func() mad.MAD {
			m := mad.NewSARequest(method, mad.AttrClassPortInfo, 0, 0)
			m.SetClassVersion(version)
			return m
		}
	}
	set := func(comp uint64, f mad.MCMemberFields) func() mad.MAD {
		return func() mad.MAD { return mcmr(mad.MethodSet, comp, f) }
	}
	del := func(comp uint64, f mad.MCMemberFields) func() mad.MAD {
		return func() mad.MAD { return mcmr(mad.MethodDelete, comp, f) }
	}
	get := func(method uint8, comp uint64, smKey uint64, f mad.MCMemberFields) func() mad.MAD {
		return func() mad.MAD {
			m := mcmr(method, comp, f)
			m.SetSMKey(smKey)
			return m
		}
	}
	withProxyByte := func(f mad.MCMemberFields, b49 uint8, reserved ...byte) func() mad.MAD {
		return func() mad.MAD {
			m := mcmr(mad.MethodSet, mad.CompCreateRequired, f)
			d := m.SAData()
			d[mad.MCMemberRecordEchoOffset] = b49
			copy(d[mad.MCMemberRecordEchoOffset+1:], reserved)
			return m
		}
	}
	a, b := e.a, e.b
	create := mad.CompCreateRequired
	ipoib := mad.CompIPoIBJoin
	ipoibRec := func(mgid wire.GID, guid uint64, js uint8) mad.MCMemberFields {
		f := e.join(mgid, guid, js)
		f.MTUSelector, f.MTU, f.RateSelector, f.Rate = mad.SelExactly, mad.MTU2048, mad.SelExactly, mad.Rate10Gbps
		return f
	}
	bcast := ipoibRec(wire.GID{0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 12: 0xff, 13: 0xff, 14: 0xff, 15: 0xff}, a, mad.JoinFullMember)
	bcast.QKey = 0x0B1B
	zero := e.join(wire.GID{}, a, mad.JoinFullMember)
	return []oracleCase{
		{name: "cpi-get", req: cpi(mad.MethodGet, mad.SAClassVersion)},
		{name: "cpi-get-v1", req: cpi(mad.MethodGet, 1)},
		{name: "cpi-gettable", req: cpi(mad.MethodGetTable, mad.SAClassVersion)},
		{name: "cpi-set", req: cpi(mad.MethodSet, mad.SAClassVersion)},
		{name: "cpi-getmulti", req: cpi(mad.MethodGetMulti, mad.SAClassVersion)},

		{name: "create-full", req: set(create, e.join(mgid1, a, mad.JoinFullMember))},
		{name: "create-again", req: set(create, e.join(mgid1, a, mad.JoinFullMember))},
		{name: "join-existing-B", fromB: true, req: set(create, e.join(mgid1, b, mad.JoinFullMember))},
		{name: "join-nonmember-B", fromB: true, req: set(mad.CompJoinRequired, e.join(mgid1, b, mad.JoinNonMember))},
		{name: "create-mgid-zero", req: set(create, zero)},
		{name: "create-sendonly-full", req: set(create, e.join(mgid2, a, mad.JoinSendOnlyFullMember))},
		{name: "join-sendonly-nonmember-B", fromB: true, req: set(mad.CompJoinRequired|mad.CompQKey, e.join(mgid2, b, mad.JoinSendOnlyNonMember))},
		{name: "create-ipoib-mask", req: set(ipoib, ipoibRec(mgid4, a, mad.JoinFullMember))},
		{name: "join-broadcast", req: set(ipoib, bcast)},
		{name: "proxy-create-B-for-A", fromB: true, req: withProxyByte(e.join(mgid3, a, mad.JoinFullMember), 0x80, 0x5a, 0xa5)},
		{name: "proxy-join-B-for-A-reserved", fromB: true, req: withProxyByte(e.join(mgid1, a, mad.JoinNonMember), 0x81, 0x01, 0x02)},
		{name: "create-B-plain", fromB: true, req: set(create, e.join(mgid5, b, mad.JoinFullMember))},
		{name: "proxy-join-B-for-A-no-bit", fromB: true, req: set(create, e.join(mgid5, a, mad.JoinFullMember))},

		{name: "set-mask-no-joinstate", req: set(mad.CompMGID|mad.CompPortGID, e.join(mgid1, a, mad.JoinFullMember))},
		{name: "create-mask-insufficient", req: set(mad.CompJoinRequired, e.join(none, a, mad.JoinFullMember))},
		{name: "create-nonmember", req: set(create, e.join(none, a, mad.JoinNonMember))},
		{name: "join-qkey-mismatch", fromB: true, req: set(create, func() mad.MCMemberFields {
			f := e.join(mgid1, b, mad.JoinFullMember)
			f.QKey = 0x0BAD0000
			return f
		}())},
		{name: "join-pkey-mismatch", fromB: true, req: set(create, func() mad.MCMemberFields {
			f := e.join(mgid1, b, mad.JoinFullMember)
			f.PKey = 0x8001
			return f
		}())},
		{name: "join-bad-mtu", req: set(create|mad.CompMTUSelector|mad.CompMTU, func() mad.MCMemberFields {
			f := e.join(mgid1, a, mad.JoinFullMember)
			f.MTUSelector, f.MTU = mad.SelExactly, 7
			return f
		}())},
		{name: "join-unknown-port", req: set(create, e.join(mgid1, 0x0002c90300abcdef, mad.JoinFullMember))},
		{name: "join-foreign-prefix", req: set(create, func() mad.MCMemberFields {
			f := e.join(mgid1, a, mad.JoinFullMember)
			f.PortGID[0], f.PortGID[1] = 0xfe, 0xc0
			return f
		}())},

		{name: "get-by-mgid", req: get(mad.MethodGet, mad.CompMGID, 0, e.join(mgid1, a, 0))},
		{name: "get-by-mgid-port-trusted", req: get(mad.MethodGet, mad.CompMGID|mad.CompPortGID, 1, e.join(mgid1, a, 0))},
		{name: "get-by-mgid-port-B-trusted", fromB: true, req: get(mad.MethodGet, mad.CompMGID|mad.CompPortGID, 1, e.join(mgid1, b, 0))},
		{name: "get-proxy-member-trusted", req: get(mad.MethodGet, mad.CompMGID|mad.CompPortGID, 1, e.join(mgid3, a, 0))},
		{name: "get-proxy-created-untrusted", req: get(mad.MethodGet, mad.CompMGID, 0, e.join(mgid3, a, 0))},
		{name: "get-proxy-joined-trusted", req: get(mad.MethodGet, mad.CompMGID|mad.CompPortGID, 1, e.join(mgid5, a, 0))},
		{name: "get-none", req: get(mad.MethodGet, mad.CompMGID, 0, e.join(none, a, 0))},
		{name: "get-all", req: get(mad.MethodGet, 0, 0, mad.MCMemberFields{})},
		{name: "gettable-all", req: get(mad.MethodGetTable, 0, 0, mad.MCMemberFields{})},
		{name: "gettable-all-trusted", req: get(mad.MethodGetTable, 0, 1, mad.MCMemberFields{})},
		{name: "gettable-mgid1-trusted", req: get(mad.MethodGetTable, mad.CompMGID, 1, e.join(mgid1, a, 0))},
		{name: "gettable-none", req: get(mad.MethodGetTable, mad.CompMGID, 0, e.join(none, a, 0))},

		{name: "leave-B-nonmember", fromB: true, req: del(mad.CompJoinRequired, e.join(mgid1, b, mad.JoinNonMember))},
		{name: "leave-B-not-held", fromB: true, req: del(mad.CompJoinRequired, e.join(mgid1, b, mad.JoinSendOnlyNonMember))},
		{name: "leave-A-full", req: del(mad.CompJoinRequired, e.join(mgid1, a, mad.JoinFullMember|mad.JoinNonMember))},
		{name: "leave-B-full", fromB: true, req: del(mad.CompJoinRequired, e.join(mgid1, b, mad.JoinFullMember))},
		{name: "get-after-leave", req: get(mad.MethodGet, mad.CompMGID, 0, e.join(mgid1, a, 0))},
		{name: "leave-unknown-group", req: del(mad.CompJoinRequired, e.join(none, a, mad.JoinFullMember))},
		{name: "leave-mask-insufficient", req: del(mad.CompMGID, e.join(mgid2, a, mad.JoinSendOnlyFullMember))},

		// PathRecord, with the mask of the kernel's cma_query_ib_route
		// (DGID, SGID, TClass, P_Key, NumbPath 1, Reversible) and others.
		{name: "pr-A-to-B", req: pr(mad.MethodGet, cmaPath, func(r mad.PathRecord) { cmaRec(r, e.gid(a), e.gid(b)) })},
		{name: "pr-A-to-A", req: pr(mad.MethodGet, cmaPath, func(r mad.PathRecord) { cmaRec(r, e.gid(a), e.gid(a)) })},
		{name: "pr-B-to-A-from-B", fromB: true, req: pr(mad.MethodGet, cmaPath, func(r mad.PathRecord) { cmaRec(r, e.gid(b), e.gid(a)) })},
		{name: "pr-serviceid-qos", req: pr(mad.MethodGet, cmaPath|mad.PathCompServiceID|mad.PathCompQoSClass, func(r mad.PathRecord) {
			cmaRec(r, e.gid(a), e.gid(b))
			r.SetServiceID(0x0000000001064791)
			r.SetQoSClass(0x123)
		})},
		{name: "pr-flow-hop", req: pr(mad.MethodGet, mad.PathCompSGID|mad.PathCompDGID|mad.PathCompFlowLabel|mad.PathCompHopLimit, func(r mad.PathRecord) {
			r.SetSGID(e.gid(a))
			r.SetDGID(e.gid(b))
			r.SetFlowLabel(0x12345)
			r.SetHopLimit(5)
		})},
		{name: "pr-tclass", req: pr(mad.MethodGet, cmaPath, func(r mad.PathRecord) { cmaRec(r, e.gid(a), e.gid(b)); r.SetTClass(0x20) })},
		{name: "pr-dgid-only", req: pr(mad.MethodGet, mad.PathCompDGID, func(r mad.PathRecord) { r.SetDGID(e.gid(b)) })},
		{name: "pr-foreign-prefix", req: pr(mad.MethodGet, cmaPath, func(r mad.PathRecord) {
			g := e.gid(b)
			g[0], g[1] = 0xfe, 0xc0
			cmaRec(r, e.gid(a), g)
		})},
		{name: "pr-mcast-sl", req: pr(mad.MethodGet, cmaPath|mad.PathCompSL, func(r mad.PathRecord) { cmaRec(r, e.gid(a), mgid2); r.SetSL(3) })},
		{name: "pr-mcast-nonmember-sgid", fromB: true, req: pr(mad.MethodGet, cmaPath, func(r mad.PathRecord) { cmaRec(r, e.gid(b), mgid4) })},
		{name: "pr-unknown-dgid", req: pr(mad.MethodGet, cmaPath, func(r mad.PathRecord) { cmaRec(r, e.gid(a), e.gid(0x0002c90300abcdef)) })},
		{name: "pr-unknown-sgid", req: pr(mad.MethodGet, cmaPath, func(r mad.PathRecord) { cmaRec(r, e.gid(0x0002c90300abcdef), e.gid(b)) })},
		{name: "pr-sl-3", req: pr(mad.MethodGet, cmaPath|mad.PathCompSL, func(r mad.PathRecord) { cmaRec(r, e.gid(a), e.gid(b)); r.SetSL(3) })},
		{name: "pr-mtu-4096-exactly", req: pr(mad.MethodGet, cmaPath|mad.PathCompMTU|mad.PathCompMTUSelector, func(r mad.PathRecord) {
			cmaRec(r, e.gid(a), e.gid(b))
			r.SetMTUSelector(mad.SelExactly)
			r.SetMTU(mad.MTU4096)
		})},
		{name: "pr-bad-mtu", req: pr(mad.MethodGet, cmaPath|mad.PathCompMTU|mad.PathCompMTUSelector, func(r mad.PathRecord) {
			cmaRec(r, e.gid(a), e.gid(b))
			r.SetMTUSelector(mad.SelExactly)
			r.SetMTU(7)
		})},
		{name: "pr-half-serviceid", req: pr(mad.MethodGet, cmaPath|1, func(r mad.PathRecord) { cmaRec(r, e.gid(a), e.gid(b)) })},
		{name: "pr-pkey-other", req: pr(mad.MethodGet, cmaPath, func(r mad.PathRecord) { cmaRec(r, e.gid(a), e.gid(b)); r.SetPKey(0x8001) })},
		{name: "pr-mcast-existing", req: pr(mad.MethodGet, cmaPath, func(r mad.PathRecord) { cmaRec(r, e.gid(a), mgid2) })},
		{name: "pr-mcast-broadcast", req: pr(mad.MethodGet, mad.PathCompDGID, func(r mad.PathRecord) { r.SetDGID(bcast.MGID) })},
		{name: "pr-mcast-none", req: pr(mad.MethodGet, cmaPath, func(r mad.PathRecord) { cmaRec(r, e.gid(a), none) })},
		{name: "pr-set", req: pr(mad.MethodSet, cmaPath, func(r mad.PathRecord) { cmaRec(r, e.gid(a), e.gid(b)) })},

		{name: "getmulti-mcmr", req: get(mad.MethodGetMulti, mad.CompMGID, 0, e.join(mgid2, a, 0))},
		{name: "gettracetable-mcmr", req: get(mad.MethodGetTraceTbl, mad.CompMGID, 0, e.join(mgid2, a, 0))},
		{name: "send-mcmr", req: get(mad.MethodSend, mad.CompMGID, 0, e.join(mgid2, a, 0))},
		{name: "mcmr-class-version-1", req: func() mad.MAD {
			m := mcmr(mad.MethodGet, mad.CompMGID, e.join(mgid2, a, 0))
			m.SetClassVersion(1)
			return m
		}},
		{name: "unknown-attribute", req: func() mad.MAD { return mad.NewSARequest(mad.MethodGet, 0x00ff, 0, 0) }},
	}
}
