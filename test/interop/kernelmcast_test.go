package interop

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/nettest"
)

// Package mcast (reliable multicast) on the kernel's rxe: the mcastpeer
// helper built with the rdmacore tag runs in the guests on rxe0 through
// rdma-core, and without it in h0 on softrdma's RoCEv2 device.

const (
	// mcastMessages and mcastMaxSize are the stream of each run: sizes
	// from 1 byte to several times the MTU (1024), drawn from a seed
	// every member shares.
	mcastMessages = 3000
	mcastMaxSize  = 5000
	// mcastRunTimeout bounds a member's whole run (a TCG guest is slow).
	mcastRunTimeout = 300 * time.Second
	// kernelDevice is the guests' rxe device (guest/init names it).
	kernelDevice = "rxe0"
	// softDevice is softrdma's RoCEv2 device of h0's eth0.
	softDevice = "rxe_eth0"
)

var mcastpeerSoft struct {
	once sync.Once
	bin  string
	err  error
}

// mcastpeerHost builds mcastpeer without the rdmacore tag (softrdma's
// devices only) once per run.
func mcastpeerHost(t *testing.T) string {
	t.Helper()
	mcastpeerSoft.once.Do(func() {
		dir, err := os.MkdirTemp("", "softrdma-interop-mcastpeer-")
		if err != nil {
			mcastpeerSoft.err = err
			return
		}
		bin := filepath.Join(dir, "mcastpeer")
		out, err := exec.Command(nettest.GoTool(), "build", "-o", bin, "github.com/softrdma/softrdma/test/interop/mcastpeer").CombinedOutput()
		if err != nil {
			mcastpeerSoft.err = fmt.Errorf("go build mcastpeer: %v\n%s", err, out)
			return
		}
		mcastpeerSoft.bin = bin
	})
	if mcastpeerSoft.err != nil {
		t.Fatal(mcastpeerSoft.err)
	}
	return mcastpeerSoft.bin
}

// mcastMember is a running mcastpeer: in a guest (g set) or in h0.
type mcastMember struct {
	name string
	g    *guest
	gc   *gcmd
	proc *nettest.Proc
}

// startMcastPeer starts mcastpeer in guest g (rdmacore build, on rxe0) or,
// with g nil, in h0 (softrdma's device); role is send or recv.
func (l *lab) startMcastPeer(t *testing.T, g *guest, role string, args ...string) *mcastMember {
	t.Helper()
	if g == nil {
		a := append([]string{"-role", role, "-b", l.hostAddr.String(), "-device", softDevice,
			"-timeout", mcastRunTimeout.String()}, args...)
		p := nettest.StartProc(t, l.h0, mcastpeerHost(t), mcastRunTimeout+30*time.Second, a...)
		return &mcastMember{name: "h0 " + role, proc: p}
	}
	bin := g.install(t, hostBuild(t, "mcastpeer-rdmacore", "github.com/softrdma/softrdma/test/interop/mcastpeer"))
	a := append([]string{"-role", role, "-b", g.addr.String(), "-device", kernelDevice,
		"-timeout", mcastRunTimeout.String()}, args...)
	c := g.start(t, "mcastpeer(rdmacore) "+strings.Join(a, " "),
		fmt.Sprintf("exec timeout -s KILL %d %s %s", int((mcastRunTimeout+30*time.Second).Seconds()), bin, strings.Join(a, " ")))
	return &mcastMember{name: g.name + " " + role, g: g, gc: c}
}

func (m *mcastMember) waitLine(line string) {
	if m.proc != nil {
		m.proc.WaitLine(line, lineTimeout)
		return
	}
	m.gc.waitLine(line, lineTimeout)
}

// finish waits for the member's exit, fails the test unless it is 0, and
// returns its output.
func (m *mcastMember) finish(t *testing.T) string {
	t.Helper()
	if m.proc != nil {
		m.proc.ExpectExit(0, mcastRunTimeout+30*time.Second)
		return m.proc.Output()
	}
	m.gc.expectExit(0, mcastRunTimeout+30*time.Second)
	return m.gc.stdout()
}

// mcastLine returns the member's line starting with prefix, and checks
// that its device line names want.
func mcastLine(t *testing.T, m *mcastMember, out, prefix, wantDevice string) string {
	t.Helper()
	dev := lineWithPrefix(out, "device ")
	if f := strings.Fields(dev); len(f) < 2 || f[1] != wantDevice {
		t.Errorf("%s: device line %q, want device %s", m.name, dev, wantDevice)
	}
	l := lineWithPrefix(out, prefix)
	if l == "" {
		t.Errorf("%s: no line %q…:\n%s", m.name, prefix, nettest.Indent(out))
	}
	return l
}

// field returns the value of key=value in a line.
func field(line, key string) string {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// TestKernelMcast: package mcast's reliable multicast on the kernel's rxe
// (rdma-core, the rdmacore build) in the guests, and between it and
// softrdma's own RoCEv2 device on the host. In each run a sender sends
// mcastMessages messages of 1 to mcastMaxSize bytes (most of several
// packets) and every receiver must get each once, whole and in order (the
// helper checks number, length and bytes); each member checks that its
// Conn is on the device it must be (rxe0 in a guest, rxe_eth0 in h0), and
// the guests' rxe counters show that the kernel carried the packets.
func TestKernelMcast(t *testing.T) {
	l := needLab(t)
	g1, g2 := l.guests[0], l.guests[1]
	common := []string{"-n", fmt.Sprint(mcastMessages), "-max", fmt.Sprint(mcastMaxSize)}

	// run starts the receivers (nil: h0), waits until they joined, starts
	// the sender and checks everyone's result.
	run := func(t *testing.T, sender *guest, receivers ...*guest) string {
		t.Helper()
		grp := randGroups(1)[0]
		args := append([]string{"-m", grp.String()}, common...)
		type before struct{ sent, rcvd uint64 }
		counts := map[*guest]before{}
		for _, g := range append([]*guest{sender}, receivers...) {
			if g != nil {
				counts[g] = before{g.counter(t, "sent_pkts"), g.counter(t, "rcvd_pkts")}
			}
		}
		var rs []*mcastMember
		for _, g := range receivers {
			r := l.startMcastPeer(t, g, "recv", args...)
			rs = append(rs, r)
		}
		for _, r := range rs {
			r.waitLine("ready")
		}
		start := time.Now()
		s := l.startMcastPeer(t, sender, "send", append([]string{"-receivers", fmt.Sprint(len(receivers))}, args...)...)
		dev := func(g *guest) string {
			if g == nil {
				return softDevice
			}
			return kernelDevice
		}
		var notes []string
		var bytes string
		for i, r := range rs {
			out := r.finish(t)
			line := mcastLine(t, r, out, "received ", dev(receivers[i]))
			bytes = field(line, "bytes")
			notes = append(notes, fmt.Sprintf("%s %s %ss", r.name, dev(receivers[i]), field(line, "elapsed_s")))
		}
		sout := s.finish(t)
		sline := mcastLine(t, s, sout, "sent ", dev(sender))
		if got := field(sline, "bytes"); got != bytes {
			t.Errorf("the sender sent %s bytes, the receivers got %s", got, bytes)
		}
		// The kernel carried the stream: at least a packet per MTU.
		var least uint64
		fmt.Sscan(bytes, &least)
		least /= 1024
		for g, b := range counts {
			sent, rcvd := g.counter(t, "sent_pkts")-b.sent, g.counter(t, "rcvd_pkts")-b.rcvd
			if g == sender && sent < least {
				t.Errorf("%s rxe0 sent_pkts +%d, want ≥ %d", g.name, sent, least)
			}
			if g != sender && rcvd < least {
				t.Errorf("%s rxe0 rcvd_pkts +%d, want ≥ %d", g.name, rcvd, least)
			}
			t.Logf("%s rxe0: sent_pkts +%d, rcvd_pkts +%d", g.name, sent, rcvd)
		}
		return fmt.Sprintf("%d messages (%s bytes, 1..%d B) from %s %s in %.1fs (sender: %s; repairs %s); %s",
			mcastMessages, bytes, mcastMaxSize, s.name, dev(sender), time.Since(start).Seconds(),
			field(sline, "elapsed_s")+"s", field(sline, "repairs"), strings.Join(notes, ", "))
	}

	t.Run("guest-to-guest", func(t *testing.T) {
		note := report(t)
		note.set("%s", run(t, g1, g2))
	})
	t.Run("host-to-guests", func(t *testing.T) {
		note := report(t)
		note.set("%s", run(t, nil, g1, g2))
	})
	t.Run("guest-to-host", func(t *testing.T) {
		note := report(t)
		note.set("%s", run(t, g2, nil, g1))
	})
}
