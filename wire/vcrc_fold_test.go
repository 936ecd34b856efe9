package wire

import (
	"math/rand/v2"
	"testing"
)

// The folded VCRC (PCLMULQDQ where the CPU has it) equals the table one
// for every length and alignment, the register preset and the tail
// included.
func TestVCRCFoldMatchesTables(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 4300)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	for n := 0; n <= 600; n++ {
		for _, off := range []int{0, 1, 7} {
			p := buf[off : off+n]
			if got, want := VCRC(p), ^vcrcTable(0xFFFF, p); got != want {
				t.Fatalf("len %d offset %d: VCRC %#04x, tables %#04x", n, off, got, want)
			}
		}
	}
	for range 200 {
		n := rng.IntN(4200)
		p := buf[rng.IntN(64):][:n]
		if got, want := VCRC(p), ^vcrcTable(0xFFFF, p); got != want {
			t.Fatalf("len %d: VCRC %#04x, tables %#04x", n, got, want)
		}
	}
	// All ones and all zeros stress the preset's XOR into the first block.
	for _, v := range []byte{0x00, 0xFF} {
		p := make([]byte, 1024)
		for i := range p {
			p[i] = v
		}
		if got, want := VCRC(p), ^vcrcTable(0xFFFF, p); got != want {
			t.Fatalf("1024 × %#02x: VCRC %#04x, tables %#04x", v, got, want)
		}
	}
}

func BenchmarkVCRCTables(b *testing.B) {
	p := make([]byte, 1100)
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		vcrcTable(0xFFFF, p)
	}
}
