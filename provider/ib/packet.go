package ib

import (
	"errors"
	"fmt"
	"runtime"
	"syscall"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// IB packet constants.
const (
	gsiQPN    = mad.GSIQPN
	gsiQKey   = mad.GSIQKey
	maxPacket = wire.LRHLen + wire.IBGRHLen + wire.BTHLen + wire.DETHLen + wire.ImmDtLen + 4096 + 3 + wire.ICRCLen + wire.VCRCLen
)

// Send implements softverbs.DriverQP: one UD packet to the switch. Multicast
// packets are also delivered to the port's own attached QPs (HCA
// loopback), except the sender when it blocks self loopback.
func (q *qp) Send(s *softverbs.UDSend) error {
	d := q.dev
	d.mu.Lock()
	lid, active, mtu, sgid := d.lid, d.active, verbs.MTU(d.mtu), d.portGIDLocked()
	d.mu.Unlock()
	if !active {
		return fmt.Errorf("ib: send: port not active: %w", syscall.ENETDOWN)
	}
	if len(s.Payload) > mtu.Bytes() {
		d.ctr.oversized.Add(1)
		return nil // completes, is not sent (C10-93.1.1)
	}
	ah := s.AH
	if ah.IsGlobal && ah.GRH.SGIDIndex != 0 {
		return fmt.Errorf("ib: send: sgid index %d: %w", ah.GRH.SGIDIndex, syscall.EINVAL)
	}
	qkey := s.RemoteQKey
	if qkey&0x80000000 != 0 {
		qkey = q.qkey.Load() // IBA: a Q_Key with the high bit set means the QP's own
	}
	p := fabric.UDPacket{
		SL: ah.SL, DLID: ah.DLID, SLID: lid | uint16(ah.SrcPathBits), Global: ah.IsGlobal,
		GRH: wire.IBGRHFields{TClass: ah.GRH.TrafficClass, FlowLabel: ah.GRH.FlowLabel, HopLmt: ah.GRH.HopLimit, SGID: sgid, DGID: ah.GRH.DGID},
		UD: wire.UDHeader{
			Solicited: s.Solicited, PKey: 0xffff, DestQP: s.RemoteQPN, PSN: q.psn.Add(1) - 1,
			QKey: qkey, SrcQP: q.qpn, HasImm: s.HasImm, Imm: s.Imm,
		},
	}
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.buf == nil {
		q.buf = make([]byte, maxPacket)
	}
	n := fabric.EncodeUD(q.buf, &p, s.Payload)
	pkt := q.buf[:n]
	if isMulticastLID(ah.DLID) {
		d.handlePacket(pkt, q)
	}
	if _, err := d.conn.WriteToUDP(pkt, d.sm); err != nil {
		d.ctr.sendErrors.Add(1)
		return fmt.Errorf("ib: send: %w", err)
	}
	d.ctr.sent.Add(1)
	return nil
}

func isMulticastLID(lid uint16) bool { return lid >= verbs.MulticastLIDBase && lid != 0xffff }

// receiveLoop reads the fabric socket: control messages from the SM and IB
// packets from the switch.
func (d *Device) receiveLoop() {
	defer d.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, _, err := d.conn.ReadFromUDP(buf)
		if err != nil {
			select {
			case <-d.done:
				return
			default:
			}
			continue
		}
		b := buf[:n]
		if isControl(b) {
			d.control(b)
			continue
		}
		d.handlePacket(b, nil)
	}
}

// handlePacket checks and delivers one IB packet; self is the sending QP
// for the local copy of a multicast send (nil for packets from the switch).
func (d *Device) handlePacket(b []byte, self *qp) {
	d.ctr.rcvd.Add(1)
	var p fabric.Packet
	if err := fabric.Parse(b, &p); err != nil {
		if errors.Is(err, fabric.ErrVCRC) || errors.Is(err, fabric.ErrICRC) {
			d.ctr.crcErrors.Add(1)
		} else {
			d.ctr.malformed.Add(1)
		}
		return
	}
	info := softverbs.IBRecvInfo{SLID: p.LRH.SLID(), SL: p.LRH.SL(), GRH: p.Global()}
	var grh [verbs.GRHLen]byte
	if p.Global() {
		copy(grh[:], p.GRH)
	}
	ud := &p.UD
	destQP := ud.BTH.DestQP()
	switch {
	case destQP == gsiQPN:
		if ud.DETH.QKey() != gsiQKey {
			d.ctr.qkeyViolations.Add(1)
			return
		}
		d.sa.receive(ud.Payload)
	case destQP == wire.MulticastQPN:
		if !p.Global() || !isMulticastLID(p.LRH.DLID()) {
			d.ctr.malformed.Add(1)
			return
		}
		mgid := p.GRH.DGID()
		d.mu.Lock()
		g := d.groups[mgid]
		d.mu.Unlock()
		if g == nil {
			d.ctr.noGroup.Add(1)
			return
		}
		for _, m := range *g.member.Load() {
			if m.lid != p.LRH.DLID() || (self != nil && m.q == self && self.blockSelf) {
				continue
			}
			d.deliver(m.q, ud, &grh, &info)
		}
	default:
		q := (*d.qps.Load())[destQP]
		if q == nil {
			d.ctr.noQP.Add(1)
			return
		}
		d.deliver(q, ud, &grh, &info)
	}
}

// deliver runs the per-QP checks and hands the datagram to the QP.
func (d *Device) deliver(q *qp, p *wire.Packet, grh *[verbs.GRHLen]byte, info *softverbs.IBRecvInfo) {
	if q.dead.Load() {
		return
	}
	q.inflight.Add(1)
	defer q.inflight.Add(-1)
	if q.dead.Load() {
		return
	}
	switch {
	case !q.receives():
		d.ctr.notReady.Add(1)
	case p.BTH.PKey()&0x7fff != 0x7fff:
		d.ctr.pkeyViolations.Add(1)
	case p.DETH.QKey() != q.qkey.Load():
		d.ctr.qkeyViolations.Add(1)
	default:
		switch q.rx.DeliverIB(grh, p.Payload, p.DETH.SrcQP(), p.Imm, p.HasImm, info) {
		case softverbs.Delivered:
			d.ctr.delivered.Add(1)
		case softverbs.NoRecvWR:
			d.ctr.noRecvWR.Add(1)
		default:
			d.ctr.otherDrops.Add(1)
		}
	}
}

// waitIdle waits until no delivery to q is running.
func (q *qp) waitIdle() {
	for q.inflight.Load() > 0 {
		runtime.Gosched()
	}
}
