package ib

import (
	"errors"
	"fmt"
	"syscall"
	"time"

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

// Send implements softverbs.DriverQP: one UD packet to the switch. The
// DETH carries the posted Q_Key as is (as the kernel's rxe does).
// Multicast packets are also delivered to the port's own attached QPs (HCA
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
		return nil // completes, is not sent (C10-93.1.1); the core counts it
	}
	ah := s.AH
	if ah.IsGlobal && ah.GRH.SGIDIndex != 0 {
		return fmt.Errorf("ib: send: sgid index %d: %w", ah.GRH.SGIDIndex, syscall.EINVAL)
	}
	p := fabric.UDPacket{
		SL: ah.SL, DLID: ah.DLID, SLID: lid | uint16(ah.SrcPathBits), Global: ah.IsGlobal,
		GRH: wire.IBGRHFields{TClass: ah.GRH.TrafficClass, FlowLabel: ah.GRH.FlowLabel, HopLmt: ah.GRH.HopLimit, SGID: sgid, DGID: ah.GRH.DGID},
		UD: wire.UDHeader{
			Solicited: s.Solicited, PKey: 0xffff, DestQP: s.RemoteQPN, PSN: s.PSN,
			QKey: s.RemoteQKey, SrcQP: q.qpn, HasImm: s.HasImm, Imm: s.Imm,
		},
	}
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.dead.Load() {
		return fmt.Errorf("ib: send: qp %#x destroyed: %w", q.qpn, syscall.EINVAL)
	}
	if q.buf == nil {
		q.buf = make([]byte, maxPacket)
	}
	n := fabric.EncodeUD(q.buf, &p, s.Payload)
	pkt := q.buf[:n]
	if isMulticastLID(ah.DLID) {
		d.handlePacket(pkt, q, &q.lrx)
	}
	sent, err := d.xmit(1, func(int, int) (int, error) {
		if _, err := d.conn.WriteToUDP(pkt, d.sm); err != nil {
			return 0, err
		}
		return 1, nil
	})
	if err != nil {
		return fmt.Errorf("ib: send: %w", err)
	}
	if sent == 0 {
		// Dropped: the link stayed without credit (counted). A UD send
		// completes all the same, as a packet lost in the fabric.
		s.Wire = n
		return nil
	}
	if d.core.Tapping() {
		d.core.Emit(verbs.Frame{Time: time.Now(), Data: pkt, Sent: true})
	}
	s.Wire = n
	return nil
}

func isMulticastLID(lid uint16) bool { return lid >= verbs.MulticastLIDBase && lid != 0xffff }

// receiveScratch is what the receive path of one goroutine reuses for
// every packet.
type receiveScratch struct {
	p    fabric.Packet
	grh  [verbs.GRHLen]byte
	info softverbs.IBRecvInfo
	dg   softverbs.Datagram
}

// receiveLoop reads the fabric socket: control messages from the SM and IB
// packets from the switch.
func (d *Device) receiveLoop() {
	defer d.wg.Done()
	buf := make([]byte, 65536)
	var rx receiveScratch
	for {
		n, from, err := d.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			select {
			case <-d.done:
				return
			default:
			}
			continue
		}
		if !d.fromSM(from) {
			d.core.Count(softverbs.UntrustedDrops, 1)
			continue
		}
		b := buf[:n]
		switch {
		case fabric.IsControl(b):
			d.control(b)
		case fabric.IsFlow(b):
			d.flowIn(b)
		default:
			d.handlePacket(b, nil, &rx)
			d.took()
		}
	}
}

// handlePacket checks one IB packet and hands it to the SA client or the
// verbs core; self is the sending QP for the local copy of a multicast
// send (nil for packets from the switch).
func (d *Device) handlePacket(b []byte, self *qp, rx *receiveScratch) {
	c := d.core
	c.Count(softverbs.RcvdPkts, 1)
	c.Count(softverbs.RcvdBytes, uint64(len(b)))
	if self == nil && c.Tapping() {
		c.Emit(verbs.Frame{Time: time.Now(), Data: b})
	}
	p := &rx.p
	if err := fabric.Parse(b, p); err != nil {
		switch {
		case errors.Is(err, fabric.ErrVCRC):
			c.Count(softverbs.VCRCErrors, 1)
		case errors.Is(err, fabric.ErrICRC):
			c.Count(softverbs.ICRCErrors, 1)
		default:
			c.Count(softverbs.MalformedDrops, 1)
		}
		return
	}
	ud := &p.UD
	destQP := ud.BTH.DestQP()
	if destQP == gsiQPN {
		if ud.DETH.QKey() != gsiQKey {
			c.Count(softverbs.QKeyViolations, 1)
			return
		}
		c.Count(softverbs.SAMADs, 1)
		if !d.mc.Receive(p.LRH.SLID(), ud.DETH.SrcQP(), ud.Payload) {
			c.Count(softverbs.SAStrayDrops, 1)
		}
		return
	}
	rx.info = softverbs.IBRecvInfo{SLID: p.LRH.SLID(), SL: p.LRH.SL(), GRH: p.Global()}
	if p.Global() {
		copy(rx.grh[:], p.GRH)
	}
	dg := &rx.dg
	*dg = softverbs.Datagram{
		GRH: &rx.grh, PKey: ud.BTH.PKey(), QKey: ud.DETH.QKey(), SrcQP: ud.DETH.SrcQP(),
		Imm: ud.Imm, HasImm: ud.HasImm, Payload: ud.Payload, Self: self != nil, IB: &rx.info,
	}
	switch {
	case destQP != wire.MulticastQPN:
		c.DeliverUnicast(destQP, dg, nil)
	case !p.Global() || !isMulticastLID(p.LRH.DLID()):
		c.Count(softverbs.MalformedDrops, 1)
	default:
		c.DeliverGroup(c.Group(p.GRH.DGID()), p.LRH.DLID(), dg, nil)
	}
	dg.Payload = nil // keep no reference to the packet buffer
}

// LinkType is the pcap link type of the port's frames: IB packets from
// the LRH on (softverbs.LinkTyper).
func (d *Device) LinkType() uint32 { return verbs.LinkTypeInfiniBand }
