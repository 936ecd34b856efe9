// Package mad holds the InfiniBand management datagram formats the
// emulated subnet speaks: the 256-byte MAD with its common header, the
// RMPP header, the Subnet Administration (SA) header, and the SA
// attributes MCMemberRecord (0x0038) and ClassPortInfo (0x0001).
//
// Like package wire, every format is a view: a byte-slice type with one
// accessor and one setter per field, big-endian as on the wire, constants
// beside it, nothing allocated. MCMemberFields is the value form of an
// MCMemberRecord for code that prefers a struct.
//
// SA MAD layout (IBA 13.4, 15.2.1; ib_types.h):
//
//	0   BaseVersion(1) MgmtClass(1) ClassVersion(1) Method(1)
//	4   Status(2) ClassSpecific(2)
//	8   TransactionID(8)
//	16  AttributeID(2) Reserved(2) AttributeModifier(4)
//	24  RMPPVersion(1) RMPPType(1) RRespTime(5)|RMPPFlags(3) RMPPStatus(1)
//	28  Data1 (SegmentNumber)(4)  32  Data2 (PayloadLength/NewWindowLast)(4)
//	36  SM_Key(8)
//	44  AttributeOffset(2) Reserved(2)
//	48  ComponentMask(8)
//	56  SA data (200 bytes)
package mad

import "encoding/binary"

// Sizes in bytes.
const (
	// Len is the size of every MAD (the SA uses 256-byte MADs).
	Len = 256
	// HeaderLen is the size of the common MAD header.
	HeaderLen = 24
	// RMPPHeaderLen is the size of the RMPP header after the common header.
	RMPPHeaderLen = 12
	// SAHeaderEnd is the offset of the SA data: common header, RMPP header
	// and the 20-byte SA header (SM_Key, AttributeOffset, ComponentMask).
	SAHeaderEnd = 56
	// SADataLen is the size of the SA data area of one MAD.
	SADataLen = Len - SAHeaderEnd
	// RMPPDataLen is the RMPP payload of one segment (everything after the
	// RMPP header: SA header and SA data).
	RMPPDataLen = Len - HeaderLen - RMPPHeaderLen
)

// Management classes and versions.
const (
	// BaseVersion is the MAD base version (1).
	BaseVersion = 1
	// ClassSubnAdm is the Subnet Administration class (0x03).
	ClassSubnAdm = 0x03
	// SAClassVersion is the SA class version (2).
	SAClassVersion = 2
)

// Methods (IBA 13.4.5, 15.2.2). A response has the 0x80 bit set.
const (
	MethodGet          = 0x01
	MethodSet          = 0x02
	MethodSend         = 0x03
	MethodTrap         = 0x05
	MethodReport       = 0x06
	MethodTrapRepress  = 0x07
	MethodGetTable     = 0x12
	MethodGetTraceTbl  = 0x13
	MethodGetMulti     = 0x14
	MethodDelete       = 0x15
	MethodResp         = 0x80
	MethodGetResp      = MethodGet | MethodResp      // 0x81
	MethodGetTableResp = MethodGetTable | MethodResp // 0x92
	MethodDeleteResp   = MethodDelete | MethodResp   // 0x95
)

// Attribute IDs.
const (
	// AttrClassPortInfo is ClassPortInfo (0x0001).
	AttrClassPortInfo = 0x0001
	// AttrMCMemberRecord is MCMemberRecord (0x0038).
	AttrMCMemberRecord = 0x0038
)

// MAD status values (big-endian u16 at offset 4). The low byte holds the
// common status bits (IBA 13.4.7), the high byte the class-specific SA
// status (IBA 15.2.1.1) shifted left by 8.
const (
	StatusOK                    = 0x0000
	StatusBusy                  = 0x0001
	StatusRedirect              = 0x0002
	StatusBadVersion            = 0x0004 // bad base or class version
	StatusUnsupportedMethod     = 0x0008
	StatusUnsupportedMethodAttr = 0x000C // method/attribute combination not supported
	StatusInvalidField          = 0x001C
	StatusNoResources           = 0x0100 // SA: ERR_NO_RESOURCES
	StatusReqInvalid            = 0x0200 // SA: ERR_REQ_INVALID
	StatusNoRecords             = 0x0300 // SA: ERR_NO_RECORDS
	StatusTooManyRecords        = 0x0400 // SA: ERR_TOO_MANY_RECORDS
	StatusInvalidGID            = 0x0500 // SA: ERR_REQ_INVALID_GID
	StatusInsufComps            = 0x0600 // SA: ERR_REQ_INSUFFICIENT_COMPONENTS
	StatusDenied                = 0x0700 // SA: ERR_REQ_DENIED
	StatusPrioSuggested         = 0x0800 // SA: ERR_STATUS_PRIO_SUGGESTED
)

// SA addressing: the SA is reached at the SM's LID, QP1, with the GSI
// well-known Q_Key.
const (
	// GSIQPN is QP1, the General Services Interface QP.
	GSIQPN = 1
	// GSIQKey is the well-known Q_Key of QP1 (0x80010000).
	GSIQKey = 0x80010000
)

// Common header offsets.
const (
	offBaseVersion   = 0
	offMgmtClass     = 1
	offClassVersion  = 2
	offMethod        = 3
	offStatus        = 4
	offClassSpecific = 6
	offTID           = 8
	offAttrID        = 16
	offAttrMod       = 20
)

// MAD is a view of a 256-byte management datagram. Accessors of the SA
// header and the RMPP header are defined on it too. It must be at least Len
// bytes long (HeaderLen for the common-header accessors).
type MAD []byte

// BaseVersion returns the base version (byte 0, 1).
func (m MAD) BaseVersion() uint8 { return m[offBaseVersion] }

// SetBaseVersion sets the base version.
func (m MAD) SetBaseVersion(v uint8) { m[offBaseVersion] = v }

// MgmtClass returns the management class (byte 1).
func (m MAD) MgmtClass() uint8 { return m[offMgmtClass] }

// SetMgmtClass sets the management class.
func (m MAD) SetMgmtClass(c uint8) { m[offMgmtClass] = c }

// ClassVersion returns the class version (byte 2).
func (m MAD) ClassVersion() uint8 { return m[offClassVersion] }

// SetClassVersion sets the class version.
func (m MAD) SetClassVersion(v uint8) { m[offClassVersion] = v }

// Method returns the method (byte 3, including the response bit 0x80).
func (m MAD) Method() uint8 { return m[offMethod] }

// SetMethod sets the method.
func (m MAD) SetMethod(v uint8) { m[offMethod] = v }

// IsResponse reports whether the method has the response bit (0x80).
func (m MAD) IsResponse() bool { return m[offMethod]&MethodResp != 0 }

// Status returns the status word (bytes 4-5).
func (m MAD) Status() uint16 { return binary.BigEndian.Uint16(m[offStatus:]) }

// SetStatus sets the status word.
func (m MAD) SetStatus(s uint16) { binary.BigEndian.PutUint16(m[offStatus:], s) }

// ClassSpecific returns the class-specific word (bytes 6-7).
func (m MAD) ClassSpecific() uint16 { return binary.BigEndian.Uint16(m[offClassSpecific:]) }

// SetClassSpecific sets the class-specific word.
func (m MAD) SetClassSpecific(v uint16) { binary.BigEndian.PutUint16(m[offClassSpecific:], v) }

// TID returns the 64-bit transaction ID (bytes 8-15).
func (m MAD) TID() uint64 { return binary.BigEndian.Uint64(m[offTID:]) }

// SetTID sets the transaction ID.
func (m MAD) SetTID(tid uint64) { binary.BigEndian.PutUint64(m[offTID:], tid) }

// AttrID returns the attribute ID (bytes 16-17).
func (m MAD) AttrID() uint16 { return binary.BigEndian.Uint16(m[offAttrID:]) }

// SetAttrID sets the attribute ID.
func (m MAD) SetAttrID(id uint16) { binary.BigEndian.PutUint16(m[offAttrID:], id) }

// AttrMod returns the attribute modifier (bytes 20-23).
func (m MAD) AttrMod() uint32 { return binary.BigEndian.Uint32(m[offAttrMod:]) }

// SetAttrMod sets the attribute modifier.
func (m MAD) SetAttrMod(v uint32) { binary.BigEndian.PutUint32(m[offAttrMod:], v) }

// Header holds the common MAD header fields that EncodeHeader writes.
type Header struct {
	MgmtClass    uint8
	ClassVersion uint8
	Method       uint8
	Status       uint16
	TID          uint64
	AttrID       uint16
	AttrMod      uint32
}

// EncodeHeader writes the 24-byte common header with base version 1;
// the class-specific word and the reserved bytes are 0.
func (m MAD) EncodeHeader(h Header) {
	_ = m[HeaderLen-1]
	clear(m[:HeaderLen])
	m[offBaseVersion] = BaseVersion
	m[offMgmtClass] = h.MgmtClass
	m[offClassVersion] = h.ClassVersion
	m[offMethod] = h.Method
	m.SetStatus(h.Status)
	m.SetTID(h.TID)
	m.SetAttrID(h.AttrID)
	m.SetAttrMod(h.AttrMod)
}
