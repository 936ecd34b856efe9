package wire

import "hash/crc32"

// crc32Masked is the ICRC computed the slow, explicit way: build the masked
// byte string and hash it with crc32.ChecksumIEEE.
func crc32Masked(ip []byte, udp, body []byte) uint32 {
	s := make([]byte, 0, 8+len(ip)+len(udp)+len(body))
	s = append(s, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF)
	h := append([]byte(nil), ip...)
	switch len(ip) {
	case IPv4HeaderLen:
		h[1] = 0xFF               // TOS
		h[8] = 0xFF               // TTL
		h[10], h[11] = 0xFF, 0xFF // header checksum
	case IPv6HeaderLen:
		h[0] |= 0x0F                        // traffic class high nibble
		h[1], h[2], h[3] = 0xFF, 0xFF, 0xFF // traffic class low nibble, flow label
		h[7] = 0xFF                         // hop limit
	default:
		panic("bad IP header length")
	}
	s = append(s, h...)
	s = append(s, udp[:6]...)
	s = append(s, 0xFF, 0xFF)
	s = append(s, body[:4]...)
	s = append(s, 0xFF)
	s = append(s, body[5:]...)
	return crc32.ChecksumIEEE(s)
}

// v4Frame is a RoCEv2-over-IPv4 datagram built by buildV4; the slices
// alias one buffer (IP header, UDP header, UDP payload).
type v4Frame struct {
	ip   IPv4
	udp  UDP
	data []byte // UDP payload: BTH..pad ‖ ICRC
	n    int    // body length (data without the ICRC)
}

func (f v4Frame) body() []byte { return f.data[:f.n] }

// buildV4 encodes a complete UD SEND_ONLY datagram with a valid ICRC.
func buildV4(h *UDHeader, payload []byte, ipf IPv4Fields, sport uint16) v4Frame {
	l := UDLen(len(payload), h.HasImm)
	buf := make([]byte, IPv4HeaderLen+UDPHeaderLen+l)
	ipf.TotalLength = uint16(len(buf))
	ipf.Protocol = IPProtocolUDP
	ip := IPv4(buf[:IPv4HeaderLen])
	ip.Encode(ipf)
	udp := UDP(buf[IPv4HeaderLen : IPv4HeaderLen+UDPHeaderLen])
	udp.Encode(sport, UDPPort, uint16(UDPHeaderLen+l))
	data := buf[IPv4HeaderLen+UDPHeaderLen:]
	n := EncodeUD(data, h, payload)
	PutICRC(data[n:], ICRCv4(ip, udp, data[:n]))
	return v4Frame{ip: ip, udp: udp, data: data, n: n}
}

// v6Frame is a RoCEv2-over-IPv6 datagram built by buildV6.
type v6Frame struct {
	ip   IPv6
	udp  UDP
	data []byte
	n    int
}

func buildV6(h *UDHeader, payload []byte, ipf IPv6Fields, sport uint16) v6Frame {
	l := UDLen(len(payload), h.HasImm)
	buf := make([]byte, IPv6HeaderLen+UDPHeaderLen+l)
	ipf.PayloadLength = uint16(UDPHeaderLen + l)
	ipf.NextHeader = IPProtocolUDP
	ip := IPv6(buf[:IPv6HeaderLen])
	ip.Encode(ipf)
	udp := UDP(buf[IPv6HeaderLen : IPv6HeaderLen+UDPHeaderLen])
	udp.Encode(sport, UDPPort, uint16(UDPHeaderLen+l))
	data := buf[IPv6HeaderLen+UDPHeaderLen:]
	n := EncodeUD(data, h, payload)
	PutICRC(data[n:], ICRCv6(ip, udp, data[:n]))
	return v6Frame{ip: ip, udp: udp, data: data, n: n}
}

// xPow returns x^e mod P (the inverse of xPowNeg), by square and multiply.
func xPow(e uint64) uint32 {
	p, sq := uint32(polyOne), uint32(polyX)
	for ; e != 0; e >>= 1 {
		if e&1 != 0 {
			p = mulModP(p, sq)
		}
		sq = mulModP(sq, sq)
	}
	return p
}
