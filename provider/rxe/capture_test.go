package rxe

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrdma/softrdma/capture"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// syncBuffer is a bytes.Buffer safe for the capture writer goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.b.Bytes())
}

// capFrame is a decoded captured frame.
type capFrame struct {
	eth *layers.Ethernet
	ip  *layers.IPv4
	udp *layers.UDP
	pkt wire.Packet
	// icrcOK reports that the ICRC recomputed over the frame's own IP
	// and UDP headers matches the one it carries.
	icrcOK bool
}

// readCapture decodes a pcap stream of Ethernet/IPv4/UDP/RoCEv2 frames.
func readCapture(t *testing.T, b []byte) []capFrame {
	t.Helper()
	r, err := pcapgo.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("pcap: %v", err)
	}
	if r.LinkType() != layers.LinkTypeEthernet {
		t.Fatalf("link type %v", r.LinkType())
	}
	var out []capFrame
	for {
		data, ci, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("pcap record %d: %v", len(out), err)
		}
		if ci.CaptureLength != ci.Length {
			t.Errorf("frame %d truncated: %d of %d", len(out), ci.CaptureLength, ci.Length)
		}
		p := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default)
		f := capFrame{}
		var ok bool
		if f.eth, ok = p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet); !ok {
			t.Fatalf("frame %d: no Ethernet layer", len(out))
		}
		if f.ip, ok = p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); !ok {
			t.Fatalf("frame %d: no IPv4 layer", len(out))
		}
		if f.udp, ok = p.Layer(layers.LayerTypeUDP).(*layers.UDP); !ok {
			t.Fatalf("frame %d: no UDP layer", len(out))
		}
		if err := wire.ParseUD(f.udp.Payload, &f.pkt); err != nil {
			t.Fatalf("frame %d: %v", len(out), err)
		}
		ipb := data[14 : 14+wire.IPv4HeaderLen]
		udpb := data[14+wire.IPv4HeaderLen : 14+wire.IPv4HeaderLen+wire.UDPHeaderLen]
		f.icrcOK = wire.ICRCv4(wire.IPv4(ipb), wire.UDP(udpb), f.pkt.Body) == f.pkt.ICRC
		if wire.IPv4(ipb).Checksum() != wire.IPv4(ipb).CalculateChecksum() {
			t.Errorf("frame %d: bad IPv4 header checksum", len(out))
		}
		out = append(out, f)
	}
}

// TestCaptureLoopback captures a multicast exchange on lo: every sent and
// every received datagram appears as a full frame whose ICRC, recomputed
// over the captured headers, matches.
func TestCaptureLoopback(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	rx := newFakeRx()
	q := newQP(t, d, rx, 0, 0x1234)
	if err := q.AttachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	var buf syncBuffer
	c, err := capture.Start(&buf, capture.Options{Device: d.Name()})
	if err != nil {
		t.Fatal(err)
	}
	if n := capture.Active(nil); n != 1 {
		t.Errorf("ActiveCaptures = %d", n)
	}
	const n = 4
	for i := range n {
		s := &softverbs.UDSend{AH: mcastAH(g), RemoteQPN: verbs.MulticastQPN, RemoteQKey: 0x1234,
			Payload: bytes.Repeat([]byte{byte(i)}, 30+i), HasImm: i%2 == 0, Imm: 0xabc}
		if err := q.Send(s); err != nil {
			t.Fatal(err)
		}
		rx.wait(t)
	}
	eventually(t, "capture of every frame", func() bool { return c.Stats().Packets == 2*n })
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if capture.Active(nil) != 0 {
		t.Error("capture still active after Stop")
	}
	select {
	case <-c.Done():
	default:
		t.Error("Done not closed after Stop")
	}
	frames := readCapture(t, buf.Bytes())
	if len(frames) != 2*n {
		t.Fatalf("%d frames, want %d", len(frames), 2*n)
	}
	psns := map[uint32]int{}
	for i, f := range frames {
		if !f.icrcOK {
			t.Errorf("frame %d: ICRC does not match its headers", i)
		}
		if f.ip.DstIP.String() != g.String() || f.ip.SrcIP.String() != "127.0.0.1" {
			t.Errorf("frame %d: %v -> %v", i, f.ip.SrcIP, f.ip.DstIP)
		}
		if f.ip.Flags&layers.IPv4DontFragment == 0 || f.ip.TTL != 64 {
			t.Errorf("frame %d: flags %v ttl %d", i, f.ip.Flags, f.ip.TTL)
		}
		a := g.As4()
		wantMAC := []byte{0x01, 0x00, 0x5e, a[1] & 0x7f, a[2], a[3]}
		if !bytes.Equal(f.eth.DstMAC, wantMAC) || f.eth.EthernetType != layers.EthernetTypeIPv4 {
			t.Errorf("frame %d: eth dst %v type %v", i, f.eth.DstMAC, f.eth.EthernetType)
		}
		if f.udp.DstPort != wire.UDPPort || f.udp.Checksum != 0 {
			t.Errorf("frame %d: udp dst %d checksum %#x", i, f.udp.DstPort, f.udp.Checksum)
		}
		h := f.pkt.Header()
		if h.DestQP != wire.MulticastQPN || h.QKey != 0x1234 || h.SrcQP != q.QPN() {
			t.Errorf("frame %d: header %+v", i, h)
		}
		psns[h.PSN]++
	}
	for i := range n {
		if psns[uint32(i)] != 2 {
			t.Errorf("PSN %d: %d frames, want 2 (sent and received)", i, psns[uint32(i)])
		}
	}
}

// TestCaptureOptions covers direction, device filter, MaxPackets and the
// option checks.
func TestCaptureOptions(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	rx := newFakeRx()
	q := newQP(t, d, rx, 0, 7)
	if err := q.AttachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	var sent, recvd, other, limited syncBuffer
	cs, _ := capture.Start(&sent, capture.Options{Direction: capture.Sent})
	cr, _ := capture.Start(&recvd, capture.Options{Direction: capture.Received})
	// A capture of another link type takes no RoCEv2 frame.
	co, _ := capture.Start(&other, capture.Options{LinkType: verbs.LinkTypeInfiniBand})
	if _, err := capture.Start(&other, capture.Options{Device: "rxe_nosuch"}); !capture.IsNoDevice(err) || !isErrno(err, syscall.ENODEV) {
		t.Errorf("capture on a device the process lacks: %v", err)
	}
	cl, _ := capture.Start(&limited, capture.Options{MaxPackets: 3})
	for range 3 {
		if err := q.Send(&softverbs.UDSend{AH: mcastAH(g), RemoteQPN: verbs.MulticastQPN, RemoteQKey: 7, Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		rx.wait(t)
	}
	select {
	case <-cl.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("MaxPackets capture did not end")
	}
	eventually(t, "sent and received frames", func() bool { return cs.Stats().Packets == 3 && cr.Stats().Packets == 3 })
	for _, c := range []*capture.Capture{cs, cr, co, cl} {
		if err := c.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(readCapture(t, sent.Bytes())); n != 3 {
		t.Errorf("sent: %d frames", n)
	}
	if n := len(readCapture(t, recvd.Bytes())); n != 3 {
		t.Errorf("received: %d frames", n)
	}
	if r, err := pcapgo.NewReader(bytes.NewReader(other.Bytes())); err != nil || uint32(r.LinkType()) != verbs.LinkTypeInfiniBand {
		t.Errorf("InfiniBand capture: %v, link type %v", err, r.LinkType())
	} else if _, _, err := r.ReadPacketData(); err != io.EOF {
		t.Errorf("InfiniBand capture holds a frame (%v)", err)
	}
	if n := len(readCapture(t, limited.Bytes())); n != 3 {
		t.Errorf("MaxPackets 3: %d frames", n)
	}
	for _, o := range []capture.Options{{Direction: 9}, {Snaplen: -1}, {MaxPackets: -1}, {Queue: -1}} {
		if _, err := capture.Start(io.Discard, o); err == nil {
			t.Errorf("options %+v accepted", o)
		}
	}
	if _, err := capture.Start(writerFunc(func([]byte) (int, error) { return 0, errors.New("broken pipe") }), capture.Options{}); err == nil || capture.Active(nil) != 0 {
		t.Errorf("capture on a broken writer: %v, %d active", err, capture.Active(nil))
	}
	for s, want := range map[string]capture.Direction{"": capture.Both, "both": capture.Both, "tx": capture.Sent, "received": capture.Received} {
		if got, err := capture.ParseDirection(s); err != nil || got != want {
			t.Errorf("capture.ParseDirection(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := capture.ParseDirection("sideways"); err == nil {
		t.Error("bad direction accepted")
	}
}

// blockingWriter blocks every write after the first until released.
type blockingWriter struct {
	release chan struct{}
	fail    bool
	n       int
}

func (b *blockingWriter) Write(p []byte) (int, error) {
	b.n++
	if b.n == 1 {
		return len(p), nil // the file header
	}
	<-b.release
	if b.fail {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

// TestCaptureNeverBlocksDatapath: a writer that does not keep up makes
// the capture drop frames, never the sender wait; a write error ends it.
func TestCaptureNeverBlocksDatapath(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	q := newQP(t, d, newFakeRx(), 0, 7)
	w := &blockingWriter{release: make(chan struct{}), fail: true}
	c, err := capture.Start(w, capture.Options{Direction: capture.Sent, Queue: 2})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 20 {
			q.Send(&softverbs.UDSend{AH: mcastAH(g), RemoteQPN: verbs.MulticastQPN, RemoteQKey: 7, Payload: []byte("x")})
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("sends blocked on a stuck capture writer")
	}
	if st := c.Stats(); st.Dropped == 0 {
		t.Errorf("stats %+v: want drops", st)
	}
	close(w.release)
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("capture did not end on a write error")
	}
	if err := c.Stop(); err == nil {
		t.Error("Stop: no error after a failed write")
	}
}

// TestCaptureHooksIdle: with no capture running the hooks allocate nothing.
func TestCaptureHooksIdle(t *testing.T) {
	d := loDev(t)
	ip := make([]byte, wire.IPv6HeaderLen)
	ip[0] = 0x45
	udp := make([]byte, wire.UDPHeaderLen)
	payload := []byte("payload")
	if a := testing.AllocsPerRun(100, func() {
		captureSent(d, ip, udp, payload)
		captureReceived(d, false, payload, nil, nil)
	}); a != 0 {
		t.Errorf("idle hooks: %v allocations", a)
	}
}

// TestCaptureReceivedMalformed: a datagram that is no RoCEv2 packet, or
// comes without control messages, is still captured, without a panic.
func TestCaptureReceivedMalformed(t *testing.T) {
	d := loDev(t)
	var buf syncBuffer
	c, err := capture.Start(&buf, capture.Options{})
	if err != nil {
		t.Fatal(err)
	}
	captureReceived(d, false, []byte{1, 2, 3}, nil, nil)
	captureReceived(d, true, nil, []byte{1}, []byte{0xff, 0xff})
	captureSent(d, []byte{0x60}, nil, nil) // too short: ignored
	eventually(t, "two frames", func() bool { return c.Stats().Packets == 2 })
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	r, err := pcapgo.NewReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		data, _, err := r.ReadPacketData()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		want := []int{14 + 20 + 8 + 3, 14 + 40 + 8}[i]
		if len(data) != want {
			t.Errorf("frame %d: %d bytes, want %d", i, len(data), want)
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
