package wire

// The invariant CRC of a native InfiniBand packet (IBA 7.8.1; Shanley,
// "InfiniBand Network Architecture", ch. 25 "Packet CRCs"). It is the same
// CRC as the RoCEv2 ICRC (ICRCv4/ICRCv6): the reflected IEEE CRC-32
// (polynomial 0x04C11DB7, register preset to all ones, result
// complemented, i.e. hash/crc32.ChecksumIEEE) over the packet from the
// first byte of the LRH through the pad, with the variant fields — those a
// switch or router may change in flight — replaced by ones:
//
//   - local packet (LNH = LNHLocal, no GRH): the LRH VL nibble (byte 0 bits
//     7:4) and BTH byte 4 (FECN, BECN, resv6a).
//   - global packet (LNH = LNHGlobal): the whole LRH (a router rewrites it:
//     SL, DLID, SLID, VL), the GRH TClass, FlowLabel and HopLmt (bytes 0-3
//     except the IPVer nibble, and byte 7), and BTH byte 4.
//
// The "8 bytes of 0xFF" that RoCEv2 hashes in front of the IP header are
// exactly this masked LRH of a global packet: RoCEv2 inherited the global
// rule. Everything else is covered: LVer, SL, LNH, DLID, PktLen and SLID of
// a local packet; IPVer, PayLen, NxtHdr, SGID and DGID of the GRH; the rest
// of the BTH including DestQP and PSN; DETH, ImmDt, payload and pad.
//
// Byte order on the wire: the ICRC is stored least significant byte first
// (PutICRC/GetICRC), as rxe stores the RoCEv2 ICRC (verified on real rxe
// frames, see ICRCv4) and as the Ethernet FCS is sent; RoCE took its ICRC
// from IB unchanged. With this order the CRC-32 of the masked packet
// through the ICRC is the fixed residue ICRCResidue, which the tests check.

// ICRCResidue is the IEEE CRC-32 of any byte string followed by its
// little-endian CRC-32; it holds for the masked ICRC input as well.
const ICRCResidue = 0x2144DF1C

// ibICRCHdrBuf holds the masked LRH or GRH plus the BTH.
type ibICRCHdrBuf [IBGRHLen + BTHLen]byte

// ICRCIB returns the ICRC of a native InfiniBand packet. pkt holds the
// packet from the first byte of the LRH through the pad (no ICRC, no
// VCRC); it must hold the LRH, the GRH when LNH is LNHGlobal, and the BTH.
// The LNH field of the LRH selects the global or the local masking rule
// (any LNH other than LNHGlobal is masked as local). It does not allocate.
func ICRCIB(pkt []byte) uint32 {
	var h ibICRCHdrBuf
	var reg uint32
	var rest []byte
	if LRH(pkt).LNH() == LNHGlobal {
		grh := pkt[LRHLen : LRHLen+IBGRHLen]
		copy(h[:IBGRHLen], grh)
		h[0] |= 0x0F                        // TClass high nibble
		h[1], h[2], h[3] = 0xFF, 0xFF, 0xFF // TClass low nibble, FlowLabel
		h[ipv6HopLimit] = 0xFF
		copy(h[IBGRHLen:], pkt[LRHLen+IBGRHLen:LRHLen+IBGRHLen+BTHLen])
		h[IBGRHLen+bthResv8a] = 0xFF
		// icrcSeed is the register after the 8 masked LRH bytes (all ones).
		reg = crcUpdate(icrcSeed, h[:IBGRHLen+BTHLen])
		rest = pkt[LRHLen+IBGRHLen+BTHLen:]
	} else {
		copy(h[:LRHLen], pkt[:LRHLen])
		h[lrhVLLVer] |= 0xF0 // VL
		copy(h[LRHLen:], pkt[LRHLen:LRHLen+BTHLen])
		h[LRHLen+bthResv8a] = 0xFF
		reg = crcUpdate(0xFFFFFFFF, h[:LRHLen+BTHLen])
		rest = pkt[LRHLen+BTHLen:]
	}
	return finishICRC(reg, rest)
}
