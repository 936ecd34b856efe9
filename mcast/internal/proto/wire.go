// Package proto is the reliable multicast protocol of package mcast: its
// packets and its state machine, with no sockets, queues or clocks of its
// own, so that property tests can drive it through any loss, reordering,
// duplication and member death (see DESIGN in mcast's package doc).
//
// Every packet starts with an 8-byte common header:
//
//	0     version (high 4 bits) | type (low 4 bits)
//	1     flags
//	2-3   Data: where the first record starting in the payload starts
//	      (NoRecord: none); others: 0
//	4-7   session: the stream the packet is about (its sender's session)
//
// followed by the type's fields, big-endian:
//
//	Data       8 seq                                  then stream bytes
//
// A sender's stream is its messages as records (the length as a uvarint,
// then the bytes), back to back; packets carry it in order, a record may
// span packets.
//
//	Heartbeat  8 next, 8 trail                        (24 bytes)
//	Status     4 from, 4 window, 8 ack                (24 bytes)
//	Nack       4 from, 2 count, 2 reserved, count × (8 start, 4 length)
//	Evict      4 to, 4 reserved, 8 resume             (24 bytes)
//	Leave      4 from, 4 reserved                     (16 bytes)
//
// Data, Heartbeat and Evict come from the stream's sender; Status, Nack
// and Leave from a receiver of the stream, to its sender.
package proto

import "encoding/binary"

// Version is the protocol version every packet carries.
const Version = 1

// Type is a packet's type.
type Type uint8

// Packet types.
const (
	TypeData      Type = 1
	TypeHeartbeat Type = 2
	TypeStatus    Type = 3
	TypeNack      Type = 4
	TypeEvict     Type = 5
	TypeLeave     Type = 6
)

// NoRecord is a Data packet's first-record offset when no record starts
// in it.
const NoRecord = 0xFFFF

// Flags of a packet's common header.
const (
	// FlagRepair marks a retransmission (Data).
	FlagRepair = 0x04
	// FlagAckReq asks every receiver for a Status now (Heartbeat).
	FlagAckReq = 0x08
	// FlagFinal says the sender sends no more: next is its end (Heartbeat).
	FlagFinal = 0x10
	// FlagHello marks the Status of a receiver that starts the stream and
	// waits for the sender's Welcome before it delivers anything.
	FlagHello = 0x20
	// FlagWelcome marks a sender's unicast answer to a Hello (Heartbeat):
	// the receiver is in the sender's window from then on, and starts at
	// the trail if its own start is older.
	FlagWelcome = 0x20
	// FlagEnd marks the Status of a receiver that knows where the stream
	// ends (it saw a Final heartbeat).
	FlagEnd = 0x10
)

// Header lengths.
const (
	// CommonLen is the length of the common header.
	CommonLen = 8
	// DataLen is the length of a Data packet's header.
	DataLen = 16
	// HeartbeatLen, StatusLen, EvictLen and LeaveLen are those packets' lengths.
	HeartbeatLen = 24
	StatusLen    = 24
	EvictLen     = 24
	LeaveLen     = 16
	// NackLen is a Nack's length before its ranges; NackRangeLen a range's.
	NackLen      = 16
	NackRangeLen = 12
)

// Packet is a view of a packet's bytes; each accessor reads one field.
// Check with Valid before reading anything else.
type Packet []byte

// Valid reports whether p is long enough for its type's fields and of
// this version.
func (p Packet) Valid() bool {
	if len(p) < CommonLen || p[0]>>4 != Version {
		return false
	}
	switch p.Type() {
	case TypeData:
		return len(p) >= DataLen
	case TypeHeartbeat:
		return len(p) >= HeartbeatLen
	case TypeStatus:
		return len(p) >= StatusLen
	case TypeEvict:
		return len(p) >= EvictLen
	case TypeLeave:
		return len(p) >= LeaveLen
	case TypeNack:
		return len(p) >= NackLen && len(p) >= NackLen+NackRangeLen*p.NackCount()
	}
	return false
}

// Type returns the packet's type.
func (p Packet) Type() Type { return Type(p[0] & 0x0f) }

// Flags returns the common header's flags.
func (p Packet) Flags() uint8 { return p[1] }

// Session returns the session of the stream the packet is about.
func (p Packet) Session() uint32 { return binary.BigEndian.Uint32(p[4:]) }

// Seq returns a Data packet's sequence number.
func (p Packet) Seq() uint64 { return binary.BigEndian.Uint64(p[8:]) }

// Payload returns a Data packet's stream bytes.
func (p Packet) Payload() []byte { return p[DataLen:] }

// FirstRecord returns where in a Data packet's payload the first record
// starting in it starts (NoRecord: none does).
func (p Packet) FirstRecord() uint16 { return binary.BigEndian.Uint16(p[2:]) }

// Next returns a Heartbeat's next sequence number (everything below it
// was sent).
func (p Packet) Next() uint64 { return binary.BigEndian.Uint64(p[8:]) }

// Trail returns a Heartbeat's trail: the oldest sequence number the sender
// still holds for repair.
func (p Packet) Trail() uint64 { return binary.BigEndian.Uint64(p[16:]) }

// From returns the session of the receiver that sent a Status, Nack or
// Leave.
func (p Packet) From() uint32 { return binary.BigEndian.Uint32(p[8:]) }

// Window returns a Status's window: how many packets from Ack the receiver
// can take.
func (p Packet) Window() uint32 { return binary.BigEndian.Uint32(p[12:]) }

// Ack returns a Status's ack: the receiver has consumed everything below it.
func (p Packet) Ack() uint64 { return binary.BigEndian.Uint64(p[16:]) }

// To returns the session of the receiver an Evict is for.
func (p Packet) To() uint32 { return binary.BigEndian.Uint32(p[8:]) }

// Resume returns an Evict's resume point: the receiver continues there.
func (p Packet) Resume() uint64 { return binary.BigEndian.Uint64(p[16:]) }

// NackCount returns the number of ranges of a Nack.
func (p Packet) NackCount() int { return int(binary.BigEndian.Uint16(p[12:])) }

// NackRange returns a Nack's range i: its first sequence number and length.
func (p Packet) NackRange(i int) (start uint64, n uint32) {
	b := p[NackLen+i*NackRangeLen:]
	return binary.BigEndian.Uint64(b), binary.BigEndian.Uint32(b[8:])
}

func putCommon(b []byte, t Type, flags uint8, session uint32) {
	b[0] = Version<<4 | uint8(t)
	b[1] = flags
	b[2], b[3] = 0, 0
	binary.BigEndian.PutUint32(b[4:], session)
}

// PutData writes a Data header into b[:DataLen] and returns DataLen.
func PutData(b []byte, session uint32, seq uint64, flags uint8, first uint16) int {
	putCommon(b, TypeData, flags, session)
	binary.BigEndian.PutUint16(b[2:], first)
	binary.BigEndian.PutUint64(b[8:], seq)
	return DataLen
}

// PutHeartbeat writes a Heartbeat into b and returns its length.
func PutHeartbeat(b []byte, session uint32, next, trail uint64, flags uint8) int {
	putCommon(b, TypeHeartbeat, flags, session)
	binary.BigEndian.PutUint64(b[8:], next)
	binary.BigEndian.PutUint64(b[16:], trail)
	return HeartbeatLen
}

// PutStatus writes a Status into b and returns its length.
func PutStatus(b []byte, session, from uint32, ack uint64, window uint32, flags uint8) int {
	putCommon(b, TypeStatus, flags, session)
	binary.BigEndian.PutUint32(b[8:], from)
	binary.BigEndian.PutUint32(b[12:], window)
	binary.BigEndian.PutUint64(b[16:], ack)
	return StatusLen
}

// PutNack writes a Nack's header for count ranges into b; PutNackRange
// fills them.
func PutNack(b []byte, session, from uint32, count int) int {
	putCommon(b, TypeNack, 0, session)
	binary.BigEndian.PutUint32(b[8:], from)
	binary.BigEndian.PutUint16(b[12:], uint16(count))
	b[14], b[15] = 0, 0
	return NackLen + count*NackRangeLen
}

// PutNackRange writes range i of a Nack.
func PutNackRange(b []byte, i int, start uint64, n uint32) {
	r := b[NackLen+i*NackRangeLen:]
	binary.BigEndian.PutUint64(r, start)
	binary.BigEndian.PutUint32(r[8:], n)
}

// PutEvict writes an Evict into b and returns its length.
func PutEvict(b []byte, session, to uint32, resume uint64) int {
	putCommon(b, TypeEvict, 0, session)
	binary.BigEndian.PutUint32(b[8:], to)
	binary.BigEndian.PutUint32(b[12:], 0)
	binary.BigEndian.PutUint64(b[16:], resume)
	return EvictLen
}

// PutLeave writes a Leave into b and returns its length.
func PutLeave(b []byte, session, from uint32) int {
	putCommon(b, TypeLeave, 0, session)
	binary.BigEndian.PutUint32(b[8:], from)
	binary.BigEndian.PutUint32(b[12:], 0)
	return LeaveLen
}

// Author returns the session of the member that sent p: the stream's
// sender for Data, Heartbeat and Evict, the receiver for Status, Nack and
// Leave. The transport learns a member's unicast address from it.
func (p Packet) Author() uint32 {
	switch p.Type() {
	case TypeStatus, TypeNack, TypeLeave:
		return p.From()
	}
	return p.Session()
}
