package mad

import (
	"encoding/binary"

	"github.com/softrdma/softrdma/wire"
)

// ClassPortInfo sizes and capability bits.
const (
	// ClassPortInfoLen is the size of ClassPortInfo (IBA 13.4.8.1).
	ClassPortInfoLen = 72

	// CapMaskUDMulticast is CapabilityMask bit 9 of the SA,
	// IsUDMulticastSupported (0x0200).
	CapMaskUDMulticast = 0x0200
	// CapMask2SendOnlyFullMember is CapabilityMask2 bit 12,
	// IsSendOnlyFullMemberSupported (value 0x1000 of the 27-bit field).
	CapMask2SendOnlyFullMember = 1 << 12
	// CapMask2WordSendOnlyFullMember is the same bit in the raw 32-bit
	// word at ClassPortInfo offset 4 (CapabilityMask2 << 5): 0x00020000.
	CapMask2WordSendOnlyFullMember = CapMask2SendOnlyFullMember << cpiRespTimeBits
)

// ClassPortInfo offsets.
const (
	cpiBaseVersion  = 0
	cpiClassVersion = 1
	cpiCapMask      = 2
	cpiCapMask2RTV  = 4 // CapabilityMask2(31:5) | RespTimeValue(4:0)
	cpiRedirGID     = 8
	cpiRedirTCSLFL  = 24 // TC(31:24) | SL(23:20) | FL(19:0)
	cpiRedirLID     = 28
	cpiRedirPKey    = 30
	cpiRedirQP      = 32 // reserved(31:24) | QP(23:0)
	cpiRedirQKey    = 36
	cpiTrapGID      = 40
	cpiTrapTCSLFL   = 56
	cpiTrapLID      = 60
	cpiTrapPKey     = 62
	cpiTrapHLQP     = 64 // HopLimit(31:24) | QP(23:0)
	cpiTrapQKey     = 68

	cpiRespTimeBits = 5
	cpiRespTimeMask = 0x1F
	qpMask          = 0x00FFFFFF
)

// ClassPortInfo is a view of the 72-byte ClassPortInfo attribute (IBA
// 13.4.8.1), e.g. MAD.SAData()[:ClassPortInfoLen]:
//
//	0  BaseVersion  1 ClassVersion  2 CapabilityMask(2)
//	4  CapabilityMask2(27b) | RespTimeValue(5b)
//	8  RedirectGID(16)  24 RedirectTC|SL|FL(4)  28 RedirectLID(2)
//	30 RedirectP_Key(2)  32 reserved|RedirectQP(4)  36 RedirectQ_Key(4)
//	40 TrapGID(16)  56 TrapTC|SL|FL(4)  60 TrapLID(2)  62 TrapP_Key(2)
//	64 TrapHL|TrapQP(4)  68 TrapQ_Key(4)
//
// It must be at least ClassPortInfoLen bytes long.
type ClassPortInfo []byte

// BaseVersion returns the MAD base version the class supports.
func (c ClassPortInfo) BaseVersion() uint8 { return c[cpiBaseVersion] }

// SetBaseVersion sets the base version.
func (c ClassPortInfo) SetBaseVersion(v uint8) { c[cpiBaseVersion] = v }

// ClassVersion returns the class version.
func (c ClassPortInfo) ClassVersion() uint8 { return c[cpiClassVersion] }

// SetClassVersion sets the class version.
func (c ClassPortInfo) SetClassVersion(v uint8) { c[cpiClassVersion] = v }

// CapabilityMask returns the 16-bit CapabilityMask.
func (c ClassPortInfo) CapabilityMask() uint16 { return binary.BigEndian.Uint16(c[cpiCapMask:]) }

// SetCapabilityMask sets the CapabilityMask.
func (c ClassPortInfo) SetCapabilityMask(m uint16) { binary.BigEndian.PutUint16(c[cpiCapMask:], m) }

func (c ClassPortInfo) word1() uint32     { return binary.BigEndian.Uint32(c[cpiCapMask2RTV:]) }
func (c ClassPortInfo) setWord1(w uint32) { binary.BigEndian.PutUint32(c[cpiCapMask2RTV:], w) }

// CapabilityMask2 returns the 27-bit CapabilityMask2 (the upper 27 bits of
// the word at offset 4).
func (c ClassPortInfo) CapabilityMask2() uint32 { return c.word1() >> cpiRespTimeBits }

// SetCapabilityMask2 sets the 27-bit CapabilityMask2.
func (c ClassPortInfo) SetCapabilityMask2(m uint32) {
	c.setWord1(m<<cpiRespTimeBits | c.word1()&cpiRespTimeMask)
}

// RespTimeValue returns the 5-bit response time value: the class answers
// within 4.096 µs × 2^RespTimeValue.
func (c ClassPortInfo) RespTimeValue() uint8 { return uint8(c.word1() & cpiRespTimeMask) }

// SetRespTimeValue sets the 5-bit response time value.
func (c ClassPortInfo) SetRespTimeValue(v uint8) {
	c.setWord1(c.word1()&^cpiRespTimeMask | uint32(v)&cpiRespTimeMask)
}

// SendOnlyFullMemberSupported reports CapabilityMask2 bit 12.
func (c ClassPortInfo) SendOnlyFullMemberSupported() bool {
	return c.word1()&CapMask2WordSendOnlyFullMember != 0
}

// RedirectGID returns the redirect GID.
func (c ClassPortInfo) RedirectGID() wire.GID { return wire.GID(c[cpiRedirGID : cpiRedirGID+16]) }

// SetRedirectGID sets the redirect GID.
func (c ClassPortInfo) SetRedirectGID(g wire.GID) { copy(c[cpiRedirGID:cpiRedirGID+16], g[:]) }

// RedirectTCSLFL returns the redirect TC(8)|SL(4)|FlowLabel(20) word.
func (c ClassPortInfo) RedirectTCSLFL() uint32 { return binary.BigEndian.Uint32(c[cpiRedirTCSLFL:]) }

// SetRedirectTCSLFL sets the redirect TC|SL|FlowLabel word.
func (c ClassPortInfo) SetRedirectTCSLFL(v uint32) {
	binary.BigEndian.PutUint32(c[cpiRedirTCSLFL:], v)
}

// RedirectLID returns the redirect LID.
func (c ClassPortInfo) RedirectLID() uint16 { return binary.BigEndian.Uint16(c[cpiRedirLID:]) }

// SetRedirectLID sets the redirect LID.
func (c ClassPortInfo) SetRedirectLID(l uint16) { binary.BigEndian.PutUint16(c[cpiRedirLID:], l) }

// RedirectPKey returns the redirect P_Key.
func (c ClassPortInfo) RedirectPKey() uint16 { return binary.BigEndian.Uint16(c[cpiRedirPKey:]) }

// SetRedirectPKey sets the redirect P_Key.
func (c ClassPortInfo) SetRedirectPKey(k uint16) { binary.BigEndian.PutUint16(c[cpiRedirPKey:], k) }

// RedirectQP returns the 24-bit redirect QP.
func (c ClassPortInfo) RedirectQP() uint32 {
	return binary.BigEndian.Uint32(c[cpiRedirQP:]) & qpMask
}

// SetRedirectQP sets the 24-bit redirect QP (reserved byte 0).
func (c ClassPortInfo) SetRedirectQP(qp uint32) {
	binary.BigEndian.PutUint32(c[cpiRedirQP:], qp&qpMask)
}

// RedirectQKey returns the redirect Q_Key.
func (c ClassPortInfo) RedirectQKey() uint32 { return binary.BigEndian.Uint32(c[cpiRedirQKey:]) }

// SetRedirectQKey sets the redirect Q_Key.
func (c ClassPortInfo) SetRedirectQKey(k uint32) {
	binary.BigEndian.PutUint32(c[cpiRedirQKey:], k)
}

// TrapGID returns the trap GID.
func (c ClassPortInfo) TrapGID() wire.GID { return wire.GID(c[cpiTrapGID : cpiTrapGID+16]) }

// SetTrapGID sets the trap GID.
func (c ClassPortInfo) SetTrapGID(g wire.GID) { copy(c[cpiTrapGID:cpiTrapGID+16], g[:]) }

// TrapTCSLFL returns the trap TC(8)|SL(4)|FlowLabel(20) word.
func (c ClassPortInfo) TrapTCSLFL() uint32 { return binary.BigEndian.Uint32(c[cpiTrapTCSLFL:]) }

// SetTrapTCSLFL sets the trap TC|SL|FlowLabel word.
func (c ClassPortInfo) SetTrapTCSLFL(v uint32) { binary.BigEndian.PutUint32(c[cpiTrapTCSLFL:], v) }

// TrapLID returns the trap LID.
func (c ClassPortInfo) TrapLID() uint16 { return binary.BigEndian.Uint16(c[cpiTrapLID:]) }

// SetTrapLID sets the trap LID.
func (c ClassPortInfo) SetTrapLID(l uint16) { binary.BigEndian.PutUint16(c[cpiTrapLID:], l) }

// TrapPKey returns the trap P_Key.
func (c ClassPortInfo) TrapPKey() uint16 { return binary.BigEndian.Uint16(c[cpiTrapPKey:]) }

// SetTrapPKey sets the trap P_Key.
func (c ClassPortInfo) SetTrapPKey(k uint16) { binary.BigEndian.PutUint16(c[cpiTrapPKey:], k) }

// TrapHopLimit returns the trap hop limit (byte 64).
func (c ClassPortInfo) TrapHopLimit() uint8 { return c[cpiTrapHLQP] }

// SetTrapHopLimit sets the trap hop limit.
func (c ClassPortInfo) SetTrapHopLimit(h uint8) { c[cpiTrapHLQP] = h }

// TrapQP returns the 24-bit trap QP.
func (c ClassPortInfo) TrapQP() uint32 { return binary.BigEndian.Uint32(c[cpiTrapHLQP:]) & qpMask }

// SetTrapQP sets the 24-bit trap QP; the hop limit byte is untouched.
func (c ClassPortInfo) SetTrapQP(qp uint32) {
	v := binary.BigEndian.Uint32(c[cpiTrapHLQP:])
	binary.BigEndian.PutUint32(c[cpiTrapHLQP:], v&^qpMask|qp&qpMask)
}

// TrapQKey returns the trap Q_Key.
func (c ClassPortInfo) TrapQKey() uint32 { return binary.BigEndian.Uint32(c[cpiTrapQKey:]) }

// SetTrapQKey sets the trap Q_Key.
func (c ClassPortInfo) SetTrapQKey(k uint32) { binary.BigEndian.PutUint32(c[cpiTrapQKey:], k) }

// ClassPortInfo returns the ClassPortInfo in the SA data of m.
func (m MAD) ClassPortInfo() ClassPortInfo {
	return ClassPortInfo(m[SAHeaderEnd : SAHeaderEnd+ClassPortInfoLen])
}
