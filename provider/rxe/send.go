package rxe

import (
	"net/netip"
	"syscall"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// Send transmits one UD datagram (verbs.DriverQP). The AH must be global:
// its DGID gives the destination IP (IPv4-mapped → IPv4, else IPv6), its
// SGID index the source (an entry of port 1's GID table of the same family,
// else EINVAL), its hop limit the IP TTL and its traffic class the TOS.
// A payload larger than the active MTU is counted and not sent, and Send
// returns nil, as rxe completes such sends successfully. The packet is
// BTH (P_Key 0xFFFF, the QP's next PSN) / DETH (RemoteQKey as given, the
// QP's QPN) / [ImmDt] / payload / pad / ICRC, the ICRC computed over the
// IP header the kernel emits (DF set, ID 0).
func (q *qp) Send(s *verbs.UDSend) error {
	d := q.dev
	ah := s.AH
	if ah == nil || !ah.IsGlobal {
		return d.errf(syscall.EINVAL, "send: address handle without GRH")
	}
	info := d.info.Load()
	sgid, ok := info.gid(int(ah.GRH.SGIDIndex))
	if !ok {
		info, _ = d.refreshInfo()
		if sgid, ok = info.gid(int(ah.GRH.SGIDIndex)); !ok {
			return d.errf(syscall.EINVAL, "send: no GID at index %d", ah.GRH.SGIDIndex)
		}
	}
	src := sgid.GID.Addr()
	dst := ah.GRH.DGID.Addr()
	if src.Is4() != dst.Is4() || !dst.IsValid() || dst.IsUnspecified() {
		return d.errf(syscall.EINVAL, "send: source %v, destination %v", src, dst)
	}
	if len(s.Payload) > info.activeMTU().Bytes() {
		d.count(q, cOversizedSend)
		return nil
	}

	q.smu.Lock()
	defer q.smu.Unlock()
	if q.dead.Load() {
		return d.errf(syscall.EINVAL, "send: qp %#x destroyed", q.qpn)
	}
	psn := q.psn
	q.psn = (psn + 1) & 0xFFFFFF
	h := wire.UDHeader{
		Solicited: s.Solicited,
		PKey:      wire.DefaultPKey,
		DestQP:    s.RemoteQPN & 0xFFFFFF,
		PSN:       psn,
		QKey:      s.RemoteQKey,
		SrcQP:     q.qpn,
		HasImm:    s.HasImm,
		Imm:       s.Imm,
	}
	n := wire.EncodeUD(q.sbuf, &h, s.Payload)
	total := n + wire.ICRCLen
	udp := wire.UDP(q.udph[:])
	hop, tc := ah.GRH.HopLimit, ah.GRH.TrafficClass
	var err error
	if dst.Is4() {
		udp.Encode(q.blk.port4, wire.UDPPort, uint16(wire.UDPHeaderLen+total))
		ip := wire.IPv4(q.iph[:wire.IPv4HeaderLen])
		ip.Encode(wire.IPv4Fields{
			TOS:         tc,
			TotalLength: uint16(wire.IPv4HeaderLen + wire.UDPHeaderLen + total),
			DF:          true,
			TTL:         hop,
			Protocol:    wire.IPProtocolUDP,
			Src:         src,
			Dst:         dst,
		})
		wire.PutICRC(q.sbuf[n:], wire.ICRCv4(ip, udp, q.sbuf[:n]))
		oob := buildOOB4(q.oob, d.ifindex, src, hop, tc)
		_, _, err = q.blk.conn4.WriteMsgUDPAddrPort(q.sbuf[:total], oob, netip.AddrPortFrom(dst, wire.UDPPort))
	} else {
		if q.blk.conn6 == nil {
			return d.errf(syscall.EAFNOSUPPORT, "send: no IPv6 socket")
		}
		udp.Encode(q.blk.port6, wire.UDPPort, uint16(wire.UDPHeaderLen+total))
		ip := wire.IPv6(q.iph[:wire.IPv6HeaderLen])
		ip.Encode(wire.IPv6Fields{
			TrafficClass:  tc,
			PayloadLength: uint16(wire.UDPHeaderLen + total),
			NextHeader:    wire.IPProtocolUDP,
			HopLimit:      hop,
			Src:           src,
			Dst:           dst,
		})
		wire.PutICRC(q.sbuf[n:], wire.ICRCv6(ip, udp, q.sbuf[:n]))
		oob := buildOOB6(q.oob, d.ifindex, src, hop, tc)
		_, _, err = q.blk.conn6.WriteMsgUDPAddrPort(q.sbuf[:total], oob, netip.AddrPortFrom(dst, wire.UDPPort))
	}
	if err != nil {
		d.count(q, cSendErrors)
		return d.errf(errnoOf(err, syscall.EIO), "send to %v: %v", dst, err)
	}
	d.count(q, cSentPkts)
	d.ctr.add(cSentBytes, uint64(total))
	q.ctr.add(cSentBytes, uint64(total))
	return nil
}
