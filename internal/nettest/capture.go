package nettest

import (
	"bufio"
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

	mu      sync.Mutex
	frames  []Frame
	changed chan struct{} // closed and replaced on every frame
	err     error
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
	c.h.Close()
	<-c.done
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
