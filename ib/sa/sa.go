// Package sa is the Subnet Administration rules engine of the emulated
// InfiniBand subnet: MCMemberRecord Set (join/create), Delete (leave),
// Get and GetTable, Get of ClassPortInfo, and Get and GetTable of
// PathRecord, with OpenSM 3.3 semantics.
// It is pure logic — 256-byte MADs in, MADs out — and knows nothing of
// sockets; the subnet manager (package ib/sm) feeds it.
//
// An SA is not safe for concurrent use; the caller serializes.
//
// Rules, in the order they are checked (first failure wins; status in the
// MAD status word, reply method GetResp for Set, DeleteResp for Delete,
// GetTableResp with AttributeOffset 0 for GetTable):
//
//	any MAD     base version ≠ 1, class ≠ 0x03, a response method, an RMPP
//	            ACK/STOP/ABORT, a method other than Get/GetTable/Set/Delete/
//	            GetMulti or an attribute other than ClassPortInfo/MCMemberRecord/
//	            PathRecord: dropped, no answer (as OpenSM); PathRecord's
//	            rules are in path.go
//	CPI         class version other than 2 or 1 → 0x0004 (a version-1 Get
//	            is answered as a version-2 one); Set or Delete: dropped;
//	            GetTable or GetMulti → 0x0200
//	MCMR        GetMulti → 0x000C (OpenSM, built with DUAL_SIDED_RMPP,
//	            hands GetMulti to the attribute's handler)
//	MCMR        class version ≠ 2 → 0x0004
//	Set/Delete  mask lacks MGID|PortGID|JoinState (0x10003) → 0x0600
//	all MCMR    comp-masked MTU (with its selector) not 1..5, or Rate not
//	            2..24 → 0x0200
//	Set         JoinState has SendOnlyFullMember and the SA has no send-only
//	            support (Config.SendOnlySupport false) → 0x0200
//	Set/Delete  PortGID prefix fe80:: is read as the SM's prefix; another
//	            prefix ≠ the SM's → 0x0500
//	Set         PortGID's port unknown → 0x0200
//	            requester ≠ that port (proxy join) and no shared P_Key → 0x0200
//	            comp-masked P_Key with base 0 → 0x0200
//	Set, new    JoinState without a full-type bit (0x1/0x8) → 0x0200
//	quota       the Set would add a membership and the port is a member
//	            of Config.MaxMembershipsPerPort groups, or it would create
//	            a group and the requester (the sending port; from the raw
//	            SA port, the record's port) created
//	            Config.MaxGroupsPerPort groups that still exist, or the
//	            requests of its source address (From.Source) created
//	            Config.MaxGroupsPerSource → 0x0100 (counted:
//	            QuotaRefusals; logged through Config.Logf)
//	group       mask lacks 0x130C7 → 0x0600
//	            zero MGID: assign ff1S:a01b:<prefix>… (1000 tries) else 0x0100
//	            else MGID byte 0 ≠ 0xFF → 0x0200; IPoIB signature 0x401B/
//	            0x601B: the IPoIB broadcast group of the same scope and P_Key
//	            must exist and comp-masked Q_Key, P_Key, TClass, SL,
//	            FlowLabel, HopLimit must match it → 0x0200; other
//	            signatures: reserved flag bits set, or 0xA01B with
//	            link-local scope → 0x0200
//	            MTU/Rate selectors not realizable on the port → 0x0200
//	            no free MLID in [0xC000, MaxMLID] → 0x0100
//	Set, exists comp-masked Q_Key, TClass, SL, FlowLabel, HopLimit differ
//	            from the group's, or P_Key base differs / both limited →
//	            0x0200
//	Set         comp-masked MTU/Rate selector not satisfied by the group,
//	            port MTU/rate below the group's, or JoinState 0 → 0x0200
//	            (a group created by this request is removed again)
//	            port not in the group's partition → 0x0200
//	            modifying an existing membership: ProxyJoin clear and the
//	            requester is not the port, or ProxyJoin set and the
//	            requester lacks the group's P_Key → 0x0200
//	Delete      group unknown, port not a member, JoinState shares no bit
//	            with the stored one or has bits not held, proxy rule → 0x0200
//	Get         no record → 0x0300; more than one → 0x0400
//
// A created group keeps the request's Scope nibble as sent (0 when the
// request had 0), not the MGID's scope, as OpenSM stores a copy of the
// request. A join ORs the bits into the member's JoinState and answers with
// the group's Q_Key, MLID, TClass, P_Key, SL, FlowLabel, HopLimit, MTU,
// Rate and PacketLifeTime (selectors 2 = exactly), the group's scope and
// the member's combined JoinState; the PortGID, the ProxyJoin bit, the
// reserved bits and bytes and the padding are echoed as sent (a leave's
// answer echoes them too). The records a Get or GetTable answers later
// carry the group's creating request's reserved bits of that byte, its
// reserved bytes and its padding (OpenSM answers its copy of that
// request), beside the member's ProxyJoin (bit 7; OpenSM 3.3.23 puts it
// at bit 0, a C bitfield's place on x86: see test/saoracle). ClassPortInfo is answered with the request's
// header copied (AttributeOffset as sent, normally 0). A leave
// clears the bits; a member left with no bits is removed, and when the
// last full-type member (0x1 or 0x8) goes the group is deleted with all
// its remaining members — except the well-known IPoIB broadcast group,
// which only loses its members.
package sa

import (
	"net/netip"
	"slices"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// Defaults.
const (
	// DefaultSubnetPrefix is the default subnet prefix fe80::/64.
	DefaultSubnetPrefix = 0xFE80000000000000
	// DefaultSMKey is the SM_Key a query must carry to be trusted (OpenSM's
	// default sm_key, 1).
	DefaultSMKey = 1
	// DefaultRespTimeValue is the ClassPortInfo RespTimeValue OpenSM
	// advertises with its default 200 ms transaction timeout: 16, i.e.
	// 4.096 µs × 2^16 ≈ 268 ms.
	DefaultRespTimeValue = 16
	// BroadcastMLID is the MLID of the IPoIB broadcast group (0xC000).
	BroadcastMLID = wire.MulticastLIDBase
	// BroadcastQKey is the Q_Key of the IPoIB broadcast group (0x0B1B).
	BroadcastQKey = 0x0B1B
	// DefaultPKey is the default partition's full-member P_Key.
	DefaultPKey = 0xFFFF
	// BroadcastPacketLifeTime is the broadcast group's PacketLifeTime
	// (OpenSM's default subnet_timeout, 18).
	BroadcastPacketLifeTime = 18
)

// BroadcastMGID is the IPoIB IPv4 broadcast group of the default partition,
// ff12:401b:ffff::ffff:ffff.
var BroadcastMGID = wire.GID{0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 12: 0xff, 13: 0xff, 14: 0xff, 15: 0xff}

// Config configures an SA.
type Config struct {
	// SubnetPrefix is the subnet prefix (0 → DefaultSubnetPrefix).
	SubnetPrefix uint64
	// SendOnlySupport advertises CapabilityMask2 bit 12 and accepts
	// SendOnlyFullMember joins; without it a Set carrying JoinState 0x8 is
	// refused with 0x0200.
	SendOnlySupport bool
	// SMKey is the SM_Key of trusted queries (0 → DefaultSMKey). A trusted
	// Get/GetTable sees every member's PortGID and JoinState; others see
	// one record per group with PortGID, JoinState and ProxyJoin zero.
	SMKey uint64
	// MaxMLID is the highest MLID the SA allocates (0 → 0xFFFE).
	MaxMLID uint16
	// RespTimeValue is advertised in ClassPortInfo (0 →
	// DefaultRespTimeValue); see RespTimeValueFor.
	RespTimeValue uint8
	// MaxGroupsPerPort caps the groups one port may have created that
	// still exist (0: no cap). A Set that would create one more is
	// answered 0x0100 (insufficient resources, as OpenSM answers when it
	// runs out of MLIDs): one port cannot take every MLID.
	MaxGroupsPerPort int
	// MaxGroupsPerSource caps the groups the ports of one source address
	// (From.Source) may have created together that still exist (0: no
	// cap): a Set that would create one more is answered 0x0100, so
	// that a few ports of one host, each within MaxGroupsPerPort, cannot
	// take every MLID either.
	MaxGroupsPerSource int
	// MaxMembershipsPerPort caps the groups one port may be a member of
	// (0: no cap); a Set that would add one more membership is answered
	// 0x0100.
	MaxMembershipsPerPort int
	// MaxRecords bounds one query (0: no bound): a Get or GetTable that
	// would answer more records, or examine more than WorkFactor ×
	// MaxRecords candidates, is answered 0x0100 (see Prepare).
	MaxRecords int
	// Logf, if set, is told when a port runs into a quota: its first
	// refusal, then each time its count of refusals doubles.
	Logf func(format string, args ...any)
}

// QuotaRefusals counts the Sets refused with 0x0100 for a quota
// (Config.MaxGroupsPerPort, Config.MaxGroupsPerSource,
// Config.MaxMembershipsPerPort).
type QuotaRefusals struct {
	// Groups counts creates refused for MaxGroupsPerPort or
	// MaxGroupsPerSource, Memberships joins refused for
	// MaxMembershipsPerPort.
	Groups, Memberships uint64
}

// Port is an end port the SA knows (the SM registers it).
type Port struct {
	// GUID is the port GUID; its GID is <subnet prefix>:<GUID>.
	GUID uint64
	// LID is the port's LID (0: unknown; the port then has no path).
	LID uint16
	// MTU is the port's MTU enum (mad.MTU2048 …); 0 → 2048.
	MTU uint8
	// Rate is the port's static rate enum (mad.Rate10Gbps …); 0 → 10 Gb/s.
	Rate uint8
	// PKeys is the port's P_Key table; empty → {0xFFFF}.
	PKeys []uint16
}

// From identifies the sender of a request.
type From struct {
	// GUID is the port the MAD came from over the fabric.
	GUID uint64
	// Raw marks a request from the raw SA port: it counts as coming from
	// the port whose GUID is the record's PortGID (or from an anonymous
	// requester in every partition when there is no such port).
	Raw bool
	// Source is the address the request came from (the SM's: the
	// sending port's attach address, the raw SA peer's address); a group
	// it creates counts against Config.MaxGroupsPerSource for it. Zero:
	// no source, no such count.
	Source netip.Addr
}

// Member is one member port of a group.
type Member struct {
	GUID      uint64
	PortGID   wire.GID // as stored: the SM's subnet prefix and the GUID
	JoinState uint8
	ProxyJoin bool
}

// Group is a snapshot of one multicast group.
type Group struct {
	// Rec is the group's record (MGID, Q_Key, MLID, MTU, Rate … with
	// selectors 2, Scope); PortGID and JoinState are zero.
	Rec mad.MCMemberFields
	// WellKnown groups (the IPoIB broadcast group) survive their last member.
	WellKnown bool
	// Members, sorted by GUID.
	Members []Member
}

type group struct {
	rec       mad.MCMemberFields
	wellKnown bool
	members   map[uint64]*Member
	full      int        // members holding a full-type bit
	creator   uint64     // the port charged for the group (MaxGroupsPerPort); 0: none
	source    netip.Addr // the source charged for it (MaxGroupsPerSource); zero: none
	// echo holds the creating request's bytes from ProxyJoin's byte to
	// the end of the record's 56 bytes, ProxyJoin itself cleared: OpenSM
	// keeps a copy of that request as the group's record, so every
	// record of the group it answers later carries its reserved bits,
	// reserved bytes and padding.
	echo [mad.MCMemberRecordStride - mad.MCMemberRecordEchoOffset]byte
}

// SA is the rules engine.
type SA struct {
	cfg     Config
	prefix  uint64
	ports   map[uint64]*Port
	byLID   map[uint16]uint64 // the GUID of each port's LID (path records)
	groups  map[wire.GID]*group
	counter uint32 // SA-assigned MGID counter, as OpenSM's uniq_count
	version uint64
	mlids   *mlids
	byMLID  map[uint16]*group   // the group of each MLID in use
	changed map[uint16]struct{} // MLIDs whose receivers changed (TakeChanged)
	// memberOf holds the groups each port is a member of, so that a
	// port's removal costs its memberships, not the number of groups.
	memberOf map[uint64]map[*group]struct{}
	created  map[uint64]int    // groups each port created that still exist
	refused  map[uint64]uint64 // quota refusals of each port (for Logf)
	// bySource counts the groups created from each source address that
	// still exist; srcRefused its refusals (for Logf), kept while it has
	// groups.
	bySource   map[netip.Addr]int
	srcRefused map[netip.Addr]uint64
	quota      QuotaRefusals
}

// New returns an SA holding only the IPoIB broadcast group
// ff12:401b:ffff::ffff:ffff (MLID 0xC000, Q_Key 0x0B1B, MTU 2048, 10 Gb/s,
// SL 0, P_Key 0xFFFF, link-local scope) and no ports.
func New(cfg Config) *SA {
	if cfg.SubnetPrefix == 0 {
		cfg.SubnetPrefix = DefaultSubnetPrefix
	}
	if cfg.SMKey == 0 {
		cfg.SMKey = DefaultSMKey
	}
	if cfg.MaxMLID == 0 || cfg.MaxMLID > wire.MulticastLIDMax {
		cfg.MaxMLID = wire.MulticastLIDMax
	}
	if cfg.RespTimeValue == 0 {
		cfg.RespTimeValue = DefaultRespTimeValue
	}
	s := &SA{
		cfg:     cfg,
		prefix:  cfg.SubnetPrefix,
		ports:   make(map[uint64]*Port),
		byLID:   make(map[uint16]uint64),
		groups:  make(map[wire.GID]*group),
		mlids:   newMLIDs(cfg.MaxMLID),
		byMLID:  make(map[uint16]*group),
		changed: make(map[uint16]struct{}),

		memberOf: make(map[uint64]map[*group]struct{}),
		created:  make(map[uint64]int),
		refused:  make(map[uint64]uint64),

		bySource:   make(map[netip.Addr]int),
		srcRefused: make(map[netip.Addr]uint64),
	}
	s.mlids.take(BroadcastMLID)
	s.groups[BroadcastMGID] = &group{
		rec: mad.MCMemberFields{
			MGID: BroadcastMGID, QKey: BroadcastQKey, MLID: BroadcastMLID,
			MTUSelector: mad.SelExactly, MTU: mad.MTU2048, PKey: DefaultPKey,
			RateSelector: mad.SelExactly, Rate: mad.Rate10Gbps,
			PacketLifeTimeSelector: mad.SelExactly, PacketLifeTime: BroadcastPacketLifeTime,
			Scope: mad.ScopeLinkLocal,
		},
		wellKnown: true,
		members:   make(map[uint64]*Member),
	}
	s.byMLID[BroadcastMLID] = s.groups[BroadcastMGID]
	return s
}

// RespTimeValueFor returns the smallest ClassPortInfo RespTimeValue whose
// time (4.096 µs × 2^v) covers d, at least DefaultRespTimeValue, at most 31.
func RespTimeValueFor(d time.Duration) uint8 {
	v := uint8(DefaultRespTimeValue)
	for v < 31 && time.Duration(4096<<v)*time.Nanosecond < d {
		v++
	}
	return v
}

// SubnetPrefix returns the SA's subnet prefix.
func (s *SA) SubnetPrefix() uint64 { return s.prefix }

// PortGID returns the GID of the port with the given GUID.
func (s *SA) PortGID(guid uint64) wire.GID { return prefixGID(s.prefix, guid) }

// AddPort registers (or updates) an end port.
func (s *SA) AddPort(p Port) {
	if p.MTU == 0 {
		p.MTU = mad.MTU2048
	}
	if p.Rate == 0 {
		p.Rate = mad.Rate10Gbps
	}
	if len(p.PKeys) == 0 {
		p.PKeys = []uint16{DefaultPKey}
	} else {
		p.PKeys = slices.Clone(p.PKeys)
	}
	if old := s.ports[p.GUID]; old != nil && old.LID != 0 && s.byLID[old.LID] == p.GUID {
		delete(s.byLID, old.LID)
	}
	if p.LID != 0 {
		s.byLID[p.LID] = p.GUID
	}
	s.ports[p.GUID] = &p
}

// HasPort reports whether the port is registered.
func (s *SA) HasPort(guid uint64) bool { return s.ports[guid] != nil }

// RemovePort forgets a port after removing its memberships (LeaveAll).
// The groups it created and that live on (other full members) still
// count against its MaxGroupsPerPort should it register again.
func (s *SA) RemovePort(guid uint64) {
	s.LeaveAll(guid)
	if p := s.ports[guid]; p != nil && p.LID != 0 && s.byLID[p.LID] == guid {
		delete(s.byLID, p.LID)
	}
	delete(s.ports, guid)
	delete(s.refused, guid)
}

// LeaveAll removes every membership of the port, as a leave of all its
// JoinState bits would (groups left without a full-type member are deleted,
// the broadcast group only loses members). It reports whether anything
// changed. It costs the port's memberships, not the number of groups.
func (s *SA) LeaveAll(guid uint64) bool {
	changed := false
	for g := range s.memberOf[guid] {
		m := g.members[guid]
		if m == nil {
			continue
		}
		mlid := g.rec.MLID
		s.removeBits(g, m, m.JoinState)
		s.changed[mlid] = struct{}{}
		changed = true
	}
	if changed {
		s.version++
	}
	return changed
}

// Memberships returns how many groups the port is a member of.
func (s *SA) Memberships(guid uint64) int { return len(s.memberOf[guid]) }

// GroupsCreated returns how many groups the port created (charged to it
// under MaxGroupsPerPort) that still exist.
func (s *SA) GroupsCreated(guid uint64) int { return s.created[guid] }

// GroupsCreatedFrom returns how many groups requests from the source
// address created (charged to it under MaxGroupsPerSource) that still
// exist.
func (s *SA) GroupsCreatedFrom(source netip.Addr) int { return s.bySource[source] }

// QuotaRefusals returns the counts of Sets refused for a quota.
func (s *SA) QuotaRefusals() QuotaRefusals { return s.quota }

// addMember makes guid a member of g (no JoinState yet).
func (s *SA) addMember(g *group, guid uint64, proxy bool) *Member {
	m := &Member{GUID: guid, PortGID: s.PortGID(guid), ProxyJoin: proxy}
	g.members[guid] = m
	set := s.memberOf[guid]
	if set == nil {
		set = make(map[*group]struct{})
		s.memberOf[guid] = set
	}
	set[g] = struct{}{}
	return m
}

// dropMember removes guid from g.
func (s *SA) dropMember(g *group, guid uint64) {
	delete(g.members, guid)
	if set := s.memberOf[guid]; set != nil {
		delete(set, g)
		if len(set) == 0 {
			delete(s.memberOf, guid)
		}
	}
}

// overSourceQuota reports (and counts and logs) a create refused for
// the source's MaxGroupsPerSource.
func (s *SA) overSourceQuota(src netip.Addr) bool {
	max := s.cfg.MaxGroupsPerSource
	if max <= 0 || !src.IsValid() || s.bySource[src] < max {
		return false
	}
	s.quota.Groups++
	n := s.srcRefused[src] + 1
	s.srcRefused[src] = n
	if s.cfg.Logf != nil && n&(n-1) == 0 {
		s.cfg.Logf("SA: source %v is at its group quota (%d groups its ports created): Set refused with status 0x0100 (%d refusals for the source so far)", src, max, n)
	}
	return true
}

// overQuota reports (and counts and logs) a Set refused for a quota.
func (s *SA) overQuota(guid uint64, groups bool) bool {
	var max, have int
	if groups {
		max, have = s.cfg.MaxGroupsPerPort, s.created[guid]
	} else {
		max, have = s.cfg.MaxMembershipsPerPort, len(s.memberOf[guid])
	}
	if max <= 0 || have < max {
		return false
	}
	what := "membership"
	if groups {
		s.quota.Groups++
		what = "group"
	} else {
		s.quota.Memberships++
	}
	n := s.refused[guid] + 1
	s.refused[guid] = n
	if s.cfg.Logf != nil && n&(n-1) == 0 {
		s.cfg.Logf("SA: port %#x is at its %s quota (%d): Set refused with status 0x0100 (%d refusals for the port so far)", guid, what, max, n)
	}
	return true
}

// Version increases whenever a membership or a group changes; the switch
// recomputes its multicast forwarding table when it moves.
func (s *SA) Version() uint64 { return s.version }

// Groups returns a snapshot of every group, sorted by MGID.
func (s *SA) Groups() []Group {
	out := make([]Group, 0, len(s.groups))
	for _, mgid := range s.sortedMGIDs() {
		g := s.groups[mgid]
		sg := Group{Rec: g.rec, WellKnown: g.wellKnown}
		for _, guid := range sortedGUIDs(g.members) {
			sg.Members = append(sg.Members, *g.members[guid])
		}
		out = append(out, sg)
	}
	return out
}

// MulticastTable returns, for every MLID in use, the GUIDs of the member
// ports holding FullMember or NonMember (the ports the switch forwards to),
// sorted. Ports holding only send-only bits are not listed.
func (s *SA) MulticastTable() map[uint16][]uint64 {
	t := make(map[uint16][]uint64)
	for _, g := range s.groups {
		if _, ok := t[g.rec.MLID]; !ok {
			t[g.rec.MLID] = nil
		}
		for guid, m := range g.members {
			if m.JoinState&mad.JoinReceivers != 0 && !slices.Contains(t[g.rec.MLID], guid) {
				t[g.rec.MLID] = append(t[g.rec.MLID], guid)
			}
		}
	}
	for mlid := range t {
		slices.Sort(t[mlid])
	}
	return t
}

// TakeChanged returns the MLIDs whose receivers may have changed since the
// last call (or since New), and forgets them: with MulticastEntry the
// switch updates its table without rebuilding it.
func (s *SA) TakeChanged() []uint16 {
	out := make([]uint16, 0, len(s.changed))
	for mlid := range s.changed {
		out = append(out, mlid)
	}
	clear(s.changed)
	return out
}

// MulticastEntry returns MulticastTable's entry of one MLID: the sorted
// GUIDs of the ports that receive it, and whether a group has the MLID.
func (s *SA) MulticastEntry(mlid uint16) ([]uint64, bool) {
	g := s.byMLID[mlid]
	if g == nil {
		return nil, false
	}
	var out []uint64
	for guid, m := range g.members {
		if m.JoinState&mad.JoinReceivers != 0 {
			out = append(out, guid)
		}
	}
	slices.Sort(out)
	return out, true
}

func (s *SA) sortedMGIDs() []wire.GID {
	k := make([]wire.GID, 0, len(s.groups))
	for mgid := range s.groups {
		k = append(k, mgid)
	}
	slices.SortFunc(k, func(a, b wire.GID) int { return bytesCompare(a[:], b[:]) })
	return k
}

func sortedGUIDs(m map[uint64]*Member) []uint64 {
	k := make([]uint64, 0, len(m))
	for guid := range m {
		k = append(k, guid)
	}
	slices.Sort(k)
	return k
}

func bytesCompare(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

// removeBits clears bits of a member, removes it when none are left, and
// deletes the group (or empties a well-known one) when its last full-type
// member went. It returns the member's remaining JoinState (0 if removed).
func (s *SA) removeBits(g *group, m *Member, js uint8) uint8 {
	old := m.JoinState
	left := old &^ js
	if left != 0 {
		m.JoinState = left
	} else {
		s.dropMember(g, m.GUID)
	}
	if old&mad.JoinFullTypes != 0 && left&mad.JoinFullTypes == 0 {
		g.full--
		if g.full == 0 {
			s.cleanup(g)
			return 0
		}
	}
	return left
}

// cleanup removes a group without full-type members: every member is
// dropped and, unless it is well known, the group with its MLID.
func (s *SA) cleanup(g *group) {
	if g.full > 0 {
		return
	}
	for guid := range g.members {
		s.dropMember(g, guid)
	}
	if !g.wellKnown {
		delete(s.groups, g.rec.MGID)
		delete(s.byMLID, g.rec.MLID)
		s.mlids.release(g.rec.MLID)
		if g.creator != 0 {
			if s.created[g.creator]--; s.created[g.creator] <= 0 {
				delete(s.created, g.creator)
			}
			g.creator = 0
		}
		if g.source.IsValid() {
			if s.bySource[g.source]--; s.bySource[g.source] <= 0 {
				delete(s.bySource, g.source)
				delete(s.srcRefused, g.source)
			}
			g.source = netip.Addr{}
		}
	}
}

// hasPKey reports whether the port (nil: anonymous, in every partition)
// holds a P_Key with the base of pkey.
func hasPKey(p *Port, pkey uint16) bool {
	if p == nil {
		return true
	}
	for _, k := range p.PKeys {
		if k&0x7FFF == pkey&0x7FFF {
			return true
		}
	}
	return false
}

// sharePKey reports whether two ports share a partition with at least one
// of them a full member of it.
func sharePKey(a, b *Port) bool {
	for _, ka := range a.PKeys {
		for _, kb := range b.PKeys {
			if ka&0x7FFF == kb&0x7FFF && (ka|kb)&0x8000 != 0 {
				return true
			}
		}
	}
	return false
}

// rateOrder lists the rate enums by bandwidth.
var rateOrder = func() []uint8 {
	var r []uint8
	for v := range uint8(64) {
		if mad.ValidRate(v) {
			r = append(r, v)
		}
	}
	slices.SortFunc(r, func(a, b uint8) int { return mad.RateMbps(a) - mad.RateMbps(b) })
	return r
}()

func compareRates(a, b uint8) int { return mad.RateMbps(a) - mad.RateMbps(b) }

func prevRate(r uint8) uint8 {
	i := slices.Index(rateOrder, r)
	if i <= 0 {
		return 0
	}
	return rateOrder[i-1]
}
