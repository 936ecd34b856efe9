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
// The softrdma SA does not wait for RMPP ACKs: it sends every segment at
// once (the raw SA port and the fabric preserve order on one host, and the
// reassembler accepts segments in any order).

// Errors returned by the Reassembler.
var (
	// ErrNotRMPP reports a MAD without the RMPP Active flag or not of type DATA.
	ErrNotRMPP = errors.New("mad: not an RMPP DATA segment")
	// ErrRMPPSegment reports an inconsistent segment (number 0 or above
	// MaxRMPPSegments, a second first or last segment, a segment after the
	// last, a TID mismatch, a bad payload length).
	ErrRMPPSegment = errors.New("mad: inconsistent RMPP segment")
)

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

// Reassembler collects the RMPP DATA segments of one transfer (one TID).
// The zero value is ready to use.
type Reassembler struct {
	first  MAD
	segs   map[uint32][]byte
	last   uint32
	tid    uint64
	lastPL uint32
	maxNum uint32 // highest segment number held
	init   bool
}

// Add adds one segment. It returns done = true and the reassembled record
// data (the SA data of every segment concatenated, without headers and
// without the padding of the last segment) once every segment from 1 to
// the Last one has arrived; Header then returns the first segment. A MAD
// that is not RMPP-active gives ErrNotRMPP (a plain response: read its
// SAData directly). Duplicate segments replace earlier copies.
func (r *Reassembler) Add(seg MAD) (done bool, data []byte, err error) {
	if len(seg) < Len || seg.RMPPFlags()&RMPPFlagActive == 0 || seg.RMPPType() != RMPPTypeData {
		return false, nil, ErrNotRMPP
	}
	num := seg.SegmentNumber()
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
	return true, data[:len(data)-pad], nil
}

// Header returns the first segment of the transfer (its common and SA
// headers describe the whole response), or nil before it arrived.
func (r *Reassembler) Header() MAD { return r.first }
