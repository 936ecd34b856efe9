package mad

import (
	"encoding/binary"

	"github.com/softrdma/softrdma/wire"
)

// MCMemberRecord sizes.
const (
	// MCMemberRecordLen is the number of defined bytes of an MCMemberRecord.
	MCMemberRecordLen = 52
	// MCMemberRecordStride is the size of one record in SA data, padded to
	// 8 bytes (AttributeOffset 7 × 8 = 56).
	MCMemberRecordStride = 56
	// MCMemberRecordWords is the AttributeOffset of an MCMemberRecord.
	MCMemberRecordWords = MCMemberRecordStride / 8
	// MCMemberRecordEchoOffset is the offset of the byte holding ProxyJoin
	// and 7 reserved bits; it, the 2 reserved bytes and the 4 bytes of
	// padding up to MCMemberRecordStride are what an SA answering with a
	// copy of the request (OpenSM) echoes untouched.
	MCMemberRecordEchoOffset = mcrProxy
	// MCMemberProxyJoinBit is ProxyJoin in the byte at
	// MCMemberRecordEchoOffset (its most significant bit, as IBA and the
	// kernel lay it out).
	MCMemberProxyJoinBit = proxyBit
)

// MCMemberRecord component mask bits (IBA 15.2.5.17; IB_SA_MCMEMBER_REC_*).
const (
	CompMGID                   uint64 = 1 << 0
	CompPortGID                uint64 = 1 << 1
	CompQKey                   uint64 = 1 << 2
	CompMLID                   uint64 = 1 << 3
	CompMTUSelector            uint64 = 1 << 4
	CompMTU                    uint64 = 1 << 5
	CompTClass                 uint64 = 1 << 6
	CompPKey                   uint64 = 1 << 7
	CompRateSelector           uint64 = 1 << 8
	CompRate                   uint64 = 1 << 9
	CompPacketLifeTimeSelector uint64 = 1 << 10
	CompPacketLifeTime         uint64 = 1 << 11
	CompSL                     uint64 = 1 << 12
	CompFlowLabel              uint64 = 1 << 13
	CompHopLimit               uint64 = 1 << 14
	CompScope                  uint64 = 1 << 15
	CompJoinState              uint64 = 1 << 16
	CompProxyJoin              uint64 = 1 << 17

	// CompJoinRequired is what every Set/Delete must carry: MGID, PortGID,
	// JoinState (0x10003).
	CompJoinRequired = CompMGID | CompPortGID | CompJoinState
	// CompCreateRequired is what a Set creating a group must carry
	// (0x130C7): MGID, PortGID, JoinState, Q_Key, TClass, P_Key,
	// FlowLabel, SL. It is also the RDMA CM's mask for a PS_UDP join.
	CompCreateRequired = CompJoinRequired | CompQKey | CompTClass | CompPKey | CompFlowLabel | CompSL
	// CompIPoIBJoin is the RDMA CM's mask for a PS_IPOIB join (0x173F7):
	// CompCreateRequired plus MTU/Rate with selectors and HopLimit.
	CompIPoIBJoin = CompCreateRequired | CompMTUSelector | CompMTU | CompRateSelector | CompRate | CompHopLimit
)

// JoinState bits.
const (
	JoinFullMember         = 0x1
	JoinNonMember          = 0x2
	JoinSendOnlyNonMember  = 0x4
	JoinSendOnlyFullMember = 0x8
	// JoinFullTypes are the bits that make a member "full": FullMember and
	// SendOnlyFullMember. A group lives while one member holds one.
	JoinFullTypes = JoinFullMember | JoinSendOnlyFullMember
	// JoinReceivers are the bits that want traffic: FullMember, NonMember.
	JoinReceivers = JoinFullMember | JoinNonMember
)

// SelectorMet reports whether a value have meets a requested want under a
// selector (IBA 15.2.5.16): exactly when the request has no selector,
// largest available (3) always.
func SelectorMet(withSel bool, sel uint8, want, have int) bool {
	if !withSel {
		sel = SelExactly
	}
	switch sel {
	case SelGreaterThan:
		return have > want
	case SelLessThan:
		return have < want
	case SelExactly:
		return have == want
	}
	return true
}

// Selector values of MTU, Rate and PacketLifeTime.
const (
	SelGreaterThan = 0
	SelLessThan    = 1
	SelExactly     = 2
	SelLargest     = 3
)

// IB MTU enum values.
const (
	MTU256  = 1
	MTU512  = 2
	MTU1024 = 3
	MTU2048 = 4
	MTU4096 = 5
)

// Some IB static rate enum values (the full table is in RateMbps).
const (
	Rate2_5Gbps = 2
	Rate10Gbps  = 3
	Rate30Gbps  = 4
	Rate5Gbps   = 5
	Rate20Gbps  = 6
	Rate40Gbps  = 7
)

// Multicast scopes (MGID byte 1 low nibble, MCMemberRecord Scope).
const (
	ScopeLinkLocal = 0x2
	ScopeSiteLocal = 0x5
	ScopeOrgLocal  = 0x8
	ScopeGlobal    = 0xE
)

// MCMemberRecord offsets.
const (
	mcrMGID     = 0
	mcrPortGID  = 16
	mcrQKey     = 32
	mcrMLID     = 36
	mcrMTU      = 38 // selector(7:6) | MTU(5:0)
	mcrTClass   = 39
	mcrPKey     = 40
	mcrRate     = 42
	mcrPktLife  = 43
	mcrSLFlHop  = 44 // SL(31:28) | FlowLabel(27:8) | HopLimit(7:0)
	mcrScopeJS  = 48 // Scope(7:4) | JoinState(3:0)
	mcrProxy    = 49 // ProxyJoin = bit 7
	selShift    = 6
	valMask6    = 0x3F
	proxyBit    = 0x80
	flowMask    = 0xFFFFF
	slShift     = 28
	flowShift   = 8
	scopeShift  = 4
	joinStateLo = 0x0F
)

// MCMemberRecord is a view of an MCMemberRecord (IBA 15.2.5.17; 52
// defined bytes, big-endian), e.g. MAD.SAData()[:MCMemberRecordLen]:
//
//	0  MGID(16)  16 PortGID(16)  32 Q_Key(4)  36 MLID(2)
//	38 MTUSelector(2b)|MTU(6b)  39 TClass  40 P_Key(2)
//	42 RateSelector|Rate  43 PacketLifeTimeSelector|PacketLifeTime
//	44 SL(4b)|FlowLabel(20b)|HopLimit(8b)
//	48 Scope(4b)|JoinState(4b)  49 ProxyJoin(bit 7)|reserved  50 reserved(2)
//
// ProxyJoin is the most significant bit of byte 49 (the kernel's layout;
// OpenSM's C bitfield puts it elsewhere on little-endian hosts). It must be
// at least MCMemberRecordLen bytes long.
type MCMemberRecord []byte

// MGID returns the multicast GID.
func (r MCMemberRecord) MGID() wire.GID { return wire.GID(r[mcrMGID : mcrMGID+16]) }

// SetMGID sets the multicast GID.
func (r MCMemberRecord) SetMGID(g wire.GID) { copy(r[mcrMGID:mcrMGID+16], g[:]) }

// PortGID returns the port GID.
func (r MCMemberRecord) PortGID() wire.GID { return wire.GID(r[mcrPortGID : mcrPortGID+16]) }

// SetPortGID sets the port GID.
func (r MCMemberRecord) SetPortGID(g wire.GID) { copy(r[mcrPortGID:mcrPortGID+16], g[:]) }

// QKey returns the Q_Key.
func (r MCMemberRecord) QKey() uint32 { return binary.BigEndian.Uint32(r[mcrQKey:]) }

// SetQKey sets the Q_Key.
func (r MCMemberRecord) SetQKey(k uint32) { binary.BigEndian.PutUint32(r[mcrQKey:], k) }

// MLID returns the multicast LID.
func (r MCMemberRecord) MLID() uint16 { return binary.BigEndian.Uint16(r[mcrMLID:]) }

// SetMLID sets the multicast LID.
func (r MCMemberRecord) SetMLID(l uint16) { binary.BigEndian.PutUint16(r[mcrMLID:], l) }

// MTUSelector returns the MTU selector (byte 38 bits 7:6).
func (r MCMemberRecord) MTUSelector() uint8 { return r[mcrMTU] >> selShift }

// SetMTUSelector sets the MTU selector (low 2 bits of s).
func (r MCMemberRecord) SetMTUSelector(s uint8) { setSel(&r[mcrMTU], s) }

// MTU returns the MTU enum (byte 38 bits 5:0).
func (r MCMemberRecord) MTU() uint8 { return r[mcrMTU] & valMask6 }

// SetMTU sets the MTU enum (low 6 bits of v).
func (r MCMemberRecord) SetMTU(v uint8) { setVal6(&r[mcrMTU], v) }

// TClass returns the traffic class.
func (r MCMemberRecord) TClass() uint8 { return r[mcrTClass] }

// SetTClass sets the traffic class.
func (r MCMemberRecord) SetTClass(tc uint8) { r[mcrTClass] = tc }

// PKey returns the partition key.
func (r MCMemberRecord) PKey() uint16 { return binary.BigEndian.Uint16(r[mcrPKey:]) }

// SetPKey sets the partition key.
func (r MCMemberRecord) SetPKey(k uint16) { binary.BigEndian.PutUint16(r[mcrPKey:], k) }

// RateSelector returns the rate selector (byte 42 bits 7:6).
func (r MCMemberRecord) RateSelector() uint8 { return r[mcrRate] >> selShift }

// SetRateSelector sets the rate selector.
func (r MCMemberRecord) SetRateSelector(s uint8) { setSel(&r[mcrRate], s) }

// Rate returns the static rate enum (byte 42 bits 5:0).
func (r MCMemberRecord) Rate() uint8 { return r[mcrRate] & valMask6 }

// SetRate sets the rate enum.
func (r MCMemberRecord) SetRate(v uint8) { setVal6(&r[mcrRate], v) }

// PacketLifeTimeSelector returns the packet lifetime selector (byte 43
// bits 7:6).
func (r MCMemberRecord) PacketLifeTimeSelector() uint8 { return r[mcrPktLife] >> selShift }

// SetPacketLifeTimeSelector sets the packet lifetime selector.
func (r MCMemberRecord) SetPacketLifeTimeSelector(s uint8) { setSel(&r[mcrPktLife], s) }

// PacketLifeTime returns the packet lifetime (byte 43 bits 5:0).
func (r MCMemberRecord) PacketLifeTime() uint8 { return r[mcrPktLife] & valMask6 }

// SetPacketLifeTime sets the packet lifetime.
func (r MCMemberRecord) SetPacketLifeTime(v uint8) { setVal6(&r[mcrPktLife], v) }

func (r MCMemberRecord) slFlowHop() uint32     { return binary.BigEndian.Uint32(r[mcrSLFlHop:]) }
func (r MCMemberRecord) setSLFlowHop(v uint32) { binary.BigEndian.PutUint32(r[mcrSLFlHop:], v) }

// SL returns the service level (word at 44, bits 31:28).
func (r MCMemberRecord) SL() uint8 { return uint8(r.slFlowHop() >> slShift) }

// SetSL sets the service level (low 4 bits of sl).
func (r MCMemberRecord) SetSL(sl uint8) {
	r.setSLFlowHop(r.slFlowHop()&^(0xF<<slShift) | uint32(sl&0xF)<<slShift)
}

// FlowLabel returns the 20-bit flow label (word at 44, bits 27:8).
func (r MCMemberRecord) FlowLabel() uint32 { return r.slFlowHop() >> flowShift & flowMask }

// SetFlowLabel sets the 20-bit flow label.
func (r MCMemberRecord) SetFlowLabel(fl uint32) {
	r.setSLFlowHop(r.slFlowHop()&^(flowMask<<flowShift) | fl&flowMask<<flowShift)
}

// HopLimit returns the hop limit (byte 47).
func (r MCMemberRecord) HopLimit() uint8 { return r[mcrSLFlHop+3] }

// SetHopLimit sets the hop limit.
func (r MCMemberRecord) SetHopLimit(h uint8) { r[mcrSLFlHop+3] = h }

// Scope returns the scope (byte 48 bits 7:4).
func (r MCMemberRecord) Scope() uint8 { return r[mcrScopeJS] >> scopeShift }

// SetScope sets the scope (low 4 bits of s).
func (r MCMemberRecord) SetScope(s uint8) {
	r[mcrScopeJS] = r[mcrScopeJS]&joinStateLo | s<<scopeShift
}

// JoinState returns the JoinState bits (byte 48 bits 3:0).
func (r MCMemberRecord) JoinState() uint8 { return r[mcrScopeJS] & joinStateLo }

// SetJoinState sets the JoinState bits (low 4 bits of js).
func (r MCMemberRecord) SetJoinState(js uint8) {
	r[mcrScopeJS] = r[mcrScopeJS]&^joinStateLo | js&joinStateLo
}

// ProxyJoin returns the ProxyJoin bit (byte 49 bit 7).
func (r MCMemberRecord) ProxyJoin() bool { return r[mcrProxy]&proxyBit != 0 }

// SetProxyJoin sets the ProxyJoin bit; the reserved bits are untouched.
func (r MCMemberRecord) SetProxyJoin(v bool) {
	if v {
		r[mcrProxy] |= proxyBit
	} else {
		r[mcrProxy] &^= proxyBit
	}
}

func setSel(p *byte, s uint8)  { *p = *p&valMask6 | s<<selShift }
func setVal6(p *byte, v uint8) { *p = *p&^valMask6 | v&valMask6 }

// MCMemberFields is the value form of an MCMemberRecord.
type MCMemberFields struct {
	MGID                   wire.GID
	PortGID                wire.GID
	QKey                   uint32
	MLID                   uint16
	MTUSelector            uint8
	MTU                    uint8
	TClass                 uint8
	PKey                   uint16
	RateSelector           uint8
	Rate                   uint8
	PacketLifeTimeSelector uint8
	PacketLifeTime         uint8
	SL                     uint8
	FlowLabel              uint32
	HopLimit               uint8
	Scope                  uint8
	JoinState              uint8
	ProxyJoin              bool
}

// Encode writes all 52 defined bytes of the record from f; the reserved
// bits are 0.
func (r MCMemberRecord) Encode(f *MCMemberFields) {
	_ = r[MCMemberRecordLen-1]
	clear(r[:MCMemberRecordLen])
	r.SetMGID(f.MGID)
	r.SetPortGID(f.PortGID)
	r.SetQKey(f.QKey)
	r.SetMLID(f.MLID)
	r[mcrMTU] = f.MTUSelector<<selShift | f.MTU&valMask6
	r[mcrTClass] = f.TClass
	r.SetPKey(f.PKey)
	r[mcrRate] = f.RateSelector<<selShift | f.Rate&valMask6
	r[mcrPktLife] = f.PacketLifeTimeSelector<<selShift | f.PacketLifeTime&valMask6
	r.setSLFlowHop(uint32(f.SL&0xF)<<slShift | f.FlowLabel&flowMask<<flowShift | uint32(f.HopLimit))
	r[mcrScopeJS] = f.Scope<<scopeShift | f.JoinState&joinStateLo
	if f.ProxyJoin {
		r[mcrProxy] = proxyBit
	}
}

// Fields returns the record as a value.
func (r MCMemberRecord) Fields() MCMemberFields {
	return MCMemberFields{
		MGID:                   r.MGID(),
		PortGID:                r.PortGID(),
		QKey:                   r.QKey(),
		MLID:                   r.MLID(),
		MTUSelector:            r.MTUSelector(),
		MTU:                    r.MTU(),
		TClass:                 r.TClass(),
		PKey:                   r.PKey(),
		RateSelector:           r.RateSelector(),
		Rate:                   r.Rate(),
		PacketLifeTimeSelector: r.PacketLifeTimeSelector(),
		PacketLifeTime:         r.PacketLifeTime(),
		SL:                     r.SL(),
		FlowLabel:              r.FlowLabel(),
		HopLimit:               r.HopLimit(),
		Scope:                  r.Scope(),
		JoinState:              r.JoinState(),
		ProxyJoin:              r.ProxyJoin(),
	}
}

// MCMemberRecord returns the first MCMemberRecord of the SA data.
func (m MAD) MCMemberRecord() MCMemberRecord {
	return MCMemberRecord(m[SAHeaderEnd : SAHeaderEnd+MCMemberRecordLen])
}

// RateMbps returns the bandwidth of an IB static rate enum in Mb/s, or 0
// for an unknown value. The enum is not monotonic (5 = 5 Gb/s comes after
// 4 = 30 Gb/s); compare rates by this value.
func RateMbps(rate uint8) int {
	if int(rate) < len(rateMbps) {
		return rateMbps[rate]
	}
	return 0
}

var rateMbps = [...]int{
	2: 2500, 3: 10000, 4: 30000, 5: 5000, 6: 20000, 7: 40000, 8: 60000,
	9: 80000, 10: 120000, 11: 14000, 12: 56000, 13: 112000, 14: 168000,
	15: 25000, 16: 100000, 17: 200000, 18: 300000, 19: 28000, 20: 50000,
	21: 400000, 22: 600000, 23: 800000, 24: 1200000,
}

// ValidRate reports whether rate is a defined IB static rate enum (2..24).
func ValidRate(rate uint8) bool { return RateMbps(rate) != 0 }

// ValidMTU reports whether mtu is a defined IB MTU enum (1..5).
func ValidMTU(mtu uint8) bool { return mtu >= MTU256 && mtu <= MTU4096 }

// MTUBytes returns the size in bytes of an IB MTU enum, or 0.
func MTUBytes(mtu uint8) int {
	if !ValidMTU(mtu) {
		return 0
	}
	return 128 << mtu
}
