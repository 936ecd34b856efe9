// Package capture writes the frames of devices as a pcap stream: what a
// process's devices send and receive, taken from their frame taps
// (driver.Tapper), whatever their backend. RoCEv2 devices give Ethernet
// frames that Wireshark's RoCE dissector decodes (UDP port 4791); the
// ports of an emulated InfiniBand subnet give IB packets from the LRH on
// (LINKTYPE_INFINIBAND, 247). One pcap stream has one link type, so a
// capture records the devices of one link type.
//
// The datapath never waits for the writer: frames go through a bounded
// queue and are counted as dropped when it is full.
package capture

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// Direction selects the frames a capture records.
type Direction uint8

// Capture directions.
const (
	// Both records what the devices send and what they receive.
	Both Direction = iota
	// Sent records only what the devices send.
	Sent
	// Received records only what the devices receive (every datagram
	// read, before any check).
	Received
)

// String returns "both", "sent" or "received".
func (d Direction) String() string {
	switch d {
	case Both:
		return "both"
	case Sent:
		return "sent"
	case Received:
		return "received"
	}
	return fmt.Sprintf("Direction(%d)", uint8(d))
}

// ParseDirection parses "both" (or ""), "sent"/"tx"/"out" and
// "received"/"rx"/"in".
func ParseDirection(s string) (Direction, error) {
	switch s {
	case "", "both":
		return Both, nil
	case "sent", "tx", "out":
		return Sent, nil
	case "received", "rx", "in":
		return Received, nil
	}
	return 0, fmt.Errorf("capture direction %q: want both, sent or received: %w", s, syscall.EINVAL)
}

// DefaultSnaplen is the snapshot length of a capture whose options give
// none: any frame fits.
const DefaultSnaplen = 65535

// DefaultQueue is how many frames may wait for the writer before frames
// are dropped, when the options give no length.
const DefaultQueue = 4096

// Options select what a capture records.
type Options struct {
	// Host is the host whose devices are captured (verbs.DefaultHost when
	// nil).
	Host *verbs.Host
	// Device is the name of the device to capture on (e.g. "rxe_lo"); ""
	// captures on every device of the link type, including devices
	// created while the capture runs.
	Device string
	// LinkType is the link type captured when Device is "" (0: Ethernet);
	// with Device set, the device's own.
	LinkType uint32
	// Direction selects sent and/or received frames.
	Direction Direction
	// Snaplen is the largest number of bytes kept of each frame
	// (DefaultSnaplen when 0).
	Snaplen int
	// MaxPackets ends the capture by itself once that many frames were
	// written (0: no limit).
	MaxPackets int
	// Queue is the number of frames that may wait for the writer
	// (DefaultQueue when 0); more are counted in Dropped.
	Queue int
}

// Stats counts a capture's frames.
type Stats struct {
	// Packets counts frames written.
	Packets uint64
	// Dropped counts frames lost because the writer lagged behind.
	Dropped uint64
}

// Capture is a running packet capture (Start). Its methods are safe for
// concurrent use.
type Capture struct {
	opts Options

	q     chan frame
	stop  chan struct{} // closed by end
	ended chan struct{} // closed by end: Done
	done  chan struct{} // closed when the writer goroutine exits
	once  sync.Once

	mu      sync.Mutex // cancels
	cancels []func()
	unwatch func()

	closed   atomic.Bool
	accepted atomic.Int64 // frames queued, for MaxPackets
	written  atomic.Uint64
	dropped  atomic.Uint64

	bw  *bufio.Writer
	pw  *pcapgo.Writer
	err error // the first write error; read after done
}

type frame struct {
	ts     time.Time
	data   []byte // at most snaplen bytes, owned by the capture
	length int    // the frame's full length
}

type activeKey struct{}

// active counts a host's running captures.
func active(h *verbs.Host) *atomic.Int64 {
	return h.Value(activeKey{}, func() any { return new(atomic.Int64) }).(*atomic.Int64)
}

// Active returns the number of captures running on a host (nil:
// verbs.DefaultHost).
func Active(h *verbs.Host) int {
	if h == nil {
		h = verbs.DefaultHost()
	}
	return int(active(h).Load())
}

// ErrNoDevice is returned by Start for a Device the host does not have.
var ErrNoDevice = fmt.Errorf("no such device: %w", syscall.ENODEV)

// Start writes the pcap file header to w and starts recording the frames
// that the selected devices send and receive, until Stop is called,
// MaxPackets frames were written or a write to w fails. Frames are written
// by a goroutine of the capture and w is flushed whenever the queue is
// empty, so a capture streamed to a pipe or a connection is timely. The
// caller closes w after Stop.
func Start(w io.Writer, o Options) (*Capture, error) {
	if o.Direction > Received || o.Snaplen < 0 || o.MaxPackets < 0 || o.Queue < 0 {
		return nil, fmt.Errorf("capture options %+v: %w", o, syscall.EINVAL)
	}
	if o.Host == nil {
		o.Host = verbs.DefaultHost()
	}
	if o.Snaplen == 0 {
		o.Snaplen = DefaultSnaplen
	}
	if o.Queue == 0 {
		o.Queue = DefaultQueue
	}
	if o.LinkType == 0 {
		o.LinkType = verbs.LinkTypeEthernet
	}
	if o.Device != "" {
		var dev *verbs.Device
		for _, d := range o.Host.Devices() {
			if d.Name() == o.Device {
				dev = d
			}
		}
		if dev == nil {
			return nil, fmt.Errorf("capture on %s: %w", o.Device, ErrNoDevice)
		}
		t, ok := dev.Ops().(driver.Tapper)
		if !ok {
			return nil, fmt.Errorf("capture on %s: the device has no frame tap: %w", o.Device, syscall.EOPNOTSUPP)
		}
		o.LinkType = t.LinkType()
	}
	c := &Capture{
		opts:  o,
		q:     make(chan frame, o.Queue),
		stop:  make(chan struct{}),
		ended: make(chan struct{}),
		done:  make(chan struct{}),
		bw:    bufio.NewWriterSize(w, 64<<10),
	}
	c.pw = pcapgo.NewWriter(c.bw)
	// Tapping before the header is written, so that whoever reads the
	// header knows the capture runs; frames offered meanwhile wait in the
	// queue for the writer goroutine, which starts after the header.
	active(o.Host).Add(1)
	c.unwatch = o.Host.WatchDevices(c.attach)
	err := c.pw.WriteFileHeader(uint32(o.Snaplen), layers.LinkType(o.LinkType))
	if err == nil {
		err = c.bw.Flush()
	}
	if err != nil {
		c.end()
		close(c.done)
		return nil, fmt.Errorf("capture: %w", err)
	}
	go c.writer()
	return c, nil
}

// attach taps a device the capture selects.
func (c *Capture) attach(d *verbs.Device) {
	if c.opts.Device != "" && d.Name() != c.opts.Device {
		return
	}
	t, ok := d.Ops().(driver.Tapper)
	if !ok || t.LinkType() != c.opts.LinkType {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return
	}
	c.cancels = append(c.cancels, t.Tap(c.offer))
}

// Options returns the capture's options, defaults filled in.
func (c *Capture) Options() Options { return c.opts }

// Stats returns the capture's frame counts so far.
func (c *Capture) Stats() Stats {
	return Stats{Packets: c.written.Load(), Dropped: c.dropped.Load()}
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
		c.unwatch()
		c.mu.Lock()
		cs := c.cancels
		c.cancels = nil
		c.mu.Unlock()
		for _, cancel := range cs {
			cancel()
		}
		active(c.opts.Host).Add(-1)
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
func (c *Capture) write(f frame) bool {
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

// offer queues a copy of a frame without ever blocking (the tap).
func (c *Capture) offer(f verbs.Frame) {
	if c.closed.Load() || (f.Sent && c.opts.Direction == Received) || (!f.Sent && c.opts.Direction == Sent) {
		return
	}
	if c.opts.MaxPackets > 0 && c.accepted.Add(1) > int64(c.opts.MaxPackets) {
		return
	}
	data := f.Data
	if len(data) > c.opts.Snaplen {
		data = data[:c.opts.Snaplen]
	}
	fr := frame{ts: f.Time, data: append([]byte(nil), data...), length: len(f.Data)}
	select {
	case c.q <- fr:
	default:
		c.dropped.Add(1)
		if c.opts.MaxPackets > 0 {
			c.accepted.Add(-1)
		}
	}
}

// IsNoDevice reports whether Start failed for a device the host lacks.
func IsNoDevice(err error) bool { return errors.Is(err, ErrNoDevice) }
