package introspect

import (
	"encoding/binary"
	"fmt"
	"io"
	"time"

	"github.com/softrdma/softrdma/verbs"
)

// captureGrace is how long past its duration a Client waits for a
// capture to end.
const captureGrace = 10 * time.Second

// pcapGuard passes a capture stream through to w while checking that it
// is the bounded pcap an endpoint writes: a little-endian classic pcap
// header (microsecond or nanosecond) of version 2.4, a snaplen of at most
// maxCaptureSnaplen and Ethernet or InfiniBand frames, records no longer than the
// snaplen and, when frames > 0, no more than that many records. Anything
// else is an error wrapping ErrAnswerTooLarge.
type pcapGuard struct {
	w       io.Writer
	frames  int // the most records allowed (0: any number)
	seen    int
	snaplen uint32
	hdr     []byte // the part of a header seen so far
	skip    int    // bytes of the current record's data still to come
	global  bool   // the file header was seen
}

// Write checks b and writes it to the underlying writer.
func (g *pcapGuard) Write(b []byte) (int, error) {
	if err := g.check(b); err != nil {
		return 0, err
	}
	return g.w.Write(b)
}

func (g *pcapGuard) check(b []byte) error {
	for len(b) > 0 {
		if g.skip > 0 {
			k := min(g.skip, len(b))
			g.skip -= k
			b = b[k:]
			continue
		}
		need := 16
		if !g.global {
			need = 24
		}
		k := min(need-len(g.hdr), len(b))
		g.hdr = append(g.hdr, b[:k]...)
		b = b[k:]
		if len(g.hdr) < need {
			return nil
		}
		h := g.hdr
		g.hdr = g.hdr[:0]
		if !g.global {
			magic := binary.LittleEndian.Uint32(h[0:4])
			if magic != 0xa1b2c3d4 && magic != 0xa1b23c4d {
				return fmt.Errorf("not a little-endian pcap stream (magic %#08x): %w", magic, ErrAnswerTooLarge)
			}
			g.snaplen = binary.LittleEndian.Uint32(h[16:20])
			lt := binary.LittleEndian.Uint32(h[20:24])
			if v := binary.LittleEndian.Uint16(h[4:6]); v != 2 || g.snaplen > maxCaptureSnaplen || (lt != verbs.LinkTypeEthernet && lt != verbs.LinkTypeInfiniBand) {
				return fmt.Errorf("pcap header: version %d, snaplen %d, link type %d (want 2, at most %d, Ethernet or InfiniBand): %w",
					v, g.snaplen, binary.LittleEndian.Uint32(h[20:24]), maxCaptureSnaplen, ErrAnswerTooLarge)
			}
			g.global = true
			continue
		}
		if g.frames > 0 && g.seen >= g.frames {
			return fmt.Errorf("more than the %d frames asked for: %w", g.frames, ErrAnswerTooLarge)
		}
		n := binary.LittleEndian.Uint32(h[8:12])
		if n > g.snaplen {
			return fmt.Errorf("frame %d of %d bytes, past the snaplen %d: %w", g.seen+1, n, g.snaplen, ErrAnswerTooLarge)
		}
		g.seen++
		g.skip = int(n)
	}
	return nil
}

// broken reports a stream that stopped before its header, inside a header
// or inside a record.
func (g *pcapGuard) broken() bool { return !g.global || len(g.hdr) > 0 || g.skip > 0 }
