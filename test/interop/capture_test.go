package interop

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/vishvananda/netns"
)

// frame is one captured Ethernet frame.
type frame struct {
	ts   time.Time
	data []byte
}

// capture reads every frame of one interface of a namespace (AF_PACKET,
// both directions) into memory and into a pcap file.
type capture struct {
	iface string
	path  string
	h     *pcapgo.EthernetHandle
	done  chan struct{}

	mu      sync.Mutex
	frames  []frame
	changed chan struct{} // closed and replaced on every frame
	err     error
}

// inNetns runs fn on a locked OS thread that has entered the named
// namespace. Sockets fn opens stay in that namespace. The thread is thrown
// away if it cannot return to its original namespace.
func inNetns(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(name)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns %s: %w", name, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", name, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Stay locked: the thread exits with this goroutine.
			errc <- fmt.Errorf("setns back: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// startCapture opens a capture on iface in namespace ns. It stops before
// the namespaces are removed; when the test failed, the pcap is kept.
func startCapture(t *testing.T, ns, iface string) *capture {
	t.Helper()
	c := &capture{
		iface:   iface,
		path:    filepath.Join(t.TempDir(), iface+".pcap"),
		done:    make(chan struct{}),
		changed: make(chan struct{}),
	}
	err := inNetns(ns, func() error {
		h, err := pcapgo.NewEthernetHandle(iface)
		c.h = h
		return err
	})
	if err != nil {
		t.Fatalf("capture on %s in %s: %v", iface, ns, err)
	}
	f, err := os.Create(c.path)
	if err != nil {
		c.h.Close()
		t.Fatal(err)
	}
	bw := bufio.NewWriter(f)
	w := pcapgo.NewWriter(bw)
	if err := w.WriteFileHeader(65536, layers.LinkTypeEthernet); err != nil {
		c.h.Close()
		f.Close()
		t.Fatal(err)
	}
	go c.loop(w)
	t.Cleanup(func() {
		c.stop()
		if err := bw.Flush(); err != nil {
			t.Errorf("pcap %s: %v", c.path, err)
		}
		f.Close()
		if t.Failed() {
			keepArtifact(t, c.path)
		}
	})
	return c
}

func (c *capture) loop(w *pcapgo.Writer) {
	defer close(c.done)
	for {
		data, ci, err := c.h.ReadPacketData()
		if err != nil {
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			return
		}
		if len(data) > 65536 {
			ci.CaptureLength = 65536
			data = data[:65536]
		}
		_ = w.WritePacket(gopacket.CaptureInfo{Timestamp: ci.Timestamp, CaptureLength: len(data), Length: ci.Length}, data)
		c.mu.Lock()
		c.frames = append(c.frames, frame{ts: ci.Timestamp, data: data})
		close(c.changed)
		c.changed = make(chan struct{})
		c.mu.Unlock()
	}
}

// stop closes the capture and waits for its reader.
func (c *capture) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	c.h.Close()
	<-c.done
}

// snapshot returns the frames captured so far.
func (c *capture) snapshot() []frame {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]frame(nil), c.frames...)
}

// waitFor waits until cond holds for the frames captured so far and
// returns them; on timeout it returns them with false.
func (c *capture) waitFor(timeout time.Duration, cond func([]frame) bool) ([]frame, bool) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		c.mu.Lock()
		fs := append([]frame(nil), c.frames...)
		ch := c.changed
		c.mu.Unlock()
		if cond(fs) {
			return fs, true
		}
		select {
		case <-ch:
		case <-c.done:
			return c.snapshot(), cond(c.snapshot())
		case <-timer.C:
			return fs, false
		}
	}
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// artifactsDir is where the files of failed cases are kept:
// $SOFTRDMA_ARTIFACTS, else /tmp/softrdma-interop-artifacts.
func artifactsDir() string {
	if dir := os.Getenv("SOFTRDMA_ARTIFACTS"); dir != "" {
		return dir
	}
	return filepath.Join(os.TempDir(), "softrdma-interop-artifacts")
}

// keepArtifact copies a file of a failed test to the artifacts directory
// (a folder per test) and logs where.
func keepArtifact(t *testing.T, path string) {
	dir := filepath.Join(artifactsDir(), unsafeChars.ReplaceAllString(t.Name(), "_"))
	dst := filepath.Join(dir, filepath.Base(path))
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		err = copyFile(dst, path)
	}
	if err != nil {
		t.Logf("artifact %s (could not keep it: %v)", path, err)
		return
	}
	t.Logf("artifact kept: %s", dst)
}

func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// ipv4Frame is the IPv4 part of an Ethernet frame.
type ipv4Frame struct {
	ts       time.Time
	ethDst   [6]byte
	ip       []byte // the IPv4 header (IHL*4 bytes)
	src, dst netip.Addr
	proto    uint8
	payload  []byte // after the IP header, up to the IP total length
}

// parseIPv4 decodes an untagged Ethernet II frame carrying IPv4; frames
// that are not (or are malformed) return false.
func parseIPv4(f frame) (ipv4Frame, bool) {
	b := f.data
	if len(b) < 14+20 || binary.BigEndian.Uint16(b[12:14]) != 0x0800 {
		return ipv4Frame{}, false
	}
	ip := b[14:]
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	if ip[0]>>4 != 4 || ihl < 20 || total < ihl || total > len(ip) {
		return ipv4Frame{}, false
	}
	p := ipv4Frame{
		ts:      f.ts,
		ip:      ip[:ihl],
		src:     netip.AddrFrom4([4]byte(ip[12:16])),
		dst:     netip.AddrFrom4([4]byte(ip[16:20])),
		proto:   ip[9],
		payload: ip[ihl:total],
	}
	copy(p.ethDst[:], b[:6])
	return p, true
}

// IGMP message and IGMPv3 group record types.
const (
	igmpV2Report = 0x16
	igmpV2Leave  = 0x17
	igmpV3Report = 0x22

	recIsInclude = 1
	recIsExclude = 2
	recToInclude = 3
	recToExclude = 4
	recAllow     = 5
	recBlock     = 6
)

// igmpEvent is one statement an IGMP message makes about a group.
type igmpEvent struct {
	ts    time.Time
	src   netip.Addr
	typ   uint8 // message type
	rec   uint8 // IGMPv3 record type (0 for v1/v2)
	group netip.Addr
	nsrc  int
}

func (e igmpEvent) String() string {
	if e.typ == igmpV3Report {
		return fmt.Sprintf("%s IGMPv3 report from %v: record type %d group %v sources %d", e.ts.Format("15:04:05.000"), e.src, e.rec, e.group, e.nsrc)
	}
	return fmt.Sprintf("%s IGMP type %#x from %v group %v", e.ts.Format("15:04:05.000"), e.typ, e.src, e.group)
}

// join reports whether the event announces membership (any source).
func (e igmpEvent) join() bool {
	switch e.typ {
	case igmpV2Report, 0x12:
		return true
	case igmpV3Report:
		return e.rec == recIsExclude || e.rec == recToExclude
	}
	return false
}

// leave reports whether the event gives up membership: a v2 leave, or an
// IGMPv3 TO_IN {} (CHANGE_TO_INCLUDE_MODE without sources).
func (e igmpEvent) leave() bool {
	return e.typ == igmpV2Leave || e.typ == igmpV3Report && e.rec == recToInclude && e.nsrc == 0
}

// igmpEvents decodes the IGMP messages among frames.
func igmpEvents(fs []frame) []igmpEvent {
	var out []igmpEvent
	for _, f := range fs {
		p, ok := parseIPv4(f)
		if !ok || p.proto != 2 || len(p.payload) < 8 {
			continue
		}
		m := p.payload
		switch m[0] {
		case 0x12, igmpV2Report, igmpV2Leave:
			out = append(out, igmpEvent{ts: p.ts, src: p.src, typ: m[0], group: netip.AddrFrom4([4]byte(m[4:8]))})
		case igmpV3Report:
			n := int(binary.BigEndian.Uint16(m[6:8]))
			r := m[8:]
			for i := 0; i < n && len(r) >= 8; i++ {
				aux, nsrc := int(r[1])*4, int(binary.BigEndian.Uint16(r[2:4]))
				out = append(out, igmpEvent{ts: p.ts, src: p.src, typ: igmpV3Report, rec: r[0],
					group: netip.AddrFrom4([4]byte(r[4:8])), nsrc: nsrc})
				l := 8 + 4*nsrc + aux
				if l > len(r) {
					break
				}
				r = r[l:]
			}
		}
	}
	return out
}

// igmpAbout returns the IGMP events from src about group.
func igmpAbout(fs []frame, src, group netip.Addr) []igmpEvent {
	var out []igmpEvent
	for _, e := range igmpEvents(fs) {
		if e.src == src && e.group == group {
			out = append(out, e)
		}
	}
	return out
}

// roceFrame is a captured RoCEv2 datagram (UDP destination port 4791).
type roceFrame struct {
	ipv4Frame
	udp  []byte // UDP header
	body []byte // UDP payload (BTH … ICRC)
}

// roceFrames returns the IPv4 frames to UDP port 4791 from src (any
// source when invalid) to group.
func roceFrames(fs []frame, src, group netip.Addr) []roceFrame {
	var out []roceFrame
	for _, f := range fs {
		p, ok := parseIPv4(f)
		if !ok || p.proto != 17 || len(p.payload) < 8 || p.dst != group || src.IsValid() && p.src != src {
			continue
		}
		if binary.BigEndian.Uint16(p.payload[2:4]) != 4791 {
			continue
		}
		out = append(out, roceFrame{ipv4Frame: p, udp: p.payload[:8], body: p.payload[8:]})
	}
	return out
}

// roceCount is a waitFor condition: at least n RoCEv2 frames src → group.
func roceCount(src, group netip.Addr, n int) func([]frame) bool {
	return func(fs []frame) bool { return len(roceFrames(fs, src, group)) >= n }
}
