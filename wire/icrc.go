package wire

import (
	"encoding/binary"
	"hash/crc32"
	"sync/atomic"
)

// The RoCEv2 invariant CRC (IBA A17.8, Linux rxe_icrc.c): the IEEE CRC-32
// (hash/crc32.ChecksumIEEE) of
//
//	8 bytes 0xFF (the masked LRH of InfiniBand)
//	‖ the IP header with its variant fields set to all ones
//	‖ the UDP header with the checksum set to 0xFFFF
//	‖ the BTH with byte 4 (FECN, BECN, resv6a) set to 0xFF
//	‖ the rest of the transport headers, the payload and the pad,
//
// stored little-endian after the pad.

// icrcSeed is the CRC-32 register after the 8 leading 0xFF bytes (rxe
// starts from this raw value instead of hashing them).
const icrcSeed = 0xDEBB20E3

// Masks ORed into the header bytes before hashing (1 bits are forced to 1).
var (
	icrcMaskIPv4 = [IPv4HeaderLen]byte{ipv4TOS: 0xFF, ipv4TTL: 0xFF, ipv4Checksum: 0xFF, ipv4Checksum + 1: 0xFF}
	icrcMaskIPv6 = [IPv6HeaderLen]byte{0: 0x0F, 1: 0xFF, 2: 0xFF, 3: 0xFF, ipv6HopLimit: 0xFF}
	icrcMaskUDP  = [UDPHeaderLen]byte{udpChecksum: 0xFF, udpChecksum + 1: 0xFF}
	icrcMaskBTH  = [BTHLen]byte{bthResv8a: 0xFF}
)

// crcMasked feeds src[i]|mask[i] into the raw (non-inverted) CRC register.
// It hashes the few header bytes byte by byte, since a masked copy passed
// to hash/crc32 would escape to the heap.
func crcMasked(reg uint32, tab *crc32.Table, src, mask []byte) uint32 {
	src = src[:len(mask)]
	for i, m := range mask {
		reg = tab[byte(reg)^(src[i]|m)] ^ reg>>8
	}
	return reg
}

// icrcFinish hashes udp and body after the IP header (reg is the raw
// register) and returns the ICRC.
func icrcFinish(reg uint32, tab *crc32.Table, udp UDP, body []byte) uint32 {
	reg = crcMasked(reg, tab, udp, icrcMaskUDP[:])
	reg = crcMasked(reg, tab, body, icrcMaskBTH[:])
	return crc32.Update(^reg, crc32.IEEETable, body[BTHLen:])
}

// ICRCv4 returns the ICRC of a RoCEv2 packet over IPv4. ip is the 20-byte
// IPv4 header as on the wire, udp the UDP header and body the UDP payload
// without the ICRC (BTH through pad, at least BTHLen bytes). It does not
// allocate.
func ICRCv4(ip IPv4, udp UDP, body []byte) uint32 {
	tab := crc32.IEEETable
	reg := crcMasked(icrcSeed, tab, ip, icrcMaskIPv4[:])
	return icrcFinish(reg, tab, udp, body)
}

// ICRCv6 returns the ICRC of a RoCEv2 packet over IPv6 (traffic class, flow
// label and hop limit are masked). Arguments as for ICRCv4.
func ICRCv6(ip IPv6, udp UDP, body []byte) uint32 {
	tab := crc32.IEEETable
	reg := crcMasked(icrcSeed, tab, ip, icrcMaskIPv6[:])
	return icrcFinish(reg, tab, udp, body)
}

// PutICRC stores crc in b[0:4] little-endian, as rxe does.
func PutICRC(b []byte, crc uint32) { binary.LittleEndian.PutUint32(b, crc) }

// GetICRC reads the little-endian ICRC from b[0:4].
func GetICRC(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }

// SolveIPv4ID recovers the IPv4 identification and DF bit of a received
// RoCEv2 packet whose IP header was not seen (UDP sockets hide it).
//
// ip is the IPv4 header as it was on the wire except for the ID and DF,
// which are ignored (pass them as 0); udp, body and icrc are the UDP header,
// the UDP payload without the ICRC and the received ICRC. It returns the
// (id, df) that make the ICRC match, or ok=false when none does (a corrupt
// packet). The solution is unique: the 17 unknown bits lie within 32
// consecutive bits, and CRC-32 maps such patterns injectively.
//
// CRC-32 is affine over GF(2): icrc(id, df) = icrc(0, 1) ⊕ rawcrc(Δ) where
// Δ is the 32-bit word at IP offset 4 followed by n = 20+len(body) zero
// bytes, and rawcrc(Δ) = Δ(x)·x^(32+8n) mod P. The solver computes
// icrc(0, DF) (the case of our own senders, which is returned at once) and
// otherwise multiplies the difference by x^-(32+8n) mod P, a constant
// cached per body length. It does not allocate after the first packet of a
// given length and is safe for concurrent use.
func SolveIPv4ID(ip IPv4, udp UDP, body []byte, icrc uint32) (id uint16, df bool, ok bool) {
	var h [IPv4HeaderLen]byte
	copy(h[:], ip[:IPv4HeaderLen])
	hip := IPv4(h[:])
	hip.SetID(0)
	hip.SetDF(true)
	t := ICRCv4(hip, udp, body) ^ icrc
	if t == 0 {
		return 0, true, true
	}
	w := mulModP(t, solveFactor(len(body)))
	// w is the difference at IP bytes 4..7 loaded little-endian: byte 0/1 =
	// ID, byte 2 = flags (only DF may differ), byte 3 = fragment offset.
	if w&^0x0040FFFF != 0 {
		return 0, false, false
	}
	return uint16(w)<<8 | uint16(w>>8)&0xFF, w&0x00400000 == 0, true
}

// crcPoly is the reflected IEEE CRC-32 polynomial (x^32 implied).
const crcPoly = 0xEDB88320

// Polynomials mod P in the reflected representation: the coefficient of
// x^k is bit 31-k.
const (
	polyOne  = 1 << 31    // x^0
	polyX    = 1 << 30    // x^1
	polyXInv = 0xDB710641 // x^-1 = (P - 1)/x
)

// mulModP returns a·b mod P (reflected representation, as zlib's multmodp).
func mulModP(a, b uint32) uint32 {
	var p uint32
	for m := uint32(polyOne); m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		b = b>>1 ^ -(b&1)&crcPoly
	}
	return p
}

// xInvPow2[k] = x^-(2^k) mod P.
var xInvPow2 = func() (t [64]uint32) {
	t[0] = polyXInv
	for k := 1; k < len(t); k++ {
		t[k] = mulModP(t[k-1], t[k-1])
	}
	return t
}()

// xPowNeg returns x^-e mod P.
func xPowNeg(e uint64) uint32 {
	p := uint32(polyOne)
	for k := 0; e != 0; k, e = k+1, e>>1 {
		if e&1 != 0 {
			p = mulModP(p, xInvPow2[k])
		}
	}
	return p
}

// solveCache is a direct-mapped cache of solveFactor: each slot holds
// bodyLen<<32 | factor (factor is never 0, so 0 means empty).
var solveCache [1024]atomic.Uint64

// solveFactor returns x^-(32 + 8(20+n)) mod P for a body of n bytes.
func solveFactor(n int) uint32 {
	slot := &solveCache[uint(n)%uint(len(solveCache))]
	if v := slot.Load(); uint32(v) != 0 && v>>32 == uint64(n) {
		return uint32(v)
	}
	f := xPowNeg(8 * (uint64(n) + 24))
	if uint64(n) <= 0xFFFFFFFF {
		slot.Store(uint64(n)<<32 | uint64(f))
	}
	return f
}
