package wire

import "encoding/binary"

// The variant CRC of a native InfiniBand packet (IBA 7.8.2): a CRC-16 over
// every byte from the first byte of the LRH through the ICRC, recomputed
// on every link (it covers the VL). Polynomial x^16+x^12+x^3+x+1 (0x100B),
// register preset to 0xFFFF, bits processed least significant first
// (reflected polynomial 0xD008, as for the ICRC), result complemented —
// the parameters of the InfiniBand VCRC routine of Endace's DAG capture
// library (dagcrc.c, dagcrc_infiniband_vcrc16_r: table of 0xD008, preset
// and final XOR 0xFFFF). Check value: VCRC("123456789") = 0x0A3D.
//
// Byte order: stored least significant byte first (PutVCRC/GetVCRC), the
// natural order of a reflected CRC and the one chosen for the ICRC; none
// of the sources consulted states it, so it is a convention of the
// softrdma fabric. With it, the VCRC of a packet followed by its correct
// VCRC is the fixed residue VCRCResidue.

// vcrcPoly is the reflected VCRC polynomial (0x100B bit-reversed).
const vcrcPoly = 0xD008

// VCRCResidue is what VCRC returns for any packet followed by its correct
// little-endian VCRC: a receiver may check VCRC(pkt‖vcrc) == VCRCResidue
// instead of comparing.
const VCRCResidue = 0xAA90

// vcrcTab holds the slicing-by-16 tables of the reflected polynomial:
// vcrcTab[0] is the byte-at-a-time table, vcrcTab[k][i] the register
// contribution of byte i followed by k zero bytes.
var vcrcTab = func() (t [16][256]uint16) {
	for i := range 256 {
		c := uint16(i)
		for range 8 {
			if c&1 != 0 {
				c = c>>1 ^ vcrcPoly
			} else {
				c >>= 1
			}
		}
		t[0][i] = c
	}
	for i := range 256 {
		for k := 1; k < 16; k++ {
			c := t[k-1][i]
			t[k][i] = c>>8 ^ t[0][byte(c)]
		}
	}
	return t
}()

// VCRC returns the variant CRC of pkt, the packet from the first byte of
// the LRH through the ICRC. It does not allocate. Where the CPU multiplies
// carry-less (PCLMULQDQ on amd64) the 16-byte blocks are folded first
// (vcrcFold); the tables take what is left.
func VCRC(pkt []byte) uint16 {
	c, rest := vcrcFast(0xFFFF, pkt)
	return ^vcrcTable(c, rest)
}

// vcrcTable runs the CRC register c over p with the slicing-by-16 tables
// (no preset, no final complement).
func vcrcTable(c uint16, p []byte) uint16 {
	t := &vcrcTab
	for len(p) >= 16 {
		c ^= binary.LittleEndian.Uint16(p)
		c = t[15][byte(c)] ^ t[14][c>>8] ^ t[13][p[2]] ^ t[12][p[3]] ^
			t[11][p[4]] ^ t[10][p[5]] ^ t[9][p[6]] ^ t[8][p[7]] ^
			t[7][p[8]] ^ t[6][p[9]] ^ t[5][p[10]] ^ t[4][p[11]] ^
			t[3][p[12]] ^ t[2][p[13]] ^ t[1][p[14]] ^ t[0][p[15]]
		p = p[16:]
	}
	if len(p) >= 8 {
		c ^= binary.LittleEndian.Uint16(p)
		c = t[7][byte(c)] ^ t[6][c>>8] ^ t[5][p[2]] ^ t[4][p[3]] ^
			t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]]
		p = p[8:]
	}
	for _, b := range p {
		c = t[0][byte(c)^b] ^ c>>8
	}
	return c
}

// vcrcFoldConst returns the folding constant of x^e: x^e mod P as a
// 64-bit bit-reflected value (the coefficient of x^d at bit 63-d), the
// form a carry-less multiply of two reflected 64-bit halves takes.
func vcrcFoldConst(e int) uint64 {
	r := uint32(1) // x^0, normal form; P = x^16 + 0x100B
	for range e {
		r <<= 1
		if r&0x10000 != 0 {
			r ^= 0x1100B
		}
	}
	var k uint64
	for d := range 16 {
		if r>>d&1 != 0 {
			k |= 1 << (63 - d)
		}
	}
	return k
}

// vcrcFoldK are the constants of vcrcFold: a 16-byte block D = Dh·x^64 +
// Dl (Dh its first 8 bytes, bit-reflected) moved on by F bits is
// Dh·x^(F+64) + Dl·x^F, congruent modulo P to clmul(Dh, K(F+63)) ⊕
// clmul(Dl, K(F-1)): the carry-less product of two reflected halves
// carries one factor x. Folds by 512 bits (four blocks in flight), then by
// 128.
var vcrcFoldK = [4]uint64{
	vcrcFoldConst(512 + 63), vcrcFoldConst(512 - 1),
	vcrcFoldConst(128 + 63), vcrcFoldConst(128 - 1),
}

// PutVCRC stores crc in b[0:2], least significant byte first.
func PutVCRC(b []byte, crc uint16) { binary.LittleEndian.PutUint16(b, crc) }

// GetVCRC reads the VCRC stored in b[0:2].
func GetVCRC(b []byte) uint16 { return binary.LittleEndian.Uint16(b) }

// CheckVCRC reports whether b (an IB packet from the LRH through the VCRC)
// ends with the correct VCRC.
func CheckVCRC(b []byte) bool {
	if len(b) < VCRCLen {
		return false
	}
	n := len(b) - VCRCLen
	return VCRC(b[:n]) == GetVCRC(b[n:])
}
