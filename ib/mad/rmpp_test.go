package mad

import (
	"bytes"
	"errors"
	"testing"
)

func rmppTestSegs(n int) ([]MAD, []byte) {
	hdr := NewSARequest(MethodGetTableResp, AttrMCMemberRecord, 0x42, 0)
	hdr.SetAttrOffset(MCMemberRecordWords)
	data := make([]byte, n*SADataLen-13)
	for i := range data {
		data[i] = byte(i * 7)
	}
	return RMPPSegments(hdr, data), data
}

// TestRMPPReceiverAcks: the receiver acknowledges as the kernel's does —
// segment 1 with NewWindowLast 1+RMPPWindow, then at each window edge,
// the completed transfer, and a retransmitted segment again.
func TestRMPPReceiverAcks(t *testing.T) {
	segs, data := rmppTestSegs(2*RMPPWindow + 5)
	var r Reassembler
	type ack struct{ seg, win uint32 }
	var acks []ack
	var got []byte
	for i, s := range segs {
		done, d, err := r.Add(s)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			got = d
		}
		if a := r.Ack(); a != nil {
			if a.Method() != MethodGetTable || a.RMPPType() != RMPPTypeAck || a.RMPPFlags() != RMPPFlagActive ||
				a.TID() != 0x42 || a.AttrOffset() != MCMemberRecordWords || a.RMPPVersion() != 1 || !bytes.Equal(a.SAData(), make([]byte, SADataLen)) {
				t.Fatalf("ACK after segment %d: % x", i+1, []byte(a[:SAHeaderEnd]))
			}
			acks = append(acks, ack{a.SegmentNumber(), a.PayloadLength()})
		}
	}
	n := uint32(len(segs))
	want := []ack{{1, 1 + RMPPWindow}, {1 + RMPPWindow, 1 + 2*RMPPWindow}, {1 + 2*RMPPWindow, 1 + 3*RMPPWindow}, {n, 1 + 3*RMPPWindow}}
	if len(acks) != len(want) {
		t.Fatalf("ACKs %v, want %v", acks, want)
	}
	for i := range want {
		if acks[i] != want[i] {
			t.Fatalf("ACKs %v, want %v", acks, want)
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatal("data")
	}
	// The last segment again (our final ACK was lost): acknowledged again.
	if done, _, err := r.Add(segs[n-1]); done || err != nil {
		t.Fatalf("repeat: %v %v", done, err)
	}
	if a := r.Ack(); a == nil || a.SegmentNumber() != n || a.PayloadLength() != 1+3*RMPPWindow {
		t.Fatalf("repeat ACK %v", a)
	}
	// A single-segment transfer is acknowledged with window 1.
	one, _ := rmppTestSegs(1)
	var r1 Reassembler
	if done, _, _ := r1.Add(one[0]); !done {
		t.Fatal("one segment")
	}
	if a := r1.Ack(); a == nil || a.SegmentNumber() != 1 || a.PayloadLength() != 1 {
		t.Fatalf("single ACK %v", a)
	}
}

// TestRMPPSenderWindow: the sender sends only what the window allows,
// waits for ACKs, retransmits from the last ACK on timeout, and gives up
// after its retries.
func TestRMPPSenderWindow(t *testing.T) {
	segs, data := rmppTestSegs(10)
	s := NewRMPPSender(segs, 2)
	nums := func(ms []MAD) []uint32 {
		var o []uint32
		for _, m := range ms {
			o = append(o, m.SegmentNumber())
		}
		return o
	}
	eq := func(got []MAD, want ...uint32) {
		t.Helper()
		g := nums(got)
		if len(g) != len(want) {
			t.Fatalf("sent %v, want %v", g, want)
		}
		for i := range g {
			if g[i] != want[i] {
				t.Fatalf("sent %v, want %v", g, want)
			}
		}
	}
	eq(s.Start(), 1)
	// No ACK yet: nothing more is sent; a timeout resends segment 1.
	eq(s.Timeout(), 1)
	// A receiver with a window of 3.
	send, prog, ab := s.Receive(NewRMPPAck(segs[0], 1, 3))
	if !prog || ab != nil {
		t.Fatal("ACK 1")
	}
	eq(send, 2, 3)
	// The same ACK again changes nothing.
	send, prog, _ = s.Receive(NewRMPPAck(segs[0], 1, 3))
	eq(send)
	if prog {
		t.Fatal("repeated ACK made progress")
	}
	// The ACK of 3 is lost: the timeout resends 2 and 3.
	eq(s.Timeout(), 2, 3)
	send, _, _ = s.Receive(NewRMPPAck(segs[2], 3, 10))
	eq(send, 4, 5, 6, 7, 8, 9, 10)
	// Retries were restored by the progress: two timeouts, then it gives up.
	eq(s.Timeout(), 4, 5, 6, 7, 8, 9, 10)
	eq(s.Timeout(), 4, 5, 6, 7, 8, 9, 10)
	eq(s.Timeout())
	if done, err := s.Done(); !done || !errors.Is(err, ErrRMPPTimeout) {
		t.Fatalf("done %v err %v", done, err)
	}

	// A whole conversation with the kernel-like receiver, every ACK kept.
	s = NewRMPPSender(segs, 0)
	var r Reassembler
	var got []byte
	queue := s.Start()
	for len(queue) > 0 {
		m := queue[0]
		queue = queue[1:]
		done, d, err := r.Add(m)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			got = d
		}
		if a := r.Ack(); a != nil {
			more, _, ab := s.Receive(a)
			if ab != nil {
				t.Fatalf("abort %d", ab.RMPPStatus())
			}
			queue = append(queue, more...)
		}
	}
	if done, err := s.Done(); !done || err != nil || !bytes.Equal(got, data) {
		t.Fatalf("conversation: done %v err %v", done, err)
	}
}

// TestRMPPSenderBadAcks: bad ACKs abort the transfer with the kernel's
// status; STOP and ABORT from the receiver end it.
func TestRMPPSenderBadAcks(t *testing.T) {
	segs, _ := rmppTestSegs(4)
	for _, c := range []struct {
		name  string
		m     func() MAD
		abort uint8 // 0: none sent back
	}{
		{"window below segment", func() MAD { return NewRMPPAck(segs[0], 2, 1) }, RMPPStatusW2S},
		{"segment beyond the window", func() MAD { return NewRMPPAck(segs[0], 3, 4) }, RMPPStatusS2B},
		{"non-zero status", func() MAD { a := NewRMPPAck(segs[0], 1, 4); a.SetRMPPStatus(3); return a }, RMPPStatusBadStatus},
		{"bad type", func() MAD { a := NewRMPPAck(segs[0], 1, 4); a.SetRMPPType(9); return a }, RMPPStatusBadT},
		{"bad version", func() MAD { a := NewRMPPAck(segs[0], 1, 4); a.SetRMPPVersion(2); return a }, RMPPStatusUnV},
		{"receiver aborts", func() MAD { return NewRMPPAbort(segs[0], RMPPStatusT2L) }, 0},
		{"receiver stops", func() MAD { a := NewRMPPAbort(segs[0], RMPPStatusResx); a.SetRMPPType(RMPPTypeStop); return a }, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := NewRMPPSender(segs, 3)
			s.Start()
			send, _, ab := s.Receive(c.m())
			if send != nil {
				t.Fatal("sent more")
			}
			if (ab != nil) != (c.abort != 0) || (ab != nil && (ab.RMPPType() != RMPPTypeAbort || ab.RMPPStatus() != c.abort)) {
				t.Fatalf("abort %v", ab)
			}
			if done, err := s.Done(); !done || !errors.Is(err, ErrRMPPAborted) {
				t.Fatalf("done %v err %v", done, err)
			}
			if s.Timeout() != nil {
				t.Fatal("retransmits after abort")
			}
		})
	}
}
