package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"net/netip"
	"sync"
	"testing"
)

func TestRxeSrcPort(t *testing.T) {
	for _, tc := range []struct {
		qpn  uint32
		want uint16
	}{
		{17, 57236},  // e1_full.pcap, SrcQP 0x11
		{18, 0xF806}, // e2_sendonly.pcap, SrcQP 0x12
		{100, 0xCC95},
		{0, 0xC000},
		{1, 0xC000 + 0x1872},
		{0xFFFFFF, 0xF94D}, // 0xFFFFFF*0x61C88647 mod 2^32 = 0xE53779B9, >>18 = 0x394D
	} {
		if got := RxeSrcPort(tc.qpn); got != tc.want {
			t.Errorf("RxeSrcPort(%d) = %#x, want %#x", tc.qpn, got, tc.want)
		}
	}
	for q := uint32(0); q < 1<<16; q++ {
		if p := RxeSrcPort(q); p < 0xC000 {
			t.Fatalf("RxeSrcPort(%d) = %#x outside 0xC000-0xFFFF", q, p)
		}
	}
}

func TestCRCConstants(t *testing.T) {
	ff := bytes.Repeat([]byte{0xFF}, 8)
	if got := ^crc32.ChecksumIEEE(ff); got != icrcSeed {
		t.Errorf("register after 8×0xFF = %#x, want %#x (rxe's seed)", got, uint32(icrcSeed))
	}
	if got := mulModP(polyX, polyXInv); got != polyOne {
		t.Errorf("x·x⁻¹ = %#x", got)
	}
	for _, e := range []uint64{0, 1, 7, 8, 32, 8 * 24, 8 * 1100, 1<<40 + 3} {
		if got := mulModP(xPow(e), xPowNeg(e)); got != polyOne {
			t.Errorf("x^%d · x^-%d = %#x", e, e, got)
		}
	}
	// Multiplying a finished CRC by x^(8n) appends n zero bytes to the raw
	// register (zlib's crc32_combine identity, checked against hash/crc32).
	a := []byte("rocev2")
	zeros := make([]byte, 37)
	raw := func(p []byte) uint32 { return ^crc32.Update(^uint32(0), crc32.IEEETable, p) } // init 0, no xorout
	if got, want := mulModP(raw(a), xPow(8*37)), raw(append(append([]byte{}, a...), zeros...)); got != want {
		t.Errorf("shift by zeros: %#x, want %#x", got, want)
	}
}

// TestICRCExplicit pins the ICRC to crc32.ChecksumIEEE of the masked byte
// string for a fixed IPv4 and IPv6 frame, and to a known value.
func TestICRCExplicit(t *testing.T) {
	h := &UDHeader{PKey: DefaultPKey, DestQP: MulticastQPN, PSN: 7, QKey: 0x01234567, SrcQP: 0x11, HasImm: true, Imm: 0x11}
	f := buildV4(h, make([]byte, 100), IPv4Fields{ID: 0x0daa, DF: true, TTL: 64,
		Src: netip.MustParseAddr("10.99.0.11"), Dst: netip.MustParseAddr("239.1.1.1")}, RxeSrcPort(0x11))
	got := ICRCv4(f.ip, f.udp, f.body())
	if want := crc32Masked(f.ip, f.udp, f.body()); got != want {
		t.Fatalf("ICRCv4 %#x, explicit %#x", got, want)
	}
	// Same headers as e1_full.pcap frame 6 (PSN 0 there): the trailer
	// 6b 0b ec 9f is the ICRC little-endian.
	BTH(f.data).SetPSN(0)
	if got, want := ICRCv4(f.ip, f.udp, f.body()), uint32(0x9fec0b6b); got != want {
		t.Errorf("ICRC of e1 frame 6 rebuilt = %#x, want %#x", got, want)
	}
	var b [4]byte
	PutICRC(b[:], 0x9fec0b6b)
	if b != [4]byte{0x6b, 0x0b, 0xec, 0x9f} || GetICRC(b[:]) != 0x9fec0b6b {
		t.Errorf("PutICRC/GetICRC not little-endian: % x", b)
	}

	g := buildV6(h, []byte("abc"), IPv6Fields{TrafficClass: 0x28, FlowLabel: 0x12345, HopLimit: 9,
		Src: netip.MustParseAddr("fe80::1"), Dst: netip.MustParseAddr("ff0e::1:2")}, 1234)
	if got, want := ICRCv6(g.ip, g.udp, g.data[:g.n]), crc32Masked(g.ip, g.udp, g.data[:g.n]); got != want {
		t.Fatalf("ICRCv6 %#x, explicit %#x", got, want)
	}
}

func TestParseUDErrors(t *testing.T) {
	valid := func(op uint8, total int) []byte {
		b := make([]byte, total)
		b[0] = op
		BTH(b).SetDestQP(MulticastQPN)
		return b
	}
	with := func(b []byte, f func(BTH)) []byte { f(BTH(b)); return b }
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"short BTH", valid(OpUDSendOnly, BTHLen-1), ErrTruncated},
		{"BTH only", valid(OpUDSendOnly, BTHLen), ErrTruncated},
		{"TVer 1", with(valid(OpUDSendOnly, 24), func(b BTH) { b.SetTVer(1) }), ErrTVer},
		{"TVer before opcode", with(valid(0x04, 24), func(b BTH) { b.SetTVer(15) }), ErrTVer},
		{"TVer before length", with(valid(OpUDSendOnly, BTHLen), func(b BTH) { b.SetTVer(1) }), ErrTVer},
		{"RC SEND_ONLY", valid(0x04, 24), ErrOpcode},
		{"UD SEND_FIRST", valid(0x60, 24), ErrOpcode},
		{"send-only 1 byte short", valid(OpUDSendOnly, 23), ErrTruncated},
		{"imm 1 byte short", valid(OpUDSendOnlyImm, 27), ErrTruncated},
		{"pad beyond payload", with(valid(OpUDSendOnly, 26), func(b BTH) { b.SetPadCount(3) }), ErrTruncated},
		{"length before DestQP", with(valid(OpUDSendOnly, 23), func(b BTH) { b.SetDestQP(0) }), ErrTruncated},
		{"DestQP 0", with(valid(OpUDSendOnly, 24), func(b BTH) { b.SetDestQP(0) }), ErrDestQP0},
		{"minimal send-only", valid(OpUDSendOnly, 24), nil},
		{"minimal imm", valid(OpUDSendOnlyImm, 28), nil},
		{"pad exactly fits", with(valid(OpUDSendOnly, 27), func(b BTH) { b.SetPadCount(3) }), nil},
		{"unicast QPN 1", with(valid(OpUDSendOnly, 24), func(b BTH) { b.SetDestQP(1) }), nil},
	} {
		var p Packet
		if err := ParseUD(tc.b, &p); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s: ParseUD = %v, want %v", tc.name, err, tc.want)
		}
	}
	// Field placement on a hand-written packet: imm, payload "hi", pad 2.
	b, _ := hex.DecodeString("65a0ffff00ffffff00000009" + "cafef00d00000042" + "01020304" + "6869" + "0000" + "efbeadde")
	var p Packet
	if err := ParseUD(b, &p); err != nil {
		t.Fatal(err)
	}
	want := UDHeader{Solicited: true, PKey: 0xFFFF, DestQP: MulticastQPN, PSN: 9, QKey: 0xcafef00d, SrcQP: 0x42, HasImm: true, Imm: 0x01020304}
	if p.Header() != want || string(p.Payload) != "hi" || len(p.Body) != len(b)-4 || p.ICRC != 0xdeadbeef {
		t.Errorf("parsed %+v payload %q body %d icrc %#x", p.Header(), p.Payload, len(p.Body), p.ICRC)
	}
	if cap(p.Payload) != len(p.Payload) {
		t.Errorf("Payload capacity %d reaches into the pad", cap(p.Payload))
	}
	out := make([]byte, UDLen(2, true))
	if n := EncodeUD(out, &want, []byte("hi")); n != len(b)-4 || !bytes.Equal(out[:n], b[:n]) {
		t.Errorf("EncodeUD\n got % x\nwant % x", out[:n], b[:len(b)-4])
	}
}

func TestUDLen(t *testing.T) {
	for _, tc := range []struct {
		n    int
		imm  bool
		want int
	}{{0, false, 24}, {0, true, 28}, {1, false, 28}, {3, true, 32}, {4, false, 28}, {100, true, 128}, {1024, false, 1048}} {
		if got := UDLen(tc.n, tc.imm); got != tc.want {
			t.Errorf("UDLen(%d, %v) = %d, want %d", tc.n, tc.imm, got, tc.want)
		}
	}
}

func TestEncodeUDOverwritesDirtyBuffer(t *testing.T) {
	h := &UDHeader{DestQP: 5, PSN: 1, QKey: 2, SrcQP: 3}
	clean := make([]byte, UDLen(5, false))
	dirty := bytes.Repeat([]byte{0xFF}, len(clean))
	n1 := EncodeUD(clean, h, []byte("hello"))
	n2 := EncodeUD(dirty, h, []byte("hello"))
	if n1 != n2 || !bytes.Equal(clean[:n1], dirty[:n2]) {
		t.Fatalf("EncodeUD leaves stale bits:\n% x\n% x", clean[:n1], dirty[:n2])
	}
	defer func() {
		if recover() == nil {
			t.Error("EncodeUD into a short buffer did not panic")
		}
	}()
	EncodeUD(make([]byte, UDLen(5, false)-1), h, []byte("hello"))
}

func TestIPv4Checksum(t *testing.T) {
	// Textbook vector: 4500 0073 0000 4000 4011 b861 c0a8 0001 c0a8 00c7.
	ip, _ := hex.DecodeString("450000730000400040110000c0a80001c0a800c7")
	if got := IPv4(ip).CalculateChecksum(); got != 0xb861 {
		t.Errorf("CalculateChecksum = %#x, want 0xb861", got)
	}
	IPv4(ip).SetChecksum(0x1234) // the field itself is ignored
	if got := IPv4(ip).CalculateChecksum(); got != 0xb861 {
		t.Errorf("CalculateChecksum with stale field = %#x", got)
	}
	var b [IPv4HeaderLen]byte
	IPv4(b[:]).Encode(IPv4Fields{TotalLength: 0x73, DF: true, TTL: 64, Protocol: IPProtocolUDP,
		Src: netip.MustParseAddr("192.168.0.1"), Dst: netip.MustParseAddr("::ffff:192.168.0.199")})
	want, _ := hex.DecodeString("45000073000040004011b861c0a80001c0a800c7")
	if !bytes.Equal(b[:], want) {
		t.Errorf("Encode\n got % x\nwant % x", b[:], want)
	}
	IPv4(b[:]).SetSrc(netip.Addr{})
	if IPv4(b[:]).Src() != netip.IPv4Unspecified() {
		t.Errorf("zero Addr did not write 0.0.0.0")
	}
}

func TestIPv6Encode(t *testing.T) {
	var b [IPv6HeaderLen]byte
	IPv6(b[:]).Encode(IPv6Fields{TrafficClass: 0xAB, FlowLabel: 0xFFF12345, PayloadLength: 0x0102, NextHeader: 17, HopLimit: 64,
		Src: netip.MustParseAddr("2001:db8::1"), Dst: netip.MustParseAddr("ff0e::1")})
	want, _ := hex.DecodeString("6ab12345" + "0102" + "11" + "40" +
		"20010db8000000000000000000000001" + "ff0e0000000000000000000000000001")
	if !bytes.Equal(b[:], want) {
		t.Errorf("Encode\n got % x\nwant % x", b[:], want)
	}
	ip := IPv6(b[:])
	if ip.Version() != 6 || ip.TrafficClass() != 0xAB || ip.FlowLabel() != 0x12345 {
		t.Errorf("read back: v%d tc %#x fl %#x", ip.Version(), ip.TrafficClass(), ip.FlowLabel())
	}
}

func TestPutGRH(t *testing.T) {
	ip4, _ := hex.DecodeString("4500009c0daa4000401132370a63000bef010101")
	dst := bytes.Repeat([]byte{0xEE}, 48)
	PutGRHv4(dst, ip4)
	if !bytes.Equal(dst[:20], make([]byte, 20)) || !bytes.Equal(dst[20:40], ip4) || dst[40] != 0xEE {
		t.Errorf("PutGRHv4: % x", dst)
	}
	if !bytes.Equal(dst[GRHIPv4SrcOffset:GRHIPv4SrcOffset+4], []byte{10, 99, 0, 11}) ||
		!bytes.Equal(dst[GRHIPv4DstOffset:GRHIPv4DstOffset+4], []byte{239, 1, 1, 1}) {
		t.Errorf("GRH source/destination offsets")
	}
	ip6 := make([]byte, IPv6HeaderLen)
	IPv6(ip6).Encode(IPv6Fields{Src: netip.MustParseAddr("fe80::1"), Dst: netip.MustParseAddr("ff0e::1")})
	PutGRHv6(dst, ip6)
	if !bytes.Equal(dst[:40], ip6) || dst[40] != 0xEE {
		t.Errorf("PutGRHv6: % x", dst)
	}
}

func TestImmDtBigEndian(t *testing.T) {
	var b [4]byte
	ImmDt(b[:]).SetImm(0x01020304)
	if b != [4]byte{1, 2, 3, 4} || ImmDt(b[:]).Imm() != 0x01020304 {
		t.Errorf("ImmDt % x", b)
	}
}

// TestSolveIPv4IDConcurrent exercises the factor cache from many
// goroutines with lengths that collide in the cache (run with -race).
func TestSolveIPv4IDConcurrent(t *testing.T) {
	var frames []v4Frame
	for i, n := range []int{0, 1, 100, 1024 - 24, 2048 - 24, 4096, 4096 + 1024} {
		h := &UDHeader{DestQP: MulticastQPN, PSN: uint32(i), QKey: 1, SrcQP: 2}
		frames = append(frames, buildV4(h, bytes.Repeat([]byte{byte(i)}, n), IPv4Fields{ID: uint16(0x1111 * (i + 1)), DF: i%2 == 0, TTL: 1,
			Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("239.0.0.1")}, 1))
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Go(func() {
			for r := 0; r < 50; r++ {
				for i := range frames {
					f := frames[(i+g)%len(frames)]
					id, df, ok := SolveIPv4ID(hideIDDF(f.ip), f.udp, f.body(), GetICRC(f.data[f.n:]))
					if !ok || id != f.ip.ID() || df != f.ip.DF() {
						t.Errorf("frame %d: (%#x,%v,%v)", i, id, df, ok)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

func TestZeroAllocs(t *testing.T) {
	h := &UDHeader{PKey: DefaultPKey, DestQP: MulticastQPN, PSN: 3, QKey: 0x01234567, SrcQP: 0x11, HasImm: true, Imm: 7}
	payload := make([]byte, 1000)
	f := buildV4(h, payload, IPv4Fields{ID: 0x4242, DF: true, TTL: 64,
		Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("239.1.1.1")}, 5000)
	g := buildV6(h, payload, IPv6Fields{HopLimit: 1, Src: netip.MustParseAddr("fe80::1"), Dst: netip.MustParseAddr("ff0e::1")}, 5000)
	hidden := hideIDDF(f.ip)
	own := append(IPv4(nil), f.ip...)
	own.SetID(0)
	ownData := append([]byte(nil), f.data...)
	PutICRC(ownData[f.n:], ICRCv4(own, f.udp, ownData[:f.n]))
	icrc := GetICRC(f.data[f.n:])
	buf := make([]byte, len(f.data))
	grh := make([]byte, GRHAreaLen)
	var p Packet
	var sink uint32
	for _, tc := range []struct {
		name string
		fn   func()
	}{
		{"ParseUD", func() {
			if ParseUD(f.data, &p) != nil {
				panic("parse")
			}
		}},
		{"EncodeUD", func() { sink += uint32(EncodeUD(buf, h, payload)) }},
		{"ICRCv4", func() { sink += ICRCv4(f.ip, f.udp, f.body()) }},
		{"ICRCv6", func() { sink += ICRCv6(g.ip, g.udp, g.data[:g.n]) }},
		{"SolveIPv4ID", func() {
			if id, _, ok := SolveIPv4ID(hidden, f.udp, f.body(), icrc); !ok || id != 0x4242 {
				panic("solve")
			}
		}},
		{"SolveIPv4ID own", func() {
			if _, df, ok := SolveIPv4ID(hidden, f.udp, ownData[:f.n], GetICRC(ownData[f.n:])); !ok || !df {
				panic("solve own")
			}
		}},
		{"PutGRHv4", func() { PutGRHv4(grh, f.ip) }},
		{"IPv4 accessors", func() {
			sink += uint32(f.ip.ID())
			_ = f.ip.Src()
			own.SetDst(f.ip.Dst())
			sink += uint32(own.CalculateChecksum())
		}},
		{"IPv6 accessors", func() { g.ip.SetSrc(g.ip.Dst()) }},
	} {
		tc.fn() // warm-up (fills the solver cache)
		if a := testing.AllocsPerRun(100, tc.fn); a != 0 {
			t.Errorf("%s: %v allocations per run", tc.name, a)
		}
	}
	_ = sink
}
