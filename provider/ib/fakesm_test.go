package ib

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
)

// fakeSM is a scripted subnet manager on loopback: it answers every
// attach with portInfo and records the control messages it receives.
// Tests send the port arbitrary datagrams from it (send) or from another
// socket (sendFrom).
type fakeSM struct {
	t    *testing.T
	conn *net.UDPConn

	mu       sync.Mutex
	portInfo fabric.Control
	quiet    bool // attaches go unanswered
	// cookie, when set, is required: an attach without it is answered
	// with a retry carrying it (address validation). cookies are the
	// cookies of the attaches received, in order (nil: none).
	cookie  []byte
	cookies [][]byte
	port    netip.AddrPort  // the port's address, once it attached
	got     map[string]int  // control messages by type
	data    int             // IB packets received
	flows   []fabric.Flow   // flow control packets received
	directs []fabric.Direct // direct forwarding messages received
	cond    *sync.Cond
	wg      sync.WaitGroup
}

func startFakeSM(t *testing.T) *fakeSM {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeSM{t: t, conn: c, got: map[string]int{}, portInfo: fabric.Control{
		Type: fabric.TypePortInfo, LID: 2, SMLID: fabric.SMLID, SubnetPrefix: fabric.DefaultSubnetPrefix,
		PKeys: []uint16{fabric.DefaultPKey}, Epoch: 1, MTU: fabric.PortMTU, Rate: fabric.PortRate, State: fabric.StateActive,
	}}
	f.cond = sync.NewCond(&f.mu)
	f.wg.Add(1)
	go f.loop()
	t.Cleanup(func() { c.Close(); f.wg.Wait() })
	return f
}

func (f *fakeSM) addr() string { return f.conn.LocalAddr().String() }

func (f *fakeSM) loop() {
	defer f.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, from, err := f.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		if fabric.IsDirect(buf[:n]) {
			var m fabric.Direct
			if fabric.DecodeDirect(buf[:n], &m) == nil {
				m.Session = nil
				f.mu.Lock()
				f.directs = append(f.directs, m)
				f.cond.Broadcast()
				f.mu.Unlock()
			}
			continue
		}
		if !fabric.IsControl(buf[:n]) {
			fl, err := fabric.DecodeFlow(buf[:n])
			f.mu.Lock()
			if err == nil {
				f.flows = append(f.flows, fl)
			} else {
				f.data++
			}
			f.cond.Broadcast()
			f.mu.Unlock()
			continue
		}
		c, err := fabric.DecodeControl(buf[:n])
		if err != nil {
			continue
		}
		f.mu.Lock()
		f.got[c.Type]++
		f.port = from
		pi, quiet, cookie := f.portInfo, f.quiet, f.cookie
		if c.Type == fabric.TypeAttach {
			f.cookies = append(f.cookies, c.Cookie)
		}
		f.cond.Broadcast()
		f.mu.Unlock()
		switch {
		case c.Type != fabric.TypeAttach || quiet:
		case cookie != nil && string(c.Cookie) != string(cookie):
			f.conn.WriteToUDPAddrPort(fabric.EncodeControl(&fabric.Control{Type: fabric.TypeRetry, GUID: c.GUID, Cookie: cookie}), from)
		default:
			pi.GUID = c.GUID
			f.conn.WriteToUDPAddrPort(fabric.EncodeControl(&pi), from)
		}
	}
}

// setQuiet makes the fake SM leave later attaches unanswered (or answer
// them again).
func (f *fakeSM) setQuiet(q bool) {
	f.mu.Lock()
	f.quiet = q
	f.mu.Unlock()
}

// setPortInfo changes what later attaches are answered with.
func (f *fakeSM) setPortInfo(fn func(*fabric.Control)) {
	f.mu.Lock()
	fn(&f.portInfo)
	f.mu.Unlock()
}

// waitFor waits until n control messages of type typ arrived.
func (f *fakeSM) waitFor(typ string, n int) {
	f.t.Helper()
	f.waitUntil(func() bool { return f.got[typ] >= n }, func() string {
		return fmt.Sprintf("%d %q messages, want %d", f.got[typ], typ, n)
	})
}

// waitUntil waits until cond (called with f.mu held) is true; what
// describes the state on a timeout.
func (f *fakeSM) waitUntil(cond func() bool, what func() string) {
	f.t.Helper()
	timer := time.AfterFunc(10*time.Second, func() { f.mu.Lock(); f.cond.Broadcast(); f.mu.Unlock() })
	defer timer.Stop()
	deadline := time.Now().Add(10 * time.Second)
	f.mu.Lock()
	defer f.mu.Unlock()
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("fake SM: %s", what())
		}
		f.cond.Wait()
	}
}

// count returns how many control messages of type typ arrived.
func (f *fakeSM) count(typ string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.got[typ]
}

// send sends b to the port from the SM's address.
func (f *fakeSM) send(b []byte) {
	f.mu.Lock()
	to := f.port
	f.mu.Unlock()
	if _, err := f.conn.WriteToUDPAddrPort(b, to); err != nil {
		f.t.Fatal(err)
	}
}

// sendFrom sends b to the port from another socket of the host.
func (f *fakeSM) sendFrom(c *net.UDPConn, b []byte) {
	f.mu.Lock()
	to := f.port
	f.mu.Unlock()
	if _, err := c.WriteToUDPAddrPort(b, to); err != nil {
		f.t.Fatal(err)
	}
}

// openOn opens a port on the fake SM (SA requests go unanswered: a short
// SA timeout keeps Open quick).
func openOn(t *testing.T, f *fakeSM, local string) *Device {
	t.Helper()
	d, err := Open(Config{SM: f.addr(), Local: netip.MustParseAddr(local), SATimeout: 20 * time.Millisecond, SARetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	return d
}
