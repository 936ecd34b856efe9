package wire

import (
	"hash/crc32"
	"testing"

	"pgregory.net/rapid"
)

// buildIB builds a complete native IB UD SEND_ONLY packet: LRH, [GRH], BTH,
// DETH, payload, pad, ICRC, VCRC.
func buildIB(global bool, vl, sl uint8, dlid, slid uint16, g IBGRHFields, h *UDHeader, payload []byte) []byte {
	hl := LRHLen
	if global {
		hl += IBGRHLen
	}
	ud := UDLen(len(payload), h.HasImm)
	b := make([]byte, hl+ud+VCRCLen)
	lnh := uint8(LNHLocal)
	if global {
		lnh = LNHGlobal
	}
	LRH(b).Encode(LRHFields{VL: vl, SL: sl, LNH: lnh, DLID: dlid, SLID: slid, PktLen: PktLenWords(hl + ud)})
	if global {
		g.PayLen = uint16(ud)
		g.NxtHdr = IBGRHNextHdrBTH
		IBGRH(b[LRHLen:]).Encode(g)
	}
	n := EncodeUD(b[hl:], h, payload)
	PutICRC(b[hl+n:], ICRCIB(b[:hl+n]))
	PutVCRC(b[hl+ud:], VCRC(b[:hl+ud]))
	return b
}

// icrcIBExplicit computes the ICRC the slow way: copy, mask, ChecksumIEEE.
func icrcIBExplicit(pkt []byte) uint32 {
	s := append([]byte(nil), pkt...)
	bth := LRHLen
	if s[1]&3 == LNHGlobal {
		for i := range LRHLen {
			s[i] = 0xFF
		}
		s[LRHLen] |= 0x0F
		s[LRHLen+1], s[LRHLen+2], s[LRHLen+3] = 0xFF, 0xFF, 0xFF
		s[LRHLen+7] = 0xFF
		bth += IBGRHLen
	} else {
		s[0] |= 0xF0
	}
	s[bth+4] = 0xFF
	return crc32.ChecksumIEEE(s)
}

func sampleUD() *UDHeader {
	return &UDHeader{PKey: 0xFFFF, DestQP: MulticastQPN, PSN: 0x123456, QKey: 0x01234567, SrcQP: 0x4711}
}

var (
	sampleSGID = GID{0xfe, 0x80, 14: 0x10, 15: 0x01}
	sampleDGID = GID{0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 12: 0x06, 13: 0x01, 14: 0x02, 15: 0x03}
)

func TestICRCIBExplicit(t *testing.T) {
	for _, global := range []bool{false, true} {
		for _, n := range []int{0, 1, 3, 4, 63, 64, 65, 256, 1000} {
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(i*7 + 1)
			}
			pkt := buildIB(global, 0, 3, 0xC001, 2, IBGRHFields{TClass: 5, FlowLabel: 77, HopLmt: 9, SGID: sampleSGID, DGID: sampleDGID}, sampleUD(), p)
			body := pkt[:len(pkt)-VCRCLen-ICRCLen]
			if got, want := ICRCIB(body), icrcIBExplicit(body); got != want {
				t.Fatalf("global=%v n=%d: ICRCIB %#08x, explicit %#08x", global, n, got, want)
			}
			if got := GetICRC(pkt[len(body):]); got != icrcIBExplicit(body) {
				t.Fatalf("stored ICRC %#08x", got)
			}
			if !CheckVCRC(pkt) {
				t.Fatalf("global=%v n=%d: VCRC check failed", global, n)
			}
			if LRH(pkt).PktLen()*4+VCRCLen != uint16(len(pkt)) {
				t.Fatalf("PktLen %d for %d bytes", LRH(pkt).PktLen(), len(pkt))
			}
		}
	}
}

// The residues: CRC of data‖crc (little-endian) is a constant, which is
// what makes the chosen byte order self-consistent.
func TestCRCResidues(t *testing.T) {
	pkt := buildIB(false, 0, 0, 1, 2, IBGRHFields{}, sampleUD(), make([]byte, 256))
	if got := VCRC(pkt); got != VCRCResidue {
		t.Fatalf("VCRC over packet+VCRC = %#04x, want residue %#04x", got, VCRCResidue)
	}
	s := append([]byte(nil), pkt[:len(pkt)-VCRCLen]...)
	s[0] |= 0xF0
	s[LRHLen+4] = 0xFF
	if got := crc32.ChecksumIEEE(s); got != ICRCResidue {
		t.Fatalf("CRC-32 over masked packet+ICRC = %#08x, want residue %#08x", got, ICRCResidue)
	}
}

func TestVCRCCheckValue(t *testing.T) {
	if got := VCRC([]byte("123456789")); got != 0x0A3D {
		t.Fatalf("VCRC(123456789) = %#04x, want 0x0a3d", got)
	}
	var b [2]byte
	PutVCRC(b[:], 0x1234)
	if b != [2]byte{0x34, 0x12} || GetVCRC(b[:]) != 0x1234 {
		t.Fatalf("PutVCRC little-endian: % x", b)
	}
	if CheckVCRC([]byte{1}) {
		t.Fatal("CheckVCRC of 1 byte")
	}
}

// Masking invariants: the variant fields do not change the ICRC, but do
// change the VCRC; invariant fields change both.
func TestPropICRCIBMasking(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		global := rapid.Bool().Draw(t, "global")
		payload := rapid.SliceOfN(rapid.Byte(), 0, 300).Draw(t, "payload")
		pkt := buildIB(global,
			rapid.Uint8Range(0, 15).Draw(t, "vl"), rapid.Uint8Range(0, 15).Draw(t, "sl"),
			rapid.Uint16().Draw(t, "dlid"), rapid.Uint16().Draw(t, "slid"),
			IBGRHFields{TClass: rapid.Uint8().Draw(t, "tc"), FlowLabel: rapid.Uint32Range(0, 0xFFFFF).Draw(t, "fl"),
				HopLmt: rapid.Uint8().Draw(t, "hop"), SGID: sampleSGID, DGID: sampleDGID},
			sampleUD(), payload)
		end := len(pkt) - VCRCLen - ICRCLen
		icrc := ICRCIB(pkt[:end])
		vcrc := VCRC(pkt[:len(pkt)-VCRCLen])
		bth := LRHLen
		if global {
			bth += IBGRHLen
		}
		type mod struct {
			name    string
			variant bool
			apply   func(b []byte)
		}
		mods := []mod{
			{"VL", true, func(b []byte) { LRH(b).SetVL(LRH(b).VL() ^ 0x5) }},
			{"BTH byte 4", true, func(b []byte) { b[bth+4] ^= 0xC0 }},
			{"PSN", false, func(b []byte) { b[bth+11] ^= 1 }},
			{"DestQP", false, func(b []byte) { b[bth+7] ^= 1 }},
			{"Q_Key", false, func(b []byte) { b[bth+BTHLen] ^= 0x80 }},
		}
		if global {
			mods = append(mods,
				mod{"SL", true, func(b []byte) { LRH(b).SetSL(LRH(b).SL() ^ 1) }},
				mod{"DLID", true, func(b []byte) { LRH(b).SetDLID(LRH(b).DLID() ^ 1) }},
				mod{"SLID", true, func(b []byte) { LRH(b).SetSLID(LRH(b).SLID() ^ 0x100) }},
				mod{"PktLen", true, func(b []byte) { b[5] ^= 0x40 }},
				mod{"TClass", true, func(b []byte) { IBGRH(b[LRHLen:]).SetTClass(^IBGRH(b[LRHLen:]).TClass()) }},
				mod{"FlowLabel", true, func(b []byte) { IBGRH(b[LRHLen:]).SetFlowLabel(IBGRH(b[LRHLen:]).FlowLabel() ^ 0x80001) }},
				mod{"HopLmt", true, func(b []byte) { IBGRH(b[LRHLen:]).SetHopLmt(IBGRH(b[LRHLen:]).HopLmt() ^ 0xFF) }},
				mod{"PayLen", false, func(b []byte) { b[LRHLen+5] ^= 4 }},
				mod{"SGID", false, func(b []byte) { b[LRHLen+23] ^= 1 }},
				mod{"DGID", false, func(b []byte) { b[LRHLen+39] ^= 1 }},
			)
		} else {
			mods = append(mods,
				mod{"SL", false, func(b []byte) { LRH(b).SetSL(LRH(b).SL() ^ 1) }},
				mod{"DLID", false, func(b []byte) { LRH(b).SetDLID(LRH(b).DLID() ^ 1) }},
				mod{"SLID", false, func(b []byte) { LRH(b).SetSLID(LRH(b).SLID() ^ 0x100) }},
				mod{"PktLen", false, func(b []byte) { b[5] ^= 0x40 }},
			)
		}
		for _, m := range mods {
			c := append([]byte(nil), pkt...)
			m.apply(c)
			gotI := ICRCIB(c[:end])
			if gotI != icrcIBExplicit(c[:end]) {
				t.Fatalf("%s: fast and explicit ICRC differ", m.name)
			}
			if m.variant != (gotI == icrc) {
				t.Fatalf("%s (variant=%v): ICRC %#08x -> %#08x", m.name, m.variant, icrc, gotI)
			}
			if VCRC(c[:len(c)-VCRCLen]) == vcrc {
				t.Fatalf("%s: VCRC unchanged", m.name)
			}
		}
	})
}

func TestICRCIBZeroAlloc(t *testing.T) {
	pkt := buildIB(true, 0, 0, 0xC001, 2, IBGRHFields{SGID: sampleSGID, DGID: sampleDGID}, sampleUD(), make([]byte, 1024))
	end := len(pkt) - VCRCLen - ICRCLen
	var sink uint32
	if n := testing.AllocsPerRun(100, func() {
		sink ^= ICRCIB(pkt[:end])
		sink ^= uint32(VCRC(pkt[:len(pkt)-VCRCLen]))
	}); n != 0 {
		t.Fatalf("%v allocs", n)
	}
	_ = sink
}

func BenchmarkICRCIB(b *testing.B) {
	pkt := buildIB(true, 0, 0, 0xC001, 2, IBGRHFields{SGID: sampleSGID, DGID: sampleDGID}, sampleUD(), make([]byte, 1024))
	end := len(pkt) - VCRCLen - ICRCLen
	b.SetBytes(int64(end))
	var sink uint32
	for b.Loop() {
		sink ^= ICRCIB(pkt[:end])
	}
	_ = sink
}

func BenchmarkVCRC(b *testing.B) {
	pkt := make([]byte, 1024+60)
	b.SetBytes(int64(len(pkt)))
	var sink uint16
	for b.Loop() {
		sink ^= VCRC(pkt)
	}
	_ = sink
}

// vcrcBitwise is the VCRC computed bit by bit.
func vcrcBitwise(p []byte) uint16 {
	c := uint16(0xFFFF)
	for _, b := range p {
		c ^= uint16(b)
		for range 8 {
			if c&1 != 0 {
				c = c>>1 ^ 0xD008
			} else {
				c >>= 1
			}
		}
	}
	return ^c
}

func TestPropVCRCMatchesBitwise(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := rapid.SliceOfN(rapid.Byte(), 0, 100).Draw(t, "p")
		if got, want := VCRC(p), vcrcBitwise(p); got != want {
			t.Fatalf("VCRC %#04x, bitwise %#04x", got, want)
		}
	})
}
