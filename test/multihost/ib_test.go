package multihost

import (
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/test/nettest"
	"github.com/softrdma/softrdma/wire"
)

var (
	softsmOnce sync.Once
	softsmBin  string
	softsmErr  error
)

func buildSoftsm(t *testing.T) string {
	t.Helper()
	softsmOnce.Do(func() {
		softsmBin = filepath.Join(filepath.Dir(mckeyBin), "softsm")
		out, err := exec.Command(nettest.GoTool(), "build", "-o", softsmBin, "github.com/softrdma/softrdma/cmd/softsm").CombinedOutput()
		if err != nil {
			softsmErr = fmt.Errorf("building softsm: %v\n%s", err, out)
		}
	})
	if softsmErr != nil {
		t.Fatal(softsmErr)
	}
	return softsmBin
}

// addHost adds host idx (its namespace, a veth into br0, 10.77.0.1<idx>).
func (tp *topo) addHost(idx int) *host {
	tp.t.Helper()
	h := &host{
		idx:  idx,
		ns:   strings.TrimSuffix(tp.sw, "sw") + fmt.Sprintf("h%d", idx),
		addr: netip.MustParseAddr(fmt.Sprintf("%s1%d", subnet, idx)),
		port: fmt.Sprintf("p%d", idx),
	}
	tp.hosts = append(tp.hosts, h)
	run(tp.t, "ip", "netns", "add", h.ns)
	run(tp.t, "ip", "-n", h.ns, "link", "set", "lo", "up")
	run(tp.t, "ip", "-n", tp.sw, "link", "add", h.port, "mtu", "1500", "type", "veth", "peer", "name", "eth0", "netns", h.ns)
	run(tp.t, "ip", "-n", tp.sw, "link", "set", h.port, "master", "br0")
	run(tp.t, "ip", "-n", tp.sw, "link", "set", h.port, "up")
	run(tp.t, "ip", "-n", h.ns, "addr", "add", h.addr.String()+"/24", "dev", "eth0")
	run(tp.t, "ip", "-n", h.ns, "link", "set", "eth0", "up")
	return h
}

// TestIBAcrossHosts runs the emulated InfiniBand subnet across hosts: the
// subnet manager (softsm: SM, SA and switch) in a fourth host, receivers in
// h2 and h3, a send-only sender in h1. Everything crosses the bridge as
// UDP to and from the SM; an IB join sends no IGMP.
func TestIBAcrossHosts(t *testing.T) {
	tp := newTopo(t)
	smHost := tp.addHost(4)
	tp.captureAll()
	sm := startProc(t, smHost.ns, buildSoftsm(t), "-listen", smHost.addr.String()+":4792", "-sa-listen", smHost.addr.String()+":4793", "-sa-allow-remote")
	sm.WaitLine(fmt.Sprintf("softsm: listening fabric %v:4792 sa %v:4793", smHost.addr, smHost.addr), 20*time.Second)
	env := "SOFTRDMA_SM=" + smHost.addr.String() + ":4792"
	ib := func(h *host, args ...string) *nettest.Proc {
		return startProc(t, h.ns, "/usr/bin/env", append([]string{env, mckeyBin}, args...)...)
	}
	const group = "230.11.12.13"
	joined := "mckey: joined dgid: ff12:4001:ffff::60b:c0d mlid 0xc001 sl 0"
	var rx []*nettest.Proc
	for _, h := range []*host{tp.h(2), tp.h(3)} {
		p := ib(h, "-m", group, "-b", h.addr.String(), "-C", "20", "-S", "1024", "--join-pause", "1s", "--timeout", "60s", "--verify")
		p.WaitLine(joined, 20*time.Second)
		rx = append(rx, p)
	}
	tx := ib(tp.h(1), "-m", group, "-b", tp.h(1).addr.String(), "-s", "-o", "-C", "20", "-S", "1024", "--join-pause", "1s")
	for _, p := range append([]*nettest.Proc{tx}, rx...) {
		if code := p.Wait(60 * time.Second); code != 0 {
			t.Fatalf("%s: exit %d\n%s", p.Name, code, p.Output())
		}
	}
	for _, p := range rx {
		if !nettest.HasLine(p.Output(), "mckey: verified 20 messages") {
			t.Errorf("%s:\n%s", p.Name, p.Output())
		}
	}
	if !nettest.HasLine(tx.Output(), joined) {
		t.Errorf("sender:\n%s", tx.Output())
	}
	// IB joins go to the SA, never to IGMP (an absence: the captures must
	// have read everything queued to them, without drops).
	for _, h := range []*host{tp.h(1), tp.h(2), tp.h(3)} {
		if ev := nettest.IGMPAbout(tp.caps[h.port].Synced(t, wireTimeout), h.addr, netip.MustParseAddr(group)); len(ev) > 0 {
			t.Errorf("%v sent IGMP for an IB group: %v", h, ev)
		}
	}
	// Delivery is proven where the data is: each receiver verified its 20
	// messages above. The path is proven on the wire: every IB packet of a
	// port goes to the SM host, which as the switch forwards it to the
	// members. The receivers got 20 messages each, so 20 IB data packets
	// (1024-byte payloads) from the SM crossed p2 and p3, and 20 from h1 to
	// the SM crossed p1; wait until the captures have read them (their
	// reader runs behind under load), and fail on a capture that dropped.
	want := func(src, dst netip.Addr) func([]nettest.Frame) bool {
		return func(fs []nettest.Frame) bool { return ibData(fs, src, dst, 1024) >= 20 }
	}
	for _, c := range []struct {
		port     string
		src, dst netip.Addr
	}{
		{"p1", tp.h(1).addr, smHost.addr},
		{"p2", smHost.addr, tp.h(2).addr},
		{"p3", smHost.addr, tp.h(3).addr},
	} {
		cp := tp.caps[c.port]
		if fs, ok := cp.WaitFor(wireTimeout, want(c.src, c.dst)); !ok {
			t.Errorf("%d IB data packets %v → %v on %s within %v, want 20 (capture: %v)", ibData(fs, c.src, c.dst, 1024), c.src, c.dst, c.port, wireTimeout, cp.Health())
		}
	}
	// Nothing went from h1 straight to a receiver.
	fs := tp.caps["p1"].Synced(t, wireTimeout)
	for _, h := range []*host{tp.h(2), tp.h(3)} {
		if n := ibData(fs, tp.h(1).addr, h.addr, -1); n != 0 {
			t.Errorf("h1 sent %d IB packets straight to %v, bypassing the SM", n, h)
		}
	}
}

// ibData counts the IB packets (fabric datagrams that are not control
// messages) from src to dst in UDP datagrams, with a UD payload of size
// bytes (any size when size < 0).
func ibData(fs []nettest.Frame, src, dst netip.Addr, size int) int {
	n := 0
	for _, f := range fs {
		ip, ok := nettest.ParseIPv4(f)
		if !ok || ip.Src != src || ip.Dst != dst || ip.Proto != 17 || len(ip.Payload) < 8 {
			continue
		}
		// A UDP GSO send is one frame on the capture: its payload is the
		// IB packets back to back, each as long as its LRH says.
		for b := ip.Payload[8:]; len(b) > 0; {
			seg := b
			if len(b) >= 8 {
				if l := int(wire.LRH(b).PktLen())*4 + 2; l >= 8 && l < len(b) {
					seg = b[:l]
				}
			}
			b = b[len(seg):]
			var p fabric.Packet
			if fabric.IsControl(seg) || fabric.Parse(seg, &p) != nil {
				continue
			}
			if size < 0 || len(p.UD.Payload) == size {
				n++
			}
		}
	}
	return n
}
