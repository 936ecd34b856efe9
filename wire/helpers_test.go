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
