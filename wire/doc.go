// Package wire holds the on-the-wire formats of RoCEv2 as Linux Soft-RoCE
// (rdma_rxe) sends them, and the GID/MGID mappings of the RDMA CM.
//
// Headers are views in the style of gVisor's pkg/tcpip/header: a header is
// a byte slice type (BTH, DETH, ImmDt, IPv4, IPv6, UDP) with one accessor
// and one setter per field. Nothing on the per-packet path allocates:
// EncodeUD, ParseUD, ICRCv4/ICRCv6 and SolveIPv4ID work in place.
//
// A RoCEv2 UD datagram is IP / UDP (destination port 4791) / BTH / DETH /
// [ImmDt] / payload / pad to 4 bytes / ICRC. The ICRC is the IEEE CRC-32 of
// the packet with its variant fields masked to ones, stored little-endian
// (see ICRCv4). A receiver on a UDP socket does not see the IP header;
// SolveIPv4ID recovers the IPv4 ID and DF bit the ICRC covers.
package wire
