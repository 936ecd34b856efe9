package sm

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/wire"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	testenv.OwnNetns() // lo to this package alone
	testenv.ClearSoftRDMA()
	goleak.VerifyTestMain(m)
}

const waitTimeout = 3 * time.Second

// startSM runs an SM on 127.0.0.1 with free ports until the test ends.
func startSM(t *testing.T, cfg Config) *SM {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.SAListen == "" {
		cfg.SAListen = "127.0.0.1:0"
	}
	if cfg.Logf == nil {
		cfg.Logf = t.Logf
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunUntilEnd(t, "Run", s.Run)
	return s
}

// fakePort is an IB port built with the fabric codec on a UDP socket.
type fakePort struct {
	t      *testing.T
	guid   uint64
	conn   *net.UDPConn
	sm     netip.AddrPort
	ctl    chan *fabric.Control
	pkts   chan []byte
	mu     sync.Mutex
	lid    uint16
	epoch  uint64
	qpn    uint32
	psn    uint32
	closed chan struct{}
	wg     sync.WaitGroup
	// Link flow control (newFlowPort): the port's end of its link,
	// guarded by mu; win is its receive window, grants whether it gives
	// the switch credit as packets arrive (a stalled port does not).
	link   fabric.Link
	win    int
	grants bool
	credit chan struct{} // signalled when credit came
	// The SM's retries (address validation) are answered by readLoop as a
	// port does, sending the last attach again with the cookie, unless
	// rawRetries is set (before the port sends): then they go to ctl.
	// lastAttach (guarded by mu) is the last attach sent; retries counts
	// the retries answered.
	rawRetries bool
	lastAttach *fabric.Control
	retries    atomic.Int64
}

func newFakePort(t *testing.T, sm netip.AddrPort, guid uint64) *fakePort {
	t.Helper()
	return newFakePortOpts(t, sm, guid, true)
}

// newFakePortOpts opens a fake port, attaching it when attach is set.
func newFakePortOpts(t *testing.T, smAddr interface{ String() string }, guid uint64, attach bool) *fakePort {
	t.Helper()
	sm := netip.MustParseAddrPort(smAddr.String())
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	p := &fakePort{t: t, guid: guid, conn: conn, sm: sm, ctl: make(chan *fabric.Control, 16),
		pkts: make(chan []byte, 256), qpn: 0x100 + uint32(guid&0xFF), closed: make(chan struct{})}
	p.wg.Add(1)
	go p.readLoop()
	t.Cleanup(p.close)
	if attach {
		p.attach()
	}
	return p
}

func (p *fakePort) readLoop() {
	defer p.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, _, err := p.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		b := append([]byte(nil), buf[:n]...)
		if fabric.IsFlow(b) {
			p.flowIn(b)
			continue
		}
		if fabric.IsControl(b) {
			c, err := fabric.DecodeControl(b)
			if err != nil {
				p.t.Errorf("bad control: %v", err)
				continue
			}
			if c.Type == fabric.TypeRetry && !p.rawRetries && p.answerRetry(c) {
				continue
			}
			p.ctl <- c
			continue
		}
		if p.win > 0 {
			p.took()
		}
		select {
		case p.pkts <- b:
		default:
			p.t.Errorf("port %#x: receive queue full", p.guid)
		}
	}
}

func (p *fakePort) close() {
	select {
	case <-p.closed:
		return
	default:
	}
	close(p.closed)
	p.conn.Close()
	p.wg.Wait()
}

func (p *fakePort) gid() wire.GID { return fabric.PortGID(fabric.DefaultSubnetPrefix, p.guid) }

// answerRetry sends the port's last attach (or a bare one for the
// retry's GUID) again with the retry's cookie; false when that attach
// carried the cookie already (then the test sees the retry).
func (p *fakePort) answerRetry(r *fabric.Control) bool {
	p.mu.Lock()
	a := fabric.Control{Type: fabric.TypeAttach, GUID: r.GUID}
	if p.lastAttach != nil && p.lastAttach.GUID == r.GUID {
		a = *p.lastAttach
	}
	if string(a.Cookie) == string(r.Cookie) {
		p.mu.Unlock()
		return false
	}
	a.Cookie = r.Cookie
	p.lastAttach = &a
	p.mu.Unlock()
	p.retries.Add(1)
	p.conn.WriteToUDPAddrPort(fabric.EncodeControl(&a), p.sm)
	return true
}

func (p *fakePort) sendControl(c *fabric.Control) {
	p.t.Helper()
	if c.Type == fabric.TypeAttach {
		a := *c
		p.mu.Lock()
		p.lastAttach = &a
		p.mu.Unlock()
	}
	if _, err := p.conn.WriteToUDPAddrPort(fabric.EncodeControl(c), p.sm); err != nil {
		p.t.Fatal(err)
	}
}

// attach sends "attach" and waits for port_info.
func (p *fakePort) attach() *fabric.Control {
	p.t.Helper()
	p.sendControl(&fabric.Control{Type: fabric.TypeAttach, GUID: p.guid, NodeDesc: "test port", Credits: p.win})
	select {
	case c := <-p.ctl:
		if c.Type != fabric.TypePortInfo {
			p.t.Fatalf("got %q, want port_info", c.Type)
		}
		p.mu.Lock()
		p.lid, p.epoch = c.LID, c.Epoch
		if p.win > 0 && c.ClientReregister {
			p.link.Reset(c.Credits, p.win)
		}
		p.mu.Unlock()
		return c
	case <-time.After(waitTimeout):
		p.t.Fatalf("port %#x: no port_info", p.guid)
		return nil
	}
}

// control waits for the next control message from the SM.
func (p *fakePort) control() *fabric.Control {
	p.t.Helper()
	select {
	case c := <-p.ctl:
		return c
	case <-time.After(waitTimeout):
		p.t.Fatalf("port %#x: no control message", p.guid)
		return nil
	}
}

func (p *fakePort) LID() uint16 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lid
}

// send builds and sends one UD packet.
func (p *fakePort) send(dlid uint16, global bool, dgid wire.GID, destQP, qkey uint32, payload []byte) {
	p.t.Helper()
	h := &fabric.UDPacket{DLID: dlid, SLID: p.LID(), Global: global,
		GRH: wire.IBGRHFields{HopLmt: 0xFF, SGID: p.gid(), DGID: dgid},
		UD:  wire.UDHeader{PKey: 0xFFFF, DestQP: destQP, PSN: p.psn, QKey: qkey, SrcQP: p.qpn}}
	p.psn++
	b := make([]byte, fabric.PacketLen(len(payload), false, global))
	fabric.EncodeUD(b, h, payload)
	p.mu.Lock()
	p.link.Sent(1)
	p.mu.Unlock()
	if _, err := p.conn.WriteToUDPAddrPort(b, p.sm); err != nil {
		p.t.Fatal(err)
	}
}

// newFlowPort opens and attaches a fake port that takes part in link flow
// control with a receive window of win packets; when grants is false it
// never gives the switch credit beyond that window (a stalled port).
func newFlowPort(t *testing.T, sm netip.AddrPort, guid uint64, win int, grants bool) *fakePort {
	t.Helper()
	p := newFakePortOpts(t, sm, guid, false)
	p.mu.Lock()
	p.win, p.grants, p.credit = win, grants, make(chan struct{}, 1)
	p.mu.Unlock()
	p.attach()
	return p
}

// sendFlow sends the port's flow control packet. mu is held.
func (p *fakePort) sendFlow(f fabric.Flow) {
	var b [fabric.FlowLen]byte
	p.conn.WriteToUDPAddrPort(fabric.EncodeFlow(b[:], f), p.sm)
}

// flowIn applies a flow control packet from the switch (readLoop).
func (p *fakePort) flowIn(b []byte) {
	f, err := fabric.DecodeFlow(b)
	if err != nil {
		p.t.Errorf("port %#x: bad flow control packet %x", p.guid, b)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.link.Receive(f) {
		select {
		case p.credit <- struct{}{}:
		default:
		}
	}
	if f.Op == fabric.FlowOpRequest && p.grants {
		p.sendFlow(p.link.Answer(p.win))
	}
}

// took counts a packet from the switch and grants credit for it
// (readLoop).
func (p *fakePort) took() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.link.Took(1)
	if p.grants && p.link.Grant(p.win, p.win/4) {
		p.sendFlow(p.link.Flow(fabric.FlowOpNormal))
	}
}

// sendCredited sends n UD packets as a port of a flow controlled link
// does: each only with credit, asking for it while there is none. It fails
// the test when credit does not come within waitTimeout.
func (p *fakePort) sendCredited(n int, dlid uint16, global bool, dgid wire.GID, destQP, qkey uint32, payload []byte) {
	p.t.Helper()
	last := time.Now()
	for i := 0; i < n; {
		if time.Since(last) > waitTimeout {
			p.t.Fatalf("port %#x: no credit after %d packets", p.guid, i)
		}
		p.mu.Lock()
		c := p.link.Credits()
		if c == 0 {
			p.sendFlow(p.link.Flow(fabric.FlowOpRequest))
		}
		p.mu.Unlock()
		if c > 0 {
			p.send(dlid, global, dgid, destQP, qkey, payload)
			i++
			last = time.Now()
			continue
		}
		select {
		case <-p.credit:
		case <-time.After(fabric.FlowRefresh):
		}
	}
}

// sa sends an SA MAD over the fabric (a GRH when global) and returns the
// answer packets' MADs (all RMPP segments for a GetTable, acknowledged as
// the kernel's RMPP receiver does).
func (p *fakePort) sa(m mad.MAD, global bool) []mad.MAD {
	p.t.Helper()
	smGID := fabric.PortGID(fabric.DefaultSubnetPrefix, DefaultSMGUID)
	p.send(fabric.SMLID, global, smGID, fabric.SAQPN, fabric.SAQKey, m)
	var out []mad.MAD
	var re mad.Reassembler
	for {
		b := p.recv(waitTimeout)
		if b == nil {
			p.t.Fatalf("port %#x: no SA answer to tid %#x", p.guid, m.TID())
		}
		var pkt fabric.Packet
		if err := fabric.Parse(b, &pkt); err != nil {
			p.t.Fatalf("SA answer: %v", err)
		}
		if pkt.LRH.SLID() != fabric.SMLID || pkt.LRH.DLID() != p.LID() || pkt.UD.DETH.SrcQP() != fabric.SAQPN ||
			pkt.UD.DETH.QKey() != fabric.SAQKey || pkt.UD.BTH.DestQP() != p.qpn || pkt.Global() != global {
			p.t.Fatalf("SA answer addressing: slid %d dlid %d srcqp %d qkey %#x destqp %#x global %v",
				pkt.LRH.SLID(), pkt.LRH.DLID(), pkt.UD.DETH.SrcQP(), pkt.UD.DETH.QKey(), pkt.UD.BTH.DestQP(), pkt.Global())
		}
		if global && (pkt.GRH.DGID() != p.gid() || pkt.GRH.SGID() != fabric.PortGID(fabric.DefaultSubnetPrefix, DefaultSMGUID)) {
			p.t.Fatalf("SA answer GRH: sgid %v dgid %v", pkt.GRH.SGID(), pkt.GRH.DGID())
		}
		r := append(mad.MAD(nil), pkt.UD.Payload[:mad.Len]...)
		if r.TID() != m.TID() {
			p.t.Fatalf("TID %#x, want %#x", r.TID(), m.TID())
		}
		if r.RMPPFlags()&mad.RMPPFlagActive == 0 {
			return append(out, r)
		}
		done, _, err := re.Add(r)
		if err != nil {
			p.t.Fatalf("RMPP segment: %v", err)
		}
		if a := re.Ack(); a != nil {
			p.send(fabric.SMLID, global, smGID, fabric.SAQPN, fabric.SAQKey, a)
		}
		if uint32(len(out)) < r.SegmentNumber() {
			out = append(out, r)
		}
		if done {
			return out
		}
	}
}

// recv returns the next IB packet or nil after d.
func (p *fakePort) recv(d time.Duration) []byte {
	select {
	case b := <-p.pkts:
		return b
	case <-time.After(d):
		return nil
	}
}

var tidCounter uint64

// mcReq builds an MCMemberRecord request for the port (PS_UDP mask).
func mcReq(method uint8, comp uint64, mgid wire.GID, guid uint64, js uint8) mad.MAD {
	tidCounter++
	m := mad.NewSARequest(method, mad.AttrMCMemberRecord, 0xABCD0000_00000000|tidCounter, comp)
	f := mad.MCMemberFields{MGID: mgid, PortGID: fabric.PortGID(fabric.DefaultSubnetPrefix, guid),
		QKey: 0x01234567, PKey: 0xFFFF, JoinState: js}
	m.MCMemberRecord().Encode(&f)
	return m
}

// rawSA sends one MAD to the raw SA port and collects the answer
// datagrams (until a non-RMPP answer or the whole RMPP transfer, whose
// segments it acknowledges as the kernel's RMPP receiver does); nil on
// timeout.
func rawSA(t *testing.T, addr netip.AddrPort, m []byte, timeout time.Duration) []mad.MAD {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.WriteToUDPAddrPort(m, addr); err != nil {
		t.Fatal(err)
	}
	var out []mad.MAD
	var re mad.Reassembler
	buf := make([]byte, 4096)
	for {
		conn.SetReadDeadline(time.Now().Add(timeout))
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if from != addr {
			t.Fatalf("answer from %v", from)
		}
		if n != mad.Len {
			t.Fatalf("answer of %d bytes", n)
		}
		r := append(mad.MAD(nil), buf[:n]...)
		if r.RMPPFlags()&mad.RMPPFlagActive == 0 {
			return append(out, r)
		}
		done, _, err := re.Add(r)
		if err != nil {
			t.Fatalf("RMPP segment: %v", err)
		}
		if a := re.Ack(); a != nil {
			if _, err := conn.WriteToUDPAddrPort(a, addr); err != nil {
				t.Fatal(err)
			}
		}
		if uint32(len(out)) < r.SegmentNumber() {
			out = append(out, r)
		}
		if done {
			return out
		}
	}
}

func mustStatus(t *testing.T, rs []mad.MAD, st uint16) mad.MAD {
	t.Helper()
	if len(rs) != 1 {
		t.Fatalf("%d answers", len(rs))
	}
	if rs[0].Status() != st {
		t.Fatalf("status %#04x, want %#04x", rs[0].Status(), st)
	}
	return rs[0]
}

func mgid(s string) wire.GID {
	g, err := wire.ParseGID(s)
	if err != nil {
		panic(err)
	}
	return g
}

// payloadOf parses an IB packet and returns its payload.
func payloadOf(t *testing.T, b []byte) []byte {
	t.Helper()
	var pkt fabric.Packet
	if err := fabric.Parse(b, &pkt); err != nil {
		t.Fatal(err)
	}
	return pkt.UD.Payload
}

// handlePacket takes one datagram as the reader does (an IB packet, a
// flow control packet or a direct forwarding message from from) and
// forwards what it can at once.
func (s *SM) handlePacket(b []byte, from netip.AddrPort) {
	raw, err := s.fabric.SyscallConn()
	if err != nil {
		panic(err)
	}
	o := s.newOutBatch()
	s.mu.Lock()
	switch {
	case fabric.IsDirect(b):
		s.directIn(b, from, time.Now())
	case fabric.IsFlow(b):
		s.flowIn(b, from, time.Now())
	default:
		s.packetIn(b, from, false)
	}
	s.directChanged(time.Now())
	s.mu.Unlock()
	s.pump(o, raw)
}
