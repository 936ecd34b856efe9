package wire

import "encoding/binary"

// ImmDt is a view of the 4-byte Immediate Data extended header. The value is
// big-endian on the wire (rxe copies it raw into imm_data, which verbs
// define as network order).
type ImmDt []byte

// Imm returns the immediate data as a host value (decoded big-endian).
func (i ImmDt) Imm() uint32 { return binary.BigEndian.Uint32(i) }

// SetImm stores v big-endian.
func (i ImmDt) SetImm(v uint32) { binary.BigEndian.PutUint32(i, v) }
