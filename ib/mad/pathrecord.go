package mad

import (
	"encoding/binary"

	"github.com/softrdma/softrdma/wire"
)

// AttrPathRecord is PathRecord (0x0035).
const AttrPathRecord = 0x0035

// PathRecord sizes.
const (
	// PathRecordLen is the size of a PathRecord (64 bytes, no padding).
	PathRecordLen = 64
	// PathRecordWords is the AttributeOffset of a PathRecord.
	PathRecordWords = PathRecordLen / 8
)

// PathRecord component mask bits (IBA 15.2.5.16; IB_SA_PATH_REC_*).
// ServiceID takes two bits, as the kernel's mask does (IBA 1.2 split the
// 64-bit field that earlier versions reserved).
const (
	PathCompServiceID       uint64 = 1<<0 | 1<<1
	PathCompDGID            uint64 = 1 << 2
	PathCompSGID            uint64 = 1 << 3
	PathCompDLID            uint64 = 1 << 4
	PathCompSLID            uint64 = 1 << 5
	PathCompRawTraffic      uint64 = 1 << 6
	PathCompFlowLabel       uint64 = 1 << 8
	PathCompHopLimit        uint64 = 1 << 9
	PathCompTClass          uint64 = 1 << 10
	PathCompReversible      uint64 = 1 << 11
	PathCompNumbPath        uint64 = 1 << 12
	PathCompPKey            uint64 = 1 << 13
	PathCompQoSClass        uint64 = 1 << 14
	PathCompSL              uint64 = 1 << 15
	PathCompMTUSelector     uint64 = 1 << 16
	PathCompMTU             uint64 = 1 << 17
	PathCompRateSelector    uint64 = 1 << 18
	PathCompRate            uint64 = 1 << 19
	PathCompPktLifeSelector uint64 = 1 << 20
	PathCompPktLife         uint64 = 1 << 21
	PathCompPreference      uint64 = 1 << 22
	pathRawBit                     = 1 << 31 // of the word at prFlowHop
	pathReversibleBit              = 0x80
	pathNumbPathMask               = 0x7F
	pathQoSShift                   = 4
	pathSLMask                     = 0x0F
	pathFlowShift                  = 8
	pathFlowMask                   = 0xFFFFF
	pathHopMask                    = 0xFF
	pathTClassOff                  = 48
	pathServiceIDOff               = 0
	pathDGIDOff                    = 8
	pathSGIDOff                    = 24
	pathDLIDOff                    = 40
	pathSLIDOff                    = 42
	pathFlowHopOff                 = 44 // RawTraffic(31) | reserved(30:28) | FlowLabel(27:8) | HopLimit(7:0)
	pathRevNumbOff                 = 49 // Reversible(7) | NumbPath(6:0)
	pathPKeyOff                    = 50
	pathQoSSLOff                   = 52 // QoSClass(15:4) | SL(3:0)
	pathMTUOff                     = 54 // selector(7:6) | MTU(5:0)
	pathRateOff                    = 55
	pathPktLifeOff                 = 56
	pathPreferenceOff              = 57
)

// PathRecord is a view of a PathRecord (IBA 15.2.5.16; 64 bytes,
// big-endian), e.g. MAD.SAData()[:PathRecordLen]:
//
//	0  ServiceID(8)  8 DGID(16)  24 SGID(16)  40 DLID(2)  42 SLID(2)
//	44 RawTraffic(1b)|reserved(3b)|FlowLabel(20b)|HopLimit(8b)
//	48 TClass  49 Reversible(1b)|NumbPath(7b)  50 P_Key(2)
//	52 QoSClass(12b)|SL(4b)  54 MTUSelector|MTU  55 RateSelector|Rate
//	56 PacketLifeTimeSelector|PacketLifeTime  57 Preference  58 reserved(6)
//
// It must be at least PathRecordLen bytes long.
type PathRecord []byte

// PathRecord returns the SA data of m as a PathRecord.
func (m MAD) PathRecord() PathRecord { return PathRecord(m.SAData()[:PathRecordLen]) }

// ServiceID returns the service ID.
func (r PathRecord) ServiceID() uint64 { return binary.BigEndian.Uint64(r[pathServiceIDOff:]) }

// SetServiceID sets the service ID.
func (r PathRecord) SetServiceID(v uint64) { binary.BigEndian.PutUint64(r[pathServiceIDOff:], v) }

// DGID returns the destination GID.
func (r PathRecord) DGID() wire.GID { return wire.GID(r[pathDGIDOff : pathDGIDOff+16]) }

// SetDGID sets the destination GID.
func (r PathRecord) SetDGID(g wire.GID) { copy(r[pathDGIDOff:pathDGIDOff+16], g[:]) }

// SGID returns the source GID.
func (r PathRecord) SGID() wire.GID { return wire.GID(r[pathSGIDOff : pathSGIDOff+16]) }

// SetSGID sets the source GID.
func (r PathRecord) SetSGID(g wire.GID) { copy(r[pathSGIDOff:pathSGIDOff+16], g[:]) }

// DLID returns the destination LID.
func (r PathRecord) DLID() uint16 { return binary.BigEndian.Uint16(r[pathDLIDOff:]) }

// SetDLID sets the destination LID.
func (r PathRecord) SetDLID(l uint16) { binary.BigEndian.PutUint16(r[pathDLIDOff:], l) }

// SLID returns the source LID.
func (r PathRecord) SLID() uint16 { return binary.BigEndian.Uint16(r[pathSLIDOff:]) }

// SetSLID sets the source LID.
func (r PathRecord) SetSLID(l uint16) { binary.BigEndian.PutUint16(r[pathSLIDOff:], l) }

func (r PathRecord) flowHop() uint32     { return binary.BigEndian.Uint32(r[pathFlowHopOff:]) }
func (r PathRecord) setFlowHop(v uint32) { binary.BigEndian.PutUint32(r[pathFlowHopOff:], v) }
func (r PathRecord) qosSL() uint16       { return binary.BigEndian.Uint16(r[pathQoSSLOff:]) }
func (r PathRecord) setQoSSL(v uint16)   { binary.BigEndian.PutUint16(r[pathQoSSLOff:], v) }

// RawTraffic reports the RawTraffic bit.
func (r PathRecord) RawTraffic() bool { return r.flowHop()&pathRawBit != 0 }

// FlowLabel returns the flow label.
func (r PathRecord) FlowLabel() uint32 { return r.flowHop() >> pathFlowShift & pathFlowMask }

// SetFlowLabel sets the flow label (low 20 bits of f).
func (r PathRecord) SetFlowLabel(f uint32) {
	r.setFlowHop(r.flowHop()&^(pathFlowMask<<pathFlowShift) | (f&pathFlowMask)<<pathFlowShift)
}

// HopLimit returns the hop limit.
func (r PathRecord) HopLimit() uint8 { return uint8(r.flowHop() & pathHopMask) }

// SetHopLimit sets the hop limit.
func (r PathRecord) SetHopLimit(h uint8) { r.setFlowHop(r.flowHop()&^pathHopMask | uint32(h)) }

// TClass returns the traffic class.
func (r PathRecord) TClass() uint8 { return r[pathTClassOff] }

// SetTClass sets the traffic class.
func (r PathRecord) SetTClass(tc uint8) { r[pathTClassOff] = tc }

// Reversible reports the Reversible bit.
func (r PathRecord) Reversible() bool { return r[pathRevNumbOff]&pathReversibleBit != 0 }

// SetReversible sets the Reversible bit.
func (r PathRecord) SetReversible(on bool) {
	r[pathRevNumbOff] &^= pathReversibleBit
	if on {
		r[pathRevNumbOff] |= pathReversibleBit
	}
}

// NumbPath returns NumbPath (the number of paths asked for).
func (r PathRecord) NumbPath() uint8 { return r[pathRevNumbOff] & pathNumbPathMask }

// SetNumbPath sets NumbPath (low 7 bits of n).
func (r PathRecord) SetNumbPath(n uint8) {
	r[pathRevNumbOff] = r[pathRevNumbOff]&pathReversibleBit | n&pathNumbPathMask
}

// PKey returns the partition key.
func (r PathRecord) PKey() uint16 { return binary.BigEndian.Uint16(r[pathPKeyOff:]) }

// SetPKey sets the partition key.
func (r PathRecord) SetPKey(k uint16) { binary.BigEndian.PutUint16(r[pathPKeyOff:], k) }

// QoSClass returns the QoS class (12 bits).
func (r PathRecord) QoSClass() uint16 { return r.qosSL() >> pathQoSShift }

// SetQoSClass sets the QoS class (low 12 bits of q).
func (r PathRecord) SetQoSClass(q uint16) {
	r.setQoSSL(r.qosSL()&pathSLMask | q<<pathQoSShift)
}

// SL returns the service level.
func (r PathRecord) SL() uint8 { return uint8(r.qosSL() & pathSLMask) }

// SetSL sets the service level (low 4 bits of sl).
func (r PathRecord) SetSL(sl uint8) { r.setQoSSL(r.qosSL()&^pathSLMask | uint16(sl)&pathSLMask) }

// MTUSelector returns the MTU selector.
func (r PathRecord) MTUSelector() uint8 { return r[pathMTUOff] >> selShift }

// SetMTUSelector sets the MTU selector.
func (r PathRecord) SetMTUSelector(s uint8) { setSel(&r[pathMTUOff], s) }

// MTU returns the MTU enum.
func (r PathRecord) MTU() uint8 { return r[pathMTUOff] & valMask6 }

// SetMTU sets the MTU enum.
func (r PathRecord) SetMTU(v uint8) { setVal6(&r[pathMTUOff], v) }

// RateSelector returns the rate selector.
func (r PathRecord) RateSelector() uint8 { return r[pathRateOff] >> selShift }

// SetRateSelector sets the rate selector.
func (r PathRecord) SetRateSelector(s uint8) { setSel(&r[pathRateOff], s) }

// Rate returns the static rate enum.
func (r PathRecord) Rate() uint8 { return r[pathRateOff] & valMask6 }

// SetRate sets the static rate enum.
func (r PathRecord) SetRate(v uint8) { setVal6(&r[pathRateOff], v) }

// PacketLifeTimeSelector returns the packet life time selector.
func (r PathRecord) PacketLifeTimeSelector() uint8 { return r[pathPktLifeOff] >> selShift }

// SetPacketLifeTimeSelector sets the packet life time selector.
func (r PathRecord) SetPacketLifeTimeSelector(s uint8) { setSel(&r[pathPktLifeOff], s) }

// PacketLifeTime returns the packet life time (4.096 µs × 2^v).
func (r PathRecord) PacketLifeTime() uint8 { return r[pathPktLifeOff] & valMask6 }

// SetPacketLifeTime sets the packet life time.
func (r PathRecord) SetPacketLifeTime(v uint8) { setVal6(&r[pathPktLifeOff], v) }

// Preference returns the preference.
func (r PathRecord) Preference() uint8 { return r[pathPreferenceOff] }

// SetPreference sets the preference.
func (r PathRecord) SetPreference(p uint8) { r[pathPreferenceOff] = p }
