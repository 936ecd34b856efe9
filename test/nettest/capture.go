package nettest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// Frame is one captured Ethernet frame.
type Frame struct {
	TS   time.Time
	Data []byte
}

// Capture reads every frame of one interface of a namespace (AF_PACKET,
// both directions) into memory and into a pcap file.
type Capture struct {
	Iface string // the interface captured
	Path  string // the pcap file

	h    *pcapgo.EthernetHandle
	done chan struct{}

	mu       sync.Mutex
	frames   []Frame
	changed  chan struct{} // closed and replaced on every frame
	err      error         // the read error that ended the reader, unless Stop did
	stopping bool          // Stop closed the handle
	queued   uint64        // frames the kernel queued to the socket (PACKET_STATISTICS)
	drops    uint64        // frames the kernel dropped (socket buffer full)
}

// StartCapture opens a capture on iface in namespace ns. It stops in a
// cleanup of t, so before the namespaces whose removal was registered
// earlier are removed; when the test failed, the pcap is kept with keep.
func StartCapture(t testing.TB, ns, iface string, keep Artifacts) *Capture {
	t.Helper()
	c := &Capture{
		Iface:   iface,
		Path:    filepath.Join(t.TempDir(), iface+".pcap"),
		done:    make(chan struct{}),
		changed: make(chan struct{}),
	}
	err := InNetns(ns, func() error {
		h, err := pcapgo.NewEthernetHandle(iface)
		c.h = h
		return err
	})
	if err != nil {
		t.Fatalf("capture on %s in %s: %v", iface, ns, err)
	}
	f, err := os.Create(c.Path)
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
		c.Stop()
		if err := c.Health(); err != nil {
			t.Logf("%v", err)
		}
		if err := bw.Flush(); err != nil {
			t.Errorf("pcap %s: %v", c.Path, err)
		}
		f.Close()
		if t.Failed() {
			keep.Keep(t, c.Path)
		}
	})
	return c
}

func (c *Capture) loop(w *pcapgo.Writer) {
	defer close(c.done)
	for {
		data, ci, err := c.h.ReadPacketData()
		if err != nil {
			c.mu.Lock()
			if !c.stopping {
				c.err = err
			}
			c.mu.Unlock()
			return
		}
		if len(data) > 65536 {
			ci.CaptureLength = 65536
			data = data[:65536]
		}
		_ = w.WritePacket(gopacket.CaptureInfo{Timestamp: ci.Timestamp, CaptureLength: len(data), Length: ci.Length}, data)
		c.mu.Lock()
		c.frames = append(c.frames, Frame{TS: ci.Timestamp, Data: data})
		close(c.changed)
		c.changed = make(chan struct{})
		c.mu.Unlock()
	}
}

// Stop closes the capture and waits for its reader. The test's cleanup
// calls it; calling it earlier is allowed.
func (c *Capture) Stop() {
	select {
	case <-c.done:
		return
	default:
	}
	c.mu.Lock()
	c.statsLocked()
	c.stopping = true
	c.mu.Unlock()
	c.h.Close()
	<-c.done
}

// statsLocked adds the kernel's counters since the last call (reading
// them resets them) to queued and drops; c.mu is held.
func (c *Capture) statsLocked() {
	if c.stopping {
		return
	}
	st, err := c.h.Stats()
	if err != nil {
		if c.err == nil {
			c.err = err
		}
		return
	}
	// tp_packets counts the dropped frames too.
	c.queued += uint64(st.Packets) - uint64(st.Drops)
	c.drops += uint64(st.Drops)
}

// Health reports whether the capture saw every frame of its interface so
// far: nil, or the reader's error or the number of frames the kernel
// dropped.
func (c *Capture) Health() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.statsLocked()
	return c.healthLocked()
}

func (c *Capture) healthLocked() error {
	switch {
	case c.err != nil:
		return fmt.Errorf("capture on %s: read: %w", c.Iface, c.err)
	case c.drops > 0:
		return fmt.Errorf("capture on %s: the kernel dropped %d frames (socket buffer full)", c.Iface, c.drops)
	}
	return nil
}

// Synced waits until the reader has read every frame the kernel queued to
// the capture so far, and returns the frames. It fails the test when the
// capture is unhealthy (a read error, dropped frames) or does not catch up
// within timeout: a check that a frame is absent must use Synced, since a
// capture that missed frames proves no absence.
func (c *Capture) Synced(t testing.TB, timeout time.Duration) []Frame {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c.mu.Lock()
		c.statsLocked()
		err := c.healthLocked()
		caughtUp := uint64(len(c.frames)) >= c.queued
		ch := c.changed
		fs := append([]Frame(nil), c.frames...)
		c.mu.Unlock()
		if err != nil {
			t.Fatalf("%v: cannot prove what is absent", err)
		}
		if caughtUp {
			return fs
		}
		if time.Now().After(deadline) {
			t.Fatalf("capture on %s: read %d of %d queued frames after %v", c.Iface, len(fs), c.queued, timeout)
		}
		select {
		case <-ch:
		case <-c.done:
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Snapshot returns the frames captured so far.
func (c *Capture) Snapshot() []Frame {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Frame(nil), c.frames...)
}

// WaitFor waits until cond holds for the frames captured so far and
// returns them; on timeout it returns them with false.
func (c *Capture) WaitFor(timeout time.Duration, cond func([]Frame) bool) ([]Frame, bool) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		c.mu.Lock()
		fs := append([]Frame(nil), c.frames...)
		ch := c.changed
		c.mu.Unlock()
		if cond(fs) {
			return fs, true
		}
		select {
		case <-ch:
		case <-c.done:
			return c.Snapshot(), cond(c.Snapshot())
		case <-timer.C:
			return fs, false
		}
	}
}

// Artifacts says where the files of failed tests are kept.
type Artifacts struct {
	// Fallback is the directory under os.TempDir used when
	// $SOFTRDMA_ARTIFACTS is not set.
	Fallback string
	// Kind names the files in the log lines ("pcap kept: …").
	Kind string
}

// Dir is $SOFTRDMA_ARTIFACTS, else Fallback under os.TempDir.
func (a Artifacts) Dir() string {
	if dir := os.Getenv("SOFTRDMA_ARTIFACTS"); dir != "" {
		return dir
	}
	return filepath.Join(os.TempDir(), a.Fallback)
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// Keep copies a file of a failed test to a folder for the test under Dir
// and logs where.
func (a Artifacts) Keep(t testing.TB, path string) {
	dir := filepath.Join(a.Dir(), unsafeChars.ReplaceAllString(t.Name(), "_"))
	dst := filepath.Join(dir, filepath.Base(path))
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		err = CopyFile(dst, path)
	}
	if err != nil {
		t.Logf("%s %s (could not keep it: %v)", a.Kind, path, err)
		return
	}
	t.Logf("%s kept: %s", a.Kind, dst)
}

// CopyFile copies the file src to dst.
func CopyFile(dst, src string) error {
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
