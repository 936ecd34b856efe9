package wire

import "encoding/binary"

// DETH field offsets.
const (
	dethQKey  = 0
	dethSrcQP = 4 // byte 4 reserved, SrcQP in bytes 5-7
)

// DETH is a view of the 8-byte Datagram Extended Transport Header: Q_Key,
// one reserved byte, 24-bit source QP. It must be at least DETHLen bytes long.
type DETH []byte

// QKey returns the queue key.
func (d DETH) QKey() uint32 { return binary.BigEndian.Uint32(d[dethQKey:]) }

// SetQKey sets the queue key.
func (d DETH) SetQKey(k uint32) { binary.BigEndian.PutUint32(d[dethQKey:], k) }

// SrcQP returns the 24-bit source QP number.
func (d DETH) SrcQP() uint32 { return binary.BigEndian.Uint32(d[dethSrcQP:]) & qpnMask }

// SetSrcQP sets the 24-bit source QP number (high bits of qpn are ignored);
// the reserved byte 4 is left untouched.
func (d DETH) SetSrcQP(qpn uint32) { put24(d[dethSrcQP+1:], qpn) }
