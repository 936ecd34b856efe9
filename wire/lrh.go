package wire

import "encoding/binary"

// Native InfiniBand link-layer lengths.
const (
	// LRHLen is the length of the Local Route Header.
	LRHLen = 8
	// VCRCLen is the length of the variant CRC trailer of a native IB packet.
	VCRCLen = 2
	// IBGRHLen is the length of the InfiniBand Global Route Header.
	IBGRHLen = 40
)

// LRH Link Next Header values (IBA 7.7.6): what follows the LRH.
const (
	// LNHRaw is a raw packet (no IBA transport, no ICRC).
	LNHRaw = 0
	// LNHIPNonIBA is a raw IPv6 packet (non-IBA transport).
	LNHIPNonIBA = 1
	// LNHLocal is "IBA local": BTH follows the LRH.
	LNHLocal = 2
	// LNHGlobal is "IBA global": a GRH follows the LRH, then the BTH.
	LNHGlobal = 3
)

// LID ranges of a subnet.
const (
	// MulticastLIDBase is the first multicast LID (0xC000).
	MulticastLIDBase = 0xC000
	// MulticastLIDMax is the last multicast LID (0xFFFE).
	MulticastLIDMax = 0xFFFE
	// PermissiveLID is the permissive LID 0xFFFF.
	PermissiveLID = 0xFFFF
)

// IsMulticastLID reports whether lid is a multicast LID (0xC000..0xFFFE).
func IsMulticastLID(lid uint16) bool { return lid >= MulticastLIDBase && lid <= MulticastLIDMax }

// LRH field offsets and masks.
const (
	lrhVLLVer  = 0 // VL(7:4) | LVer(3:0)
	lrhSLLNH   = 1 // SL(7:4) | rsv(3:2) | LNH(1:0)
	lrhDLID    = 2
	lrhPktLen  = 4 // rsv(15:11) | PktLen(10:0)
	lrhSLID    = 6
	lrhLNHMask = 0x03

	// PktLenMask is the 11-bit PktLen field.
	pktLenMask = 0x07FF
)

// LRH is a view of the 8-byte InfiniBand Local Route Header (IBA 7.7,
// big-endian):
//
//	byte 0: VL(4) | LVer(4)
//	byte 1: SL(4) | reserved(2) | LNH(2)
//	bytes 2-3: DLID
//	bytes 4-5: reserved(5) | PktLen(11)
//	bytes 6-7: SLID
//
// PktLen counts 4-byte words from the first byte of the LRH through the
// ICRC; the VCRC is not counted. An LRH never starts with 'S' (0x53) on
// the softrdma fabric because LVer is 0. It must be at least LRHLen bytes
// long.
type LRH []byte

// VL returns the virtual lane (byte 0 bits 7:4).
func (l LRH) VL() uint8 { return l[lrhVLLVer] >> 4 }

// SetVL sets the virtual lane; only the low 4 bits of vl are used.
func (l LRH) SetVL(vl uint8) { l[lrhVLLVer] = l[lrhVLLVer]&0x0F | vl<<4 }

// LVer returns the link version (byte 0 bits 3:0, must be 0).
func (l LRH) LVer() uint8 { return l[lrhVLLVer] & 0x0F }

// SetLVer sets the link version; only the low 4 bits of v are used.
func (l LRH) SetLVer(v uint8) { l[lrhVLLVer] = l[lrhVLLVer]&0xF0 | v&0x0F }

// SL returns the service level (byte 1 bits 7:4).
func (l LRH) SL() uint8 { return l[lrhSLLNH] >> 4 }

// SetSL sets the service level; only the low 4 bits of sl are used.
func (l LRH) SetSL(sl uint8) { l[lrhSLLNH] = l[lrhSLLNH]&0x0F | sl<<4 }

// LNH returns the link next header (byte 1 bits 1:0): LNHLocal, LNHGlobal…
func (l LRH) LNH() uint8 { return l[lrhSLLNH] & lrhLNHMask }

// SetLNH sets the link next header; only the low 2 bits of lnh are used.
func (l LRH) SetLNH(lnh uint8) { l[lrhSLLNH] = l[lrhSLLNH]&^lrhLNHMask | lnh&lrhLNHMask }

// DLID returns the destination LID.
func (l LRH) DLID() uint16 { return binary.BigEndian.Uint16(l[lrhDLID:]) }

// SetDLID sets the destination LID.
func (l LRH) SetDLID(lid uint16) { binary.BigEndian.PutUint16(l[lrhDLID:], lid) }

// PktLen returns the 11-bit packet length in 4-byte words (LRH through
// ICRC, VCRC excluded).
func (l LRH) PktLen() uint16 { return binary.BigEndian.Uint16(l[lrhPktLen:]) & pktLenMask }

// SetPktLen sets the 11-bit packet length in 4-byte words (high bits of
// words are ignored); the 5 reserved bits are left untouched.
func (l LRH) SetPktLen(words uint16) {
	v := binary.BigEndian.Uint16(l[lrhPktLen:])
	binary.BigEndian.PutUint16(l[lrhPktLen:], v&^pktLenMask|words&pktLenMask)
}

// SLID returns the source LID.
func (l LRH) SLID() uint16 { return binary.BigEndian.Uint16(l[lrhSLID:]) }

// SetSLID sets the source LID.
func (l LRH) SetSLID(lid uint16) { binary.BigEndian.PutUint16(l[lrhSLID:], lid) }

// LRHFields holds the values Encode writes into an LRH (LVer 0, reserved
// bits 0).
type LRHFields struct {
	VL, SL     uint8
	LNH        uint8
	DLID, SLID uint16
	PktLen     uint16 // 4-byte words, LRH through ICRC
}

// Encode writes all eight bytes of the LRH from f; LVer and the reserved
// bits are 0.
func (l LRH) Encode(f LRHFields) {
	_ = l[LRHLen-1]
	l[lrhVLLVer] = f.VL << 4
	l[lrhSLLNH] = f.SL<<4 | f.LNH&lrhLNHMask
	l.SetDLID(f.DLID)
	binary.BigEndian.PutUint16(l[lrhPktLen:], f.PktLen&pktLenMask)
	l.SetSLID(f.SLID)
}

// PktLenWords returns the LRH PktLen of a packet whose bytes from the LRH
// through the ICRC number n (n must be a multiple of 4).
func PktLenWords(n int) uint16 { return uint16(n / 4) }
