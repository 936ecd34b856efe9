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

// crcTab8 holds the slicing-by-8 tables of the reflected IEEE polynomial:
// crcTab8[0] is crc32.IEEETable, crcTab8[k][i] the register contribution of
// byte i followed by k zero bytes.
var crcTab8 = func() (t [8][256]uint32) {
	t[0] = *crc32.IEEETable
	for i := range 256 {
		for k := 1; k < 8; k++ {
			c := t[k-1][i]
			t[k][i] = c>>8 ^ t[0][byte(c)]
		}
	}
	return t
}()

// crcUpdate feeds p into the raw (non-inverted) CRC register, 8 bytes at a
// time, then 4. It hashes the masked headers, which live in stack buffers
// that hash/crc32 would make escape to the heap.
func crcUpdate(reg uint32, p []byte) uint32 {
	t := &crcTab8
	for len(p) >= 8 {
		reg ^= binary.LittleEndian.Uint32(p)
		reg = t[0][p[7]] ^ t[1][p[6]] ^ t[2][p[5]] ^ t[3][p[4]] ^
			t[4][reg>>24] ^ t[5][reg>>16&0xFF] ^ t[6][reg>>8&0xFF] ^ t[7][reg&0xFF]
		p = p[8:]
	}
	if len(p) >= 4 {
		reg ^= binary.LittleEndian.Uint32(p)
		reg = t[0][reg>>24] ^ t[1][reg>>16&0xFF] ^ t[2][reg>>8&0xFF] ^ t[3][reg&0xFF]
		p = p[4:]
	}
	for _, c := range p {
		reg = t[0][byte(reg)^c] ^ reg>>8
	}
	return reg
}

// finishICRC hashes the unmasked rest of a packet into the raw register
// reg and returns the ICRC. It hashes the first len%16 bytes itself so
// that hash/crc32's vector loop gets a multiple of 16 bytes and no
// byte-at-a-time tail.
func finishICRC(reg uint32, rest []byte) uint32 {
	if len(rest) >= 64 {
		head := len(rest) & 15
		reg = crcUpdate(reg, rest[:head])
		rest = rest[head:]
	}
	return crc32.Update(^reg, crc32.IEEETable, rest)
}

// ICRCPrefix is the part of a RoCEv2 ICRC that the IP and UDP headers
// determine: the CRC register after the 8 bytes 0xFF and the masked IP and
// UDP headers. The masked fields aside, those headers are the same for
// every packet of one flow and length (addresses, ports, UDP length), so a
// receiver or sender can compute the prefix once and finish each packet's
// ICRC from it (ICRC), hashing only the BTH onwards.
type ICRCPrefix uint32

// ICRCPrefixV4 returns the ICRC prefix of an IPv4 packet: ip is the 20-byte
// IPv4 header as on the wire (TOS, TTL and the checksum are masked), udp
// the UDP header (its checksum is masked).
func ICRCPrefixV4(ip IPv4, udp UDP) ICRCPrefix {
	var h [IPv4HeaderLen + UDPHeaderLen]byte
	copy(h[:IPv4HeaderLen], ip[:IPv4HeaderLen])
	h[ipv4TOS], h[ipv4TTL], h[ipv4Checksum], h[ipv4Checksum+1] = 0xFF, 0xFF, 0xFF, 0xFF
	maskUDP(h[IPv4HeaderLen:], udp)
	return ICRCPrefix(crcUpdate(icrcSeed, h[:]))
}

// ICRCPrefixV6 returns the ICRC prefix of an IPv6 packet: traffic class,
// flow label and hop limit are masked, and the UDP checksum.
func ICRCPrefixV6(ip IPv6, udp UDP) ICRCPrefix {
	var h [IPv6HeaderLen + UDPHeaderLen]byte
	copy(h[:IPv6HeaderLen], ip[:IPv6HeaderLen])
	h[0] |= 0x0F
	h[1], h[2], h[3], h[ipv6HopLimit] = 0xFF, 0xFF, 0xFF, 0xFF
	maskUDP(h[IPv6HeaderLen:], udp)
	return ICRCPrefix(crcUpdate(icrcSeed, h[:]))
}

// maskUDP copies the UDP header into dst with the checksum set to 0xFFFF.
func maskUDP(dst []byte, udp UDP) {
	copy(dst[:UDPHeaderLen], udp[:UDPHeaderLen])
	dst[udpChecksum], dst[udpChecksum+1] = 0xFF, 0xFF
}

// ICRC returns the ICRC of the packet whose IP and UDP headers gave p: body
// is the UDP payload without the ICRC (BTH through pad, at least BTHLen
// bytes). The BTH's byte 4 is masked. It does not allocate.
func (p ICRCPrefix) ICRC(body []byte) uint32 {
	// The masked BTH and the 4 bytes after it: two 8-byte steps.
	var h [BTHLen + 4]byte
	copy(h[:BTHLen], body[:BTHLen])
	h[bthResv8a] = 0xFF
	k, rest := BTHLen, body[BTHLen:]
	if len(rest) >= 4 {
		copy(h[BTHLen:], rest[:4])
		k, rest = k+4, rest[4:]
	}
	return finishICRC(crcUpdate(uint32(p), h[:k]), rest)
}

// ICRCv4 returns the ICRC of a RoCEv2 packet over IPv4. ip is the 20-byte
// IPv4 header as on the wire, udp the UDP header and body the UDP payload
// without the ICRC (BTH through pad, at least BTHLen bytes). TOS, TTL and
// the header checksum are masked. It does not allocate.
func ICRCv4(ip IPv4, udp UDP, body []byte) uint32 {
	return ICRCPrefixV4(ip, udp).ICRC(body)
}

// ICRCv6 returns the ICRC of a RoCEv2 packet over IPv6. Arguments as for
// ICRCv4; traffic class, flow label and hop limit are masked.
func ICRCv6(ip IPv6, udp UDP, body []byte) uint32 {
	return ICRCPrefixV6(ip, udp).ICRC(body)
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
// the UDP payload without the ICRC (at least BTHLen bytes) and the received
// ICRC. It returns the (id, df) that make the ICRC match, or ok=false when
// none does (a corrupt packet). The solution is unique: the 17 unknown bits lie within 32
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
	return ICRCPrefixV4(hip, udp).SolveIPv4ID(body, icrc)
}

// SolveIPv4ID is the package's SolveIPv4ID for a prefix p that
// ICRCPrefixV4 computed from the IPv4 header with ID 0 and DF set (and the
// UDP header): a receiver of a flow computes that prefix once.
func (p ICRCPrefix) SolveIPv4ID(body []byte, icrc uint32) (id uint16, df bool, ok bool) {
	t := p.ICRC(body) ^ icrc
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
