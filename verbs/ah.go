package verbs

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"syscall"
)

// InitAHFromWC builds the attributes of an address handle that answers the
// sender of a received datagram (ibv_init_ah_from_wc). grh is the 40-byte
// GRH area of the receive buffer. As in libibverbs, a datagram received on
// a multicast group cannot be answered this way (EINVAL).
func InitAHFromWC(ctx *Context, port uint8, wc *WC, grh []byte) (_ AHAttr, err error) {
	defer wrap(&err, "ibv_init_ah_from_wc", "")
	var ah AHAttr
	if wc == nil {
		return ah, syscall.EINVAL
	}
	ah.DLID = wc.SLID
	ah.SL = wc.SL
	ah.SrcPathBits = wc.DLIDPathBits
	ah.PortNum = port
	if wc.Flags&WCGRH == 0 {
		return ah, nil
	}
	if len(grh) < GRHLen {
		return ah, fmt.Errorf("short grh: %w", syscall.EINVAL)
	}
	ah.IsGlobal = true
	tbl, err := ctx.QueryGIDTable(port)
	if err != nil {
		return ah, err
	}
	find := func(g GID) (uint8, bool) {
		for _, e := range tbl {
			if e.GID == g {
				return uint8(e.Index), true
			}
		}
		return 0, false
	}
	if grh[0]>>4 != 6 {
		// RoCEv2 over IPv4: 20 reserved bytes, then the IPv4 header.
		ip := grh[20:40]
		if ip[0]>>4 != 4 {
			return ah, syscall.EPROTONOSUPPORT
		}
		src := netip.AddrFrom4([4]byte(ip[12:16]))
		dst := netip.AddrFrom4([4]byte(ip[16:20]))
		if dst.IsMulticast() {
			return ah, fmt.Errorf("multicast destination: %w", syscall.EINVAL)
		}
		idx, ok := find(netip.AddrFrom16(dst.As16()).As16())
		if !ok {
			return ah, fmt.Errorf("no local gid for %v: %w", dst, syscall.EINVAL)
		}
		ah.GRH = GlobalRoute{DGID: netip.AddrFrom16(src.As16()).As16(), SGIDIndex: idx, HopLimit: ip[8], TrafficClass: ip[1]}
		return ah, nil
	}
	var dgid, sgid GID
	copy(sgid[:], grh[8:24])
	copy(dgid[:], grh[24:40])
	if dgid[0] == 0xff {
		return ah, fmt.Errorf("multicast destination: %w", syscall.EINVAL)
	}
	idx, ok := find(dgid)
	if !ok {
		return ah, fmt.Errorf("no local gid for %v: %w", dgid, syscall.EINVAL)
	}
	w0 := binary.BigEndian.Uint32(grh[0:4])
	ah.GRH = GlobalRoute{DGID: sgid, SGIDIndex: idx, HopLimit: grh[7], TrafficClass: uint8(w0 >> 20), FlowLabel: w0 & 0xfffff}
	return ah, nil
}

// CreateAHFromWC creates an address handle answering a received datagram
// (ibv_create_ah_from_wc).
func (pd *PD) CreateAHFromWC(wc *WC, grh []byte, port uint8) (*AH, error) {
	attr, err := InitAHFromWC(pd.ctx, port, wc, grh)
	if err != nil {
		return nil, OpError("ibv_create_ah_from_wc", "", err)
	}
	return pd.CreateAH(&attr)
}
