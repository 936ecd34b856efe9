package wire

import "encoding/binary"

// IBGRHNextHdrBTH is the GRH NxtHdr value announcing an IBA transport
// header (BTH) after the GRH (IBA 8.3.1).
const IBGRHNextHdrBTH = 0x1B

// IBGRH is a view of the 40-byte InfiniBand Global Route Header (IBA 8.3),
// which has the IPv6 header layout:
//
//	IPVer(4) | TClass(8) | FlowLabel(20)
//	PayLen(16) | NxtHdr(8) | HopLmt(8)
//	SGID(128)
//	DGID(128)
//
// PayLen counts the bytes after the GRH through the ICRC (BTH, extended
// headers, payload, pad, ICRC); NxtHdr is IBGRHNextHdrBTH. It must be at
// least IBGRHLen bytes long. The accessors of IPv6 apply as well
// (IPv6(g)); this type adds the GID-typed ones.
type IBGRH []byte

// IPVer returns the IP version nibble (6).
func (g IBGRH) IPVer() uint8 { return g[0] >> 4 }

// TClass returns the traffic class.
func (g IBGRH) TClass() uint8 { return IPv6(g).TrafficClass() }

// SetTClass sets the traffic class.
func (g IBGRH) SetTClass(tc uint8) { IPv6(g).SetTrafficClass(tc) }

// FlowLabel returns the 20-bit flow label.
func (g IBGRH) FlowLabel() uint32 { return IPv6(g).FlowLabel() }

// SetFlowLabel sets the 20-bit flow label.
func (g IBGRH) SetFlowLabel(fl uint32) { IPv6(g).SetFlowLabel(fl) }

// PayLen returns the payload length (bytes after the GRH through the ICRC).
func (g IBGRH) PayLen() uint16 { return binary.BigEndian.Uint16(g[ipv6PayLen:]) }

// SetPayLen sets the payload length.
func (g IBGRH) SetPayLen(n uint16) { binary.BigEndian.PutUint16(g[ipv6PayLen:], n) }

// NxtHdr returns the next header (IBGRHNextHdrBTH for IBA transport).
func (g IBGRH) NxtHdr() uint8 { return g[ipv6NextHdr] }

// SetNxtHdr sets the next header.
func (g IBGRH) SetNxtHdr(n uint8) { g[ipv6NextHdr] = n }

// HopLmt returns the hop limit.
func (g IBGRH) HopLmt() uint8 { return g[ipv6HopLimit] }

// SetHopLmt sets the hop limit.
func (g IBGRH) SetHopLmt(h uint8) { g[ipv6HopLimit] = h }

// SGID returns the source GID.
func (g IBGRH) SGID() GID { return GID(g[ipv6Src : ipv6Src+GIDLen]) }

// SetSGID sets the source GID.
func (g IBGRH) SetSGID(gid GID) { copy(g[ipv6Src:ipv6Src+GIDLen], gid[:]) }

// DGID returns the destination GID.
func (g IBGRH) DGID() GID { return GID(g[ipv6Dst : ipv6Dst+GIDLen]) }

// SetDGID sets the destination GID.
func (g IBGRH) SetDGID(gid GID) { copy(g[ipv6Dst:ipv6Dst+GIDLen], gid[:]) }

// IBGRHFields holds the values Encode writes into a GRH (IPVer 6).
type IBGRHFields struct {
	TClass     uint8
	FlowLabel  uint32
	PayLen     uint16
	NxtHdr     uint8
	HopLmt     uint8
	SGID, DGID GID
}

// Encode writes the 40-byte GRH from f with IPVer 6.
func (g IBGRH) Encode(f IBGRHFields) {
	_ = g[IBGRHLen-1]
	binary.BigEndian.PutUint32(g[ipv6VerTCFlow:],
		ipv6Version<<28|uint32(f.TClass)<<ipv6TCShift|f.FlowLabel&ipv6FlowLabelMask)
	g.SetPayLen(f.PayLen)
	g[ipv6NextHdr] = f.NxtHdr
	g[ipv6HopLimit] = f.HopLmt
	g.SetSGID(f.SGID)
	g.SetDGID(f.DGID)
}
