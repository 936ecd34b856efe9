package wire

import (
	"encoding/binary"
	"net/netip"
)

// IPProtocolUDP is the IPv4 protocol / IPv6 next-header number of UDP.
const IPProtocolUDP = 17

// IPv4 header field offsets and values.
const (
	ipv4VersionIHL = 0
	ipv4TOS        = 1
	ipv4TotalLen   = 2
	ipv4ID         = 4
	ipv4FlagsFrag  = 6
	ipv4TTL        = 8
	ipv4Protocol   = 9
	ipv4Checksum   = 10
	ipv4Src        = 12
	ipv4Dst        = 16

	// IPv4VersionIHL is the first byte of an IPv4 header without options
	// (version 4, IHL 5 words).
	IPv4VersionIHL = 0x45

	ipv4DFMask       = 0x40 // in byte 6
	ipv4FlagsShift   = 13   // in the 16-bit word at offset 6
	ipv4FragOffMask  = 0x1FFF
	ipv4FlagsMaskU16 = 0xE000
)

// IPv4 is a view of a 20-byte IPv4 header (options are not supported by the
// RoCEv2 ICRC). It must be at least IPv4HeaderLen bytes long.
type IPv4 []byte

// IPv4Fields holds the values Encode writes into an IPv4 header. Version/IHL
// is always 0x45, the fragment offset 0 and the checksum is computed.
type IPv4Fields struct {
	TOS         uint8
	TotalLength uint16
	ID          uint16
	DF          bool
	TTL         uint8
	Protocol    uint8
	Src, Dst    netip.Addr
}

// VersionIHL returns byte 0 (version in the high nibble, IHL in the low one).
func (ip IPv4) VersionIHL() uint8 { return ip[ipv4VersionIHL] }

// SetVersionIHL sets byte 0.
func (ip IPv4) SetVersionIHL(v uint8) { ip[ipv4VersionIHL] = v }

// HeaderLength returns the header length in bytes given by the IHL field.
func (ip IPv4) HeaderLength() int { return int(ip[ipv4VersionIHL]&0x0F) * 4 }

// TOS returns the type of service (DSCP | ECN) byte.
func (ip IPv4) TOS() uint8 { return ip[ipv4TOS] }

// SetTOS sets the type of service byte.
func (ip IPv4) SetTOS(v uint8) { ip[ipv4TOS] = v }

// TotalLength returns the total length of the datagram (header + payload).
func (ip IPv4) TotalLength() uint16 { return binary.BigEndian.Uint16(ip[ipv4TotalLen:]) }

// SetTotalLength sets the total length.
func (ip IPv4) SetTotalLength(l uint16) { binary.BigEndian.PutUint16(ip[ipv4TotalLen:], l) }

// ID returns the identification field.
func (ip IPv4) ID() uint16 { return binary.BigEndian.Uint16(ip[ipv4ID:]) }

// SetID sets the identification field.
func (ip IPv4) SetID(id uint16) { binary.BigEndian.PutUint16(ip[ipv4ID:], id) }

// Flags returns the 3 flag bits (reserved, DF, MF) as a value 0-7.
func (ip IPv4) Flags() uint8 {
	return uint8(binary.BigEndian.Uint16(ip[ipv4FlagsFrag:]) >> ipv4FlagsShift)
}

// SetFlags sets the 3 flag bits; only the low 3 bits of f are used.
func (ip IPv4) SetFlags(f uint8) {
	v := binary.BigEndian.Uint16(ip[ipv4FlagsFrag:])&^ipv4FlagsMaskU16 | uint16(f&7)<<ipv4FlagsShift
	binary.BigEndian.PutUint16(ip[ipv4FlagsFrag:], v)
}

// FragmentOffset returns the 13-bit fragment offset (in 8-byte units).
func (ip IPv4) FragmentOffset() uint16 {
	return binary.BigEndian.Uint16(ip[ipv4FlagsFrag:]) & ipv4FragOffMask
}

// SetFragmentOffset sets the 13-bit fragment offset (in 8-byte units).
func (ip IPv4) SetFragmentOffset(off uint16) {
	v := binary.BigEndian.Uint16(ip[ipv4FlagsFrag:])&^ipv4FragOffMask | off&ipv4FragOffMask
	binary.BigEndian.PutUint16(ip[ipv4FlagsFrag:], v)
}

// DF returns the don't-fragment flag.
func (ip IPv4) DF() bool { return ip[ipv4FlagsFrag]&ipv4DFMask != 0 }

// SetDF sets the don't-fragment flag.
func (ip IPv4) SetDF(v bool) { setBit(&ip[ipv4FlagsFrag], ipv4DFMask, v) }

// TTL returns the time to live.
func (ip IPv4) TTL() uint8 { return ip[ipv4TTL] }

// SetTTL sets the time to live.
func (ip IPv4) SetTTL(v uint8) { ip[ipv4TTL] = v }

// Protocol returns the payload protocol number (17 for UDP).
func (ip IPv4) Protocol() uint8 { return ip[ipv4Protocol] }

// SetProtocol sets the payload protocol number.
func (ip IPv4) SetProtocol(p uint8) { ip[ipv4Protocol] = p }

// Checksum returns the header checksum field.
func (ip IPv4) Checksum() uint16 { return binary.BigEndian.Uint16(ip[ipv4Checksum:]) }

// SetChecksum sets the header checksum field.
func (ip IPv4) SetChecksum(c uint16) { binary.BigEndian.PutUint16(ip[ipv4Checksum:], c) }

// Src returns the source address.
func (ip IPv4) Src() netip.Addr { return netip.AddrFrom4([4]byte(ip[ipv4Src:])) }

// SetSrc sets the source address. a must be an IPv4 or IPv4-mapped IPv6
// address; the zero Addr writes 0.0.0.0. Other IPv6 addresses panic.
func (ip IPv4) SetSrc(a netip.Addr) { put4(ip[ipv4Src:], a) }

// Dst returns the destination address.
func (ip IPv4) Dst() netip.Addr { return netip.AddrFrom4([4]byte(ip[ipv4Dst:])) }

// SetDst sets the destination address, with the same rules as SetSrc.
func (ip IPv4) SetDst(a netip.Addr) { put4(ip[ipv4Dst:], a) }

// CalculateChecksum returns the header checksum the header should carry: the
// ones' complement of the ones'-complement sum of the header (IHL words, at
// least 20 bytes) with the checksum field taken as zero. A header is valid
// when Checksum() == CalculateChecksum().
func (ip IPv4) CalculateChecksum() uint16 {
	n := ip.HeaderLength()
	if n < IPv4HeaderLen || n > len(ip) {
		n = IPv4HeaderLen
	}
	var sum uint32
	for i := 0; i+1 < n; i += 2 {
		if i == ipv4Checksum {
			continue
		}
		sum += uint32(ip[i])<<8 | uint32(ip[i+1])
	}
	for sum > 0xFFFF {
		sum = sum&0xFFFF + sum>>16
	}
	return ^uint16(sum)
}

// Encode writes a 20-byte IPv4 header (version/IHL 0x45, no options,
// fragment offset 0, reserved and MF flags 0) from f, including a valid
// header checksum.
func (ip IPv4) Encode(f IPv4Fields) {
	_ = ip[IPv4HeaderLen-1]
	ip[ipv4VersionIHL] = IPv4VersionIHL
	ip[ipv4TOS] = f.TOS
	ip.SetTotalLength(f.TotalLength)
	ip.SetID(f.ID)
	ip[ipv4FlagsFrag] = 0
	ip[ipv4FlagsFrag+1] = 0
	ip.SetDF(f.DF)
	ip[ipv4TTL] = f.TTL
	ip[ipv4Protocol] = f.Protocol
	ip.SetSrc(f.Src)
	ip.SetDst(f.Dst)
	ip.SetChecksum(ip.CalculateChecksum())
}

func put4(b []byte, a netip.Addr) {
	if !a.IsValid() {
		clear(b[:4])
		return
	}
	v := a.Unmap().As4() // panics on a true IPv6 address
	copy(b[:4], v[:])
}
