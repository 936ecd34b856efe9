package mad

import "encoding/binary"

// RMPP header values (IBA 13.6.2).
const (
	// RMPPVersion1 is the RMPP version every RMPP-active MAD carries.
	RMPPVersion1 = 1

	// RMPP types.
	RMPPTypeData  = 1
	RMPPTypeAck   = 2
	RMPPTypeStop  = 3
	RMPPTypeAbort = 4

	// RMPP flags (low 3 bits of byte 26).
	RMPPFlagActive = 0x01
	RMPPFlagFirst  = 0x02
	RMPPFlagLast   = 0x04

	// RMPPNoRespTime is the RRespTime value meaning "no time given" (0x1F).
	RMPPNoRespTime = 0x1F
)

// RMPP and SA header offsets.
const (
	offRMPPVersion   = 24
	offRMPPType      = 25
	offRMPPTimeFlags = 26 // RRespTime(7:3) | RMPPFlags(2:0)
	offRMPPStatus    = 27
	offRMPPData1     = 28
	offRMPPData2     = 32
	offSMKey         = 36
	offAttrOffset    = 44
	offCompMask      = 48
)

// RMPPVersion returns the RMPP version (byte 24; 0 when RMPP is not used).
func (m MAD) RMPPVersion() uint8 { return m[offRMPPVersion] }

// SetRMPPVersion sets the RMPP version.
func (m MAD) SetRMPPVersion(v uint8) { m[offRMPPVersion] = v }

// RMPPType returns the RMPP type (byte 25).
func (m MAD) RMPPType() uint8 { return m[offRMPPType] }

// SetRMPPType sets the RMPP type.
func (m MAD) SetRMPPType(t uint8) { m[offRMPPType] = t }

// RMPPRespTime returns the 5-bit RRespTime (byte 26 bits 7:3).
func (m MAD) RMPPRespTime() uint8 { return m[offRMPPTimeFlags] >> 3 }

// SetRMPPRespTime sets the 5-bit RRespTime.
func (m MAD) SetRMPPRespTime(t uint8) {
	m[offRMPPTimeFlags] = m[offRMPPTimeFlags]&0x07 | t<<3
}

// RMPPFlags returns the 3 RMPP flag bits (byte 26 bits 2:0).
func (m MAD) RMPPFlags() uint8 { return m[offRMPPTimeFlags] & 0x07 }

// SetRMPPFlags sets the 3 RMPP flag bits.
func (m MAD) SetRMPPFlags(f uint8) { m[offRMPPTimeFlags] = m[offRMPPTimeFlags]&^0x07 | f&0x07 }

// RMPPStatus returns the RMPP status (byte 27).
func (m MAD) RMPPStatus() uint8 { return m[offRMPPStatus] }

// SetRMPPStatus sets the RMPP status.
func (m MAD) SetRMPPStatus(s uint8) { m[offRMPPStatus] = s }

// SegmentNumber returns RMPP Data1, the 1-based segment number of a DATA
// segment.
func (m MAD) SegmentNumber() uint32 { return binary.BigEndian.Uint32(m[offRMPPData1:]) }

// SetSegmentNumber sets RMPP Data1.
func (m MAD) SetSegmentNumber(n uint32) { binary.BigEndian.PutUint32(m[offRMPPData1:], n) }

// PayloadLength returns RMPP Data2: in a DATA segment the payload length
// (first segment: the whole transfer's; last segment: that segment's).
func (m MAD) PayloadLength() uint32 { return binary.BigEndian.Uint32(m[offRMPPData2:]) }

// SetPayloadLength sets RMPP Data2.
func (m MAD) SetPayloadLength(n uint32) { binary.BigEndian.PutUint32(m[offRMPPData2:], n) }

// SMKey returns the SM_Key of the SA header (bytes 36-43).
func (m MAD) SMKey() uint64 { return binary.BigEndian.Uint64(m[offSMKey:]) }

// SetSMKey sets the SM_Key.
func (m MAD) SetSMKey(k uint64) { binary.BigEndian.PutUint64(m[offSMKey:], k) }

// AttrOffset returns the SA AttributeOffset (bytes 44-45): the size of
// one record in 8-byte words (MCMemberRecord: 7).
func (m MAD) AttrOffset() uint16 { return binary.BigEndian.Uint16(m[offAttrOffset:]) }

// SetAttrOffset sets the AttributeOffset.
func (m MAD) SetAttrOffset(w uint16) { binary.BigEndian.PutUint16(m[offAttrOffset:], w) }

// CompMask returns the 64-bit SA component mask (bytes 48-55).
func (m MAD) CompMask() uint64 { return binary.BigEndian.Uint64(m[offCompMask:]) }

// SetCompMask sets the component mask.
func (m MAD) SetCompMask(c uint64) { binary.BigEndian.PutUint64(m[offCompMask:], c) }

// SAData returns the 200-byte SA data area (bytes 56-255).
func (m MAD) SAData() []byte { return m[SAHeaderEnd:Len] }

// NewSARequest returns a new 256-byte SA MAD (class 0x03, version 2) with
// the given method, attribute, transaction ID and component mask; the SA
// data area is zero. For MCMemberRecord the AttributeOffset is set to 7.
func NewSARequest(method uint8, attr uint16, tid uint64, compMask uint64) MAD {
	m := MAD(make([]byte, Len))
	m.EncodeHeader(Header{MgmtClass: ClassSubnAdm, ClassVersion: SAClassVersion, Method: method, TID: tid, AttrID: attr})
	m.SetCompMask(compMask)
	if attr == AttrMCMemberRecord {
		m.SetAttrOffset(MCMemberRecordWords)
	}
	return m
}
