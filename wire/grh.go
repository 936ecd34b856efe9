package wire

// Offsets in the GRH area of a UD receive buffer.
const (
	// GRHIPv4Offset is where the IPv4 header starts in the GRH area (the
	// first 20 bytes are zero).
	GRHIPv4Offset = GRHAreaLen - IPv4HeaderLen
	// GRHIPv4SrcOffset is the offset of the IPv4 source address in the GRH area.
	GRHIPv4SrcOffset = GRHIPv4Offset + ipv4Src
	// GRHIPv4DstOffset is the offset of the IPv4 destination address in the GRH area.
	GRHIPv4DstOffset = GRHIPv4Offset + ipv4Dst
)

// PutGRHv4 writes the 40-byte GRH area of a UD receive buffer for an IPv4
// packet, as rxe does: 20 zero bytes, then the 20-byte IPv4 header ip.
// dst must be at least GRHAreaLen bytes long.
func PutGRHv4(dst []byte, ip IPv4) {
	_ = dst[GRHAreaLen-1]
	clear(dst[:GRHIPv4Offset])
	copy(dst[GRHIPv4Offset:GRHAreaLen], ip[:IPv4HeaderLen])
}

// PutGRHv6 writes the 40-byte GRH area of a UD receive buffer for an IPv6
// packet: the IPv6 header verbatim. dst must be at least GRHAreaLen bytes long.
func PutGRHv6(dst []byte, ip IPv6) {
	_ = dst[GRHAreaLen-1]
	copy(dst[:GRHAreaLen], ip[:IPv6HeaderLen])
}
