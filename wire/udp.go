package wire

import "encoding/binary"

// UDPPort is the IANA UDP destination port of RoCEv2.
const UDPPort = 4791

// UDP header field offsets.
const (
	udpSrcPort  = 0
	udpDstPort  = 2
	udpLength   = 4
	udpChecksum = 6
)

// UDP is a view of an 8-byte UDP header. It must be at least UDPHeaderLen
// bytes long.
type UDP []byte

// SrcPort returns the source port.
func (u UDP) SrcPort() uint16 { return binary.BigEndian.Uint16(u[udpSrcPort:]) }

// SetSrcPort sets the source port.
func (u UDP) SetSrcPort(p uint16) { binary.BigEndian.PutUint16(u[udpSrcPort:], p) }

// DstPort returns the destination port.
func (u UDP) DstPort() uint16 { return binary.BigEndian.Uint16(u[udpDstPort:]) }

// SetDstPort sets the destination port.
func (u UDP) SetDstPort(p uint16) { binary.BigEndian.PutUint16(u[udpDstPort:], p) }

// Length returns the UDP length (header + payload).
func (u UDP) Length() uint16 { return binary.BigEndian.Uint16(u[udpLength:]) }

// SetLength sets the UDP length.
func (u UDP) SetLength(l uint16) { binary.BigEndian.PutUint16(u[udpLength:], l) }

// Checksum returns the UDP checksum (0 = none, as rxe sends).
func (u UDP) Checksum() uint16 { return binary.BigEndian.Uint16(u[udpChecksum:]) }

// SetChecksum sets the UDP checksum.
func (u UDP) SetChecksum(c uint16) { binary.BigEndian.PutUint16(u[udpChecksum:], c) }

// Encode writes a UDP header with the given ports and length (header +
// payload) and a zero checksum, as rxe sends it.
func (u UDP) Encode(src, dst, length uint16) {
	u.SetSrcPort(src)
	u.SetDstPort(dst)
	u.SetLength(length)
	u.SetChecksum(0)
}

// RxeSrcPort returns the UDP source port Linux rxe uses for a QP:
// 0xC000 + hash_32(qpn, 14), where hash_32(v, 14) = (v*0x61C88647 mod 2^32) >> 18.
func RxeSrcPort(qpn uint32) uint16 {
	return 0xC000 + uint16((qpn*0x61C88647)>>18)
}
