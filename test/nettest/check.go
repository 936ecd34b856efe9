package nettest

import (
	"net/netip"
	"testing"

	"github.com/softrdma/softrdma/wire"
)

// MulticastMAC returns the Ethernet multicast address of an IPv4 group
// (01:00:5e and the low 23 bits of the group).
func MulticastMAC(group netip.Addr) [6]byte {
	g := group.As4()
	return [6]byte{0x01, 0x00, 0x5e, g[1] & 0x7f, g[2], g[3]}
}

// CheckIPv4 checks the IPv4 header of a RoCEv2 frame as every sender of
// the tests writes it: 20 bytes, sent to wantMAC, DF only, TTL 64, TOS 0,
// a valid header checksum. It reports each problem with errorf and returns
// false (having checked nothing else) when the header is not 20 bytes.
func CheckIPv4(t testing.TB, f RoCEFrame, wantMAC [6]byte, errorf func(format string, args ...any)) bool {
	t.Helper()
	ip := wire.IPv4(f.IP)
	if len(f.IP) != wire.IPv4HeaderLen {
		errorf("IPv4 header length %d, want %d", len(f.IP), wire.IPv4HeaderLen)
		return false
	}
	if f.EthDst != wantMAC {
		errorf("Ethernet destination %x, want %x", f.EthDst, wantMAC)
	}
	if !ip.DF() || ip.Flags()&1 != 0 || ip.FragmentOffset() != 0 {
		errorf("IPv4 flags %#x offset %d, want DF only", ip.Flags(), ip.FragmentOffset())
	}
	if ip.TTL() != 64 {
		errorf("TTL %d, want 64", ip.TTL())
	}
	if ip.TOS() != 0 {
		errorf("TOS %#x, want 0", ip.TOS())
	}
	if c := ip.CalculateChecksum(); c != ip.Checksum() {
		errorf("IPv4 header checksum %#04x, want %#04x", ip.Checksum(), c)
	}
	return true
}

// CheckUDP checks the UDP header of a RoCEv2 frame: destination port
// 4791, no checksum, a length that matches the datagram, and the source
// port *sport of the earlier frames of the same QP (the first frame, first
// true, sets *sport). It reports each problem with errorf.
func CheckUDP(t testing.TB, f RoCEFrame, first bool, sport *uint16, errorf func(format string, args ...any)) {
	t.Helper()
	udp := wire.UDP(f.UDP)
	if udp.DstPort() != wire.UDPPort {
		errorf("UDP destination port %d", udp.DstPort())
	}
	if udp.Checksum() != 0 {
		errorf("UDP checksum %#04x, want 0", udp.Checksum())
	}
	if int(udp.Length()) != wire.UDPHeaderLen+len(f.Body) {
		errorf("UDP length %d, datagram %d", udp.Length(), wire.UDPHeaderLen+len(f.Body))
	}
	if first {
		*sport = udp.SrcPort()
	} else if udp.SrcPort() != *sport {
		errorf("UDP source port %d, earlier frames %d (must be fixed per QP)", udp.SrcPort(), *sport)
	}
}

// CheckMcastUD checks the BTH and DETH of a parsed UD datagram p (the body
// of f) that mckey sent to a multicast group with a size-byte payload:
// transport version 0, no MigReq, the pad count of size, P_Key 0xffff,
// DestQP 0xffffff, Q_Key 0x01234567. It reports each problem with errorf.
func CheckMcastUD(t testing.TB, f RoCEFrame, p *wire.Packet, size int, errorf func(format string, args ...any)) {
	t.Helper()
	if p.BTH.TVer() != 0 || p.BTH.MigReq() || p.BTH.PadCount() != -size&3 {
		errorf("BTH flags byte %#02x (pad %d, want %d)", f.Body[1], p.BTH.PadCount(), -size&3)
	}
	if p.BTH.PKey() != 0xffff {
		errorf("P_Key %#x, want 0xffff", p.BTH.PKey())
	}
	if p.BTH.DestQP() != 0xffffff {
		errorf("DestQP %#x, want 0xffffff", p.BTH.DestQP())
	}
	if p.DETH.QKey() != 0x01234567 {
		errorf("Q_Key %#x, want 0x01234567", p.DETH.QKey())
	}
}

// CheckPayload checks the payload and the ICRC of a parsed UD datagram p
// (the body of f): size bytes, mckey's pattern (byte j is j*7+3) when
// pattern is set, and an ICRC that matches the one recomputed over the
// captured headers. It reports each problem with errorf.
func CheckPayload(t testing.TB, f RoCEFrame, p *wire.Packet, size int, pattern bool, errorf func(format string, args ...any)) {
	t.Helper()
	if len(p.Payload) != size {
		errorf("payload %d bytes, want %d", len(p.Payload), size)
	} else if pattern {
		for j, b := range p.Payload {
			if b != byte(j*7+3) {
				errorf("payload byte %d = %#02x, want mckey's pattern %#02x", j, b, byte(j*7+3))
				break
			}
		}
	}
	if got := wire.ICRCv4(wire.IPv4(f.IP), wire.UDP(f.UDP), p.Body); got != p.ICRC {
		errorf("ICRC on the wire %08x, recomputed over the captured headers %08x", p.ICRC, got)
	}
}
