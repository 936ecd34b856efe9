package wire

import "encoding/binary"

// UD opcodes (IBA transport class UD, prefix 0x60) that the RDMA CM
// multicast data path uses.
const (
	// OpUDSendOnly is UD SEND_ONLY: BTH + DETH + payload.
	OpUDSendOnly uint8 = 0x64
	// OpUDSendOnlyImm is UD SEND_ONLY_WITH_IMMEDIATE: BTH + DETH + ImmDt + payload.
	OpUDSendOnlyImm uint8 = 0x65
)

// Header and trailer lengths in bytes.
const (
	// BTHLen is the length of the Base Transport Header.
	BTHLen = 12
	// DETHLen is the length of the Datagram Extended Transport Header.
	DETHLen = 8
	// ImmDtLen is the length of the Immediate Data extended header.
	ImmDtLen = 4
	// ICRCLen is the length of the invariant CRC trailer.
	ICRCLen = 4
	// GRHAreaLen is the length of the "GRH" area at the start of every UD
	// receive buffer.
	GRHAreaLen = 40
	// IPv4HeaderLen is the length of an IPv4 header without options.
	IPv4HeaderLen = 20
	// IPv6HeaderLen is the length of the fixed IPv6 header.
	IPv6HeaderLen = 40
	// UDPHeaderLen is the length of the UDP header.
	UDPHeaderLen = 8
)

const (
	// MulticastQPN is the destination QP number of every multicast packet.
	MulticastQPN = 0xFFFFFF
	// DefaultPKey is the full-member default partition key; rxe always sends it.
	DefaultPKey = 0xFFFF
)

// BTH field offsets and masks.
const (
	bthOpcode = 0
	bthFlags  = 1 // SE | MigReq | PadCnt | TVer
	bthPKey   = 2
	bthResv8a = 4 // FECN | BECN | resv6a; masked to 0xFF in the ICRC
	bthDestQP = 4 // 24-bit DestQP in bytes 5-7, read as a 32-bit word
	bthAckPSN = 8 // AckReq | resv7 in byte 8, PSN in bytes 9-11

	bthSEMask     = 0x80
	bthMigMask    = 0x40
	bthPadMask    = 0x30
	bthPadShift   = 4
	bthTVerMask   = 0x0F
	bthFECNMask   = 0x80
	bthBECNMask   = 0x40
	bthAckReqMask = 0x80

	qpnMask = 0x00FFFFFF
	psnMask = 0x00FFFFFF
)

// BTH is a view of the 12-byte InfiniBand Base Transport Header (big-endian
// fields). It must be at least BTHLen bytes long.
type BTH []byte

// Opcode returns the OpCode field (byte 0).
func (b BTH) Opcode() uint8 { return b[bthOpcode] }

// SetOpcode sets the OpCode field.
func (b BTH) SetOpcode(op uint8) { b[bthOpcode] = op }

// Solicited returns the Solicited Event (SE) bit.
func (b BTH) Solicited() bool { return b[bthFlags]&bthSEMask != 0 }

// SetSolicited sets the Solicited Event (SE) bit.
func (b BTH) SetSolicited(v bool) { setBit(&b[bthFlags], bthSEMask, v) }

// MigReq returns the migration request (M) bit.
func (b BTH) MigReq() bool { return b[bthFlags]&bthMigMask != 0 }

// SetMigReq sets the migration request (M) bit.
func (b BTH) SetMigReq(v bool) { setBit(&b[bthFlags], bthMigMask, v) }

// PadCount returns the number of pad bytes (0-3) after the payload.
func (b BTH) PadCount() int { return int(b[bthFlags]&bthPadMask) >> bthPadShift }

// SetPadCount sets the pad count; only the two low bits of n are used.
func (b BTH) SetPadCount(n int) {
	b[bthFlags] = b[bthFlags]&^bthPadMask | uint8(n<<bthPadShift)&bthPadMask
}

// TVer returns the transport header version (must be 0).
func (b BTH) TVer() uint8 { return b[bthFlags] & bthTVerMask }

// SetTVer sets the transport header version; only the low 4 bits are used.
func (b BTH) SetTVer(v uint8) { b[bthFlags] = b[bthFlags]&^bthTVerMask | v&bthTVerMask }

// PKey returns the partition key.
func (b BTH) PKey() uint16 { return binary.BigEndian.Uint16(b[bthPKey:]) }

// SetPKey sets the partition key.
func (b BTH) SetPKey(k uint16) { binary.BigEndian.PutUint16(b[bthPKey:], k) }

// FECN returns the forward explicit congestion notification bit (byte 4).
func (b BTH) FECN() bool { return b[bthResv8a]&bthFECNMask != 0 }

// SetFECN sets the FECN bit.
func (b BTH) SetFECN(v bool) { setBit(&b[bthResv8a], bthFECNMask, v) }

// BECN returns the backward explicit congestion notification bit (byte 4).
func (b BTH) BECN() bool { return b[bthResv8a]&bthBECNMask != 0 }

// SetBECN sets the BECN bit.
func (b BTH) SetBECN(v bool) { setBit(&b[bthResv8a], bthBECNMask, v) }

// DestQP returns the 24-bit destination QP number.
func (b BTH) DestQP() uint32 { return binary.BigEndian.Uint32(b[bthDestQP:]) & qpnMask }

// SetDestQP sets the 24-bit destination QP number (high bits of qpn are
// ignored); byte 4 is left untouched.
func (b BTH) SetDestQP(qpn uint32) { put24(b[bthDestQP+1:], qpn) }

// AckReq returns the acknowledge request bit (byte 8).
func (b BTH) AckReq() bool { return b[bthAckPSN]&bthAckReqMask != 0 }

// SetAckReq sets the acknowledge request bit.
func (b BTH) SetAckReq(v bool) { setBit(&b[bthAckPSN], bthAckReqMask, v) }

// PSN returns the 24-bit packet sequence number.
func (b BTH) PSN() uint32 { return binary.BigEndian.Uint32(b[bthAckPSN:]) & psnMask }

// SetPSN sets the 24-bit packet sequence number (high bits of psn are
// ignored); byte 8 is left untouched.
func (b BTH) SetPSN(psn uint32) { put24(b[bthAckPSN+1:], psn) }

func setBit(p *byte, mask uint8, v bool) {
	if v {
		*p |= mask
	} else {
		*p &^= mask
	}
}

// put24 stores the low 24 bits of v big-endian in b[0:3].
func put24(b []byte, v uint32) {
	_ = b[2]
	b[0] = byte(v >> 16)
	b[1] = byte(v >> 8)
	b[2] = byte(v)
}
