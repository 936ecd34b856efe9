package ib_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// startSMWith starts an SM of cfg on a free loopback port.
func startSMWith(t *testing.T, cfg sm.Config) *sm.SM {
	t.Helper()
	s, _ := stoppableSM(t, cfg)
	return s
}

// sendSeq posts one datagram carrying seq to ah / qpn.
func (p *port) sendSeq(t *testing.T, ah *verbs.AH, qpn uint32, seq uint32) {
	t.Helper()
	binary.BigEndian.PutUint32(p.mr.Buf()[8*(40+64)-64:], seq)
	wr := verbs.SendWR{Opcode: verbs.WRSend, SGList: []verbs.SGE{p.mr.SGE(8*(40+64)-64, 16)},
		UD: verbs.UDWR{AH: ah, RemoteQPN: qpn, RemoteQKey: 0x01234567}}
	if err := p.qp.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	var wc [8]verbs.WC
	p.cq.Poll(wc[:]) // the send completions
}

// recvSeq waits for the next datagram and returns the seq it carries (the
// receive WR is posted again).
func (p *port) recvSeq(t *testing.T, grh bool) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		var wc [1]verbs.WC
		if n, _ := p.cq.Poll(wc[:]); n == 1 {
			if wc[0].Status != verbs.WCSuccess || wc[0].Opcode != verbs.WCOpRecv {
				continue // a send completion
			}
			i := int(wc[0].WRID)
			off := i*(40+64) + 40
			v := binary.BigEndian.Uint32(p.mr.Buf()[off:])
			if err := p.qp.PostRecv(&verbs.RecvWR{WRID: wc[0].WRID, SGList: []verbs.SGE{p.mr.SGE(i*(40+64), 40+64)}}); err != nil {
				t.Fatal(err)
			}
			return v
		}
		if err := p.cq.Wait(ctx); err != nil {
			t.Fatalf("port LID %d: no datagram: %v", p.dev.LID(), err)
		}
	}
}

// TestDirectForwarding: with direct forwarding (softsm's default) a
// sender's first packets to a DLID go through the switch, then it sends
// to the destination ports itself (its DirectSends grows by one per
// destination and packet, the switch forwards nothing more of it), in
// order and nothing lost; a member's leave reaches the route, and a
// unicast DLID goes directly too.
func TestDirectForwarding(t *testing.T) {
	s := startSMWith(t, sm.Config{SendOnlySupport: true})
	a, b, sender := openPort(t, s, "127.0.3.1"), openPort(t, s, "127.0.3.2"), openPort(t, s, "127.0.3.3")
	mgid, _ := verbs.ParseGID("ff12:4001:ffff::d1")
	_, rec := a.join(t, mgid, mad.JoinFullMember)
	bm, _ := b.join(t, mgid, mad.JoinFullMember)
	sender.join(t, mgid, mad.JoinSendOnlyFullMember)
	for _, p := range []*port{a, b} {
		if err := p.qp.AttachMcast(mgid, rec.MLID); err != nil {
			t.Fatal(err)
		}
	}
	ah, err := sender.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: 1, DLID: rec.MLID, GRH: verbs.GlobalRoute{DGID: mgid, HopLimit: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Destroy()
	direct := func() uint64 { return sender.dev.Counters().Get(softverbs.DirectSends) }
	fwd := func() uint64 {
		for _, ps := range s.Stats().Ports {
			if ps.GUID == sender.dev.GUID() {
				return ps.Forwarded
			}
		}
		return 0
	}
	// Ping-pong pace: each datagram received by both before the next.
	seq := uint32(0)
	step := func(to ...*port) {
		seq++
		sender.sendSeq(t, ah, verbs.MulticastQPN, seq)
		for _, p := range to {
			if got := p.recvSeq(t, true); got != seq {
				t.Fatalf("port LID %d received %d, want %d (order or loss)", p.dev.LID(), got, seq)
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for direct() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no direct send after %d datagrams (switch forwarded %d)", seq, fwd())
		}
		step(a, b)
	}
	viaSwitch, d0 := fwd(), direct()
	t.Logf("direct after %d datagrams (the switch forwarded %d copies)", seq, viaSwitch)
	for range 20 {
		step(a, b)
	}
	if got := direct() - d0; got != 40 {
		t.Errorf("DirectSends grew by %d for 20 datagrams to 2 ports, want 40", got)
	}
	if f := fwd(); f != viaSwitch {
		t.Errorf("the switch forwarded %d more copies of the sender's", f-viaSwitch)
	}
	// b leaves: the route loses it.
	if err := saAgent(t, b.dev).Leave(bm); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for {
		before := direct()
		step(a)
		if direct()-before == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the route still has the port that left")
		}
	}
	// Unicast: the sender to a's QP.
	uah, err := sender.pd.CreateAH(&verbs.AHAttr{PortNum: 1, DLID: a.dev.LID()})
	if err != nil {
		t.Fatal(err)
	}
	defer uah.Destroy()
	deadline = time.Now().Add(5 * time.Second)
	for {
		before := direct()
		seq++
		sender.sendSeq(t, uah, a.qp.Num(), seq)
		if got := a.recvSeq(t, false); got != seq {
			t.Fatalf("unicast: received %d, want %d", got, seq)
		}
		if direct()-before == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("unicast: no direct send")
		}
	}
}

// TestDirectPeerGone: once a peer's port detached, its address is
// nobody's peer any more: a socket that binds it then (another process)
// gets nothing delivered, its packets count as untrusted.
func TestDirectPeerGone(t *testing.T) {
	s := startSMWith(t, sm.Config{})
	a := openPort(t, s, "127.0.3.11")
	bd, err := ib.Open(ib.Config{SM: s.FabricAddr().String(), Local: netip.MustParseAddr("127.0.3.12")})
	if err != nil {
		t.Fatal(err)
	}
	var aAddr, bAddr netip.AddrPort
	for _, ps := range s.Stats().Ports {
		switch ps.GUID {
		case a.dev.GUID():
			aAddr = ps.Addr
		case bd.GUID():
			bAddr = ps.Addr
		}
	}
	// b sends to a until it does so directly: the two are peers.
	ctx, _ := bd.Verbs().Open()
	pd, _ := ctx.AllocPD()
	cq, _ := ctx.CreateCQ(64)
	qp := udQP(t, pd, cq, 8)
	mr, _ := pd.RegMR(make([]byte, 64), verbs.AccessLocalWrite)
	ah, err := pd.CreateAH(&verbs.AHAttr{PortNum: 1, DLID: a.dev.LID()})
	if err != nil {
		t.Fatal(err)
	}
	wr := verbs.SendWR{Opcode: verbs.WRSend, SGList: []verbs.SGE{mr.SGE(0, 16)}, UD: verbs.UDWR{AH: ah, RemoteQPN: a.qp.Num(), RemoteQKey: 0x01234567}}
	deadline := time.Now().Add(5 * time.Second)
	for bd.Counters().Get(softverbs.DirectSends) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("b never sent directly")
		}
		if err := qp.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		a.recvSeq(t, false)
		var wc [8]verbs.WC
		cq.Poll(wc[:])
	}
	blid := bd.LID()
	ah.Destroy()
	qp.Destroy()
	mr.Dereg()
	cq.Destroy()
	pd.Dealloc()
	ctx.Close()
	bd.Close()
	// Another socket on b's address sends a's QP b's packet.
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(bAddr))
	if err != nil {
		t.Fatalf("bind b's address: %v", err)
	}
	defer c.Close()
	buf := make([]byte, 256)
	n := fabric.EncodeUD(buf, &fabric.UDPacket{DLID: a.dev.LID(), SLID: blid,
		UD: wire.UDHeader{PKey: 0xffff, DestQP: a.qp.Num(), QKey: 0x01234567, SrcQP: 2}}, make([]byte, 16))
	untrusted := func() uint64 { return a.dev.Counters().Get(softverbs.UntrustedDrops) }
	before := untrusted()
	deadline = time.Now().Add(5 * time.Second)
	for untrusted() == before {
		if time.Now().After(deadline) {
			t.Fatal("the packet from the gone peer's address was never refused")
		}
		if _, err := c.WriteToUDPAddrPort(buf[:n], aAddr); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // pace: the SM's peer_gone is on its way
	}
}

// TestDirectStreamInOrder: a sender that streams to a group as fast as
// its receiver takes it goes from the switch to direct forwarding while
// it streams, and the receiver gets every datagram once, in order: what
// went through the switch before the route came is not overtaken by what
// then went directly.
func TestDirectStreamInOrder(t *testing.T) {
	s := startSMWith(t, sm.Config{SendOnlySupport: true})
	const n, window, slots = 20000, 256, 512
	rx, sender := openPort(t, s, "127.0.3.21"), openPort(t, s, "127.0.3.22")
	// The receiver's own QP with room for a window of datagrams.
	ctx, _ := rx.dev.Verbs().Open()
	defer ctx.Close()
	pd, _ := ctx.AllocPD()
	defer pd.Dealloc()
	cq, _ := ctx.CreateCQ(2 * slots)
	defer cq.Destroy()
	qp := udQP(t, pd, cq, slots)
	defer qp.Destroy()
	const sz = 40 + 64
	mr, _ := pd.RegMR(make([]byte, slots*sz), verbs.AccessLocalWrite)
	defer mr.Dereg()
	for i := range slots {
		if err := qp.PostRecv(&verbs.RecvWR{WRID: uint64(i), SGList: []verbs.SGE{mr.SGE(i*sz, sz)}}); err != nil {
			t.Fatal(err)
		}
	}
	mgid, _ := verbs.ParseGID("ff12:4001:ffff::d2")
	_, rec := rx.join(t, mgid, mad.JoinFullMember)
	sender.join(t, mgid, mad.JoinSendOnlyFullMember)
	if err := qp.AttachMcast(mgid, rec.MLID); err != nil {
		t.Fatal(err)
	}
	ah, err := sender.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: 1, DLID: rec.MLID, GRH: verbs.GlobalRoute{DGID: mgid, HopLimit: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Destroy()
	var received atomic.Uint32
	errc := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		var wc [64]verbs.WC
		for want := uint32(1); want <= n; {
			k, err := cq.Poll(wc[:])
			if err != nil {
				errc <- err
				return
			}
			if k == 0 {
				if err := cq.Wait(wctx); err != nil {
					errc <- fmt.Errorf("waiting for datagram %d: %w", want, err)
					return
				}
				continue
			}
			for _, c := range wc[:k] {
				i := int(c.WRID)
				if got := binary.BigEndian.Uint32(mr.Buf()[i*sz+40:]); c.Status != verbs.WCSuccess || got != want {
					errc <- fmt.Errorf("datagram %d: got %d (status %v)", want, got, c.Status)
					return
				}
				want++
				received.Store(want - 1)
				if err := qp.PostRecv(&verbs.RecvWR{WRID: c.WRID, SGList: []verbs.SGE{mr.SGE(i*sz, sz)}}); err != nil {
					errc <- err
					return
				}
			}
		}
		errc <- nil
	}()
	deadline := time.Now().Add(60 * time.Second)
	for seq := uint32(1); seq <= n; seq++ {
		for seq-received.Load() > window {
			if time.Now().After(deadline) {
				t.Fatalf("the receiver is stuck at %d", received.Load())
			}
			select {
			case err := <-errc:
				t.Fatal(err)
			default:
			}
			runtime.Gosched()
		}
		sender.sendSeq(t, ah, verbs.MulticastQPN, seq)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	c := sender.dev.Counters()
	var fwd uint64
	for _, ps := range s.Stats().Ports {
		if ps.GUID == sender.dev.GUID() {
			fwd = ps.Forwarded
		}
	}
	t.Logf("%d datagrams in order: %d through the switch, %d directly, %d direct discards", n, fwd, c.Get(softverbs.DirectSends), c.Get(softverbs.DirectDiscards))
	if fwd == 0 || c.Get(softverbs.DirectSends) == 0 || fwd+c.Get(softverbs.DirectSends) != n {
		t.Errorf("switch %d + direct %d, want both and %d in all", fwd, c.Get(softverbs.DirectSends), n)
	}
	if d := rx.dev.Counters().Get(softverbs.NoRecvWRDrops); d != 0 {
		t.Errorf("%d datagrams found no receive WR", d)
	}
}

// TestDataPathAllocs: a datagram sent directly from one port to another
// and received there allocates nothing, in steady state.
func TestDataPathAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops what it is given: measured without -race (.ci/run)")
	}
	{
		s := startSMWith(t, sm.Config{})
		a, b := openPort(t, s, "127.0.3.31"), openPort(t, s, "127.0.3.32")
		ah, err := b.pd.CreateAH(&verbs.AHAttr{PortNum: 1, DLID: a.dev.LID()})
		if err != nil {
			t.Fatal(err)
		}
		defer ah.Destroy()
		// Everything a round uses is made once.
		swr := verbs.SendWR{Opcode: verbs.WRSend, SGList: []verbs.SGE{b.mr.SGE(0, 16)},
			UD: verbs.UDWR{AH: ah, RemoteQPN: a.qp.Num(), RemoteQKey: 0x01234567}}
		rwrs := make([]verbs.RecvWR, 8)
		for i := range rwrs {
			rwrs[i] = verbs.RecvWR{WRID: uint64(i), SGList: []verbs.SGE{a.mr.SGE(i*(40+64), 40+64)}}
		}
		var wc [8]verbs.WC
		failed := false
		round := func() {
			if err := b.qp.PostSend(&swr); err != nil {
				failed = true
				return
			}
			for {
				if n, _ := a.cq.Poll(wc[:1]); n == 1 {
					if a.qp.PostRecv(&rwrs[wc[0].WRID%8]) != nil {
						failed = true
					}
					break
				}
			}
			b.cq.Poll(wc[:]) // the send completion
		}
		deadline := time.Now().Add(5 * time.Second)
		for b.dev.Counters().Get(softverbs.DirectSends) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("no direct send")
			}
			round()
		}
		for range 100 {
			round()
		}
		n := testing.AllocsPerRun(500, round)
		if failed {
			t.Fatal("a post failed")
		}
		if n > 0 {
			t.Errorf("%.2f allocations per datagram sent directly and received", n)
		}
	}
}
