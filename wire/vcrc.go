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
// the LRH through the ICRC. It does not allocate.
func VCRC(pkt []byte) uint16 {
	t := &vcrcTab
	c := uint16(0xFFFF)
	for len(pkt) >= 16 {
		c ^= binary.LittleEndian.Uint16(pkt)
		c = t[15][byte(c)] ^ t[14][c>>8] ^ t[13][pkt[2]] ^ t[12][pkt[3]] ^
			t[11][pkt[4]] ^ t[10][pkt[5]] ^ t[9][pkt[6]] ^ t[8][pkt[7]] ^
			t[7][pkt[8]] ^ t[6][pkt[9]] ^ t[5][pkt[10]] ^ t[4][pkt[11]] ^
			t[3][pkt[12]] ^ t[2][pkt[13]] ^ t[1][pkt[14]] ^ t[0][pkt[15]]
		pkt = pkt[16:]
	}
	if len(pkt) >= 8 {
		c ^= binary.LittleEndian.Uint16(pkt)
		c = t[7][byte(c)] ^ t[6][c>>8] ^ t[5][pkt[2]] ^ t[4][pkt[3]] ^
			t[3][pkt[4]] ^ t[2][pkt[5]] ^ t[1][pkt[6]] ^ t[0][pkt[7]]
		pkt = pkt[8:]
	}
	for _, b := range pkt {
		c = t[0][byte(c)^b] ^ c>>8
	}
	return ^c
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
