package sa

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// The four pre-registered ports of the issue: GUIDs 0x100001, 0x100003,
// 0x100005, 0x100007 → GIDs fe80::10:1 ….
const (
	guidA = 0x100001
	guidB = 0x100003
	guidC = 0x100005
	guidD = 0x100007
)

func gid(s string) wire.GID {
	g, err := wire.ParseGID(s)
	if err != nil {
		panic(err)
	}
	return g
}

func portGID(guid uint64) wire.GID {
	var g wire.GID
	binary.BigEndian.PutUint64(g[:8], DefaultSubnetPrefix)
	binary.BigEndian.PutUint64(g[8:], guid)
	return g
}

func newSA(cfg Config) *SA {
	s := New(cfg)
	for _, g := range []uint64{guidA, guidB, guidC, guidD} {
		s.AddPort(Port{GUID: g})
	}
	return s
}

var nextTID uint64 = 0x1000

// req builds an SA MCMemberRecord request.
func req(method uint8, comp uint64, f mad.MCMemberFields) mad.MAD {
	nextTID++
	m := mad.NewSARequest(method, mad.AttrMCMemberRecord, nextTID, comp)
	m.MCMemberRecord().Encode(&f)
	return m
}

// udpJoin is the RDMA CM PS_UDP join record (mask 0x130C7).
func udpJoin(mgid wire.GID, guid uint64, js uint8) mad.MCMemberFields {
	return mad.MCMemberFields{MGID: mgid, PortGID: portGID(guid), QKey: 0x01234567, PKey: 0xFFFF, JoinState: js}
}

// groupOf returns the snapshot of one group.
func groupOf(t *testing.T, s *SA, mgid wire.GID) Group {
	t.Helper()
	for _, g := range s.Groups() {
		if g.Rec.MGID == mgid {
			return g
		}
	}
	t.Fatalf("no group %v", mgid)
	return Group{}
}

// raw sends from the raw SA port.
var raw = From{Raw: true}

// one runs a request and expects exactly one response MAD.
func one(t *testing.T, s *SA, m mad.MAD, from From) mad.MAD {
	t.Helper()
	r := s.Handle(m, from)
	if len(r) != 1 {
		t.Fatalf("%d responses, want 1", len(r))
	}
	if r[0].TID() != m.TID() {
		t.Fatalf("TID %#x, want %#x", r[0].TID(), m.TID())
	}
	return r[0]
}

func mustOK(t *testing.T, s *SA, m mad.MAD, from From) mad.MCMemberFields {
	t.Helper()
	r := one(t, s, m, from)
	if r.Status() != 0 {
		t.Fatalf("status %#04x, want success", r.Status())
	}
	return r.MCMemberRecord().Fields()
}

var (
	mgidUDP   = gid("ff12:4001:ffff::601:203")
	mgidUDP2  = gid("ff12:4001:ffff::601:204")
	mgidIPoIB = gid("ff12:401b:ffff::601:203")
)

// ruleCase is one row of the SA rule table: setup requests that must
// succeed, then a request and the expected status and response method.
type ruleCase struct {
	name   string
	ref    string // the rule (OpenSM's osm_sa_mcmember_record.c), or the case it re-expresses
	cfg    Config
	setup  []mad.MAD
	req    mad.MAD
	from   From
	status uint16
	method uint8
	drop   bool // no answer (OpenSM sends none)
	check  func(t *testing.T, s *SA, r mad.MAD)
}

func TestRuleTable(t *testing.T) {
	full := mad.CompCreateRequired
	on := Config{SendOnlySupport: true}
	cases := []ruleCase{
		{name: "create UDP group", ref: "21", cfg: on,
			req: req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1)), status: 0, method: mad.MethodGetResp,
			check: func(t *testing.T, s *SA, r mad.MAD) {
				f := r.MCMemberRecord().Fields()
				if f.MLID != 0xC001 || f.MTUSelector != 2 || f.MTU != mad.MTU2048 || f.RateSelector != 2 ||
					f.Rate != mad.Rate10Gbps || f.PacketLifeTimeSelector != 2 || f.JoinState != 1 || f.Scope != 0 ||
					f.QKey != 0x01234567 || f.MGID != mgidUDP || f.PortGID != portGID(guidA) {
					t.Fatalf("record %+v", f)
				}
				if r.AttrOffset() != 7 || r.SMKey() != 0 {
					t.Fatal("header")
				}
			}},
		{name: "create with JoinState NonMember", ref: "22", cfg: on,
			req: req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 2)), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "create with JoinState SendOnlyNonMember", ref: "22", cfg: on,
			req: req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 4)), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "create with mask 0x10003", ref: "22", cfg: on,
			req: req(mad.MethodSet, mad.CompJoinRequired, udpJoin(mgidUDP, guidA, 1)), status: mad.StatusInsufComps, method: mad.MethodGetResp},
		{name: "create missing TClass", ref: "22", cfg: on,
			req: req(mad.MethodSet, full&^mad.CompTClass, udpJoin(mgidUDP, guidA, 1)), status: mad.StatusInsufComps, method: mad.MethodGetResp},
		{name: "JoinState check precedes create mask", ref: "22 (OpenSM order)", cfg: on,
			req: req(mad.MethodSet, mad.CompJoinRequired, udpJoin(mgidUDP, guidA, 2)), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "Set without MGID bit", ref: "23", cfg: on,
			req: req(mad.MethodSet, full&^mad.CompMGID, udpJoin(mgidUDP, guidA, 1)), status: mad.StatusInsufComps, method: mad.MethodGetResp},
		{name: "Set without PortGID bit", ref: "23", cfg: on,
			req: req(mad.MethodSet, full&^mad.CompPortGID, udpJoin(mgidUDP, guidA, 1)), status: mad.StatusInsufComps, method: mad.MethodGetResp},
		{name: "Set without JoinState bit", ref: "23", cfg: on,
			req: req(mad.MethodSet, full&^mad.CompJoinState, udpJoin(mgidUDP, guidA, 1)), status: mad.StatusInsufComps, method: mad.MethodGetResp},
		{name: "Delete without JoinState bit", ref: "23", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req:   req(mad.MethodDelete, mad.CompMGID|mad.CompPortGID, udpJoin(mgidUDP, guidA, 1)), status: mad.StatusInsufComps, method: mad.MethodDeleteResp},
		{name: "Delete without MGID bit", ref: "23", cfg: on,
			req: req(mad.MethodDelete, mad.CompPortGID|mad.CompJoinState, udpJoin(mgidUDP, guidA, 1)), status: mad.StatusInsufComps, method: mad.MethodDeleteResp},
		{name: "join with another Q_Key", ref: "24", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidB, 1)
				f.QKey = 0x11111111
				return req(mad.MethodSet, full, f)
			}(), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "join with JoinState 0", ref: "24", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req:   req(mad.MethodSet, full, udpJoin(mgidUDP, guidB, 0)), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "join with another TClass", ref: "OpenSM: joining a group", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidB, 1)
				f.TClass = 3
				return req(mad.MethodSet, full, f)
			}(), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "join with another SL", ref: "OpenSM: joining a group", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidB, 1)
				f.SL = 1
				return req(mad.MethodSet, full, f)
			}(), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "join with another FlowLabel", ref: "OpenSM: joining a group", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidB, 1)
				f.FlowLabel = 5
				return req(mad.MethodSet, full, f)
			}(), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "join with another HopLimit", ref: "OpenSM: joining a group", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidB, 1)
				f.HopLimit = 5
				return req(mad.MethodSet, full|mad.CompHopLimit, f)
			}(), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "join with another P_Key base", ref: "OpenSM: joining a group", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidB, 1)
				f.PKey = 0x8001
				return req(mad.MethodSet, full, f)
			}(), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "join with the limited P_Key of the group", ref: "OpenSM: joining a group", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidB, 1)
				f.PKey = 0x7FFF
				return req(mad.MethodSet, full, f)
			}(), status: 0, method: mad.MethodGetResp},
		{name: "HopLimit not comp-masked is ignored", ref: "OpenSM: joining a group", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidB, 1)
				f.HopLimit = 5
				return req(mad.MethodSet, full, f)
			}(), status: 0, method: mad.MethodGetResp},
		{name: "MGID byte 0 0xFE", ref: "25", cfg: on,
			req: req(mad.MethodSet, full, udpJoin(gid("fe12:4001:ffff::601:203"), guidA, 1)), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "SA signature with link-local scope requested", ref: "25", cfg: on,
			req: req(mad.MethodSet, full, udpJoin(gid("ff12:a01b:fe80::1"), guidA, 1)), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "SA signature with site scope requested", ref: "OpenSM: creating a group", cfg: on,
			req: req(mad.MethodSet, full, udpJoin(gid("ff15:a01b:fe80::1"), guidA, 1)), status: 0, method: mad.MethodGetResp},
		{name: "reserved MGID flag bits", ref: "OpenSM: creating a group", cfg: on,
			req: req(mad.MethodSet, full, udpJoin(gid("ff32:4001:ffff::1"), guidA, 1)), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "IPoIB MGID without its P_Key's broadcast group", ref: "25", cfg: on,
			req: func() mad.MAD {
				f := udpJoin(gid("ff12:401b:8001::601:203"), guidA, 1)
				f.QKey = BroadcastQKey
				return req(mad.MethodSet, full, f)
			}(), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "IPoIB MGID with the broadcast Q_Key", ref: "25", cfg: on,
			req: func() mad.MAD {
				f := udpJoin(mgidIPoIB, guidA, 1)
				f.QKey = BroadcastQKey
				return req(mad.MethodSet, full, f)
			}(), status: 0, method: mad.MethodGetResp},
		{name: "IPoIB MGID with another Q_Key", ref: "25", cfg: on,
			req: req(mad.MethodSet, full, udpJoin(mgidIPoIB, guidA, 1)), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "IPoIB IPv6 MGID with the broadcast Q_Key", ref: "OpenSM: creating a group", cfg: on,
			req: func() mad.MAD {
				f := udpJoin(gid("ff12:601b:ffff::1:ff00:1"), guidA, 1)
				f.QKey = BroadcastQKey
				return req(mad.MethodSet, full, f)
			}(), status: 0, method: mad.MethodGetResp},
		{name: "create with SendOnlyFullMember", ref: "26", cfg: on,
			req: req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 8)), status: 0, method: mad.MethodGetResp,
			check: func(t *testing.T, s *SA, r mad.MAD) {
				if r.MCMemberRecord().JoinState() != 8 {
					t.Fatal("JoinState")
				}
				if rs := s.MulticastTable()[0xC001]; len(rs) != 0 {
					t.Fatalf("send-only member in forwarding table: %x", rs)
				}
			}},
		{name: "send-only leave deletes the group", ref: "26", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 8))},
			req:   req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(mgidUDP, guidA, 8)), status: 0, method: mad.MethodDeleteResp,
			check: func(t *testing.T, s *SA, r mad.MAD) {
				if r.MCMemberRecord().JoinState() != 0 {
					t.Fatal("remaining JoinState")
				}
				if len(s.Groups()) != 1 {
					t.Fatal("group still there")
				}
			}},
		{name: "send-only join without SA support", ref: "send-only needs SM support (ClassPortInfo CapabilityMask2 bit 12)", cfg: Config{},
			req: req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 8)), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "leave of an unknown MGID", ref: "27", cfg: on,
			req: req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(mgidUDP, guidA, 1)), status: mad.StatusReqInvalid, method: mad.MethodDeleteResp},
		{name: "leave of bits not held", ref: "27", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req:   req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(mgidUDP, guidA, 2)), status: mad.StatusReqInvalid, method: mad.MethodDeleteResp},
		{name: "leave with extra bits not held", ref: "27", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req:   req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(mgidUDP, guidA, 3)), status: mad.StatusReqInvalid, method: mad.MethodDeleteResp},
		{name: "leave by a non-member", ref: "27", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req:   req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(mgidUDP, guidB, 1)), status: mad.StatusReqInvalid, method: mad.MethodDeleteResp},
		{name: "second leave after the group died", ref: "27", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1)), req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(mgidUDP, guidA, 1))},
			req:   req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(mgidUDP, guidA, 1)), status: mad.StatusReqInvalid, method: mad.MethodDeleteResp},
		{name: "unknown port", ref: "OpenSM: creating a group", cfg: on,
			req: req(mad.MethodSet, full, udpJoin(mgidUDP, 0x999, 1)), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "PortGID with a foreign prefix", ref: "OpenSM: creating a group", cfg: on,
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidA, 1)
				f.PortGID[0], f.PortGID[1] = 0xfe, 0xc0
				return req(mad.MethodSet, full, f)
			}(), status: mad.StatusInvalidGID, method: mad.MethodGetResp},
		{name: "Delete with a foreign prefix", ref: "OpenSM: creating a group", cfg: on,
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidA, 1)
				f.PortGID[7] = 1
				return req(mad.MethodDelete, mad.CompJoinRequired, f)
			}(), status: mad.StatusInvalidGID, method: mad.MethodDeleteResp},
		{name: "fe80:: stands for the SM's prefix", ref: "OpenSM: creating a group",
			cfg: Config{SendOnlySupport: true, SubnetPrefix: 0xfec0000000000001},
			req: req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1)), status: 0, method: mad.MethodGetResp,
			check: func(t *testing.T, s *SA, r mad.MAD) {
				if r.MCMemberRecord().PortGID() != portGID(guidA) {
					t.Fatal("PortGID not echoed as sent")
				}
				if m := groupOf(t, s, mgidUDP).Members[0]; m.PortGID != gid("fec0:0:0:1::10:1") {
					t.Fatalf("stored PortGID %v", m.PortGID)
				}
			}},
		{name: "the SM's own prefix", ref: "OpenSM: creating a group",
			cfg: Config{SendOnlySupport: true, SubnetPrefix: 0xfec0000000000001},
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidA, 1)
				f.PortGID = gid("fec0:0:0:1::10:1")
				return req(mad.MethodSet, full, f)
			}(), status: 0, method: mad.MethodGetResp},
		{name: "P_Key with base 0", ref: "OpenSM: creating a group", cfg: on,
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidA, 1)
				f.PKey = 0x8000
				return req(mad.MethodSet, full, f)
			}(), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "group in a partition the port is not in", ref: "OpenSM: joining a group", cfg: on,
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidA, 1)
				f.PKey = 0x8001
				return req(mad.MethodSet, full, f)
			}(), status: mad.StatusReqInvalid, method: mad.MethodGetResp,
			check: func(t *testing.T, s *SA, r mad.MAD) {
				if len(s.Groups()) != 1 {
					t.Fatal("failed create left a group")
				}
			}},
		{name: "invalid MTU enum", ref: "OpenSM: creating a group, step 1", cfg: on,
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidA, 1)
				f.MTUSelector, f.MTU = 2, 7
				return req(mad.MethodSet, full|mad.CompMTU|mad.CompMTUSelector, f)
			}(), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "invalid rate enum", ref: "OpenSM: creating a group, step 1", cfg: on,
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidA, 1)
				f.RateSelector, f.Rate = 2, 1
				return req(mad.MethodSet, full|mad.CompRate|mad.CompRateSelector, f)
			}(), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "MTU greater than the port's", ref: "OpenSM: creating a group, step 6", cfg: on,
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidA, 1)
				f.MTUSelector, f.MTU = mad.SelGreaterThan, mad.MTU2048
				return req(mad.MethodSet, full|mad.CompMTU|mad.CompMTUSelector, f)
			}(), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "MTU exactly 4096 on a 2048 port", ref: "OpenSM: creating a group, step 6", cfg: on,
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidA, 1)
				f.MTUSelector, f.MTU = mad.SelExactly, mad.MTU4096
				return req(mad.MethodSet, full|mad.CompMTU|mad.CompMTUSelector, f)
			}(), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "MTU less than 2048", ref: "OpenSM: creating a group, step 6", cfg: on,
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidA, 1)
				f.MTUSelector, f.MTU = mad.SelLessThan, mad.MTU2048
				return req(mad.MethodSet, full|mad.CompMTU|mad.CompMTUSelector, f)
			}(), status: 0, method: mad.MethodGetResp,
			check: func(t *testing.T, s *SA, r mad.MAD) {
				if r.MCMemberRecord().MTU() != mad.MTU1024 || r.MCMemberRecord().MTUSelector() != 2 {
					t.Fatal("MTU")
				}
			}},
		{name: "rate exactly 40 Gb/s on a 10 Gb/s port", ref: "OpenSM: joining a group", cfg: on,
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidA, 1)
				f.RateSelector, f.Rate = mad.SelExactly, mad.Rate40Gbps
				return req(mad.MethodSet, full|mad.CompRate|mad.CompRateSelector, f)
			}(), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "join selector not met by the group", ref: "OpenSM: joining a group", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidB, 1)
				f.MTUSelector, f.MTU = mad.SelExactly, mad.MTU1024
				return req(mad.MethodSet, full|mad.CompMTU|mad.CompMTUSelector, f)
			}(), status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "MLID pool exhausted", ref: "OpenSM: MGID and MLID", cfg: Config{SendOnlySupport: true, MaxMLID: 0xC001},
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req:   req(mad.MethodSet, full, udpJoin(mgidUDP2, guidA, 1)), status: mad.StatusNoResources, method: mad.MethodGetResp},
		{name: "requested MLID honoured", ref: "OpenSM: MGID and MLID", cfg: on,
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidA, 1)
				f.MLID = 0xC123
				return req(mad.MethodSet, full, f)
			}(), status: 0, method: mad.MethodGetResp,
			check: func(t *testing.T, s *SA, r mad.MAD) {
				if r.MCMemberRecord().MLID() != 0xC123 {
					t.Fatal("MLID")
				}
			}},
		{name: "requested MLID in use", ref: "OpenSM: MGID and MLID", cfg: on,
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidA, 1)
				f.MLID = 0xC000
				return req(mad.MethodSet, full, f)
			}(), status: 0, method: mad.MethodGetResp,
			check: func(t *testing.T, s *SA, r mad.MAD) {
				if r.MCMemberRecord().MLID() != 0xC001 {
					t.Fatal("MLID")
				}
			}},
		{name: "modify another port's membership", ref: "OpenSM: joining by proxy", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req:   req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 2)), from: From{GUID: guidB},
			status: mad.StatusReqInvalid, method: mad.MethodGetResp},
		{name: "delete another port's membership", ref: "OpenSM: leaving by proxy", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req:   req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(mgidUDP, guidA, 1)), from: From{GUID: guidB},
			status: mad.StatusReqInvalid, method: mad.MethodDeleteResp},
		{name: "proxy join (shared P_Key)", ref: "OpenSM: creating by proxy", cfg: on,
			req: req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1)), from: From{GUID: guidB},
			status: 0, method: mad.MethodGetResp,
			check: func(t *testing.T, s *SA, r mad.MAD) {
				if !groupOf(t, s, mgidUDP).Members[0].ProxyJoin {
					t.Fatal("ProxyJoin not stored")
				}
				// A proxy membership may be changed by any port of the partition.
				r2 := one(t, s, req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(mgidUDP, guidA, 1)), From{GUID: guidC})
				if r2.Status() != 0 {
					t.Fatalf("proxy leave %#x", r2.Status())
				}
			}},
		{name: "ClassPortInfo", ref: "29", cfg: on,
			req: mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 7, 0), status: 0, method: mad.MethodGetResp,
			check: func(t *testing.T, s *SA, r mad.MAD) {
				c := r.ClassPortInfo()
				if !c.SendOnlyFullMemberSupported() || binary.BigEndian.Uint32(c[4:])&0x00020000 == 0 ||
					c.CapabilityMask() != mad.CapMaskUDMulticast || c.RespTimeValue() != DefaultRespTimeValue ||
					c.BaseVersion() != 1 || c.ClassVersion() != 2 || r.AttrOffset() != 0 {
					t.Fatalf("ClassPortInfo % x", []byte(c))
				}
			}},
		{name: "ClassPortInfo without send-only support", ref: "29", cfg: Config{},
			req: mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 7, 0), status: 0, method: mad.MethodGetResp,
			check: func(t *testing.T, s *SA, r mad.MAD) {
				if r.ClassPortInfo().SendOnlyFullMemberSupported() {
					t.Fatal("bit 12 set")
				}
			}},
		{name: "Set ClassPortInfo", ref: "OpenSM: no set handler for ClassPortInfo", cfg: on,
			req: mad.NewSARequest(mad.MethodSet, mad.AttrClassPortInfo, 7, 0), drop: true},
		{name: "Delete ClassPortInfo", ref: "OpenSM: no set handler for ClassPortInfo", cfg: on,
			req: mad.NewSARequest(mad.MethodDelete, mad.AttrClassPortInfo, 7, 0), drop: true},
		{name: "GetTable ClassPortInfo", ref: "osm_cpi_rcv_process", cfg: on,
			req: mad.NewSARequest(mad.MethodGetTable, mad.AttrClassPortInfo, 7, 0), status: mad.StatusReqInvalid, method: mad.MethodGetTableResp},
		{name: "GetMulti MCMemberRecord", ref: "OpenSM ERR 1B21 (GetMulti reaches the handler; test/saoracle)", cfg: on,
			req: req(mad.MethodGetMulti, full, udpJoin(mgidUDP, guidA, 1)), status: mad.StatusUnsupportedMethodAttr, method: mad.MethodGetMulti | mad.MethodResp},
		{name: "GetMulti ClassPortInfo", ref: "OpenSM ERR 1403 (test/saoracle)", cfg: on,
			req: mad.NewSARequest(mad.MethodGetMulti, mad.AttrClassPortInfo, 7, 0), status: mad.StatusReqInvalid, method: mad.MethodGetMulti | mad.MethodResp},
		{name: "unsupported MCMemberRecord method", ref: "OpenSM ERR 1A05", cfg: on,
			req: req(mad.MethodGetTraceTbl, full, udpJoin(mgidUDP, guidA, 1)), drop: true},
		{name: "unsupported attribute", ref: "OpenSM ERR 1A01", cfg: on,
			req: mad.NewSARequest(mad.MethodGet, 0x0011, 7, 0), drop: true},
		{name: "unsupported attribute 0x0039", ref: "OpenSM ERR 1A01", cfg: on,
			req: mad.NewSARequest(mad.MethodGet, 0x0039, 7, 0), drop: true},
		{name: "ClassPortInfo class version 1", ref: "OpenSM cpi_rcv_respond", cfg: on,
			req: func() mad.MAD {
				m := mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 7, 0)
				m.SetClassVersion(1)
				return m
			}(), status: 0, method: mad.MethodGetResp,
			check: func(t *testing.T, s *SA, r mad.MAD) {
				c := r.ClassPortInfo()
				if r.ClassVersion() != 1 || c.ClassVersion() != 2 || !c.SendOnlyFullMemberSupported() || r.AttrOffset() != 0 {
					t.Fatalf("header version %d, ClassPortInfo % x", r.ClassVersion(), []byte(c))
				}
			}},
		{name: "ClassPortInfo class version 3", ref: "SA MAD status", cfg: on,
			req: func() mad.MAD {
				m := mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 7, 0)
				m.SetClassVersion(3)
				return m
			}(), status: mad.StatusBadVersion, method: mad.MethodGetResp},
		{name: "MCMemberRecord class version 1", ref: "SA MAD status", cfg: on,
			req: func() mad.MAD {
				m := req(mad.MethodGet, mad.CompMGID, udpJoin(mgidUDP, guidA, 0))
				m.SetClassVersion(1)
				return m
			}(), status: mad.StatusBadVersion, method: mad.MethodGetResp},
		{name: "RMPP ACK is not a request", ref: "mad_rmpp.c", cfg: on,
			req: func() mad.MAD {
				m := req(mad.MethodGetTable, 0, mad.MCMemberFields{})
				m.SetRMPPVersion(mad.RMPPVersion1)
				m.SetRMPPType(mad.RMPPTypeAck)
				m.SetRMPPFlags(mad.RMPPFlagActive)
				return m
			}(), drop: true},
		{name: "Get of no record", ref: "SA MAD status", cfg: on,
			req: req(mad.MethodGet, mad.CompMGID, udpJoin(mgidUDP, guidA, 0)), status: mad.StatusNoRecords, method: mad.MethodGetResp},
		{name: "Get of several records", ref: "SA MAD status", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req:   req(mad.MethodGet, 0, mad.MCMemberFields{}), status: mad.StatusTooManyRecords, method: mad.MethodGetResp},
		{name: "Get of one group", ref: "SA MAD status", cfg: on,
			setup: []mad.MAD{req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1))},
			req:   req(mad.MethodGet, mad.CompMGID, udpJoin(mgidUDP, guidB, 0)), status: 0, method: mad.MethodGetResp,
			check: func(t *testing.T, s *SA, r mad.MAD) {
				f := r.MCMemberRecord().Fields()
				if f.MLID != 0xC001 || f.JoinState != 0 || !f.PortGID.IsZero() || f.QKey != 0x01234567 {
					t.Fatalf("%+v", f)
				}
			}},
		{name: "GetTable error", ref: "SA MAD status", cfg: on,
			req: func() mad.MAD {
				f := udpJoin(mgidUDP, guidA, 1)
				f.MTUSelector, f.MTU = 2, 0
				m := req(mad.MethodGetTable, mad.CompMTU|mad.CompMTUSelector, f)
				m.SetSMKey(5)
				return m
			}(), status: mad.StatusReqInvalid, method: mad.MethodGetTableResp,
			check: func(t *testing.T, s *SA, r mad.MAD) {
				if r.AttrOffset() != 0 || r.SMKey() != 0 {
					t.Fatal("GetTable error header")
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newSA(c.cfg)
			for i, m := range c.setup {
				if r := mustOK(t, s, m, raw); r.JoinState == 0xFF {
					t.Fatalf("setup %d", i)
				}
			}
			from := c.from
			if from == (From{}) {
				from = raw
			}
			if c.drop {
				if rs := s.Handle(c.req, from); rs != nil {
					t.Fatalf("[%s] answered status %#04x, want no answer", c.ref, rs[0].Status())
				}
				return
			}
			r := one(t, s, c.req, from)
			if r.Status() != c.status {
				t.Fatalf("[%s] status %#04x, want %#04x", c.ref, r.Status(), c.status)
			}
			if r.Method() != c.method {
				t.Fatalf("[%s] method %#02x, want %#02x", c.ref, r.Method(), c.method)
			}
			if r.SMKey() != 0 {
				t.Fatal("SM_Key not zeroed")
			}
			if c.check != nil {
				c.check(t, s, r)
			}
		})
	}
}

// Item 28: zero MGID twice on a fresh SA.
func TestSAAssignedMGID(t *testing.T) {
	s := newSA(Config{})
	var got []string
	for range 2 {
		f := mustOK(t, s, req(mad.MethodSet, mad.CompCreateRequired, udpJoin(wire.GID{}, guidA, 1)), raw)
		got = append(got, f.MGID.String())
	}
	if got[0] != "ff12:a01b:fe80::" || got[1] != "ff12:a01b:fe80::100:0:0" {
		t.Fatalf("assigned %v", got)
	}
	// With a comp-masked scope the MGID takes it.
	f := udpJoin(wire.GID{}, guidA, 1)
	f.Scope = mad.ScopeSiteLocal
	r := mustOK(t, s, req(mad.MethodSet, mad.CompCreateRequired|mad.CompScope, f), raw)
	if r.MGID.String() != "ff15:a01b:fe80::200:0:0" || r.Scope != mad.ScopeSiteLocal {
		t.Fatalf("scoped MGID %v scope %d", r.MGID, r.Scope)
	}
	// The counter skips MGIDs in use and lives as long as the SA.
	if r := mustOK(t, s, req(mad.MethodSet, mad.CompCreateRequired, udpJoin(wire.GID{}, guidB, 1)), raw); r.MGID.String() != "ff12:a01b:fe80::300:0:0" {
		t.Fatalf("fourth %v", r.MGID)
	}
}

func TestBroadcastGroup(t *testing.T) {
	s := newSA(Config{})
	g := s.Groups()
	if len(g) != 1 || !g[0].WellKnown {
		t.Fatalf("groups %+v", g)
	}
	b := g[0].Rec
	if b.MGID.String() != "ff12:401b:ffff::ffff:ffff" || b.MLID != 0xC000 || b.QKey != 0x0B1B || b.MTU != 4 ||
		b.Rate != 3 || b.SL != 0 || b.PKey != 0xFFFF || b.Scope != 2 || b.MTUSelector != 2 || b.RateSelector != 2 {
		t.Fatalf("broadcast %+v", b)
	}
	// The IPoIB join of the kernel: mask 0x173F7 from the broadcast template.
	f := b
	f.PortGID, f.JoinState = portGID(guidA), 1
	r := mustOK(t, s, req(mad.MethodSet, mad.CompIPoIBJoin, f), raw)
	if r.MLID != 0xC000 || r.JoinState != 1 {
		t.Fatalf("%+v", r)
	}
	// The last full member leaves: the well-known group stays, empty.
	mustOK(t, s, req(mad.MethodDelete, mad.CompJoinRequired, f), raw)
	g = s.Groups()
	if len(g) != 1 || len(g[0].Members) != 0 {
		t.Fatalf("after leave %+v", g)
	}
}

func TestJoinStateArithmetic(t *testing.T) {
	s := newSA(Config{SendOnlySupport: true})
	full := mad.CompCreateRequired
	if r := mustOK(t, s, req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1)), raw); r.JoinState != 1 {
		t.Fatal(r.JoinState)
	}
	if r := mustOK(t, s, req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 2)), raw); r.JoinState != 3 {
		t.Fatalf("OR: %d", r.JoinState)
	}
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(mgidUDP, guidB, 1)), raw)
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(mgidUDP, guidC, 2)), raw)
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(mgidUDP, guidD, 8)), raw)
	if got := s.MulticastTable()[0xC001]; fmt.Sprint(got) != fmt.Sprint([]uint64{guidA, guidB, guidC}) {
		t.Fatalf("receivers %x", got)
	}
	// A leaves its full bit; B is still full, so A stays as NonMember.
	if r := mustOK(t, s, req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(mgidUDP, guidA, 1)), raw); r.JoinState != 2 {
		t.Fatalf("remaining %d", r.JoinState)
	}
	// B leaves: D (send-only full) keeps the group alive.
	mustOK(t, s, req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(mgidUDP, guidB, 1)), raw)
	if len(s.Groups()) != 2 {
		t.Fatal("group died with a send-only full member left")
	}
	// D leaves: no full-type member left → group deleted with A and C.
	v := s.Version()
	mustOK(t, s, req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(mgidUDP, guidD, 8)), raw)
	if len(s.Groups()) != 1 || s.Version() == v {
		t.Fatalf("group not deleted: %+v", s.Groups())
	}
	if _, ok := s.MulticastTable()[0xC001]; ok {
		t.Fatal("MLID still in the table")
	}
	// The MLID is free again.
	if r := mustOK(t, s, req(mad.MethodSet, full, udpJoin(mgidUDP2, guidA, 1)), raw); r.MLID != 0xC001 {
		t.Fatalf("MLID %#x", r.MLID)
	}
}

func TestLeaveAll(t *testing.T) {
	s := newSA(Config{SendOnlySupport: true})
	full := mad.CompCreateRequired
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1)), raw)
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(mgidUDP, guidB, 2)), raw)
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(mgidUDP2, guidB, 1)), raw)
	f := s.Groups()[0].Rec
	f.PortGID, f.JoinState = portGID(guidA), 1
	mustOK(t, s, req(mad.MethodSet, mad.CompIPoIBJoin, f), raw)
	if !s.LeaveAll(guidA) {
		t.Fatal("no change")
	}
	// mgidUDP died (B was only NonMember); mgidUDP2 remains; broadcast empty.
	if g := s.Groups(); len(g) != 2 || len(groupOf(t, s, BroadcastMGID).Members) != 0 || len(groupOf(t, s, mgidUDP2).Members) != 1 {
		t.Fatalf("%+v", g)
	}
	if s.LeaveAll(guidA) {
		t.Fatal("second LeaveAll changed something")
	}
	s.RemovePort(guidB)
	if len(s.Groups()) != 1 || s.HasPort(guidB) {
		t.Fatal("RemovePort")
	}
	r := one(t, s, req(mad.MethodSet, full, udpJoin(mgidUDP, guidB, 1)), raw)
	if r.Status() != mad.StatusReqInvalid {
		t.Fatal("removed port can still join")
	}
}

func TestQueries(t *testing.T) {
	s := newSA(Config{SendOnlySupport: true})
	full := mad.CompCreateRequired
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(mgidUDP, guidA, 1)), raw)
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(mgidUDP, guidB, 2)), raw)
	mustOK(t, s, req(mad.MethodSet, full, udpJoin(mgidUDP2, guidC, 8)), raw)

	table := func(m mad.MAD, from From) []mad.MCMemberFields {
		t.Helper()
		var r mad.Reassembler
		for _, seg := range s.Handle(m, from) {
			if seg.Status() != 0 || seg.Method() != mad.MethodGetTableResp || seg.TID() != m.TID() {
				t.Fatalf("segment status %#x method %#x", seg.Status(), seg.Method())
			}
			done, data, err := r.Add(seg)
			if err != nil {
				t.Fatal(err)
			}
			if done {
				var out []mad.MCMemberFields
				for i := 0; i+mad.MCMemberRecordStride <= len(data); i += mad.MCMemberRecordStride {
					out = append(out, mad.MCMemberRecord(data[i:]).Fields())
				}
				return out
			}
		}
		t.Fatal("no complete table")
		return nil
	}
	// Untrusted: one record per group, PortGID/JoinState zero.
	recs := table(req(mad.MethodGetTable, 0, mad.MCMemberFields{}), raw)
	if len(recs) != 3 {
		t.Fatalf("%d records", len(recs))
	}
	for _, r := range recs {
		if !r.PortGID.IsZero() || r.JoinState != 0 {
			t.Fatalf("untrusted record leaks %+v", r)
		}
	}
	// Trusted (SM_Key 1): one record per member.
	m := req(mad.MethodGetTable, 0, mad.MCMemberFields{})
	m.SetSMKey(DefaultSMKey)
	recs = table(m, raw)
	if len(recs) != 3 || recs[0].PortGID != portGID(guidA) || recs[0].JoinState != 1 ||
		recs[1].PortGID != portGID(guidB) || recs[1].JoinState != 2 || recs[2].JoinState != 8 {
		t.Fatalf("trusted %+v", recs)
	}
	// Trusted, filtered by JoinState.
	f := mad.MCMemberFields{JoinState: 2}
	m = req(mad.MethodGetTable, mad.CompJoinState, f)
	m.SetSMKey(DefaultSMKey)
	if recs = table(m, raw); len(recs) != 1 || recs[0].PortGID != portGID(guidB) {
		t.Fatalf("by JoinState %+v", recs)
	}
	// By PortGID: the member's own record.
	if recs = table(req(mad.MethodGetTable, mad.CompPortGID, udpJoin(wire.GID{}, guidC, 0)), raw); len(recs) != 1 || recs[0].MGID != mgidUDP2 {
		t.Fatalf("by PortGID %+v", recs)
	}
	// By MLID.
	if recs = table(req(mad.MethodGetTable, mad.CompMLID, mad.MCMemberFields{MLID: 0xC000}), raw); len(recs) != 1 || recs[0].MGID != BroadcastMGID {
		t.Fatalf("by MLID %+v", recs)
	}
	// Empty table: one segment, AttributeOffset 0.
	segs := s.Handle(req(mad.MethodGetTable, mad.CompMLID, mad.MCMemberFields{MLID: 0xD000}), raw)
	if len(segs) != 1 || segs[0].AttrOffset() != 0 || segs[0].Status() != 0 || segs[0].PayloadLength() != 20 {
		t.Fatalf("empty table: %d segs offset %d paylen %d", len(segs), segs[0].AttrOffset(), segs[0].PayloadLength())
	}
	// A fabric query from an unknown port is dropped.
	if r := s.Handle(req(mad.MethodGetTable, 0, mad.MCMemberFields{}), From{GUID: 0x42}); r != nil {
		t.Fatal("unknown requester answered")
	}
}

// GetTable with more groups than fit one MAD (3 records a MAD) is
// RMPP-segmented.
func TestGetTableRMPP(t *testing.T) {
	s := newSA(Config{})
	for i := range 10 {
		g := mgidUDP
		g[15] = byte(i)
		mustOK(t, s, req(mad.MethodSet, mad.CompCreateRequired, udpJoin(g, guidA, 1)), raw)
	}
	m := req(mad.MethodGetTable, 0, mad.MCMemberFields{})
	segs := s.Handle(m, raw)
	// 11 records × 56 = 616 bytes → 4 segments of 200.
	if len(segs) != 4 {
		t.Fatalf("%d segments", len(segs))
	}
	var r mad.Reassembler
	for i, seg := range segs {
		done, data, err := r.Add(seg)
		if err != nil {
			t.Fatal(err)
		}
		if done != (i == 3) {
			t.Fatalf("done at %d", i)
		}
		if done && len(data) != 11*mad.MCMemberRecordStride {
			t.Fatalf("%d bytes", len(data))
		}
	}
	if segs[0].PayloadLength() != 4*220-(800-616) {
		t.Fatalf("first paylen %d", segs[0].PayloadLength())
	}
}

func TestDropped(t *testing.T) {
	s := newSA(Config{})
	good := mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 1, 0)
	for name, mod := range map[string]func(m mad.MAD) mad.MAD{
		"short":        func(m mad.MAD) mad.MAD { return m[:100] },
		"base version": func(m mad.MAD) mad.MAD { m.SetBaseVersion(2); return m },
		"class":        func(m mad.MAD) mad.MAD { m.SetMgmtClass(0x81); return m },
		"response":     func(m mad.MAD) mad.MAD { m.SetMethod(mad.MethodGetResp); return m },
	} {
		m := append(mad.MAD(nil), good...)
		if r := s.Handle(mod(m), raw); r != nil {
			t.Errorf("%s: answered", name)
		}
	}
	if r := s.Handle(good, raw); len(r) != 1 {
		t.Fatal("good request not answered")
	}
	// Set from an unknown fabric requester is dropped, as OpenSM does when
	// it cannot find the requester's port.
	if r := s.Handle(req(mad.MethodSet, mad.CompCreateRequired, udpJoin(mgidUDP, guidA, 1)), From{GUID: 0x77}); r != nil {
		t.Fatal("unknown requester answered")
	}
}

func TestErrorReplyCopiesRequest(t *testing.T) {
	s := newSA(Config{})
	m := req(mad.MethodSet, mad.CompCreateRequired, udpJoin(mgidUDP, guidA, 2))
	m.SetSMKey(99)
	r := one(t, s, m, raw)
	if r.Status() != mad.StatusReqInvalid || r.Method() != mad.MethodGetResp || r.SMKey() != 0 ||
		r.CompMask() != mad.CompCreateRequired || r.MCMemberRecord().Fields() != m.MCMemberRecord().Fields() {
		t.Fatal("error reply")
	}
}

func TestRespTimeValueFor(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want uint8
	}{{0, 16}, {200 * time.Millisecond, 16}, {300 * time.Millisecond, 17}, {5 * time.Second, 21}, {time.Hour, 30}, {2 * time.Hour, 31}, {1000 * time.Hour, 31}} {
		if got := RespTimeValueFor(c.d); got != c.want {
			t.Errorf("RespTimeValueFor(%v) = %d, want %d", c.d, got, c.want)
		}
	}
	s := newSA(Config{RespTimeValue: 20})
	r := one(t, s, mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 1, 0), raw)
	if r.ClassPortInfo().RespTimeValue() != 20 {
		t.Fatal("RespTimeValue")
	}
}

// TestOpenSMScopeAndEcho: a created group keeps the requester's Scope
// nibble (0 when the request had 0, whatever the MGID's scope), and the
// answer to Set and Delete echoes the ProxyJoin bit, the reserved bits and
// bytes and the padding of the request, as OpenSM's answer (a copy of the
// received record) does.
func TestOpenSMScopeAndEcho(t *testing.T) {
	cases := []struct {
		name      string
		scope     uint8
		comp      uint64
		wantScope uint8
	}{
		{"scope 0 in the request", 0, 0, 0},
		{"scope 0, comp-masked", 0, mad.CompScope, 0},
		{"scope 5 with a link-local MGID", mad.ScopeSiteLocal, 0, mad.ScopeSiteLocal},
		{"scope 2", mad.ScopeLinkLocal, mad.CompScope, mad.ScopeLinkLocal},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newSA(Config{})
			f := udpJoin(mgidUDP, guidA, 1)
			f.Scope = c.scope
			m := req(mad.MethodSet, mad.CompCreateRequired|c.comp, f)
			echo := m.SAData()[mad.MCMemberRecordEchoOffset:mad.MCMemberRecordStride]
			copy(echo, []byte{0x80 | 0x55, 0xA5, 0x5A, 1, 2, 3, 4}) // ProxyJoin + reserved bits, reserved, pad
			want := append([]byte(nil), echo...)
			r := one(t, s, m, raw)
			if r.Status() != 0 {
				t.Fatalf("status %#04x", r.Status())
			}
			if got := r.MCMemberRecord().Scope(); got != c.wantScope {
				t.Errorf("answer scope %d, want %d", got, c.wantScope)
			}
			if got := groupOf(t, s, mgidUDP).Rec.Scope; got != c.wantScope {
				t.Errorf("group scope %d, want %d", got, c.wantScope)
			}
			if got := r.SAData()[mad.MCMemberRecordEchoOffset:mad.MCMemberRecordStride]; string(got) != string(want) {
				t.Errorf("join answer bytes 49..55 % x, want % x", got, want)
			}
			// A Get of the group reports the stored scope.
			g := mustOK(t, s, req(mad.MethodGet, mad.CompMGID, udpJoin(mgidUDP, guidA, 0)), raw)
			if g.Scope != c.wantScope {
				t.Errorf("Get scope %d, want %d", g.Scope, c.wantScope)
			}
			// The leave's answer echoes them too.
			d := req(mad.MethodDelete, mad.CompJoinRequired, udpJoin(mgidUDP, guidA, 1))
			copy(d.SAData()[mad.MCMemberRecordEchoOffset:], []byte{0x80, 0xFF, 0x01, 9, 8, 7, 6})
			want = append([]byte(nil), d.SAData()[mad.MCMemberRecordEchoOffset:mad.MCMemberRecordStride]...)
			r = one(t, s, d, raw)
			if r.Status() != 0 {
				t.Fatalf("leave status %#04x", r.Status())
			}
			if got := r.SAData()[mad.MCMemberRecordEchoOffset:mad.MCMemberRecordStride]; string(got) != string(want) {
				t.Errorf("leave answer bytes 49..55 % x, want % x", got, want)
			}
		})
	}
	// The IPoIB broadcast group has scope 2.
	s := newSA(Config{})
	if b := groupOf(t, s, BroadcastMGID); b.Rec.Scope != mad.ScopeLinkLocal {
		t.Fatalf("broadcast scope %d", b.Rec.Scope)
	}
}
