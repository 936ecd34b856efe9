package mad

import (
	"bytes"
	"testing"
)

// FuzzReassembler feeds a stream of segments (the input cut into 256-byte
// MADs, each with the RMPP DATA type and Active flag forced on some) to
// one Reassembler: it must never panic, hold at most MaxRMPPSegments
// segments, and when done return data that a fresh reassembler given
// segments 1..Last in order returns too.
func FuzzReassembler(f *testing.F) {
	hdr := NewSARequest(MethodGetTableResp, AttrMCMemberRecord, 7, 0)
	var seed []byte
	for _, s := range RMPPSegments(hdr, bytes.Repeat([]byte{0xAB}, 500)) {
		seed = append(seed, s...)
	}
	f.Add(seed, uint8(0xff))
	f.Add(seed[:Len], uint8(1))
	f.Fuzz(func(t *testing.T, in []byte, force uint8) {
		var r Reassembler
		seg := MAD(make([]byte, Len)) // reused: Add copies what it keeps
		for i := 0; len(in) > 0 && i < 512; i++ {
			clear(seg)
			n := copy(seg, in)
			in = in[n:]
			if force&(1<<(i%8)) != 0 {
				seg.SetRMPPType(RMPPTypeData)
				seg.SetRMPPFlags(seg.RMPPFlags() | RMPPFlagActive)
			}
			done, data, err := r.Add(seg)
			if len(r.segs) > MaxRMPPSegments {
				t.Fatalf("%d segments held", len(r.segs))
			}
			if err != nil || !done {
				continue
			}
			if len(data) > int(r.last)*SADataLen {
				t.Fatalf("%d bytes from %d segments", len(data), r.last)
			}
			var again Reassembler
			var got []byte
			for n := uint32(1); n <= r.last; n++ {
				var d bool
				var e error
				clear(seg)
				copy(seg[:SAHeaderEnd], r.first[:SAHeaderEnd])
				if n != 1 {
					seg.SetRMPPFlags(RMPPFlagActive)
				}
				if n == r.last {
					seg.SetRMPPFlags(seg.RMPPFlags() | RMPPFlagLast)
					seg.SetPayloadLength(r.lastPL)
				}
				seg.SetSegmentNumber(n)
				copy(seg[SAHeaderEnd:], r.segs[n])
				d, got, e = again.Add(seg)
				if e != nil || d != (n == r.last) {
					t.Fatalf("segment %d in order: done %v err %v", n, d, e)
				}
			}
			if !bytes.Equal(got, data) {
				t.Fatal("in-order reassembly differs")
			}
			return
		}
	})
}

// TestReassemblerBounds: segment numbers above MaxRMPPSegments, after the
// last one, or a second different last segment are refused.
func TestReassemblerBounds(t *testing.T) {
	hdr := NewSARequest(MethodGetTableResp, AttrMCMemberRecord, 7, 0)
	segs := RMPPSegments(hdr, make([]byte, 3*SADataLen))
	var r Reassembler
	big := append(MAD(nil), segs[1]...)
	big.SetSegmentNumber(MaxRMPPSegments + 1)
	if _, _, err := r.Add(big); err != ErrRMPPSegment {
		t.Errorf("segment %d: %v", MaxRMPPSegments+1, err)
	}
	if _, _, err := r.Add(segs[2]); err != nil { // the last, number 3
		t.Fatal(err)
	}
	after := append(MAD(nil), segs[1]...)
	after.SetSegmentNumber(4)
	if _, _, err := r.Add(after); err != ErrRMPPSegment {
		t.Errorf("segment after the last: %v", err)
	}
	otherLast := append(MAD(nil), segs[2]...)
	otherLast.SetSegmentNumber(2)
	if _, _, err := r.Add(otherLast); err != ErrRMPPSegment {
		t.Errorf("second last segment: %v", err)
	}
	if _, _, err := r.Add(segs[0]); err != nil {
		t.Fatal(err)
	}
	done, data, err := r.Add(segs[1])
	if err != nil || !done || len(data) != 3*SADataLen {
		t.Fatalf("done %v, %d bytes, %v", done, len(data), err)
	}
}
