//go:build amd64 && !purego

package wire

import (
	"encoding/binary"

	"golang.org/x/sys/cpu"
)

// vcrcCLMUL reports whether vcrcFold may run.
var vcrcCLMUL = cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE2

// vcrcFold folds the n bytes at p (n a multiple of 16, at least 64), the
// CRC register init XORed into their first bytes, into one 16-byte block
// congruent modulo P to them (lo: its first 8 bytes, hi: the next 8, as
// little-endian loads). k is vcrcFoldK.
//
//go:noescape
func vcrcFold(init uint64, p *byte, n int, k *[4]uint64) (lo, hi uint64)

// vcrcFast runs the register c over the whole 16-byte blocks of p by
// folding them and returns the register and the bytes left; c and p as
// they are for a short p or a CPU without PCLMULQDQ.
func vcrcFast(c uint16, p []byte) (uint16, []byte) {
	if !vcrcCLMUL || len(p) < 64 {
		return c, p
	}
	n := len(p) &^ 15
	lo, hi := vcrcFold(uint64(c), &p[0], n, &vcrcFoldK)
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], lo)
	binary.LittleEndian.PutUint64(b[8:], hi)
	return vcrcTable(0, b[:]), p[n:]
}
