package wire

import (
	"bytes"
	"net/netip"
	"testing"

	"pgregory.net/rapid"
)

func genUDHeader() *rapid.Generator[*UDHeader] {
	return rapid.Custom(func(t *rapid.T) *UDHeader {
		return &UDHeader{
			Solicited: rapid.Bool().Draw(t, "se"),
			PKey:      rapid.Uint16().Draw(t, "pkey"),
			DestQP:    rapid.Uint32Range(1, MulticastQPN).Draw(t, "destqp"),
			PSN:       rapid.Uint32().Draw(t, "psn"), // high bits must be dropped
			QKey:      rapid.Uint32().Draw(t, "qkey"),
			SrcQP:     rapid.Uint32().Draw(t, "srcqp"), // high bits must be dropped
			HasImm:    rapid.Bool().Draw(t, "hasimm"),
			Imm:       rapid.Uint32().Draw(t, "imm"),
		}
	})
}

func genAddr4(t *rapid.T, label string) netip.Addr {
	return netip.AddrFrom4([4]byte(rapid.SliceOfN(rapid.Byte(), 4, 4).Draw(t, label)))
}

func genAddr6(t *rapid.T, label string) netip.Addr {
	return netip.AddrFrom16([16]byte(rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, label)))
}

func genIPv4Fields(t *rapid.T) IPv4Fields {
	return IPv4Fields{
		TOS: rapid.Byte().Draw(t, "tos"),
		ID:  rapid.Uint16().Draw(t, "id"),
		DF:  rapid.Bool().Draw(t, "df"),
		TTL: rapid.Byte().Draw(t, "ttl"),
		Src: genAddr4(t, "src"),
		Dst: genAddr4(t, "dst"),
	}
}

func genPayload(t *rapid.T) []byte {
	return rapid.SliceOfN(rapid.Byte(), 0, 1100).Draw(t, "payload")
}

// genV4Frame draws a random valid RoCEv2/IPv4 datagram.
func genV4Frame(t *rapid.T) (v4Frame, *UDHeader, []byte) {
	h := genUDHeader().Draw(t, "hdr")
	payload := genPayload(t)
	f := buildV4(h, payload, genIPv4Fields(t), rapid.Uint16().Draw(t, "sport"))
	return f, h, payload
}

func TestPropEncodeParseRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f, h, payload := genV4Frame(t)
		if len(f.data) != UDLen(len(payload), h.HasImm) || f.n != len(f.data)-ICRCLen {
			t.Fatalf("lengths: data %d body %d", len(f.data), f.n)
		}
		if f.n%4 != 0 {
			t.Fatalf("body length %d not a multiple of 4", f.n)
		}
		var p Packet
		if err := ParseUD(f.data, &p); err != nil {
			t.Fatal(err)
		}
		want := *h
		want.DestQP &= 0xFFFFFF
		want.PSN &= 0xFFFFFF
		want.SrcQP &= 0xFFFFFF
		if !want.HasImm {
			want.Imm = 0
		}
		if got := p.Header(); got != want {
			t.Fatalf("header\n got %+v\nwant %+v", got, want)
		}
		wantOp := OpUDSendOnly
		if h.HasImm {
			wantOp = OpUDSendOnlyImm
		}
		b := p.BTH
		if b.Opcode() != wantOp || b.TVer() != 0 || b.MigReq() || b.AckReq() || b[4] != 0 || p.DETH[4] != 0 {
			t.Fatalf("BTH % x DETH % x", []byte(b), []byte(p.DETH))
		}
		if b.PadCount() != -len(payload)&3 {
			t.Fatalf("pad count %d for %d bytes", b.PadCount(), len(payload))
		}
		if !bytes.Equal(p.Payload, payload) {
			t.Fatalf("payload differs")
		}
		if pad := f.data[f.n-b.PadCount() : f.n]; !bytes.Equal(pad, make([]byte, len(pad))) {
			t.Fatalf("pad % x not zero", pad)
		}
		if &p.Body[0] != &f.data[0] || len(p.Body) != f.n {
			t.Fatalf("Body does not alias data[:n]")
		}
		if p.ICRC != ICRCv4(f.ip, f.udp, p.Body) {
			t.Fatalf("ICRC mismatch after round trip")
		}
		if f.ip.Checksum() != f.ip.CalculateChecksum() {
			t.Fatalf("IPv4.Encode checksum")
		}
	})
}

func TestPropICRCMatchesExplicitCRC32(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f, _, _ := genV4Frame(t)
		if got, want := ICRCv4(f.ip, f.udp, f.body()), crc32Masked(f.ip, f.udp, f.body()); got != want {
			t.Fatalf("ICRCv4 %#x, explicit %#x", got, want)
		}
		h := genUDHeader().Draw(t, "hdr6")
		g := buildV6(h, genPayload(t), IPv6Fields{
			TrafficClass: rapid.Byte().Draw(t, "tc"),
			FlowLabel:    rapid.Uint32().Draw(t, "fl"),
			HopLimit:     rapid.Byte().Draw(t, "hl"),
			Src:          genAddr6(t, "src6"),
			Dst:          genAddr6(t, "dst6"),
		}, rapid.Uint16().Draw(t, "sport6"))
		if got, want := ICRCv6(g.ip, g.udp, g.data[:g.n]), crc32Masked(g.ip, g.udp, g.data[:g.n]); got != want {
			t.Fatalf("ICRCv6 %#x, explicit %#x", got, want)
		}
	})
}

// mutation flips bits of one byte of a frame (xor is never 0).
type mutation struct {
	name string
	buf  func(f v4Frame) []byte // the slice to mutate
	off  int
}

func TestPropICRCMasking(t *testing.T) {
	masked := []mutation{
		{"TOS", func(f v4Frame) []byte { return f.ip }, 1},
		{"TTL", func(f v4Frame) []byte { return f.ip }, 8},
		{"IP checksum hi", func(f v4Frame) []byte { return f.ip }, 10},
		{"IP checksum lo", func(f v4Frame) []byte { return f.ip }, 11},
		{"UDP checksum hi", func(f v4Frame) []byte { return f.udp }, 6},
		{"UDP checksum lo", func(f v4Frame) []byte { return f.udp }, 7},
		{"BTH byte 4 (FECN/BECN)", func(f v4Frame) []byte { return f.data }, 4},
	}
	covered := []mutation{
		{"IP ID hi", func(f v4Frame) []byte { return f.ip }, 4},
		{"IP ID lo", func(f v4Frame) []byte { return f.ip }, 5},
		{"IP flags", func(f v4Frame) []byte { return f.ip }, 6},
		{"IP total length", func(f v4Frame) []byte { return f.ip }, 3},
		{"IP protocol", func(f v4Frame) []byte { return f.ip }, 9},
		{"IP src", func(f v4Frame) []byte { return f.ip }, 12},
		{"IP dst", func(f v4Frame) []byte { return f.ip }, 19},
		{"UDP src port", func(f v4Frame) []byte { return f.udp }, 0},
		{"UDP length", func(f v4Frame) []byte { return f.udp }, 5},
		{"opcode", func(f v4Frame) []byte { return f.data }, 0},
		{"P_Key", func(f v4Frame) []byte { return f.data }, 2},
		{"DestQP", func(f v4Frame) []byte { return f.data }, 7},
		{"PSN", func(f v4Frame) []byte { return f.data }, 11},
		{"Q_Key", func(f v4Frame) []byte { return f.data }, 12},
		{"DETH reserved", func(f v4Frame) []byte { return f.data }, 16},
		{"SrcQP", func(f v4Frame) []byte { return f.data }, 19},
	}
	rapid.Check(t, func(t *rapid.T) {
		f, _, payload := genV4Frame(t)
		orig := ICRCv4(f.ip, f.udp, f.body())
		flip := rapid.ByteRange(1, 255).Draw(t, "xor")
		check := func(m mutation, wantSame bool) {
			b := m.buf(f)
			b[m.off] ^= flip
			got := ICRCv4(f.ip, f.udp, f.body())
			b[m.off] ^= flip
			if (got == orig) != wantSame {
				t.Fatalf("flipping %s with %#x: ICRC %#x → %#x, want unchanged=%v", m.name, flip, orig, got, wantSame)
			}
		}
		for _, m := range masked {
			check(m, true)
		}
		for _, m := range covered {
			check(m, false)
		}
		if len(payload) > 0 {
			at := f.n - BTH(f.data).PadCount() - len(payload) + rapid.IntRange(0, len(payload)-1).Draw(t, "at")
			check(mutation{"payload", func(f v4Frame) []byte { return f.data }, at}, false)
		}
		// IPv6: traffic class, flow label and hop limit are masked.
		g := buildV6(genUDHeader().Draw(t, "h6"), payload, IPv6Fields{Src: genAddr6(t, "s6"), Dst: genAddr6(t, "d6")}, 4791)
		o6 := ICRCv6(g.ip, g.udp, g.data[:g.n])
		g.ip.SetTrafficClass(rapid.Byte().Draw(t, "tc"))
		g.ip.SetFlowLabel(rapid.Uint32().Draw(t, "fl"))
		g.ip.SetHopLimit(rapid.Byte().Draw(t, "hl"))
		if got := ICRCv6(g.ip, g.udp, g.data[:g.n]); got != o6 {
			t.Fatalf("IPv6 masked fields changed the ICRC")
		}
		g.ip.SetPayloadLength(g.ip.PayloadLength() ^ uint16(flip))
		if got := ICRCv6(g.ip, g.udp, g.data[:g.n]); got == o6 {
			t.Fatalf("IPv6 payload length not covered")
		}
	})
}

// hideIDDF returns a copy of ip as a UDP-socket receiver reconstructs it:
// ID 0, DF clear (and a stale checksum, which is masked anyway).
func hideIDDF(ip IPv4) IPv4 {
	h := append(IPv4(nil), ip...)
	h.SetID(0)
	h.SetDF(false)
	return h
}

func TestPropSolveIPv4ID(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f, _, _ := genV4Frame(t)
		id, df, ok := SolveIPv4ID(hideIDDF(f.ip), f.udp, f.body(), GetICRC(f.data[f.n:]))
		if !ok || id != f.ip.ID() || df != f.ip.DF() {
			t.Fatalf("SolveIPv4ID = (%#x, %v, %v), want (%#x, %v, true)", id, df, ok, f.ip.ID(), f.ip.DF())
		}
		// The ID and DF passed in are ignored.
		junk := append(IPv4(nil), f.ip...)
		junk.SetID(rapid.Uint16().Draw(t, "junkid"))
		junk.SetDF(rapid.Bool().Draw(t, "junkdf"))
		if id2, df2, ok2 := SolveIPv4ID(junk, f.udp, f.body(), GetICRC(f.data[f.n:])); id2 != id || df2 != df || !ok2 {
			t.Fatalf("result depends on the ID/DF passed in")
		}
		// The prefix of the header with ID 0 and DF gives the same answer,
		// and finishes the same ICRC as the whole computation.
		h0 := flowHeader(f.ip)
		p := ICRCPrefixV4(h0, f.udp)
		if id3, df3, ok3 := p.SolveIPv4ID(f.body(), GetICRC(f.data[f.n:])); id3 != id || df3 != df || !ok3 {
			t.Fatalf("ICRCPrefix.SolveIPv4ID = (%#x, %v, %v), want (%#x, %v, true)", id3, df3, ok3, id, df)
		}
		if got, want := p.ICRC(f.body()), ICRCv4(h0, f.udp, f.body()); got != want {
			t.Fatalf("ICRCPrefix.ICRC = %#x, ICRCv4 %#x", got, want)
		}
	})
}

// flowHeader returns a copy of ip with ID 0 and DF set, the header an
// ICRCPrefix for SolveIPv4ID is computed from.
func flowHeader(ip IPv4) IPv4 {
	h := append(IPv4(nil), ip...)
	h.SetID(0)
	h.SetDF(true)
	return h
}

func TestPropSolveIPv4IDRejectsCorruptICRC(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f, _, _ := genV4Frame(t)
		hidden := hideIDDF(f.ip)
		good := GetICRC(f.data[f.n:])

		// Any corruption: when a solution is reported it must be a real one
		// (and therefore differ from the original ID/DF).
		bad := good ^ rapid.Uint32Min(1).Draw(t, "err")
		if id, df, ok := SolveIPv4ID(hidden, f.udp, f.body(), bad); ok {
			cand := append(IPv4(nil), f.ip...)
			cand.SetID(id)
			cand.SetDF(df)
			if ICRCv4(cand, f.udp, f.body()) != bad || (id == f.ip.ID() && df == f.ip.DF()) {
				t.Fatalf("false solution (%#x, %v) for a corrupt ICRC", id, df)
			}
		}

		// A corruption outside the span of the 17 unknown bits can never
		// be explained by an ID/DF: build it from a word with a bit outside
		// ID/DF, mapped forward through the CRC.
		w := rapid.Uint32().Draw(t, "w")
		w |= 1 << rapid.SampledFrom([]int{16, 17, 18, 19, 20, 21, 23, 24, 28, 31}).Draw(t, "bit")
		e := mulModP(w, xPow(8*(uint64(f.n)+24)))
		if _, _, ok := SolveIPv4ID(hidden, f.udp, f.body(), good^e); ok {
			t.Fatalf("solved an ICRC corrupted outside the ID/DF span (w=%#x)", w)
		}
		// And a corruption inside the span is solved as exactly that ID/DF.
		dID := rapid.Uint16().Draw(t, "did")
		dDF := rapid.Bool().Draw(t, "ddf")
		win := uint32(dID>>8) | uint32(dID&0xFF)<<8
		if dDF {
			win |= 0x40 << 16
		}
		e = mulModP(win, xPow(8*(uint64(f.n)+24)))
		id, df, ok := SolveIPv4ID(hidden, f.udp, f.body(), good^e)
		if !ok || id != f.ip.ID()^dID || df != (f.ip.DF() != dDF) {
			t.Fatalf("in-span change (%#x,%v): got (%#x,%v,%v)", dID, dDF, id, df, ok)
		}
	})
}

// fieldSpec describes one header field for the accessor property test.
type fieldSpec struct {
	name  string
	size  int    // header length
	mask  []byte // bits the field occupies (nil bytes beyond are 0)
	width uint   // bits
	set   func(b []byte, v uint64)
	get   func(b []byte) uint64
}

func b2u(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}

func maskAt(size int, kv ...int) []byte {
	m := make([]byte, size)
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = byte(kv[i+1])
	}
	return m
}

var fieldSpecs = []fieldSpec{
	{"BTH.Opcode", BTHLen, maskAt(BTHLen, 0, 0xFF), 8, func(b []byte, v uint64) { BTH(b).SetOpcode(uint8(v)) }, func(b []byte) uint64 { return uint64(BTH(b).Opcode()) }},
	{"BTH.Solicited", BTHLen, maskAt(BTHLen, 1, 0x80), 1, func(b []byte, v uint64) { BTH(b).SetSolicited(v&1 != 0) }, func(b []byte) uint64 { return b2u(BTH(b).Solicited()) }},
	{"BTH.MigReq", BTHLen, maskAt(BTHLen, 1, 0x40), 1, func(b []byte, v uint64) { BTH(b).SetMigReq(v&1 != 0) }, func(b []byte) uint64 { return b2u(BTH(b).MigReq()) }},
	{"BTH.PadCount", BTHLen, maskAt(BTHLen, 1, 0x30), 2, func(b []byte, v uint64) { BTH(b).SetPadCount(int(v)) }, func(b []byte) uint64 { return uint64(BTH(b).PadCount()) }},
	{"BTH.TVer", BTHLen, maskAt(BTHLen, 1, 0x0F), 4, func(b []byte, v uint64) { BTH(b).SetTVer(uint8(v)) }, func(b []byte) uint64 { return uint64(BTH(b).TVer()) }},
	{"BTH.PKey", BTHLen, maskAt(BTHLen, 2, 0xFF, 3, 0xFF), 16, func(b []byte, v uint64) { BTH(b).SetPKey(uint16(v)) }, func(b []byte) uint64 { return uint64(BTH(b).PKey()) }},
	{"BTH.FECN", BTHLen, maskAt(BTHLen, 4, 0x80), 1, func(b []byte, v uint64) { BTH(b).SetFECN(v&1 != 0) }, func(b []byte) uint64 { return b2u(BTH(b).FECN()) }},
	{"BTH.BECN", BTHLen, maskAt(BTHLen, 4, 0x40), 1, func(b []byte, v uint64) { BTH(b).SetBECN(v&1 != 0) }, func(b []byte) uint64 { return b2u(BTH(b).BECN()) }},
	{"BTH.DestQP", BTHLen, maskAt(BTHLen, 5, 0xFF, 6, 0xFF, 7, 0xFF), 24, func(b []byte, v uint64) { BTH(b).SetDestQP(uint32(v)) }, func(b []byte) uint64 { return uint64(BTH(b).DestQP()) }},
	{"BTH.AckReq", BTHLen, maskAt(BTHLen, 8, 0x80), 1, func(b []byte, v uint64) { BTH(b).SetAckReq(v&1 != 0) }, func(b []byte) uint64 { return b2u(BTH(b).AckReq()) }},
	{"BTH.PSN", BTHLen, maskAt(BTHLen, 9, 0xFF, 10, 0xFF, 11, 0xFF), 24, func(b []byte, v uint64) { BTH(b).SetPSN(uint32(v)) }, func(b []byte) uint64 { return uint64(BTH(b).PSN()) }},
	{"DETH.QKey", DETHLen, maskAt(DETHLen, 0, 0xFF, 1, 0xFF, 2, 0xFF, 3, 0xFF), 32, func(b []byte, v uint64) { DETH(b).SetQKey(uint32(v)) }, func(b []byte) uint64 { return uint64(DETH(b).QKey()) }},
	{"DETH.SrcQP", DETHLen, maskAt(DETHLen, 5, 0xFF, 6, 0xFF, 7, 0xFF), 24, func(b []byte, v uint64) { DETH(b).SetSrcQP(uint32(v)) }, func(b []byte) uint64 { return uint64(DETH(b).SrcQP()) }},
	{"ImmDt.Imm", ImmDtLen, maskAt(ImmDtLen, 0, 0xFF, 1, 0xFF, 2, 0xFF, 3, 0xFF), 32, func(b []byte, v uint64) { ImmDt(b).SetImm(uint32(v)) }, func(b []byte) uint64 { return uint64(ImmDt(b).Imm()) }},
	{"IPv4.VersionIHL", IPv4HeaderLen, maskAt(IPv4HeaderLen, 0, 0xFF), 8, func(b []byte, v uint64) { IPv4(b).SetVersionIHL(uint8(v)) }, func(b []byte) uint64 { return uint64(IPv4(b).VersionIHL()) }},
	{"IPv4.TOS", IPv4HeaderLen, maskAt(IPv4HeaderLen, 1, 0xFF), 8, func(b []byte, v uint64) { IPv4(b).SetTOS(uint8(v)) }, func(b []byte) uint64 { return uint64(IPv4(b).TOS()) }},
	{"IPv4.TotalLength", IPv4HeaderLen, maskAt(IPv4HeaderLen, 2, 0xFF, 3, 0xFF), 16, func(b []byte, v uint64) { IPv4(b).SetTotalLength(uint16(v)) }, func(b []byte) uint64 { return uint64(IPv4(b).TotalLength()) }},
	{"IPv4.ID", IPv4HeaderLen, maskAt(IPv4HeaderLen, 4, 0xFF, 5, 0xFF), 16, func(b []byte, v uint64) { IPv4(b).SetID(uint16(v)) }, func(b []byte) uint64 { return uint64(IPv4(b).ID()) }},
	{"IPv4.Flags", IPv4HeaderLen, maskAt(IPv4HeaderLen, 6, 0xE0), 3, func(b []byte, v uint64) { IPv4(b).SetFlags(uint8(v)) }, func(b []byte) uint64 { return uint64(IPv4(b).Flags()) }},
	{"IPv4.DF", IPv4HeaderLen, maskAt(IPv4HeaderLen, 6, 0x40), 1, func(b []byte, v uint64) { IPv4(b).SetDF(v&1 != 0) }, func(b []byte) uint64 { return b2u(IPv4(b).DF()) }},
	{"IPv4.FragmentOffset", IPv4HeaderLen, maskAt(IPv4HeaderLen, 6, 0x1F, 7, 0xFF), 13, func(b []byte, v uint64) { IPv4(b).SetFragmentOffset(uint16(v)) }, func(b []byte) uint64 { return uint64(IPv4(b).FragmentOffset()) }},
	{"IPv4.TTL", IPv4HeaderLen, maskAt(IPv4HeaderLen, 8, 0xFF), 8, func(b []byte, v uint64) { IPv4(b).SetTTL(uint8(v)) }, func(b []byte) uint64 { return uint64(IPv4(b).TTL()) }},
	{"IPv4.Protocol", IPv4HeaderLen, maskAt(IPv4HeaderLen, 9, 0xFF), 8, func(b []byte, v uint64) { IPv4(b).SetProtocol(uint8(v)) }, func(b []byte) uint64 { return uint64(IPv4(b).Protocol()) }},
	{"IPv4.Checksum", IPv4HeaderLen, maskAt(IPv4HeaderLen, 10, 0xFF, 11, 0xFF), 16, func(b []byte, v uint64) { IPv4(b).SetChecksum(uint16(v)) }, func(b []byte) uint64 { return uint64(IPv4(b).Checksum()) }},
	{"IPv4.Src", IPv4HeaderLen, maskAt(IPv4HeaderLen, 12, 0xFF, 13, 0xFF, 14, 0xFF, 15, 0xFF), 32,
		func(b []byte, v uint64) { IPv4(b).SetSrc(addr4(v)) }, func(b []byte) uint64 { return u4(IPv4(b).Src()) }},
	{"IPv4.Dst", IPv4HeaderLen, maskAt(IPv4HeaderLen, 16, 0xFF, 17, 0xFF, 18, 0xFF, 19, 0xFF), 32,
		func(b []byte, v uint64) { IPv4(b).SetDst(addr4(v)) }, func(b []byte) uint64 { return u4(IPv4(b).Dst()) }},
	{"IPv6.TrafficClass", IPv6HeaderLen, maskAt(IPv6HeaderLen, 0, 0x0F, 1, 0xF0), 8, func(b []byte, v uint64) { IPv6(b).SetTrafficClass(uint8(v)) }, func(b []byte) uint64 { return uint64(IPv6(b).TrafficClass()) }},
	{"IPv6.FlowLabel", IPv6HeaderLen, maskAt(IPv6HeaderLen, 1, 0x0F, 2, 0xFF, 3, 0xFF), 20, func(b []byte, v uint64) { IPv6(b).SetFlowLabel(uint32(v)) }, func(b []byte) uint64 { return uint64(IPv6(b).FlowLabel()) }},
	{"IPv6.PayloadLength", IPv6HeaderLen, maskAt(IPv6HeaderLen, 4, 0xFF, 5, 0xFF), 16, func(b []byte, v uint64) { IPv6(b).SetPayloadLength(uint16(v)) }, func(b []byte) uint64 { return uint64(IPv6(b).PayloadLength()) }},
	{"IPv6.NextHeader", IPv6HeaderLen, maskAt(IPv6HeaderLen, 6, 0xFF), 8, func(b []byte, v uint64) { IPv6(b).SetNextHeader(uint8(v)) }, func(b []byte) uint64 { return uint64(IPv6(b).NextHeader()) }},
	{"IPv6.HopLimit", IPv6HeaderLen, maskAt(IPv6HeaderLen, 7, 0xFF), 8, func(b []byte, v uint64) { IPv6(b).SetHopLimit(uint8(v)) }, func(b []byte) uint64 { return uint64(IPv6(b).HopLimit()) }},
	{"UDP.SrcPort", UDPHeaderLen, maskAt(UDPHeaderLen, 0, 0xFF, 1, 0xFF), 16, func(b []byte, v uint64) { UDP(b).SetSrcPort(uint16(v)) }, func(b []byte) uint64 { return uint64(UDP(b).SrcPort()) }},
	{"UDP.DstPort", UDPHeaderLen, maskAt(UDPHeaderLen, 2, 0xFF, 3, 0xFF), 16, func(b []byte, v uint64) { UDP(b).SetDstPort(uint16(v)) }, func(b []byte) uint64 { return uint64(UDP(b).DstPort()) }},
	{"UDP.Length", UDPHeaderLen, maskAt(UDPHeaderLen, 4, 0xFF, 5, 0xFF), 16, func(b []byte, v uint64) { UDP(b).SetLength(uint16(v)) }, func(b []byte) uint64 { return uint64(UDP(b).Length()) }},
	{"UDP.Checksum", UDPHeaderLen, maskAt(UDPHeaderLen, 6, 0xFF, 7, 0xFF), 16, func(b []byte, v uint64) { UDP(b).SetChecksum(uint16(v)) }, func(b []byte) uint64 { return uint64(UDP(b).Checksum()) }},
}

func addr4(v uint64) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func u4(a netip.Addr) uint64 {
	b := a.As4()
	return uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
}

// TestPropAccessors checks every setter/getter pair: the value reads back
// (truncated to the field width), the field's bits hold the big-endian
// value, and no bit outside the field changes.
func TestPropAccessors(t *testing.T) {
	for _, fs := range fieldSpecs {
		t.Run(fs.name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				b := rapid.SliceOfN(rapid.Byte(), fs.size, fs.size).Draw(t, "bg")
				before := append([]byte(nil), b...)
				v := rapid.Uint64().Draw(t, "v")
				want := v & (1<<fs.width - 1)
				fs.set(b, v)
				if got := fs.get(b); got != want {
					t.Fatalf("get after set(%#x) = %#x, want %#x", v, got, want)
				}
				// Pack the masked bits (MSB first) and compare with want.
				var packed uint64
				for i := range b {
					if d := (b[i] ^ before[i]) &^ fs.mask[i]; d != 0 {
						t.Fatalf("byte %d changed outside the field: % x → % x", i, before, b)
					}
					for bit := 7; bit >= 0; bit-- {
						if fs.mask[i]>>bit&1 != 0 {
							packed = packed<<1 | uint64(b[i]>>bit&1)
						}
					}
				}
				if packed != want {
					t.Fatalf("field bits hold %#x, want %#x (layout)", packed, want)
				}
			})
		})
	}
}

func TestPropIPv6Addrs(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b := IPv6(rapid.SliceOfN(rapid.Byte(), IPv6HeaderLen, IPv6HeaderLen).Draw(t, "bg"))
		before := append([]byte(nil), b...)
		src, dst := genAddr6(t, "src"), genAddr6(t, "dst")
		b.SetSrc(src)
		b.SetDst(dst)
		if b.Src() != src || b.Dst() != dst {
			t.Fatalf("addresses do not read back")
		}
		s, d := src.As16(), dst.As16()
		if !bytes.Equal(b[8:24], s[:]) || !bytes.Equal(b[24:40], d[:]) || !bytes.Equal(b[:8], before[:8]) {
			t.Fatalf("layout % x", []byte(b))
		}
	})
}
