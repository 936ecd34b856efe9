package wire

import (
	"fmt"
	"hash/crc32"
	"net/netip"
	"testing"
)

var benchSizes = []int{64, 1024, 4096}

func benchFrame(payload int, id uint16) v4Frame {
	h := &UDHeader{PKey: DefaultPKey, DestQP: MulticastQPN, PSN: 1, QKey: 0x01234567, SrcQP: 0x11, HasImm: true, Imm: 0x11}
	return buildV4(h, make([]byte, payload), IPv4Fields{ID: id, DF: true, TTL: 64,
		Src: netip.MustParseAddr("10.99.0.11"), Dst: netip.MustParseAddr("239.1.1.1")}, RxeSrcPort(0x11))
}

// hashedLen is the number of bytes the ICRC covers.
func hashedLen(f v4Frame) int64 { return int64(8 + IPv4HeaderLen + UDPHeaderLen + f.n) }

// BenchmarkICRC measures ICRCv4; compare with BenchmarkCRC32Baseline, which
// hashes a byte string of the same length with crc32.ChecksumIEEE.
func BenchmarkICRC(b *testing.B) {
	for _, size := range benchSizes {
		f := benchFrame(size, 0x1234)
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			b.SetBytes(hashedLen(f))
			var sink uint32
			for b.Loop() {
				sink ^= ICRCv4(f.ip, f.udp, f.body())
			}
			_ = sink
		})
	}
}

// BenchmarkCRC32Baseline is hash/crc32 over the same number of bytes as
// BenchmarkICRC, already masked.
func BenchmarkCRC32Baseline(b *testing.B) {
	for _, size := range benchSizes {
		f := benchFrame(size, 0x1234)
		s := make([]byte, hashedLen(f))
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			var sink uint32
			for b.Loop() {
				sink ^= crc32.ChecksumIEEE(s)
			}
			_ = sink
		})
	}
}

// BenchmarkSolveIPv4ID measures the ID recovery of a receiver: "own" is a
// frame with ID 0 and DF (the fast path), "rxe" one with a non-zero ID.
func BenchmarkSolveIPv4ID(b *testing.B) {
	for _, size := range benchSizes {
		for _, c := range []struct {
			name string
			id   uint16
		}{{"own", 0}, {"rxe", 0x0daa}} {
			f := benchFrame(size, c.id)
			hidden := hideIDDF(f.ip)
			icrc := GetICRC(f.data[f.n:])
			b.Run(fmt.Sprintf("%s/%d", c.name, size), func(b *testing.B) {
				b.SetBytes(hashedLen(f))
				for b.Loop() {
					if id, _, ok := SolveIPv4ID(hidden, f.udp, f.body(), icrc); !ok || id != c.id {
						b.Fatal("not solved")
					}
				}
			})
		}
	}
}

// BenchmarkSolveIPv4IDPrefixed is BenchmarkSolveIPv4ID with the prefix of
// the flow computed once, as a receiver does for a flow it saw before.
func BenchmarkSolveIPv4IDPrefixed(b *testing.B) {
	for _, size := range benchSizes {
		f := benchFrame(size, 0)
		p := ICRCPrefixV4(flowHeader(f.ip), f.udp)
		icrc := GetICRC(f.data[f.n:])
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			b.SetBytes(hashedLen(f))
			for b.Loop() {
				if _, _, ok := p.SolveIPv4ID(f.body(), icrc); !ok {
					b.Fatal("not solved")
				}
			}
		})
	}
}

// BenchmarkSolveFactorUncached measures the per-length constant the solver
// caches.
func BenchmarkSolveFactorUncached(b *testing.B) {
	var sink uint32
	for b.Loop() {
		sink ^= xPowNeg(8 * (4096 + 24))
	}
	_ = sink
}

func BenchmarkParseUD(b *testing.B) {
	f := benchFrame(1024, 1)
	var p Packet
	for b.Loop() {
		if ParseUD(f.data, &p) != nil {
			b.Fatal("parse")
		}
	}
}

func BenchmarkEncodeUD(b *testing.B) {
	h := &UDHeader{PKey: DefaultPKey, DestQP: MulticastQPN, PSN: 1, QKey: 0x01234567, SrcQP: 0x11, HasImm: true, Imm: 0x11}
	payload := make([]byte, 1024)
	buf := make([]byte, UDLen(len(payload), true))
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		EncodeUD(buf, h, payload)
	}
}
