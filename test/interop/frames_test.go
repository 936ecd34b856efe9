package interop

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/nettest"
	"github.com/softrdma/softrdma/wire"
)

// flow is the RoCEv2 frames one sender QP sent to one group, in capture
// order.
type flow struct {
	src    netip.Addr
	group  netip.Addr
	srcQP  uint32
	frames []nettest.RoCEFrame
}

// flows groups RoCEv2 frames src → group by the DETH SrcQP, ordered by
// first appearance. A QPN names a QP only while its process lives: a
// sender that starts after another exited may get the same ephemeral send
// port, hence the same QPN; so a frame whose PSN does not follow the
// previous one of its QPN starts a new flow. Frames that do not parse as
// UD SEND_ONLY are a flow of their own with srcQP 0xffffffff.
func flows(frames []nettest.RoCEFrame) []*flow {
	var out []*flow
	by := map[uint32]*flow{}
	last := map[uint32]uint32{}
	for _, f := range frames {
		qp := uint32(0xffffffff)
		var p wire.Packet
		parsed := wire.ParseUD(f.Body, &p) == nil
		if parsed {
			qp = p.DETH.SrcQP()
		}
		fl := by[qp]
		if fl != nil && parsed && p.BTH.PSN() != (last[qp]+1)&0xFFFFFF {
			fl = nil
		}
		if fl == nil {
			fl = &flow{src: f.Src, group: f.Dst, srcQP: qp}
			by[qp] = fl
			out = append(out, fl)
		}
		if parsed {
			last[qp] = p.BTH.PSN()
		}
		fl.frames = append(fl.frames, f)
	}
	return out
}

// expect is what a flow must look like.
type expect struct {
	size     int  // payload bytes
	count    int  // frames
	imm      bool // SEND_ONLY_WITH_IMMEDIATE (0x65) with imm = SrcQP, else SEND_ONLY (0x64)
	softrdma bool // sent by softrdma's mckey: its payload pattern, IP ID 0
	rxe      bool // sent by Linux rxe: UDP source port = rxe's hash of the QPN
}

// checkFlow checks that fl holds exactly the frames one mckey sender QP
// sends and that each is byte-valid RoCEv2 (ICRC recomputed over the
// captured headers). It returns a short description.
func checkFlow(t *testing.T, where string, fl *flow, e expect) string {
	t.Helper()
	if len(fl.frames) != e.count {
		t.Errorf("%s: %d RoCEv2 frames %v → %v from QP %#x, want %d", where, len(fl.frames), fl.src, fl.group, fl.srcQP, e.count)
	}
	wantMAC := nettest.MulticastMAC(fl.group)
	var psn uint32
	var sport uint16
	ids := map[uint16]bool{}
	for i, f := range fl.frames {
		errorf := func(format string, args ...any) {
			t.Helper()
			t.Errorf("%s: frame %d of %d (%v → %v, QP %#x): %s", where, i+1, len(fl.frames), fl.src, fl.group, fl.srcQP, fmt.Sprintf(format, args...))
		}
		if !nettest.CheckIPv4(t, f, wantMAC, errorf) {
			continue
		}
		ip := wire.IPv4(f.IP)
		ids[ip.ID()] = true
		if e.softrdma && ip.ID() != 0 {
			errorf("IP ID %#x, want 0 (unconnected socket with IP_PMTUDISC_DO)", ip.ID())
		}
		udp := wire.UDP(f.UDP)
		nettest.CheckUDP(t, f, i == 0, &sport, errorf)
		var p wire.Packet
		if err := wire.ParseUD(f.Body, &p); err != nil {
			errorf("ParseUD: %v (% x)", err, f.Body[:min(len(f.Body), 32)])
			continue
		}
		if e.rxe && udp.SrcPort() != wire.RxeSrcPort(p.DETH.SrcQP()) {
			errorf("UDP source port %d, rxe's hash of QPN %#x is %d", udp.SrcPort(), p.DETH.SrcQP(), wire.RxeSrcPort(p.DETH.SrcQP()))
		}
		wantOp := uint8(0x64)
		if e.imm {
			wantOp = 0x65
		}
		if op := p.BTH.Opcode(); op != wantOp {
			errorf("opcode %#x, want %#x", op, wantOp)
		}
		nettest.CheckMcastUD(t, f, &p, e.size, errorf)
		if e.imm && p.Imm != p.DETH.SrcQP() {
			errorf("imm %#x, want SrcQP %#x (mckey sends its QPN)", p.Imm, p.DETH.SrcQP())
		}
		if i > 0 {
			if want := (psn + 1) & 0xffffff; p.BTH.PSN() != want {
				errorf("PSN %#x, want %#x (previous + 1)", p.BTH.PSN(), want)
			}
		}
		psn = p.BTH.PSN()
		nettest.CheckPayload(t, f, &p, e.size, e.softrdma, errorf)
	}
	return fmt.Sprintf("QP %#x sport %d: %d×%dB, %d IP IDs", fl.srcQP, sport, len(fl.frames), e.size, len(ids))
}

// sameFrames checks that the frames forwarded to another port are the bytes
// the sender put on its port (IP header and UDP payload).
func sameFrames(t *testing.T, what string, sent, fwd []nettest.RoCEFrame) {
	t.Helper()
	if len(sent) != len(fwd) {
		t.Errorf("%s: %d frames sent, %d forwarded", what, len(sent), len(fwd))
	}
	for i := range min(len(sent), len(fwd)) {
		if string(sent[i].Body) != string(fwd[i].Body) || string(sent[i].IP[12:]) != string(fwd[i].IP[12:]) {
			t.Errorf("%s: frame %d differs", what, i+1)
		}
	}
}

// waitRoCE waits until capture c holds count RoCEv2 frames src → group,
// then a little longer to catch extra ones, and returns them all.
func waitRoCE(t *testing.T, c *nettest.Capture, src, group netip.Addr, count int) []nettest.RoCEFrame {
	t.Helper()
	if _, ok := c.WaitFor(wireTimeout, nettest.RoCECount(src, group, count)); !ok {
		t.Errorf("capture %s: fewer than %d RoCEv2 frames %v → %v within %v (have %d)", c.Iface, count, src, group, wireTimeout,
			len(nettest.RoCEFrames(c.Snapshot(), src, group)))
	}
	time.Sleep(300 * time.Millisecond)
	return nettest.RoCEFrames(c.Synced(t, wireTimeout), src, group)
}

// noRoCE fails the test when capture c holds frames to group.
func noRoCE(t *testing.T, c *nettest.Capture, group netip.Addr, why string) {
	t.Helper()
	if n := len(nettest.RoCEFrames(c.Synced(t, wireTimeout), netip.Addr{}, group)); n != 0 {
		t.Errorf("%d RoCEv2 frames to %v on %s: %s", n, group, c.Iface, why)
	}
}

// reported reports whether src sent an IGMP membership report for group.
func reported(t *testing.T, c *nettest.Capture, src, group netip.Addr) bool {
	t.Helper()
	for _, e := range nettest.IGMPAbout(c.Synced(t, wireTimeout), src, group) {
		if e.Join() {
			return true
		}
	}
	return false
}

// waitIGMP waits until capture c shows an IGMP message from src about group
// for which want holds.
func waitIGMP(c *nettest.Capture, src, group netip.Addr, want func(nettest.IGMPEvent) bool) bool {
	_, ok := c.WaitFor(wireTimeout, func(fs []nettest.Frame) bool {
		for _, e := range nettest.IGMPAbout(fs, src, group) {
			if want(e) {
				return true
			}
		}
		return false
	})
	return ok
}

// igmpKinds describes the IGMP messages from src about group: "v3 type 4,
// v3 type 3" etc., in order, without repetitions in a row.
func igmpKinds(c *nettest.Capture, src, group netip.Addr) string {
	var kinds []string
	for _, e := range nettest.IGMPAbout(c.Snapshot(), src, group) {
		k := fmt.Sprintf("type %#x", e.Type)
		if e.Type == nettest.IGMPV3Report {
			k = fmt.Sprintf("v3 record %d/%d sources", e.Rec, e.NSrc)
		}
		if len(kinds) == 0 || kinds[len(kinds)-1] != k {
			kinds = append(kinds, k)
		}
	}
	return strings.Join(kinds, ", ")
}

func logIGMP(t *testing.T, caps map[string]*nettest.Capture) {
	t.Helper()
	names := make([]string, 0, len(caps))
	for n := range caps {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "%s:\n", n)
		for _, e := range nettest.IGMPEvents(caps[n].Snapshot()) {
			fmt.Fprintf(&b, "\t%v\n", e)
		}
	}
	t.Logf("IGMP seen:\n%s", b.String())
}

// payloadLen returns the payload length of a RoCEv2 UD frame.
func payloadLen(f nettest.RoCEFrame) (int, bool) {
	var p wire.Packet
	if wire.ParseUD(f.Body, &p) != nil {
		return 0, false
	}
	return len(p.Payload), true
}

// igmpJoinLeave describes the first membership report and the first leave
// src sent about group: "join v3 record 4/0 sources, leave v3 record 3/0 sources".
// The join is the state-change report the host sends on joining; a
// current-state report (MODE_IS_EXCLUDE, record 2) answers a querier's
// general query, which may come at any time (once just as the host
// joined), and counts only when no state-change report was seen.
func igmpJoinLeave(c *nettest.Capture, src, group netip.Addr) string {
	kind := func(e nettest.IGMPEvent) string {
		if e.Type == nettest.IGMPV3Report {
			return fmt.Sprintf("v3 record %d/%d sources", e.Rec, e.NSrc)
		}
		return fmt.Sprintf("type %#x", e.Type)
	}
	join, answer, leave := "none", "none", "none"
	for _, e := range nettest.IGMPAbout(c.Snapshot(), src, group) {
		switch {
		case e.Join() && e.Type == nettest.IGMPV3Report && e.Rec == nettest.RecIsExclude:
			if answer == "none" {
				answer = kind(e)
			}
		case e.Join() && join == "none":
			join = kind(e)
		}
		if e.Leave() && leave == "none" {
			leave = kind(e)
		}
	}
	if join == "none" {
		join = answer
	}
	return "join " + join + ", leave " + leave
}
