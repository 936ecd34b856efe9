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
	dg   softverbs.Datagram

	// burst defers the CQ wake-ups of a batch's deliveries to its end.
	burst softverbs.Burst
	bp    *softverbs.Burst // &burst for batched reads, nil otherwise
}

func newReceiver(d *Device, s *recvSock, br *mmsg.Reader) *receiver {
	r := &receiver{d: d, s: s, br: br}
	r.dg.GRH = &r.grh
	if br != nil {
		r.bp = &r.burst
	}
	return r
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
	d.core.Count(softverbs.RcvdPkts, 1)
	d.core.Count(softverbs.RcvdBytes, uint64(len(b)))
	if trunc {
		d.core.Count(softverbs.OversizedRecvDrops, 1)
		return
	}
	p := &r.pkt
	if err := wire.ParseUD(b, p); err != nil {
		switch {
		case errors.Is(err, wire.ErrTVer):
			d.core.Count(softverbs.TVerDrops, 1)
		case errors.Is(err, wire.ErrOpcode):
			d.core.Count(softverbs.OpcodeDrops, 1)
		case errors.Is(err, wire.ErrDestQP0):
			d.core.Count(softverbs.DestQP0Drops, 1)
		default:
			d.core.Count(softverbs.TruncatedDrops, 1)
		}
		return
	}
	m := &r.meta
	parseRxMeta(m, name, oob, r.s.v6)
	if !m.dst.IsValid() || !m.src.IsValid() {
		d.core.Count(softverbs.TruncatedDrops, 1) // no IP_PKTINFO / address: cannot check the ICRC
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
			d.core.Count(softverbs.ICRCErrors, 1)
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
			d.core.Count(softverbs.ICRCErrors, 1)
			return
		}
		wire.PutGRHv6(r.grh[:], ip)
	}

	dg := &r.dg
	dg.PKey, dg.QKey, dg.SrcQP = p.BTH.PKey(), p.DETH.QKey(), p.DETH.SrcQP()
	dg.Imm, dg.HasImm, dg.Payload = p.Imm, p.HasImm, p.Payload
	dg.Solicited, dg.Self = p.BTH.Solicited(), false
	destQP := p.BTH.DestQP()
	if destQP != wire.MulticastQPN {
		d.core.DeliverUnicast(destQP, dg, r.bp)
		dg.Payload = nil
		return
	}
	var g *softverbs.Group
	if ms := r.s.lookup(m.dst); ms != nil {
		g = ms.grp.Load()
	}
	dg.Self = g != nil && r.fromUs()
	d.core.DeliverGroup(g, 0, dg, r.bp)
	dg.Payload = nil // keep no reference to the socket buffer
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
