package rxe

import (
	"net"
	"net/netip"
	"time"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// The frame tap (softverbs' driver.Tapper): while someone taps the device
// (a capture), it builds every datagram it sends and receives as a full
// Ethernet/IPv4|IPv6/UDP/RoCEv2 frame that Wireshark's RoCE dissector
// decodes (UDP port 4791).
//
// The device sees UDP payloads only, so the capture rebuilds the rest:
//   - sent: the IP header is the one the ICRC was computed over, which is
//     what the kernel emits (IPv4: DF set, ID 0, header checksum valid;
//     IPv6: flow label 0 — a kernel with auto flow labels may send another
//     one, which the ICRC does not cover); the UDP checksum is 0.
//   - received: the IPv4 identification and DF bit are the ones the ICRC
//     check solved for (a datagram whose ICRC no ID matches gets ID 0 and
//     DF, so its ICRC shows as wrong, as it was); TTL, TOS and addresses
//     come from the control messages; the UDP checksum is shown as 0.
//   - Ethernet: the destination MAC of a multicast datagram is the group's
//     (01:00:5e:… / 33:33:…); otherwise the device's own MAC for a received
//     datagram and 00:00:00:00:00:00 for a sent one (the neighbour is not
//     known); the source MAC is the device's for a sent datagram and all
//     zeros for a received one. Loopback's MAC is all zeros.
//
// With no tap the hooks cost one atomic load.

// captureSent is the send path's hook: ip is the IP header the ICRC was
// computed over (its version nibble says IPv4 or IPv6; the slice may be
// longer than the header), udp the UDP header, roce the UDP payload.
func captureSent(d *Device, ip, udp, roce []byte) {
	if d.core.Tapping() {
		d.captureSent(ip, udp, roce)
	}
}

// captureReceived is the receive path's hook, called with each datagram as
// read from a socket: its UDP payload b, raw source address and control
// messages.
func captureReceived(d *Device, v6 bool, b, name, oob []byte) {
	if d.core.Tapping() {
		d.captureReceived(v6, b, name, oob)
	}
}

func (d *Device) captureSent(ip, udp, roce []byte) {
	if len(ip) < wire.IPv4HeaderLen || len(udp) < wire.UDPHeaderLen {
		return
	}
	ipLen := wire.IPv4HeaderLen
	if ip[0]>>4 == 6 {
		ipLen = wire.IPv6HeaderLen
	}
	if len(ip) < ipLen {
		return
	}
	f := make([]byte, ethHeaderLen+ipLen+wire.UDPHeaderLen+len(roce))
	n := copy(f[ethHeaderLen:], ip[:ipLen])
	n += copy(f[ethHeaderLen+n:], udp[:wire.UDPHeaderLen])
	copy(f[ethHeaderLen+n:], roce)
	dst := ipDst(f[ethHeaderLen:])
	putEth(f, multicastMAC(dst, nil), d.info.Load().mac, ipLen == wire.IPv6HeaderLen)
	d.core.Emit(verbs.Frame{Time: time.Now(), Data: f, Sent: true})
}

func (d *Device) captureReceived(v6 bool, b, name, oob []byte) {
	var m rxMeta
	parseRxMeta(&m, name, oob, v6)
	d.captureMeta(v6, b, &m)
}

// captureMeta emits received datagram b with the IP and UDP fields m
// describes (a forwarded datagram's come from its forwarding header).
func (d *Device) captureMeta(v6 bool, b []byte, m *rxMeta) {
	ipLen := wire.IPv4HeaderLen
	if v6 {
		ipLen = wire.IPv6HeaderLen
	}
	f := make([]byte, ethHeaderLen+ipLen+wire.UDPHeaderLen+len(b))
	ipb := f[ethHeaderLen : ethHeaderLen+ipLen]
	udp := wire.UDP(f[ethHeaderLen+ipLen : ethHeaderLen+ipLen+wire.UDPHeaderLen])
	copy(f[ethHeaderLen+ipLen+wire.UDPHeaderLen:], b)
	udp.Encode(m.srcPort, wire.UDPPort, uint16(wire.UDPHeaderLen+len(b)))
	src, dst := m.src, m.dst
	if !v6 {
		if !src.Is4() {
			src = netip.IPv4Unspecified()
		}
		if !dst.Is4() {
			dst = netip.IPv4Unspecified()
		}
		ip := wire.IPv4(ipb)
		ip.Encode(wire.IPv4Fields{
			TOS:         m.tos,
			TotalLength: uint16(wire.IPv4HeaderLen + wire.UDPHeaderLen + len(b)),
			DF:          true,
			TTL:         m.ttl,
			Protocol:    wire.IPProtocolUDP,
			Src:         src,
			Dst:         dst,
		})
		var p wire.Packet
		if wire.ParseUD(b, &p) == nil {
			if id, df, ok := wire.SolveIPv4ID(ip, udp, p.Body, p.ICRC); ok {
				ip.SetID(id)
				ip.SetDF(df)
				ip.SetChecksum(ip.CalculateChecksum())
			}
		}
	} else {
		if !src.Is6() {
			src = netip.IPv6Unspecified()
		}
		if !dst.Is6() {
			dst = netip.IPv6Unspecified()
		}
		wire.IPv6(ipb).Encode(wire.IPv6Fields{
			TrafficClass:  m.tos,
			FlowLabel:     m.flow,
			PayloadLength: uint16(wire.UDPHeaderLen + len(b)),
			NextHeader:    wire.IPProtocolUDP,
			HopLimit:      m.ttl,
			Src:           src,
			Dst:           dst,
		})
	}
	mac := d.info.Load().mac
	putEth(f, multicastMAC(ipDst(ipb), mac), nil, v6)
	d.core.Emit(verbs.Frame{Time: time.Now(), Data: f})
}

const ethHeaderLen = 14

// putEth writes the Ethernet header at f[0:14]; a nil MAC is all zeros.
func putEth(f []byte, dst, src net.HardwareAddr, v6 bool) {
	clear(f[:12])
	copy(f[0:6], dst)
	copy(f[6:12], src)
	if v6 {
		f[12], f[13] = 0x86, 0xDD
	} else {
		f[12], f[13] = 0x08, 0x00
	}
}

// ipDst returns the destination address bytes of the IP header at b.
func ipDst(b []byte) []byte {
	if b[0]>>4 == 6 {
		return b[24:40]
	}
	return b[16:20]
}

// multicastMAC maps a multicast IP destination to its Ethernet group
// address (RFC 1112 / RFC 2464); any other destination gets def.
func multicastMAC(dst []byte, def net.HardwareAddr) net.HardwareAddr {
	switch {
	case len(dst) == 4 && dst[0]&0xF0 == 0xE0:
		return net.HardwareAddr{0x01, 0x00, 0x5e, dst[1] & 0x7F, dst[2], dst[3]}
	case len(dst) == 16 && dst[0] == 0xFF:
		return net.HardwareAddr{0x33, 0x33, dst[12], dst[13], dst[14], dst[15]}
	}
	return def
}
