package ib

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// IB packet constants.
const (
	gsiQPN    = mad.GSIQPN
	gsiQKey   = mad.GSIQKey
	maxPacket = wire.LRHLen + wire.IBGRHLen + wire.BTHLen + wire.DETHLen + wire.ImmDtLen + 4096 + 3 + wire.ICRCLen + wire.VCRCLen
	// maxDatagram is the largest datagram the port reads: a packet of a
	// 4096-byte MTU or a control message; a longer one is truncated and
	// dropped.
	maxDatagram = 8192
)

// Send implements softverbs.DriverQP: one UD packet to the switch. The
// DETH carries the posted Q_Key as is (as the kernel's rxe does).
// Multicast packets are also delivered to the port's own attached QPs (HCA
// loopback), except the sender when it blocks self loopback. The packet
// waits for the link's credit (see link.go); a packet the stalled link
// drops completes all the same, as a packet lost in the fabric.
func (q *qp) Send(s *softverbs.UDSend) error {
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.bufs == nil {
		q.bufs = make([][]byte, 1, softverbs.MaxSendBatch)
		q.bufs[0] = make([]byte, maxPacket)
	}
	pkt, err := q.build(q.bufs[0], s)
	if err != nil || pkt == nil {
		return err
	}
	d := q.dev
	dlid := s.AH.DLID
	if r := d.routeFor(dlid); r != nil {
		d.xmitDirect(1, r, func(_ int, to netip.AddrPort) error {
			_, err := d.conn.WriteToUDPAddrPort(pkt, to)
			return err
		}, nil)
		q.tap(pkt)
		return nil
	}
	_, err = d.xmit(1, func(int, int) (int, error) {
		if _, err := d.conn.WriteToUDPAddrPort(pkt, d.smDst); err != nil {
			return 0, err
		}
		return 1, nil
	})
	d.switchSent(dlid)
	if err != nil {
		return fmt.Errorf("ib: send: %w", err)
	}
	q.tap(pkt)
	return nil
}

// SendBatch implements softverbs.BatchSender: the packets go to the
// switch with one sendmmsg per run the link has credit for.
func (q *qp) SendBatch(ss []softverbs.UDSend, errs []error) {
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.batch == nil {
		q.batch = &sendBatch{g: mmsg.NewGSOBatch(softverbs.MaxSendBatch)}
	}
	b := q.batch
	for len(q.bufs) < len(ss) {
		q.bufs = append(q.bufs, make([]byte, maxPacket))
	}
	k := 0
	for i := range ss {
		pkt, err := q.build(q.bufs[i], &ss[i])
		errs[i] = err
		if err != nil || pkt == nil {
			continue
		}
		b.pkts[k], b.idx[k], b.dlid[k] = pkt, i, ss[i].AH.DLID
		k++
	}
	d := q.dev
	raw, err := d.conn.SyscallConn()
	if err != nil {
		for _, i := range b.idx[:k] {
			errs[i] = fmt.Errorf("ib: send: %w", err)
		}
		k = 0
	}
	b.g.GSO = d.gso
	// Runs of one DLID, each directly or through the switch, in order.
	for from := 0; from < k; {
		dlid := b.dlid[from]
		to := from + 1
		for to < k && b.dlid[to] == dlid {
			to++
		}
		if r := d.routeFor(dlid); r != nil {
			pkts := b.pkts[from:to]
			flush := func() {
				if refused, _ := b.g.Send(raw); refused > 0 {
					d.core.Count(softverbs.DirectDiscards, uint64(refused))
				}
			}
			d.xmitDirect(len(pkts), r, func(i int, to netip.AddrPort) error {
				if b.g.Full() {
					flush()
				}
				b.g.Add(pkts[i], to, false)
				return nil
			}, flush)
			from = to
			continue
		}
		pkts := b.pkts[from:to]
		sent, err := d.xmit(len(pkts), func(from, to int) (int, error) {
			for _, pkt := range pkts[from:to] {
				b.g.Add(pkt, d.smDst, false)
			}
			refused, err := b.g.Send(raw)
			if err != nil {
				return 0, err
			}
			if refused > 0 {
				return to - from - refused, fmt.Errorf("%d datagrams refused: %w", refused, syscall.EIO)
			}
			return to - from, nil
		})
		d.switchSent(dlid)
		if err != nil {
			// The packets from the first refused one on count as failed
			// (a sendmmsg error does not say which of a GSO message's
			// failed).
			for _, i := range b.idx[from+sent : to] {
				errs[i] = fmt.Errorf("ib: send: %w", err)
			}
		}
		from = to
	}
	for _, pkt := range b.pkts[:k] {
		q.tap(pkt)
	}
	clear(b.pkts[:k])
}

// build checks one datagram and writes its packet into buf; nil (and no
// error) for a datagram larger than the MTU, which completes without
// being sent. A multicast packet is delivered to the port's own QPs at
// once. q.smu is held.
func (q *qp) build(buf []byte, s *softverbs.UDSend) ([]byte, error) {
	d := q.dev
	d.mu.Lock()
	lid, active, mtu, sgid := d.lid, d.active, verbs.MTU(d.mtu), d.portGIDLocked()
	d.mu.Unlock()
	if !active {
		return nil, fmt.Errorf("ib: send: port not active: %w", syscall.ENETDOWN)
	}
	if len(s.Payload) > mtu.Bytes() {
		return nil, nil // completes, is not sent (C10-93.1.1); the core counts it
	}
	ah := s.AH
	if ah.IsGlobal && ah.GRH.SGIDIndex != 0 {
		return nil, fmt.Errorf("ib: send: sgid index %d: %w", ah.GRH.SGIDIndex, syscall.EINVAL)
	}
	p := fabric.UDPacket{
		SL: ah.SL, DLID: ah.DLID, SLID: lid | uint16(ah.SrcPathBits), Global: ah.IsGlobal,
		GRH: wire.IBGRHFields{TClass: ah.GRH.TrafficClass, FlowLabel: ah.GRH.FlowLabel, HopLmt: ah.GRH.HopLimit, SGID: sgid, DGID: ah.GRH.DGID},
		UD: wire.UDHeader{
			Solicited: s.Solicited, PKey: 0xffff, DestQP: s.RemoteQPN, PSN: s.PSN,
			QKey: s.RemoteQKey, SrcQP: q.qpn, HasImm: s.HasImm, Imm: s.Imm,
		},
	}
	if q.dead.Load() {
		return nil, fmt.Errorf("ib: send: qp %#x destroyed: %w", q.qpn, syscall.EINVAL)
	}
	n := fabric.EncodeUD(buf, &p, s.Payload)
	pkt := buf[:n]
	if isMulticastLID(ah.DLID) {
		d.handlePacket(pkt, q, &q.lrx)
	}
	s.Wire = n
	return pkt, nil
}

// tap hands a sent packet to a capture. q.smu is held.
func (q *qp) tap(pkt []byte) {
	if c := q.dev.core; c.Tapping() {
		c.Emit(verbs.Frame{Time: time.Now(), Data: pkt, Sent: true})
	}
}

// sendBatch is the scratch of SendBatch: the packets, where they come
// from in the caller's batch, and the sendmmsg (GSO) layout.
type sendBatch struct {
	pkts [softverbs.MaxSendBatch][]byte
	idx  [softverbs.MaxSendBatch]int
	dlid [softverbs.MaxSendBatch]uint16
	g    *mmsg.GSOBatch
}

func isMulticastLID(lid uint16) bool { return lid >= verbs.MulticastLIDBase && lid != 0xffff }

// receiveScratch is what the receive path of one goroutine reuses for
// every packet.
type receiveScratch struct {
	p    fabric.Packet
	grh  [verbs.GRHLen]byte
	info softverbs.IBRecvInfo
	dg   softverbs.Datagram

	// bp defers the CQ wake-ups of a batch's deliveries to its end
	// (&burst in the receive loop; nil elsewhere: a wake-up each).
	bp    *softverbs.Burst
	burst softverbs.Burst
	// The receive loop's sources: relayed by the switch, or not (direct
	// forwarding).
	relayed, own *softverbs.Source
}

// recvBatch is the number of datagrams one recvmmsg of the receive loop
// reads.
const recvBatch = 16

// receiveLoop reads the fabric socket, recvBatch datagrams at a time:
// control messages and flow control packets from the SM, IB packets from
// the switch.
func (d *Device) receiveLoop() {
	defer d.wg.Done()
	rx := &receiveScratch{}
	rx.bp = &rx.burst
	r, err := mmsg.NewReader(d.conn, mmsg.NewBatch(recvBatch, maxDatagram, unix.SizeofSockaddrInet6, 0))
	if err != nil {
		return
	}
	// The fabric socket is the source of what the port delivers: a
	// consumer whose CQ it fills reads it itself (softverbs.Source). What
	// the switch relays waits for softsm's process; with direct
	// forwarding nothing relays the port's data.
	rx.relayed, rx.own = softverbs.NewRelayedSource(r), softverbs.NewSource(r)
	rx.burst.Src = rx.relayed
	handle := func(n int) { d.handleBatch(r, n, rx) }
	for {
		// Serve reads batches as rxe's receivers do: no recvmmsg that
		// would find the socket empty.
		err := r.Serve(handle)
		select {
		case <-d.done:
			return
		default:
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

// handleBatch handles the n datagrams of one batch of the receive loop.
func (d *Device) handleBatch(r *mmsg.Reader, n int, rx *receiveScratch) {
	if d.directOn.Load() {
		rx.burst.Src = rx.own
	} else {
		rx.burst.Src = rx.relayed
	}
	for i := range n {
		b, name, _, trunc := r.Datagram(i)
		if from := mmsg.AddrPort(name); !d.fromSM(from) {
			switch pl := d.peerAt(from); {
			case pl != nil:
				d.peerDatagram(b, pl, trunc, rx)
			case d.markerIn(b, from):
			default:
				d.core.Count(softverbs.UntrustedDrops, 1)
			}
			continue
		}
		isControl := fabric.IsControl(b) || fabric.IsDirect(b)
		if !isControl && !d.smTrusted.Load() {
			// The SM at the address is not authenticated (smauth.go).
			d.core.Count(softverbs.UntrustedDrops, 1)
			continue
		}
		switch {
		case isControl:
			if trunc {
				d.core.Count(softverbs.ControlDrops, 1)
				continue
			}
			if fabric.IsDirect(b) {
				d.directIn(b)
			} else {
				d.control(b)
			}
		case fabric.IsFlow(b):
			d.flowIn(b)
		default:
			d.dataIn(b, trunc, rx)
			d.took()
		}
	}
	rx.burst.Flush()
	if n == recvBatch {
		// More are waiting: let the consumers just woken run (and
		// repost receive WRs) before the next batch, as rxe does.
		runtime.Gosched()
	}
}

// dataIn takes an IB packet the socket read (truncated: longer than the
// port reads, counted and dropped).
func (d *Device) dataIn(b []byte, trunc bool, rx *receiveScratch) {
	if trunc {
		d.core.Count(softverbs.RcvdPkts, 1)
		d.core.Count(softverbs.OversizedRecvDrops, 1)
		return
	}
	d.handlePacket(b, nil, rx)
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
	parse := fabric.Parse
	if self != nil {
		parse = fabric.ParseBuilt // our own packet: its CRCs are right
	}
	if err := parse(b, p); err != nil {
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
		if !d.deliverMAD(p.LRH.SLID(), ud.DETH.SrcQP(), ud.Payload) {
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
		Imm: ud.Imm, HasImm: ud.HasImm, Solicited: ud.BTH.Solicited(), Payload: ud.Payload, Self: self != nil, IB: &rx.info,
	}
	switch {
	case destQP != wire.MulticastQPN:
		c.DeliverUnicast(destQP, dg, rx.bp)
	case !p.Global() || !isMulticastLID(p.LRH.DLID()):
		c.Count(softverbs.MalformedDrops, 1)
	default:
		c.DeliverGroup(c.Group(p.GRH.DGID()), p.LRH.DLID(), dg, rx.bp)
	}
	dg.Payload = nil // keep no reference to the packet buffer
}

// LinkType is the pcap link type of the port's frames: IB packets from
// the LRH on (softverbs.LinkTyper).
func (d *Device) LinkType() uint32 { return verbs.LinkTypeInfiniBand }
