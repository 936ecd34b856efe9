package rxe

import (
	"errors"
	"runtime"
	"syscall"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// receiver is the receive goroutine of one socket. It owns its buffers and
// scratch headers; the hot path takes no lock and allocates nothing.
type receiver struct {
	d   *Device
	s   *recvSock  // a UDP 4791 socket; nil for a hand-over reader
	blk *sendBlock // the send block whose hand-overs this reads
	v6  bool       // s is an IPv6 socket
	br  *mmsg.Reader
	in  *uinput // a unicast input: its activity (nil for a membership socket)

	asked   peerKey // the peer whose socket this receiver asked for last (peers.go)
	askedAt int64   // clock() when it asked

	meta rxMeta
	pkt  wire.Packet
	ip   [wire.IPv6HeaderLen]byte
	grh  [verbs.GRHLen]byte
	dg   softverbs.Datagram

	// The flow of the last datagram checked (flowOK: there was one): its
	// IP header in ip (IPv4: ID 0 and DF) and ICRC prefix, computed
	// again only when a datagram's addresses, ports, length, TOS, TTL or
	// flow label differ.
	flow   flowKey
	flowOK bool
	prefix wire.ICRCPrefix

	// burst defers the CQ wake-ups of a batch's deliveries to its end
	// and keeps the locks of a run of deliveries to one QP.
	burst   softverbs.Burst
	bp      *softverbs.Burst // &burst for batched reads, nil otherwise
	batches uint32           // batches handled, for the refresh of burst.HoldLocks

	fwd forwarder
}

// newReceiver returns the receiver of UDP 4791 socket s. The socket is the
// source of what it delivers: a consumer whose CQ it fills may read it
// itself (softverbs.Source).
func newReceiver(d *Device, s *recvSock, br *mmsg.Reader) *receiver {
	r := &receiver{d: d, s: s, v6: s.v6, br: br}
	r.init()
	if br != nil {
		r.burst.Src = newSource(d, br)
		br.OnAsyncError(func(errno syscall.Errno) { d.socketError(s, errno) })
	}
	return r
}

// newBlockReceiver returns the receiver of the datagrams handed over to
// blk on one connection, read by br (nil: the caller reads and calls
// handleForwarded). A consumer whose CQ it fills may read the connection
// itself, as a socket (progress.go).
func newBlockReceiver(d *Device, blk *sendBlock, br *mmsg.Reader) *receiver {
	r := &receiver{d: d, blk: blk, br: br}
	r.init()
	if br != nil {
		r.burst.Src = newSource(d, br)
	}
	return r
}

func (r *receiver) init() {
	r.dg.GRH = &r.grh
	if r.br != nil {
		r.batched()
	}
	r.fwd.init()
}

// batched makes r deliver with its Burst, as the receiver of a batched
// reader: wake-ups and counters once a batch, and with one P the locks of
// a run of deliveries to one QP held (between deliveries a receiver only
// parses and checks; it releases the locks before a tap and a forward).
func (r *receiver) batched() { r.bp = &r.burst }

// run reads batches until the socket is closed (net.ErrClosed), the
// connection of a hand-over reader ends (ECONNRESET), or the socket fails
// for good (the error).
func (r *receiver) run() error { return r.br.Serve(r.handleBatch) }

// handleBatch handles the n datagrams of one batch read by run.
func (r *receiver) handleBatch(n int) {
	// With one P no consumer runs while this goroutine delivers: holding
	// a QP's locks across the batch then costs nobody anything. With more,
	// a consumer polling on another core would wait for the batch's end
	// and repost late. GOMAXPROCS takes the scheduler's lock, and a
	// consumer reading its socket itself handles a batch of one datagram
	// per message: asked every 256 batches (it changes when the program
	// or the runtime, following the cgroup's CPU limit, changes it).
	if r.batches&255 == 0 {
		r.burst.HoldLocks = runtime.GOMAXPROCS(0) == 1
	}
	r.batches++
	// Counted received before any is handled, so that no outcome counter
	// (delivered, a drop) is ever ahead of rcvd_pkts.
	var bytes uint64
	for i := 0; i < n; i++ {
		b, _, _, _ := r.br.Datagram(i)
		bytes += uint64(len(b))
	}
	r.countReceived(n, bytes)
	if r.in != nil {
		r.in.last.Store(clock())
	}
	for i := 0; i < n; i++ {
		b, name, oob, trunc := r.br.Datagram(i)
		if r.blk != nil {
			r.handleForwarded(b, trunc)
		} else {
			r.handle(b, name, oob, trunc)
		}
	}
	r.burst.Flush()
	if n == RecvBatch && r.br.InServe() {
		// A full batch: more are waiting, and Serve reads on without
		// blocking. Let the consumers just woken run first, so that they
		// repost receive WRs while the backlog lasts; otherwise, on a
		// single P, the backlog would use up the posted WRs
		// (no_recv_wr_drops) before they run. A consumer reading in its
		// own poll does not yield (to itself, or, from a C thread's cgo
		// callback, its Go runtime to another thread).
		runtime.Gosched()
	}
}

// countReceived counts n datagrams of the given total size received: once
// a batch, not twice a datagram (atomic adds).
func (r *receiver) countReceived(n int, bytes uint64) {
	r.d.core.Count(softverbs.RcvdPkts, uint64(n))
	r.d.core.Count(softverbs.RcvdBytes, bytes)
}

// handle runs rxe's receive checks on one datagram read from a UDP 4791
// socket (handleBatch counts it received), in the order of the kernel's
// rxe_udp_encap_recv and rxe_rcv, and delivers it, or forwards it to the
// device of the host that owns its QPN. Every drop is counted; nothing here may
// panic on bad input.
func (r *receiver) handle(b, name, oob []byte, trunc bool) {
	d := r.d
	if d.core.Tapping() {
		r.burst.Release() // a tap runs code of its own: no lock held
		captureReceived(d, r.v6, b, name, oob)
	}
	if trunc {
		d.core.Count(softverbs.OversizedRecvDrops, 1)
		return
	}
	if !r.parse(b) {
		return
	}
	parseRxMeta(&r.meta, name, oob, r.v6)
	r.checkDeliver(b, r.v6, false)
}

// parse parses b into r.pkt, counting the drop of a datagram that does not
// parse.
func (r *receiver) parse(b []byte) bool {
	err := wire.ParseUD(b, &r.pkt)
	if err == nil {
		return true
	}
	d := r.d
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
	return false
}

// checkDeliver checks the ICRC of the parsed datagram b (r.pkt) against
// the IP and UDP headers r.meta describes and delivers it: to the group of
// its destination address, to its QP, or — a unicast datagram for a QPN of
// another device, read from UDP 4791 — to that device (forward). A
// forwarded datagram (fwd) only goes to a QP of the send socket it came
// on.
func (r *receiver) checkDeliver(b []byte, v6, fwd bool) {
	d := r.d
	p := &r.pkt
	m := &r.meta
	if !m.dst.IsValid() || !m.src.IsValid() {
		d.core.Count(softverbs.TruncatedDrops, 1) // no destination (IP_ORIGDSTADDR, IPV6_PKTINFO) or source: cannot check the ICRC
		return
	}
	if !r.flowOK || r.flow.differs(m, len(b), v6) {
		r.newFlow(m, len(b), v6)
	}
	if !v6 {
		id, df, ok := r.prefix.SolveIPv4ID(p.Body, p.ICRC)
		if !ok {
			d.core.Count(softverbs.ICRCErrors, 1)
			return
		}
		wire.PutGRHv4(r.grh[:], wire.IPv4(r.ip[:wire.IPv4HeaderLen]))
		if id != 0 || !df {
			// r.ip has ID 0 and DF, what softrdma and rxe send: the GRH's
			// copy gets the solved ones and its checksum again.
			ip := wire.IPv4(r.grh[wire.GRHIPv4Offset:wire.GRHAreaLen])
			ip.SetID(id)
			ip.SetDF(df)
			ip.SetChecksum(ip.CalculateChecksum())
		}
	} else {
		if r.prefix.ICRC(p.Body) != p.ICRC {
			d.core.Count(softverbs.ICRCErrors, 1)
			return
		}
		wire.PutGRHv6(r.grh[:], wire.IPv6(r.ip[:]))
	}

	destQP := p.BTH.DestQP()
	if destQP == gsiQPN && !m.dst.IsMulticast() {
		r.deliverGSI(b, v6, fwd)
		return
	}
	if destQP != wire.MulticastQPN {
		port := uint16(destQP >> 8)
		switch {
		case fwd:
			if port != r.blk.port4 {
				d.core.Count(softverbs.NoQPDrops, 1)
				return
			}
			r.askPeer(v6)
		case port != 0 && !m.dst.IsMulticast() && !d.ownsPort4(port):
			// Every member of a group reads a multicast datagram: only the
			// one socket the kernel chose forwards a unicast one.
			r.forward(b, port, v6)
			return
		}
	} else if fwd {
		d.core.Count(softverbs.MalformedDrops, 1) // a forwarder never sends one
		return
	}
	dg := &r.dg
	dg.PKey, dg.QKey, dg.SrcQP = p.BTH.PKey(), p.DETH.QKey(), p.DETH.SrcQP()
	dg.Imm, dg.HasImm, dg.Payload = p.Imm, p.HasImm, p.Payload
	dg.Solicited, dg.Self = p.BTH.Solicited(), false
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

// flowKey is what the IP and UDP headers of a received datagram are made
// of: its receive metadata, its length and its IP version.
type flowKey struct {
	m  rxMeta
	n  int
	v6 bool
}

// differs reports whether a datagram of n bytes described by m is of
// another flow than k.
func (k *flowKey) differs(m *rxMeta, n int, v6 bool) bool {
	return k.n != n || k.v6 != v6 || k.m != *m
}

// newFlow encodes the IP header of a datagram of n bytes described by m
// into r.ip (IPv4 with ID 0 and DF) and computes the ICRC prefix of that
// header and the UDP header.
func (r *receiver) newFlow(m *rxMeta, n int, v6 bool) {
	var udp [wire.UDPHeaderLen]byte
	_, r.prefix = encodeHeaders(&r.ip, &udp, flowHeaders{
		src: m.src, dst: m.dst, srcPort: m.srcPort, tos: m.tos, ttl: m.ttl, flow: m.flow, n: n, v6: v6,
	})
	r.flow = flowKey{m: *m, n: n, v6: v6}
	r.flowOK = true
}

// ownsPort4 reports whether port is the IPv4 send socket port of one of
// the device's send blocks, that is whether its QPNs are the device's
// (lock-free).
func (d *Device) ownsPort4(port uint16) bool {
	for _, p := range *d.ownPorts4.Load() {
		if p == port {
			return true
		}
	}
	return false
}

// fromUs reports whether the current datagram was sent by this device:
// its source address is the interface's and its source port one of the
// device's send sockets of that family (an IPv4 and an IPv6 socket of two
// devices may have the same port).
func (r *receiver) fromUs() bool {
	d := r.d
	ports := d.ownPorts4.Load()
	if r.v6 {
		ports = d.ownPorts6.Load()
	}
	own := false
	for _, p := range *ports {
		if p == r.meta.srcPort {
			own = true
			break
		}
	}
	return own && d.info.Load().hasAddr(r.meta.src)
}
