package wire

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
)

// fuzzIP and fuzzUDP are the fixed outer headers the fuzz target hashes
// fuzzed bodies with.
var (
	fuzzIP = func() IPv4 {
		b := make(IPv4, IPv4HeaderLen)
		b.Encode(IPv4Fields{ID: 0x1234, DF: true, TTL: 64, Protocol: IPProtocolUDP, Src: netip.MustParseAddr("10.99.0.11"), Dst: netip.MustParseAddr("239.1.1.1")})
		return b
	}()
	fuzzUDP = func() UDP { b := make(UDP, UDPHeaderLen); b.Encode(RxeSrcPort(0x11), UDPPort, 0); return b }()
)

// FuzzParseUD feeds arbitrary UDP payloads to ParseUD. It must never panic;
// when it accepts a packet, re-encoding the parsed header and payload with
// EncodeUD must reproduce the body (exactly for canonical packets, and up
// to the bits EncodeUD always writes as zero otherwise).
func FuzzParseUD(f *testing.F) {
	for _, fr := range allRoCEFrames(f) {
		f.Add(fr.data)
	}
	for _, hasImm := range []bool{false, true} {
		for _, n := range []int{0, 1, 2, 3, 4, 37} {
			h := &UDHeader{Solicited: n%2 == 1, PKey: DefaultPKey, DestQP: MulticastQPN, PSN: uint32(n), QKey: 0x01234567, SrcQP: 0x11, HasImm: hasImm, Imm: 0x11}
			b := make([]byte, UDLen(n, hasImm))
			k := EncodeUD(b, h, bytes.Repeat([]byte{'x'}, n))
			PutICRC(b[k:], ICRCv4(fuzzIP, fuzzUDP, b[:k]))
			f.Add(b)
		}
	}
	f.Add([]byte{})
	f.Add(make([]byte, 23))

	f.Fuzz(func(t *testing.T, b []byte) {
		var p Packet
		if err := ParseUD(b, &p); err != nil {
			for _, s := range []error{ErrTruncated, ErrTVer, ErrOpcode, ErrDestQP0} {
				if errors.Is(err, s) {
					return
				}
			}
			t.Fatalf("non-sentinel error %v", err)
		}
		hl := BTHLen + DETHLen
		if p.HasImm {
			hl += ImmDtLen
		}
		pad := p.BTH.PadCount()
		if len(p.Body) != len(b)-ICRCLen || hl+len(p.Payload)+pad != len(p.Body) ||
			!bytes.Equal(p.Payload, b[hl:hl+len(p.Payload)]) || p.ICRC != GetICRC(b[len(b)-ICRCLen:]) {
			t.Fatalf("inconsistent slices: hdr %d payload %d pad %d body %d len %d", hl, len(p.Payload), pad, len(p.Body), len(b))
		}
		if p.BTH.TVer() != 0 || p.BTH.DestQP() == 0 || (p.BTH.Opcode() == OpUDSendOnlyImm) != p.HasImm {
			t.Fatalf("accepted invalid header % x", []byte(p.BTH))
		}

		h := p.Header()
		out := make([]byte, UDLen(len(p.Payload), h.HasImm))
		n := EncodeUD(out, &h, p.Payload)

		// The bits EncodeUD does not carry: MigReq, byte 4, AckReq/resv7,
		// the DETH reserved byte, the pad contents.
		want := append([]byte(nil), p.Body...)
		want[1] &^= bthMigMask
		want[bthResv8a] = 0
		want[bthAckPSN] = 0
		want[BTHLen+dethSrcQP] = 0
		clear(want[len(want)-pad:])
		canonical := bytes.Equal(want, p.Body) && pad == padLen(len(p.Payload))
		switch {
		case canonical:
			if !bytes.Equal(out[:n], p.Body) {
				t.Fatalf("re-encode differs\n got % x\nwant % x", out[:n], p.Body)
			}
		case pad == padLen(len(p.Payload)):
			if !bytes.Equal(out[:n], want) {
				t.Fatalf("re-encode differs outside reserved bits\n got % x\nwant % x", out[:n], want)
			}
		default: // pad count inconsistent with a 4-byte aligned length
			want[1] = want[1]&^bthPadMask | out[1]&bthPadMask
			if !bytes.Equal(out[:hl+len(p.Payload)], want[:hl+len(p.Payload)]) {
				t.Fatalf("re-encode headers/payload differ\n got % x\nwant % x", out[:n], want)
			}
		}

		// The ICRC and the ID solver must cope with any accepted body.
		crc := ICRCv4(fuzzIP, fuzzUDP, p.Body)
		if crc != crc32Masked(fuzzIP, fuzzUDP, p.Body) {
			t.Fatalf("ICRCv4 differs from the explicit CRC")
		}
		if id, df, ok := SolveIPv4ID(hideIDDF(fuzzIP), fuzzUDP, p.Body, crc); !ok || id != fuzzIP.ID() || df != fuzzIP.DF() {
			t.Fatalf("SolveIPv4ID = (%#x,%v,%v)", id, df, ok)
		}
		if id, df, ok := SolveIPv4ID(fuzzIP, fuzzUDP, p.Body, p.ICRC); ok {
			cand := append(IPv4(nil), fuzzIP...)
			cand.SetID(id)
			cand.SetDF(df)
			if ICRCv4(cand, fuzzUDP, p.Body) != p.ICRC {
				t.Fatalf("SolveIPv4ID returned a non-solution (%#x,%v)", id, df)
			}
		}
	})
}

// TestFuzzSeedsPresent makes sure the golden frames reach the fuzz corpus.
func TestFuzzSeedsPresent(t *testing.T) {
	if n := len(allRoCEFrames(t)); n < 40 {
		t.Fatalf("only %d RoCEv2 frames in the captures", n)
	}
}
