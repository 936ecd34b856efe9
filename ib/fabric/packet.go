package fabric

import (
	"errors"

	"github.com/softrdma/softrdma/wire"
)

// Errors returned by Parse, in the order it checks. Compare with errors.Is.
var (
	// ErrShort reports a datagram shorter than LRH + BTH + ICRC + VCRC.
	ErrShort = errors.New("fabric: IB packet too short")
	// ErrLVer reports an LRH link version other than 0.
	ErrLVer = errors.New("fabric: LRH LVer is not 0")
	// ErrLNH reports an LRH next header other than IBA local/global.
	ErrLNH = errors.New("fabric: LRH LNH is not IBA local or global")
	// ErrPktLen reports an LRH PktLen that disagrees with the datagram.
	ErrPktLen = errors.New("fabric: LRH PktLen does not match the datagram")
	// ErrVCRC reports a bad VCRC.
	ErrVCRC = errors.New("fabric: bad VCRC")
	// ErrGRH reports a GRH with IPVer ≠ 6, NxtHdr ≠ 0x1B or a PayLen that
	// disagrees with the datagram.
	ErrGRH = errors.New("fabric: bad GRH")
	// ErrICRC reports a bad ICRC.
	ErrICRC = errors.New("fabric: bad ICRC")
)

// UDPacket describes the headers EncodeUD writes.
type UDPacket struct {
	VL, SL     uint8
	DLID, SLID uint16
	// Global selects LNH 3 and a GRH built from GRH (PayLen and NxtHdr are
	// filled in); otherwise LNH 2 and no GRH.
	Global bool
	GRH    wire.IBGRHFields
	// UD holds BTH/DETH/ImmDt (opcode from HasImm, pad count computed).
	UD wire.UDHeader
}

// PacketLen returns the datagram length of a UD SEND_ONLY packet with a
// payload of n bytes: LRH, [GRH], BTH, DETH, [ImmDt], payload, pad, ICRC,
// VCRC.
func PacketLen(n int, hasImm, global bool) int {
	l := wire.LRHLen + wire.UDLen(n, hasImm) + wire.VCRCLen
	if global {
		l += wire.IBGRHLen
	}
	return l
}

// EncodeUD writes a complete IB UD SEND_ONLY[_WITH_IMMEDIATE] packet into
// b (len(b) >= PacketLen) — LRH with PktLen, GRH, BTH, DETH, ImmDt,
// payload, zero pad, ICRC and VCRC — and returns its length.
func EncodeUD(b []byte, p *UDPacket, payload []byte) int {
	total := PacketLen(len(payload), p.UD.HasImm, p.Global)
	if len(b) < total {
		panic("fabric: EncodeUD buffer too short")
	}
	hl := wire.LRHLen
	lnh := uint8(wire.LNHLocal)
	if p.Global {
		hl += wire.IBGRHLen
		lnh = wire.LNHGlobal
	}
	ud := wire.UDLen(len(payload), p.UD.HasImm)
	wire.LRH(b).Encode(wire.LRHFields{VL: p.VL, SL: p.SL, LNH: lnh, DLID: p.DLID, SLID: p.SLID,
		PktLen: wire.PktLenWords(hl + ud)})
	if p.Global {
		g := p.GRH
		g.PayLen = uint16(ud)
		g.NxtHdr = wire.IBGRHNextHdrBTH
		wire.IBGRH(b[wire.LRHLen:]).Encode(g)
	}
	n := wire.EncodeUD(b[hl:], &p.UD, payload)
	wire.PutICRC(b[hl+n:], wire.ICRCIB(b[:hl+n]))
	wire.PutVCRC(b[hl+ud:], wire.VCRC(b[:hl+ud]))
	return total
}

// Packet is a parsed IB UD packet; slices alias the datagram.
type Packet struct {
	LRH wire.LRH
	// GRH is nil for a local packet (LNH 2).
	GRH wire.IBGRH
	// UD is the transport part (BTH, DETH, ImmDt, payload).
	UD wire.Packet
}

// Global reports whether the packet carries a GRH.
func (p *Packet) Global() bool { return p.GRH != nil }

// CheckLink runs the link-layer checks a switch makes on a datagram b:
// length, LVer, LNH, PktLen and VCRC (see Parse). It returns the LRH.
func CheckLink(b []byte) (wire.LRH, error) {
	l, err := checkLinkHeaders(b)
	if err != nil {
		return nil, err
	}
	if !wire.CheckVCRC(b) {
		return nil, ErrVCRC
	}
	return l, nil
}

// checkLinkHeaders is CheckLink without the VCRC.
func checkLinkHeaders(b []byte) (wire.LRH, error) {
	if len(b) < wire.LRHLen+wire.BTHLen+wire.ICRCLen+wire.VCRCLen {
		return nil, ErrShort
	}
	l := wire.LRH(b[:wire.LRHLen])
	if l.LVer() != 0 {
		return nil, ErrLVer
	}
	if lnh := l.LNH(); lnh != wire.LNHLocal && lnh != wire.LNHGlobal {
		return nil, ErrLNH
	}
	if int(l.PktLen())*4+wire.VCRCLen != len(b) {
		return nil, ErrPktLen
	}
	return l, nil
}

// Parse checks and splits an IB UD packet: CheckLink, then the GRH
// (IPVer 6, NxtHdr 0x1B, PayLen), then the transport headers
// (wire.ParseUD: TVer, UD SEND_ONLY opcode, lengths, DestQP ≠ 0), then the
// ICRC. It does not allocate. On error p is left unchanged.
func Parse(b []byte, p *Packet) error { return parse(b, p, true) }

// ParseBuilt splits a packet EncodeUD just built (an HCA's loopback copy
// of its own send), as Parse does but without computing the VCRC and the
// ICRC, which are right by construction.
func ParseBuilt(b []byte, p *Packet) error { return parse(b, p, false) }

func parse(b []byte, p *Packet, crcs bool) error {
	var l wire.LRH
	var err error
	if crcs {
		l, err = CheckLink(b)
	} else {
		l, err = checkLinkHeaders(b)
	}
	if err != nil {
		return err
	}
	hl := wire.LRHLen
	var g wire.IBGRH
	if l.LNH() == wire.LNHGlobal {
		if len(b) < wire.LRHLen+wire.IBGRHLen+wire.BTHLen+wire.ICRCLen+wire.VCRCLen {
			return ErrShort
		}
		g = wire.IBGRH(b[wire.LRHLen : wire.LRHLen+wire.IBGRHLen])
		hl += wire.IBGRHLen
		if g.IPVer() != 6 || g.NxtHdr() != wire.IBGRHNextHdrBTH || int(g.PayLen()) != len(b)-hl-wire.VCRCLen {
			return ErrGRH
		}
	}
	var ud wire.Packet
	if err := wire.ParseUD(b[hl:len(b)-wire.VCRCLen], &ud); err != nil {
		return err
	}
	if crcs && wire.ICRCIB(b[:hl+len(ud.Body)]) != ud.ICRC {
		return ErrICRC
	}
	p.LRH, p.GRH, p.UD = l, g, ud
	return nil
}
