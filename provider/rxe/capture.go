package rxe

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrdma/softrdma/wire"
)

// Packet capture: while a Capture runs, the devices it selects hand every
// datagram they send and receive to it, and it writes them as a pcap
// stream of full Ethernet/IPv4|IPv6/UDP/RoCEv2 frames that Wireshark's
// RoCE dissector decodes (UDP port 4791).
//
// The device sees UDP payloads only, so the capture rebuilds the rest:
//   - sent: the IP header is the one the ICRC was computed over, which is
//     what the kernel emits (IPv4: DF set, ID 0, header checksum valid;
//     IPv6: flow label 0 — a kernel with auto flow labels may send another
//     one, which the ICRC does not cover); the UDP checksum is 0.
//   - received: the IPv4 identification and DF bit are the ones the ICRC
//     check solved for (a datagram whose ICRC no ID matches gets ID 0 and
//     DF, so its ICRC shows as wrong, as it was); TTL, TOS and addresses
//     come from the control messages; the UDP checksum is shown as 0.
//   - Ethernet: the destination MAC of a multicast datagram is the group's
//     (01:00:5e:… / 33:33:…); otherwise the device's own MAC for a received
//     datagram and 00:00:00:00:00:00 for a sent one (the neighbour is not
//     known); the source MAC is the device's for a sent datagram and all
//     zeros for a received one. Loopback's MAC is all zeros.
//
// The datapath never waits for the writer: frames go through a bounded
// queue and are counted as dropped when it is full. With no capture
// running the hooks cost one atomic load.

// CaptureDirection selects the datagrams a capture records.
type CaptureDirection uint8

// Capture directions.
const (
	// CaptureBoth records what the devices send and what they receive.
	CaptureBoth CaptureDirection = iota
	// CaptureSent records only what the devices send.
	CaptureSent
	// CaptureReceived records only what the devices receive (every
	// datagram read from a UDP 4791 socket, before any check).
	CaptureReceived
)

// String returns "both", "sent" or "received".
func (d CaptureDirection) String() string {
	switch d {
	case CaptureBoth:
		return "both"
	case CaptureSent:
		return "sent"
	case CaptureReceived:
		return "received"
	}
	return fmt.Sprintf("CaptureDirection(%d)", uint8(d))
}

// ParseCaptureDirection parses "both" (or ""), "sent"/"tx" and
// "received"/"rx".
func ParseCaptureDirection(s string) (CaptureDirection, error) {
	switch s {
	case "", "both":
		return CaptureBoth, nil
	case "sent", "tx", "out":
		return CaptureSent, nil
	case "received", "rx", "in":
		return CaptureReceived, nil
	}
	return 0, fmt.Errorf("rxe: capture direction %q: want both, sent or received", s)
}

// DefaultCaptureSnaplen is the snapshot length of a capture whose
// options give none: any RoCEv2 frame fits.
const DefaultCaptureSnaplen = 65535

// DefaultCaptureQueue is how many frames may wait for the writer before
// frames are dropped, when the options give no length.
const DefaultCaptureQueue = 4096

// CaptureOptions select what a capture records.
type CaptureOptions struct {
	// Device is the name of the device to capture on (e.g. "rxe_lo"); ""
	// captures on every device of the process, including devices created
	// while the capture runs.
	Device string
	// Direction selects sent and/or received datagrams.
	Direction CaptureDirection
	// Snaplen is the largest number of bytes kept of each frame
	// (DefaultCaptureSnaplen when 0).
	Snaplen int
	// MaxPackets ends the capture by itself once that many frames were
	// written (0: no limit).
	MaxPackets int
	// Queue is the number of frames that may wait for the writer
	// (DefaultCaptureQueue when 0); more are counted in Dropped.
	Queue int
}

// CaptureStats counts a capture's frames.
type CaptureStats struct {
	// Packets counts frames written.
	Packets uint64
	// Dropped counts frames lost because the writer lagged behind.
	Dropped uint64
}

// Capture is a running packet capture (StartCapture). Its methods are safe
// for concurrent use.
type Capture struct {
	opts CaptureOptions

	q     chan capturedFrame
	stop  chan struct{} // closed by end
	ended chan struct{} // closed by end: Done
	done  chan struct{} // closed when the writer goroutine exits
	once  sync.Once

	closed   atomic.Bool
	accepted atomic.Int64 // frames queued, for MaxPackets
	written  atomic.Uint64
	dropped  atomic.Uint64

	bw  *bufio.Writer
	pw  *pcapgo.Writer
	err error // the first write error; read after done
}

type capturedFrame struct {
	ts     time.Time
	data   []byte // at most snaplen bytes
	length int    // the frame's full length
}

// captures holds the running captures; activeCaptures publishes them to
// the datapath (nil when none runs).
var (
	captures struct {
		sync.Mutex
		list []*Capture
	}
	activeCaptures atomic.Pointer[[]*Capture]
)

// StartCapture writes the pcap file header (Ethernet link type) to w and
// starts recording the datagrams that the selected devices send and
// receive, until Stop is called, MaxPackets frames were written or a write
// to w fails. Frames are written by a goroutine of the capture and w is
// flushed whenever the queue is empty, so a capture streamed to a pipe or
// a connection is timely. The caller closes w after Stop.
func StartCapture(w io.Writer, o CaptureOptions) (*Capture, error) {
	if o.Direction > CaptureReceived || o.Snaplen < 0 || o.MaxPackets < 0 || o.Queue < 0 {
		return nil, fmt.Errorf("rxe: capture options %+v: invalid", o)
	}
	if o.Snaplen == 0 {
		o.Snaplen = DefaultCaptureSnaplen
	}
	if o.Queue == 0 {
		o.Queue = DefaultCaptureQueue
	}
	c := &Capture{
		opts:  o,
		q:     make(chan capturedFrame, o.Queue),
		stop:  make(chan struct{}),
		ended: make(chan struct{}),
		done:  make(chan struct{}),
		bw:    bufio.NewWriterSize(w, 64<<10),
	}
	c.pw = pcapgo.NewWriter(c.bw)
	// Registered before the header is written, so that whoever reads the
	// header knows the capture runs; frames offered meanwhile wait in the
	// queue for the writer goroutine, which starts after the header.
	captures.Lock()
	captures.list = append(captures.list, c)
	publishCapturesLocked()
	captures.Unlock()
	err := c.pw.WriteFileHeader(uint32(o.Snaplen), layers.LinkTypeEthernet)
	if err == nil {
		err = c.bw.Flush()
	}
	if err != nil {
		c.end()
		close(c.done)
		return nil, fmt.Errorf("rxe: capture: %w", err)
	}
	go c.writer()
	return c, nil
}

func publishCapturesLocked() {
	if len(captures.list) == 0 {
		activeCaptures.Store(nil)
		return
	}
	l := slices.Clone(captures.list)
	activeCaptures.Store(&l)
}

// ActiveCaptures returns the number of captures running in the process.
func ActiveCaptures() int {
	captures.Lock()
	defer captures.Unlock()
	return len(captures.list)
}

// Options returns the capture's options, defaults filled in.
func (c *Capture) Options() CaptureOptions { return c.opts }

// Stats returns the capture's frame counts so far.
func (c *Capture) Stats() CaptureStats {
	return CaptureStats{Packets: c.written.Load(), Dropped: c.dropped.Load()}
}

// Done is closed when the capture stops: Stop was called, MaxPackets
// frames were written, or a write failed.
func (c *Capture) Done() <-chan struct{} { return c.ended }

// Stop ends the capture: the devices stop handing it frames, the frames
// already queued are written and the writer is flushed. It returns the
// first write error, if any. Stopping a stopped capture returns the same.
func (c *Capture) Stop() error {
	c.end()
	<-c.done
	return c.err
}

// end detaches the capture from the devices (once).
func (c *Capture) end() {
	c.once.Do(func() {
		c.closed.Store(true)
		captures.Lock()
		captures.list = slices.DeleteFunc(captures.list, func(x *Capture) bool { return x == c })
		publishCapturesLocked()
		captures.Unlock()
		close(c.ended)
		close(c.stop)
	})
}

// writer writes queued frames until the capture ends, then drains.
func (c *Capture) writer() {
	defer close(c.done)
	for {
		select {
		case f := <-c.q:
			if !c.write(f) {
				c.end()
				return
			}
		case <-c.stop:
			for {
				select {
				case f := <-c.q:
					if !c.write(f) {
						return
					}
				default:
					if err := c.bw.Flush(); err != nil && c.err == nil {
						c.err = err
					}
					return
				}
			}
		}
	}
}

// write writes one frame; false after a write error or when MaxPackets is
// reached (the capture then ends).
func (c *Capture) write(f capturedFrame) bool {
	if c.opts.MaxPackets > 0 && c.written.Load() >= uint64(c.opts.MaxPackets) {
		return true // queued past the limit; ignored
	}
	ci := gopacket.CaptureInfo{Timestamp: f.ts, CaptureLength: len(f.data), Length: f.length}
	if err := c.pw.WritePacket(ci, f.data); err != nil {
		c.err = err
		return false
	}
	n := c.written.Add(1)
	if len(c.q) == 0 {
		if err := c.bw.Flush(); err != nil {
			c.err = err
			return false
		}
	}
	if c.opts.MaxPackets > 0 && n >= uint64(c.opts.MaxPackets) {
		if err := c.bw.Flush(); err != nil {
			c.err = err
		}
		c.end()
	}
	return true
}

// wants reports whether the capture records a datagram of device name in
// direction dir (CaptureSent or CaptureReceived).
func (c *Capture) wants(name string, dir CaptureDirection) bool {
	if c.closed.Load() {
		return false
	}
	if c.opts.Direction != CaptureBoth && c.opts.Direction != dir {
		return false
	}
	return c.opts.Device == "" || c.opts.Device == name
}

// offer queues a frame without ever blocking.
func (c *Capture) offer(f capturedFrame) {
	if c.opts.MaxPackets > 0 && c.accepted.Add(1) > int64(c.opts.MaxPackets) {
		return
	}
	if len(f.data) > c.opts.Snaplen {
		f.data = f.data[:c.opts.Snaplen]
	}
	select {
	case c.q <- f:
	default:
		c.dropped.Add(1)
		if c.opts.MaxPackets > 0 {
			c.accepted.Add(-1)
		}
	}
}

// captureSent is the send path's hook: ip is the IP header the ICRC was
// computed over (its version nibble says IPv4 or IPv6; the slice may be
// longer than the header), udp the UDP header, roce the UDP payload.
func captureSent(d *Device, ip, udp, roce []byte) {
	if activeCaptures.Load() != nil {
		d.captureSent(ip, udp, roce)
	}
}

// captureReceived is the receive path's hook, called with each datagram as
// read from a socket: its UDP payload b, raw source address and control
// messages.
func captureReceived(d *Device, v6 bool, b, name, oob []byte) {
	if activeCaptures.Load() != nil {
		d.captureReceived(v6, b, name, oob)
	}
}

func (d *Device) captureSent(ip, udp, roce []byte) {
	cs := activeCaptures.Load()
	if cs == nil {
		return
	}
	var sel []*Capture
	for _, c := range *cs {
		if c.wants(d.name, CaptureSent) {
			sel = append(sel, c)
		}
	}
	if len(sel) == 0 || len(ip) < wire.IPv4HeaderLen || len(udp) < wire.UDPHeaderLen {
		return
	}
	ipLen := wire.IPv4HeaderLen
	if ip[0]>>4 == 6 {
		ipLen = wire.IPv6HeaderLen
	}
	if len(ip) < ipLen {
		return
	}
	f := make([]byte, ethHeaderLen+ipLen+wire.UDPHeaderLen+len(roce))
	n := copy(f[ethHeaderLen:], ip[:ipLen])
	n += copy(f[ethHeaderLen+n:], udp[:wire.UDPHeaderLen])
	copy(f[ethHeaderLen+n:], roce)
	dst := ipDst(f[ethHeaderLen:])
	putEth(f, multicastMAC(dst, nil), d.info.Load().mac, ipLen == wire.IPv6HeaderLen)
	fr := capturedFrame{ts: time.Now(), data: f, length: len(f)}
	for _, c := range sel {
		c.offer(fr)
	}
}

func (d *Device) captureReceived(v6 bool, b, name, oob []byte) {
	cs := activeCaptures.Load()
	if cs == nil {
		return
	}
	var sel []*Capture
	for _, c := range *cs {
		if c.wants(d.name, CaptureReceived) {
			sel = append(sel, c)
		}
	}
	if len(sel) == 0 {
		return
	}
	var m rxMeta
	parseRxMeta(&m, name, oob, v6)
	ipLen := wire.IPv4HeaderLen
	if v6 {
		ipLen = wire.IPv6HeaderLen
	}
	f := make([]byte, ethHeaderLen+ipLen+wire.UDPHeaderLen+len(b))
	ipb := f[ethHeaderLen : ethHeaderLen+ipLen]
	udp := wire.UDP(f[ethHeaderLen+ipLen : ethHeaderLen+ipLen+wire.UDPHeaderLen])
	copy(f[ethHeaderLen+ipLen+wire.UDPHeaderLen:], b)
	udp.Encode(m.srcPort, wire.UDPPort, uint16(wire.UDPHeaderLen+len(b)))
	src, dst := m.src, m.dst
	if !v6 {
		if !src.Is4() {
			src = netip.IPv4Unspecified()
		}
		if !dst.Is4() {
			dst = netip.IPv4Unspecified()
		}
		ip := wire.IPv4(ipb)
		ip.Encode(wire.IPv4Fields{
			TOS:         m.tos,
			TotalLength: uint16(wire.IPv4HeaderLen + wire.UDPHeaderLen + len(b)),
			DF:          true,
			TTL:         m.ttl,
			Protocol:    wire.IPProtocolUDP,
			Src:         src,
			Dst:         dst,
		})
		var p wire.Packet
		if wire.ParseUD(b, &p) == nil {
			if id, df, ok := wire.SolveIPv4ID(ip, udp, p.Body, p.ICRC); ok {
				ip.SetID(id)
				ip.SetDF(df)
				ip.SetChecksum(ip.CalculateChecksum())
			}
		}
	} else {
		if !src.Is6() {
			src = netip.IPv6Unspecified()
		}
		if !dst.Is6() {
			dst = netip.IPv6Unspecified()
		}
		wire.IPv6(ipb).Encode(wire.IPv6Fields{
			TrafficClass:  m.tos,
			FlowLabel:     m.flow,
			PayloadLength: uint16(wire.UDPHeaderLen + len(b)),
			NextHeader:    wire.IPProtocolUDP,
			HopLimit:      m.ttl,
			Src:           src,
			Dst:           dst,
		})
	}
	mac := d.info.Load().mac
	putEth(f, multicastMAC(ipDst(ipb), mac), nil, v6)
	fr := capturedFrame{ts: time.Now(), data: f, length: len(f)}
	for _, c := range sel {
		c.offer(fr)
	}
}

const ethHeaderLen = 14

// putEth writes the Ethernet header at f[0:14]; a nil MAC is all zeros.
func putEth(f []byte, dst, src net.HardwareAddr, v6 bool) {
	clear(f[:12])
	copy(f[0:6], dst)
	copy(f[6:12], src)
	if v6 {
		f[12], f[13] = 0x86, 0xDD
	} else {
		f[12], f[13] = 0x08, 0x00
	}
}

// ipDst returns the destination address bytes of the IP header at b.
func ipDst(b []byte) []byte {
	if b[0]>>4 == 6 {
		return b[24:40]
	}
	return b[16:20]
}

// multicastMAC maps a multicast IP destination to its Ethernet group
// address (RFC 1112 / RFC 2464); any other destination gets def.
func multicastMAC(dst []byte, def net.HardwareAddr) net.HardwareAddr {
	switch {
	case len(dst) == 4 && dst[0]&0xF0 == 0xE0:
		return net.HardwareAddr{0x01, 0x00, 0x5e, dst[1] & 0x7F, dst[2], dst[3]}
	case len(dst) == 16 && dst[0] == 0xFF:
		return net.HardwareAddr{0x33, 0x33, dst[12], dst[13], dst[14], dst[15]}
	}
	return def
}
