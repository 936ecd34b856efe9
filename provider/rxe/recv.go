package rxe

import (
	"errors"

	"github.com/softrdma/softrdma/internal/mmsg"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// receiver is the receive goroutine of one socket. It owns its buffers and
// scratch headers; the hot path takes no lock and allocates nothing.
type receiver struct {
	d  *Device
	s  *recvSock
	br *mmsg.Reader

	meta rxMeta
	pkt  wire.Packet
	ip   [wire.IPv6HeaderLen]byte
	udp  [wire.UDPHeaderLen]byte
	grh  [verbs.GRHLen]byte

	// burst defers the CQ wake-ups of a batch's deliveries to its end.
	burst softverbs.Burst
}

func newReceiver(d *Device, s *recvSock, br *mmsg.Reader) *receiver {
	return &receiver{d: d, s: s, br: br}
}

// run reads batches until the socket is closed.
func (r *receiver) run() {
	for {
		n, err := r.br.Read()
		if err != nil {
			return
		}
		for i := 0; i < n; i++ {
			b, name, oob, trunc := r.br.Datagram(i)
			r.handle(b, name, oob, trunc)
		}
		r.burst.Flush()
	}
}

// handle runs rxe's receive checks on one datagram (kernel.md §10.4) and
// delivers it. Every drop is counted; nothing here may panic on bad input.
func (r *receiver) handle(b, name, oob []byte, trunc bool) {
	d := r.d
	captureReceived(d, r.s.v6, b, name, oob)
	d.ctr.add(cRcvdPkts, 1)
	d.ctr.add(cRcvdBytes, uint64(len(b)))
	if trunc {
		d.count(nil, cOversizedRecv)
		return
	}
	p := &r.pkt
	if err := wire.ParseUD(b, p); err != nil {
		switch {
		case errors.Is(err, wire.ErrTVer):
			d.count(nil, cTVer)
		case errors.Is(err, wire.ErrOpcode):
			d.count(nil, cOpcode)
		case errors.Is(err, wire.ErrDestQP0):
			d.count(nil, cDestQP0)
		default:
			d.count(nil, cTruncated)
		}
		return
	}
	m := &r.meta
	parseRxMeta(m, name, oob, r.s.v6)
	if !m.dst.IsValid() || !m.src.IsValid() {
		d.count(nil, cTruncated) // no IP_PKTINFO / address: cannot check the ICRC
		return
	}
	udp := wire.UDP(r.udp[:])
	udp.Encode(m.srcPort, wire.UDPPort, uint16(wire.UDPHeaderLen+len(b)))
	if !r.s.v6 {
		ip := wire.IPv4(r.ip[:wire.IPv4HeaderLen])
		ip.Encode(wire.IPv4Fields{
			TOS:         m.tos,
			TotalLength: uint16(wire.IPv4HeaderLen + wire.UDPHeaderLen + len(b)),
			TTL:         m.ttl,
			Protocol:    wire.IPProtocolUDP,
			Src:         m.src,
			Dst:         m.dst,
		})
		id, df, ok := wire.SolveIPv4ID(ip, udp, p.Body, p.ICRC)
		if !ok {
			d.count(nil, cICRC)
			return
		}
		ip.SetID(id)
		ip.SetDF(df)
		ip.SetChecksum(ip.CalculateChecksum())
		wire.PutGRHv4(r.grh[:], ip)
	} else {
		ip := wire.IPv6(r.ip[:])
		ip.Encode(wire.IPv6Fields{
			TrafficClass:  m.tos,
			FlowLabel:     m.flow,
			PayloadLength: uint16(wire.UDPHeaderLen + len(b)),
			NextHeader:    wire.IPProtocolUDP,
			HopLimit:      m.ttl,
			Src:           m.src,
			Dst:           m.dst,
		})
		if wire.ICRCv6(ip, udp, p.Body) != p.ICRC {
			d.count(nil, cICRC)
			return
		}
		wire.PutGRHv6(r.grh[:], ip)
	}

	destQP := p.BTH.DestQP()
	if destQP != wire.MulticastQPN {
		q := (*d.qpTable.Load())[destQP]
		if q == nil {
			d.count(nil, cNoQP)
			return
		}
		r.deliver(q, false)
		return
	}
	ms := r.s.lookup(m.dst)
	var g *group
	if ms != nil {
		g = ms.grp.Load()
	}
	if g == nil {
		d.count(nil, cNoGroup)
		return
	}
	qps := *g.qps.Load()
	if len(qps) == 0 {
		d.count(nil, cNoGroup)
		return
	}
	fromUs := r.fromUs()
	for _, q := range qps {
		r.deliver(q, fromUs)
	}
}

// fromUs reports whether the current datagram was sent by this device:
// its source address is the interface's and its source port one of the
// device's send sockets.
func (r *receiver) fromUs() bool {
	d := r.d
	own := false
	for _, p := range *d.ownPorts.Load() {
		if p == r.meta.srcPort {
			own = true
			break
		}
	}
	return own && d.info.Load().hasAddr(r.meta.src)
}

// deliver runs the per-QP checks (state, P_Key, Q_Key, self-loopback
// blocking for multicast) and hands the datagram to q's receive queue.
func (r *receiver) deliver(q *qp, fromUs bool) {
	d := r.d
	if !q.enter() {
		return
	}
	defer q.exit()
	p := &r.pkt
	if !q.receives() {
		d.count(q, cNotReady)
		return
	}
	if p.BTH.PKey()&0x7FFF != 0x7FFF {
		d.count(q, cPKey)
		return
	}
	if p.DETH.QKey() != q.qkey.Load() {
		d.count(q, cQKey)
		return
	}
	srcQP := p.DETH.SrcQP()
	if fromUs && q.blockSelf && srcQP == q.qpn {
		d.count(q, cSelfLB)
		return
	}
	var res softverbs.DeliverResult
	if q.brx != nil && r.br != nil {
		res = q.brx.DeliverBurst(&r.burst, &r.grh, p.Payload, srcQP, p.Imm, p.HasImm)
	} else {
		res = q.rx.Deliver(&r.grh, p.Payload, srcQP, p.Imm, p.HasImm)
	}
	switch res {
	case softverbs.Delivered:
		d.count(q, cDelivered)
	case softverbs.NoRecvWR:
		d.count(q, cNoRecvWR)
	case softverbs.TooLong:
		d.count(q, cTooLong)
	case softverbs.CQFull:
		d.count(q, cCQFull)
	default:
		d.count(q, cNotReady)
	}
}
