package mad

import "errors"

// RMPP segmentation of SA responses as the softrdma SA sends them.
//
// A GetTableResp always travels RMPP-active, even when it fits in one MAD
// (as OpenSM with kernel RMPP does). Each segment is a complete 256-byte
// MAD that repeats the common header (same TID, method, status, attribute)
// and the SA header (SM_Key 0, AttributeOffset, ComponentMask); bytes
// 56..255 carry the next 200 bytes of the record data. The RMPP header of
// every segment has RMPPVersion 1, RMPPType DATA, RRespTime 0x1F, flag
// Active, plus First on segment 1 and Last on the final segment;
// SegmentNumber counts from 1. PayloadLength follows the Linux kernel's
// RMPP sender (mad_rmpp.c): it counts the RMPP payload, i.e. the 20-byte
// SA header plus data of every segment (220 bytes a segment), minus the
// padding of the last one — on the first segment for the whole transfer
// (segments×220 − pad), on the last segment for that segment (220 − pad),
// 0 on the others; a single segment carries 220 − pad. The record data of
// n segments is therefore PayloadLength(first) − 20×n bytes long.
//
// An error answer to a GetTable is one plain MAD (RMPP inactive,
// AttributeOffset 0), like OpenSM's osm_sa_send_error.
//
// Flow control follows the kernel's MAD layer (mad_rmpp.c). The sender
// (RMPPSender) starts with a window of one segment, sends no segment above
// the receiver's NewWindowLast, retransmits from the last acknowledged
// segment when no ACK moved the window in time, and is done when the last
// segment is acknowledged. The receiver (Reassembler.Ack) acknowledges the
// first segment with NewWindowLast 1+RMPPWindow, then each time the
// segments held in order reach NewWindowLast (raising it by RMPPWindow),
// the completed transfer, and any segment at or below its last ACK again.
// An ACK is the received segment's 56 header bytes with the response bit
// of the method flipped (an ACK of a GetTableResp says GetTable), RMPP
// type ACK, flag Active only, SegmentNumber = the segments held in order,
// PayloadLength = NewWindowLast.

// RMPP status values of STOP and ABORT (IBA 13.6.2.1; ib_types.h).
const (
	RMPPStatusOK        = 0
	RMPPStatusResx      = 1   // STOP: resources exhausted
	RMPPStatusT2L       = 118 // ABORT: total time too long
	RMPPStatusBadLen    = 119 // inconsistent last segment and payload length
	RMPPStatusBadSeg    = 120 // inconsistent First flag and segment number
	RMPPStatusBadT      = 121 // bad RMPP type
	RMPPStatusW2S       = 122 // NewWindowLast too small
	RMPPStatusS2B       = 123 // segment number too big
	RMPPStatusBadStatus = 124 // illegal status
	RMPPStatusUnV       = 125 // unsupported RMPP version
	RMPPStatusTMR       = 126 // too many retries
	RMPPStatusUnspec    = 127 // unspecified
)

// RMPPWindow is the receive window of the kernel's RMPP receiver:
// window_size() is the MAD receive queue (512) / 8.
const RMPPWindow = 64

// Errors returned by the Reassembler.
var (
	// ErrNotRMPP reports a MAD without the RMPP Active flag or not of type DATA.
	ErrNotRMPP = errors.New("mad: not an RMPP DATA segment")
	// ErrRMPPSegment reports an inconsistent segment (number 0 or above
	// MaxRMPPSegments, a second first or last segment, a segment after the
	// last, a TID mismatch, a bad payload length).
	ErrRMPPSegment = errors.New("mad: inconsistent RMPP segment")
	// ErrRMPPTimeout reports a transfer given up after its retries: no ACK
	// moved the window.
	ErrRMPPTimeout = errors.New("mad: RMPP transfer timed out waiting for an ACK")
	// ErrRMPPAborted reports a transfer the receiver stopped or aborted, or
	// that the sender aborted on a bad ACK.
	ErrRMPPAborted = errors.New("mad: RMPP transfer aborted")
)

// NewRMPPAck returns the ACK of an RMPP DATA segment: its 56 header bytes
// with the method's response bit flipped, RMPP type ACK, flag Active,
// status 0, SegmentNumber segNum and NewWindowLast newWin (format_ack).
func NewRMPPAck(seg MAD, segNum, newWin uint32) MAD {
	a := rmppReply(seg)
	a.SetRMPPType(RMPPTypeAck)
	a.SetSegmentNumber(segNum)
	a.SetPayloadLength(newWin)
	return a
}

// NewRMPPAbort returns the ABORT answering an RMPP MAD m with the given
// status: m's 56 header bytes, the method's response bit flipped, RMPP
// version 1, type ABORT, flag Active, SegmentNumber and NewWindowLast 0
// (nack_recv).
func NewRMPPAbort(m MAD, status uint8) MAD {
	a := rmppReply(m)
	a.SetRMPPVersion(RMPPVersion1)
	a.SetRMPPType(RMPPTypeAbort)
	a.SetRMPPStatus(status)
	return a
}

func rmppReply(m MAD) MAD {
	a := MAD(make([]byte, Len))
	copy(a[:SAHeaderEnd], m[:SAHeaderEnd])
	a.SetMethod(m.Method() ^ MethodResp)
	a.SetRMPPFlags(RMPPFlagActive)
	a.SetRMPPStatus(RMPPStatusOK)
	a.SetSegmentNumber(0)
	a.SetPayloadLength(0)
	return a
}

// MaxRMPPSegments bounds one transfer: at most this many segments (13 MB
// of SA data) are held; a segment numbered above it is refused.
const MaxRMPPSegments = 1 << 16

// RMPPSegments splits data (the concatenated records) into RMPP DATA
// segments. hdr supplies bytes 0..55 of every segment (common header and
// SA header); its RMPP header bytes are overwritten. At least one segment
// is returned, even for empty data.
func RMPPSegments(hdr MAD, data []byte) []MAD {
	n := (len(data) + SADataLen - 1) / SADataLen
	if n == 0 {
		n = 1
	}
	pad := n*SADataLen - len(data)
	segs := make([]MAD, n)
	for i := range segs {
		s := MAD(make([]byte, Len))
		copy(s[:SAHeaderEnd], hdr[:SAHeaderEnd])
		s.SetRMPPVersion(RMPPVersion1)
		s.SetRMPPType(RMPPTypeData)
		s.SetRMPPStatus(0)
		flags := uint8(RMPPFlagActive)
		var paylen uint32
		if i == 0 {
			flags |= RMPPFlagFirst
			paylen = uint32(n*RMPPDataLen - pad)
		}
		if i == n-1 {
			flags |= RMPPFlagLast
			paylen = uint32(RMPPDataLen - pad)
		}
		s[offRMPPTimeFlags] = RMPPNoRespTime<<3 | flags
		s.SetSegmentNumber(uint32(i + 1))
		s.SetPayloadLength(paylen)
		lo := i * SADataLen
		hi := min(lo+SADataLen, len(data))
		copy(s[SAHeaderEnd:], data[lo:hi])
		segs[i] = s
	}
	return segs
}

// Reassembler collects the RMPP DATA segments of one transfer (one TID)
// and says which ACKs the receiver owes the sender (Ack). The zero value is
// ready to use.
type Reassembler struct {
	first  MAD
	segs   map[uint32][]byte
	last   uint32
	tid    uint64
	lastPL uint32
	maxNum uint32 // highest segment number held
	init   bool

	inOrder  uint32 // segments 1..inOrder are held
	newWin   uint32 // NewWindowLast last advertised
	lastAck  uint32 // SegmentNumber of the last ACK
	complete bool
	ack      MAD // the ACK owed after the last Add
}

// Ack returns the ACK the receiver owes after the last Add, as the
// kernel's RMPP receiver sends them (see the package's RMPP notes), or nil
// when none is due. Send it back to the sender (to the SA: its LID, QP1).
func (r *Reassembler) Ack() MAD {
	a := r.ack
	r.ack = nil
	return a
}

// Complete reports whether the transfer was reassembled; a segment given
// to Add after that is only acknowledged again.
func (r *Reassembler) Complete() bool { return r.complete }

// Add adds one segment. It returns done = true and the reassembled record
// data (the SA data of every segment concatenated, without headers and
// without the padding of the last segment) once every segment from 1 to
// the Last one has arrived; Header then returns the first segment. A MAD
// that is not RMPP-active gives ErrNotRMPP (a plain response: read its
// SAData directly). Duplicate segments replace earlier copies.
func (r *Reassembler) Add(seg MAD) (done bool, data []byte, err error) {
	r.ack = nil
	if len(seg) < Len || seg.RMPPFlags()&RMPPFlagActive == 0 || seg.RMPPType() != RMPPTypeData {
		return false, nil, ErrNotRMPP
	}
	num := seg.SegmentNumber()
	if r.init && seg.TID() == r.tid && num != 0 && (r.complete || num <= r.lastAck) {
		// A retransmission of a segment already acknowledged (the ACK was
		// lost): acknowledge again (continue_rmpp).
		r.ack = NewRMPPAck(seg, r.inOrder, r.newWin)
		r.lastAck = r.inOrder
		return false, nil, nil
	}
	if num == 0 || num > MaxRMPPSegments || (r.last != 0 && num > r.last) {
		return false, nil, ErrRMPPSegment
	}
	if !r.init {
		r.init = true
		r.tid = seg.TID()
		r.segs = make(map[uint32][]byte)
	} else if seg.TID() != r.tid {
		return false, nil, ErrRMPPSegment
	}
	flags := seg.RMPPFlags()
	if flags&RMPPFlagFirst != 0 {
		if num != 1 || r.first != nil {
			return false, nil, ErrRMPPSegment
		}
		r.first = append(MAD(nil), seg[:Len]...)
	}
	if flags&RMPPFlagLast != 0 {
		pl := seg.PayloadLength()
		if (r.last != 0 && r.last != num) || pl > RMPPDataLen || pl < RMPPDataLen-SADataLen {
			return false, nil, ErrRMPPSegment
		}
		if r.maxNum > num {
			return false, nil, ErrRMPPSegment // a segment after the last one
		}
		r.last, r.lastPL = num, pl
	}
	r.segs[num] = append([]byte(nil), seg[SAHeaderEnd:Len]...)
	r.maxNum = max(r.maxNum, num)
	r.window(seg)
	if r.first == nil || r.last == 0 || uint32(len(r.segs)) < r.last {
		return false, nil, nil
	}
	data = make([]byte, 0, int(r.last)*SADataLen)
	for i := uint32(1); i <= r.last; i++ {
		s, ok := r.segs[i]
		if !ok {
			return false, nil, nil
		}
		data = append(data, s...)
	}
	pad := RMPPDataLen - int(r.lastPL)
	r.complete = true
	return true, data[:len(data)-pad], nil
}

// window advances the in-order count after seg was stored and decides the
// ACK owed (start_rmpp, continue_rmpp, complete_rmpp).
func (r *Reassembler) window(seg MAD) {
	prev := r.inOrder
	for r.segs[r.inOrder+1] != nil {
		r.inOrder++
	}
	if r.inOrder == prev {
		return // a segment out of order: held, not acknowledged
	}
	if prev == 0 {
		r.newWin = 1 // the first segment starts the transfer
	}
	switch {
	case r.last != 0 && r.inOrder == r.last:
		// Complete: acknowledge the last segment with the window as is.
	case prev == 0 || r.inOrder >= r.newWin:
		r.newWin = r.inOrder + RMPPWindow
	default:
		return
	}
	r.ack = NewRMPPAck(seg, r.inOrder, r.newWin)
	r.lastAck = r.inOrder
}

// RMPPSender sends the segments of one RMPP transfer as the kernel's MAD
// layer does: window 1 at first, never a segment above the receiver's
// NewWindowLast, retransmission from the last acknowledged segment after
// each timeout (the caller runs the timer and calls Timeout), done when the
// last segment is acknowledged. It is pure logic: the caller sends what
// Start, Receive and Timeout return. Not safe for concurrent use.
type RMPPSender struct {
	segs    []MAD
	lastAck uint32 // segments acknowledged
	newWin  uint32 // highest segment the receiver admits
	sent    uint32 // highest segment sent
	retries int    // retransmissions left
	max     int
	err     error
	done    bool
}

// NewRMPPSender returns a sender of segs (from RMPPSegments) that gives up
// after retries timeouts in a row without progress.
func NewRMPPSender(segs []MAD, retries int) *RMPPSender {
	return &RMPPSender{segs: segs, newWin: 1, retries: retries, max: retries}
}

// Start returns the segments to send first: segment 1 (window 1).
func (s *RMPPSender) Start() []MAD { return s.next() }

// next returns the unsent segments up to the window.
func (s *RMPPSender) next() []MAD {
	hi := min(s.newWin, uint32(len(s.segs)))
	if s.done || s.sent >= hi {
		return nil
	}
	out := s.segs[s.sent:hi]
	s.sent = hi
	return out
}

// Done reports whether the transfer ended, and how: nil when every
// segment was acknowledged, ErrRMPPTimeout or ErrRMPPAborted.
func (s *RMPPSender) Done() (bool, error) { return s.done, s.err }

// Acked returns the number of segments acknowledged so far.
func (s *RMPPSender) Acked() uint32 { return s.lastAck }

// Receive takes an RMPP ACK, STOP or ABORT of the transfer (the caller
// matched its TID and peer). It returns the segments the window now allows
// (progress reported true when the ACK acknowledged more segments: restart
// the timer), and an ABORT to send back when the MAD was bad
// (process_rmpp_ack: non-zero status, NewWindowLast below the segment,
// segment beyond the window or the transfer; an unknown type or version).
// Old or repeated ACKs change nothing.
func (s *RMPPSender) Receive(m MAD) (send []MAD, progress bool, abort MAD) {
	if s.done || len(m) < Len || m.RMPPFlags()&RMPPFlagActive == 0 {
		return nil, false, nil
	}
	fail := func(st uint8) (send []MAD, progress bool, abort MAD) {
		s.done, s.err = true, ErrRMPPAborted
		return nil, false, NewRMPPAbort(m, st)
	}
	if m.RMPPVersion() != RMPPVersion1 {
		return fail(RMPPStatusUnV)
	}
	switch m.RMPPType() {
	case RMPPTypeAck:
	case RMPPTypeStop:
		if m.RMPPStatus() != RMPPStatusResx {
			return fail(RMPPStatusBadStatus)
		}
		s.done, s.err = true, ErrRMPPAborted
		return nil, false, nil
	case RMPPTypeAbort:
		if st := m.RMPPStatus(); st < RMPPStatusT2L || st > RMPPStatusUnspec {
			return fail(RMPPStatusBadStatus)
		}
		s.done, s.err = true, ErrRMPPAborted
		return nil, false, nil
	default:
		return fail(RMPPStatusBadT)
	}
	if m.RMPPStatus() != RMPPStatusOK {
		return fail(RMPPStatusBadStatus)
	}
	seg, win := m.SegmentNumber(), m.PayloadLength()
	if win < seg {
		return fail(RMPPStatusW2S)
	}
	if seg > uint32(len(s.segs)) || seg > s.newWin {
		return fail(RMPPStatusS2B)
	}
	if win < s.newWin || seg < s.lastAck {
		return nil, false, nil // an old ACK
	}
	if seg > s.lastAck {
		s.lastAck = seg
		s.retries = s.max
		progress = true
	}
	s.newWin = win
	if s.lastAck == uint32(len(s.segs)) {
		s.done = true
		return nil, progress, nil
	}
	return s.next(), progress, nil
}

// Timeout is called when no ACK moved the window in time. It returns the
// segments to send again — from the first unacknowledged one up to the
// window (ib_retry_rmpp) — or nil once the retries are used up; Done then
// reports ErrRMPPTimeout.
func (s *RMPPSender) Timeout() []MAD {
	if s.done {
		return nil
	}
	if s.retries <= 0 {
		s.done, s.err = true, ErrRMPPTimeout
		return nil
	}
	s.retries--
	s.sent = s.lastAck
	return s.next()
}

// Header returns the first segment of the transfer (its common and SA
// headers describe the whole response), or nil before it arrived.
func (r *Reassembler) Header() MAD { return r.first }
