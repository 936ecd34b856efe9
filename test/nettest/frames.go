package nettest

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"
)

// IPv4Frame is the IPv4 part of an Ethernet frame.
type IPv4Frame struct {
	TS       time.Time
	EthDst   [6]byte
	IP       []byte // the IPv4 header (IHL*4 bytes)
	Src, Dst netip.Addr
	Proto    uint8
	Payload  []byte // after the IP header, up to the IP total length
}

// ParseIPv4 decodes an untagged Ethernet II frame carrying IPv4; frames
// that are not (or are malformed) return false.
func ParseIPv4(f Frame) (IPv4Frame, bool) {
	b := f.Data
	if len(b) < 14+20 || binary.BigEndian.Uint16(b[12:14]) != 0x0800 {
		return IPv4Frame{}, false
	}
	ip := b[14:]
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	if ip[0]>>4 != 4 || ihl < 20 || total < ihl || total > len(ip) {
		return IPv4Frame{}, false
	}
	p := IPv4Frame{
		TS:      f.TS,
		IP:      ip[:ihl],
		Src:     netip.AddrFrom4([4]byte(ip[12:16])),
		Dst:     netip.AddrFrom4([4]byte(ip[16:20])),
		Proto:   ip[9],
		Payload: ip[ihl:total],
	}
	copy(p.EthDst[:], b[:6])
	return p, true
}

// NotFrom returns the IPv4 frames whose source is not src: on the capture
// of a bridge port with src the address of the host behind it, the frames
// the bridge forwarded to that host.
func NotFrom(fs []Frame, src netip.Addr) []Frame {
	var out []Frame
	for _, f := range fs {
		if p, ok := ParseIPv4(f); ok && p.Src != src {
			out = append(out, f)
		}
	}
	return out
}

// IGMP message and IGMPv3 group record types.
const (
	IGMPV2Report = 0x16
	IGMPV2Leave  = 0x17
	IGMPV3Report = 0x22

	RecIsInclude = 1
	RecIsExclude = 2
	RecToInclude = 3
	RecToExclude = 4
	RecAllow     = 5
	RecBlock     = 6
)

// IGMPEvent is one statement an IGMP message makes about a group.
type IGMPEvent struct {
	TS    time.Time
	Src   netip.Addr
	Type  uint8 // message type
	Rec   uint8 // IGMPv3 record type (0 for v1/v2)
	Group netip.Addr
	NSrc  int // IGMPv3 record: number of sources
}

// String describes the event, e.g. for test failure messages.
func (e IGMPEvent) String() string {
	if e.Type == IGMPV3Report {
		return fmt.Sprintf("%s IGMPv3 report from %v: record type %d group %v sources %d", e.TS.Format("15:04:05.000"), e.Src, e.Rec, e.Group, e.NSrc)
	}
	return fmt.Sprintf("%s IGMP type %#x from %v group %v", e.TS.Format("15:04:05.000"), e.Type, e.Src, e.Group)
}

// Join reports whether the event announces membership (any source).
func (e IGMPEvent) Join() bool {
	switch e.Type {
	case IGMPV2Report, 0x12:
		return true
	case IGMPV3Report:
		return e.Rec == RecIsExclude || e.Rec == RecToExclude
	}
	return false
}

// Leave reports whether the event gives up membership: a v2 leave, or an
// IGMPv3 TO_IN {} (CHANGE_TO_INCLUDE_MODE without sources).
func (e IGMPEvent) Leave() bool {
	return e.Type == IGMPV2Leave || e.Type == IGMPV3Report && e.Rec == RecToInclude && e.NSrc == 0
}

// IGMPEvents decodes the IGMP messages among frames.
func IGMPEvents(fs []Frame) []IGMPEvent {
	var out []IGMPEvent
	for _, f := range fs {
		p, ok := ParseIPv4(f)
		if !ok || p.Proto != 2 || len(p.Payload) < 8 {
			continue
		}
		m := p.Payload
		switch m[0] {
		case 0x12, IGMPV2Report, IGMPV2Leave:
			out = append(out, IGMPEvent{TS: p.TS, Src: p.Src, Type: m[0], Group: netip.AddrFrom4([4]byte(m[4:8]))})
		case IGMPV3Report:
			n := int(binary.BigEndian.Uint16(m[6:8]))
			r := m[8:]
			for i := 0; i < n && len(r) >= 8; i++ {
				aux, nsrc := int(r[1])*4, int(binary.BigEndian.Uint16(r[2:4]))
				out = append(out, IGMPEvent{TS: p.TS, Src: p.Src, Type: IGMPV3Report, Rec: r[0],
					Group: netip.AddrFrom4([4]byte(r[4:8])), NSrc: nsrc})
				l := 8 + 4*nsrc + aux
				if l > len(r) {
					break
				}
				r = r[l:]
			}
		}
	}
	return out
}

// IGMPAbout returns the IGMP events from src about group.
func IGMPAbout(fs []Frame, src, group netip.Addr) []IGMPEvent {
	var out []IGMPEvent
	for _, e := range IGMPEvents(fs) {
		if e.Src == src && e.Group == group {
			out = append(out, e)
		}
	}
	return out
}

// RoCEFrame is a captured RoCEv2 datagram (UDP destination port 4791).
type RoCEFrame struct {
	IPv4Frame
	UDP  []byte // UDP header
	Body []byte // UDP payload (BTH … ICRC)
}

// RoCEFrames returns the IPv4 frames to UDP port 4791 from src (any
// source when invalid) to group.
func RoCEFrames(fs []Frame, src, group netip.Addr) []RoCEFrame {
	var out []RoCEFrame
	for _, f := range fs {
		p, ok := ParseIPv4(f)
		if !ok || p.Proto != 17 || len(p.Payload) < 8 || p.Dst != group || src.IsValid() && p.Src != src {
			continue
		}
		if binary.BigEndian.Uint16(p.Payload[2:4]) != 4791 {
			continue
		}
		out = append(out, RoCEFrame{IPv4Frame: p, UDP: p.Payload[:8], Body: p.Payload[8:]})
	}
	return out
}

// RoCECount is a WaitFor condition: at least n RoCEv2 frames src → group.
func RoCECount(src, group netip.Addr, n int) func([]Frame) bool {
	return func(fs []Frame) bool { return len(RoCEFrames(fs, src, group)) >= n }
}
