package wire

import (
	"encoding/binary"
	"net/netip"
)

// IPv6 header field offsets.
const (
	ipv6VerTCFlow = 0 // version(4) | traffic class(8) | flow label(20)
	ipv6PayLen    = 4
	ipv6NextHdr   = 6
	ipv6HopLimit  = 7
	ipv6Src       = 8
	ipv6Dst       = 24

	ipv6Version       = 6
	ipv6FlowLabelMask = 0x000FFFFF
	ipv6TCShift       = 20
)

// IPv6 is a view of the 40-byte fixed IPv6 header. It must be at least
// IPv6HeaderLen bytes long.
type IPv6 []byte

// IPv6Fields holds the values Encode writes into an IPv6 header (version 6).
type IPv6Fields struct {
	TrafficClass  uint8
	FlowLabel     uint32
	PayloadLength uint16
	NextHeader    uint8
	HopLimit      uint8
	Src, Dst      netip.Addr
}

func (ip IPv6) word0() uint32     { return binary.BigEndian.Uint32(ip[ipv6VerTCFlow:]) }
func (ip IPv6) setWord0(v uint32) { binary.BigEndian.PutUint32(ip[ipv6VerTCFlow:], v) }

// Version returns the IP version nibble (6).
func (ip IPv6) Version() uint8 { return ip[0] >> 4 }

// TrafficClass returns the 8-bit traffic class.
func (ip IPv6) TrafficClass() uint8 { return uint8(ip.word0() >> ipv6TCShift) }

// SetTrafficClass sets the traffic class.
func (ip IPv6) SetTrafficClass(tc uint8) {
	ip.setWord0(ip.word0()&^(0xFF<<ipv6TCShift) | uint32(tc)<<ipv6TCShift)
}

// FlowLabel returns the 20-bit flow label.
func (ip IPv6) FlowLabel() uint32 { return ip.word0() & ipv6FlowLabelMask }

// SetFlowLabel sets the 20-bit flow label (high bits of fl are ignored).
func (ip IPv6) SetFlowLabel(fl uint32) {
	ip.setWord0(ip.word0()&^ipv6FlowLabelMask | fl&ipv6FlowLabelMask)
}

// PayloadLength returns the payload length (bytes after the fixed header).
func (ip IPv6) PayloadLength() uint16 { return binary.BigEndian.Uint16(ip[ipv6PayLen:]) }

// SetPayloadLength sets the payload length.
func (ip IPv6) SetPayloadLength(l uint16) { binary.BigEndian.PutUint16(ip[ipv6PayLen:], l) }

// NextHeader returns the next header (17 for UDP).
func (ip IPv6) NextHeader() uint8 { return ip[ipv6NextHdr] }

// SetNextHeader sets the next header.
func (ip IPv6) SetNextHeader(n uint8) { ip[ipv6NextHdr] = n }

// HopLimit returns the hop limit.
func (ip IPv6) HopLimit() uint8 { return ip[ipv6HopLimit] }

// SetHopLimit sets the hop limit.
func (ip IPv6) SetHopLimit(h uint8) { ip[ipv6HopLimit] = h }

// Src returns the source address.
func (ip IPv6) Src() netip.Addr { return netip.AddrFrom16([16]byte(ip[ipv6Src:])) }

// SetSrc sets the source address (an IPv4 address is written IPv4-mapped;
// the zero Addr writes ::).
func (ip IPv6) SetSrc(a netip.Addr) { v := a.As16(); copy(ip[ipv6Src:ipv6Src+16], v[:]) }

// Dst returns the destination address.
func (ip IPv6) Dst() netip.Addr { return netip.AddrFrom16([16]byte(ip[ipv6Dst:])) }

// SetDst sets the destination address, with the same rules as SetSrc.
func (ip IPv6) SetDst(a netip.Addr) { v := a.As16(); copy(ip[ipv6Dst:ipv6Dst+16], v[:]) }

// Encode writes a 40-byte IPv6 header (version 6) from f.
func (ip IPv6) Encode(f IPv6Fields) {
	_ = ip[IPv6HeaderLen-1]
	ip.setWord0(ipv6Version<<28 | uint32(f.TrafficClass)<<ipv6TCShift | f.FlowLabel&ipv6FlowLabelMask)
	ip.SetPayloadLength(f.PayloadLength)
	ip[ipv6NextHdr] = f.NextHeader
	ip[ipv6HopLimit] = f.HopLimit
	ip.SetSrc(f.Src)
	ip.SetDst(f.Dst)
}
