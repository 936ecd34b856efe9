package interop

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/wire"
)

// flow is the RoCEv2 frames one sender QP sent to one group, in capture
// order.
type flow struct {
	src    netip.Addr
	group  netip.Addr
	srcQP  uint32
	frames []roceFrame
}

// flows groups RoCEv2 frames src → group by the DETH SrcQP, ordered by
// first appearance. Frames that do not parse as UD SEND_ONLY are a flow of
// their own with srcQP 0xffffffff.
func flows(frames []roceFrame) []*flow {
	var out []*flow
	by := map[uint32]*flow{}
	for _, f := range frames {
		qp := uint32(0xffffffff)
		var p wire.Packet
		if wire.ParseUD(f.body, &p) == nil {
			qp = p.DETH.SrcQP()
		}
		fl := by[qp]
		if fl == nil {
			fl = &flow{src: f.src, group: f.dst, srcQP: qp}
			by[qp] = fl
			out = append(out, fl)
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
	g := fl.group.As4()
	wantMAC := [6]byte{0x01, 0x00, 0x5e, g[1] & 0x7f, g[2], g[3]}
	var psn uint32
	var sport uint16
	ids := map[uint16]bool{}
	for i, f := range fl.frames {
		errorf := func(format string, args ...any) {
			t.Helper()
			t.Errorf("%s: frame %d of %d (%v → %v, QP %#x): %s", where, i+1, len(fl.frames), fl.src, fl.group, fl.srcQP, fmt.Sprintf(format, args...))
		}
		ip := wire.IPv4(f.ip)
		if len(f.ip) != wire.IPv4HeaderLen {
			errorf("IPv4 header length %d, want %d", len(f.ip), wire.IPv4HeaderLen)
			continue
		}
		ids[ip.ID()] = true
		if f.ethDst != wantMAC {
			errorf("Ethernet destination %x, want %x", f.ethDst, wantMAC)
		}
		if !ip.DF() || ip.Flags()&1 != 0 || ip.FragmentOffset() != 0 {
			errorf("IPv4 flags %#x offset %d, want DF only", ip.Flags(), ip.FragmentOffset())
		}
		if ip.TTL() != 64 {
			errorf("TTL %d, want 64", ip.TTL())
		}
		if ip.TOS() != 0 {
			errorf("TOS %#x, want 0", ip.TOS())
		}
		if c := ip.CalculateChecksum(); c != ip.Checksum() {
			errorf("IPv4 header checksum %#04x, want %#04x", ip.Checksum(), c)
		}
		if e.softrdma && ip.ID() != 0 {
			errorf("IP ID %#x, want 0 (unconnected socket with IP_PMTUDISC_DO)", ip.ID())
		}
		udp := wire.UDP(f.udp)
		if udp.DstPort() != wire.UDPPort {
			errorf("UDP destination port %d", udp.DstPort())
		}
		if udp.Checksum() != 0 {
			errorf("UDP checksum %#04x, want 0", udp.Checksum())
		}
		if int(udp.Length()) != wire.UDPHeaderLen+len(f.body) {
			errorf("UDP length %d, datagram %d", udp.Length(), wire.UDPHeaderLen+len(f.body))
		}
		if i == 0 {
			sport = udp.SrcPort()
		} else if udp.SrcPort() != sport {
			errorf("UDP source port %d, earlier frames %d (must be fixed per QP)", udp.SrcPort(), sport)
		}
		var p wire.Packet
		if err := wire.ParseUD(f.body, &p); err != nil {
			errorf("ParseUD: %v (% x)", err, f.body[:min(len(f.body), 32)])
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
		if p.BTH.TVer() != 0 || p.BTH.MigReq() || p.BTH.PadCount() != -e.size&3 {
			errorf("BTH flags byte %#02x (pad %d, want %d)", f.body[1], p.BTH.PadCount(), -e.size&3)
		}
		if p.BTH.PKey() != 0xffff {
			errorf("P_Key %#x, want 0xffff", p.BTH.PKey())
		}
		if p.BTH.DestQP() != 0xffffff {
			errorf("DestQP %#x, want 0xffffff", p.BTH.DestQP())
		}
		if p.DETH.QKey() != 0x01234567 {
			errorf("Q_Key %#x, want 0x01234567", p.DETH.QKey())
		}
		if e.imm && p.Imm != p.DETH.SrcQP() {
			errorf("imm %#x, want SrcQP %#x (mckey sends its QPN)", p.Imm, p.DETH.SrcQP())
		}
		if i > 0 {
			if want := (psn + 1) & 0xffffff; p.BTH.PSN() != want {
				errorf("PSN %#x, want %#x (previous + 1)", p.BTH.PSN(), want)
			}
		}
		psn = p.BTH.PSN()
		if len(p.Payload) != e.size {
			errorf("payload %d bytes, want %d", len(p.Payload), e.size)
		} else if e.softrdma {
			for j, b := range p.Payload {
				if b != byte(j*7+3) {
					errorf("payload byte %d = %#02x, want mckey's pattern %#02x", j, b, byte(j*7+3))
					break
				}
			}
		}
		if got := wire.ICRCv4(ip, udp, p.Body); got != p.ICRC {
			errorf("ICRC on the wire %08x, recomputed over the captured headers %08x", p.ICRC, got)
		}
	}
	return fmt.Sprintf("QP %#x sport %d: %d×%dB, %d IP IDs", fl.srcQP, sport, len(fl.frames), e.size, len(ids))
}

// sameFrames checks that the frames forwarded to another port are the bytes
// the sender put on its port (IP header and UDP payload).
func sameFrames(t *testing.T, what string, sent, fwd []roceFrame) {
	t.Helper()
	if len(sent) != len(fwd) {
		t.Errorf("%s: %d frames sent, %d forwarded", what, len(sent), len(fwd))
	}
	for i := range min(len(sent), len(fwd)) {
		if string(sent[i].body) != string(fwd[i].body) || string(sent[i].ip[12:]) != string(fwd[i].ip[12:]) {
			t.Errorf("%s: frame %d differs", what, i+1)
		}
	}
}

// waitRoCE waits until capture c holds count RoCEv2 frames src → group,
// then a little longer to catch extra ones, and returns them all.
func waitRoCE(t *testing.T, c *capture, src, group netip.Addr, count int) []roceFrame {
	t.Helper()
	if _, ok := c.waitFor(wireTimeout, roceCount(src, group, count)); !ok {
		t.Errorf("capture %s: fewer than %d RoCEv2 frames %v → %v within %v (have %d)", c.iface, count, src, group, wireTimeout,
			len(roceFrames(c.snapshot(), src, group)))
	}
	time.Sleep(300 * time.Millisecond)
	return roceFrames(c.snapshot(), src, group)
}

// noRoCE fails the test when capture c holds frames to group.
func noRoCE(t *testing.T, c *capture, group netip.Addr, why string) {
	t.Helper()
	if n := len(roceFrames(c.snapshot(), netip.Addr{}, group)); n != 0 {
		t.Errorf("%d RoCEv2 frames to %v on %s: %s", n, group, c.iface, why)
	}
}

// reported reports whether src sent an IGMP membership report for group.
func reported(c *capture, src, group netip.Addr) bool {
	for _, e := range igmpAbout(c.snapshot(), src, group) {
		if e.join() {
			return true
		}
	}
	return false
}

// waitIGMP waits until capture c shows an IGMP message from src about group
// for which want holds.
func waitIGMP(c *capture, src, group netip.Addr, want func(igmpEvent) bool) bool {
	_, ok := c.waitFor(wireTimeout, func(fs []frame) bool {
		for _, e := range igmpAbout(fs, src, group) {
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
func igmpKinds(c *capture, src, group netip.Addr) string {
	var kinds []string
	for _, e := range igmpAbout(c.snapshot(), src, group) {
		k := fmt.Sprintf("type %#x", e.typ)
		if e.typ == igmpV3Report {
			k = fmt.Sprintf("v3 record %d/%d sources", e.rec, e.nsrc)
		}
		if len(kinds) == 0 || kinds[len(kinds)-1] != k {
			kinds = append(kinds, k)
		}
	}
	return strings.Join(kinds, ", ")
}

func logIGMP(t *testing.T, caps map[string]*capture) {
	t.Helper()
	names := make([]string, 0, len(caps))
	for n := range caps {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "%s:\n", n)
		for _, e := range igmpEvents(caps[n].snapshot()) {
			fmt.Fprintf(&b, "\t%v\n", e)
		}
	}
	t.Logf("IGMP seen:\n%s", b.String())
}

// payloadLen returns the payload length of a RoCEv2 UD frame.
func payloadLen(f roceFrame) (int, bool) {
	var p wire.Packet
	if wire.ParseUD(f.body, &p) != nil {
		return 0, false
	}
	return len(p.Payload), true
}

// igmpJoinLeave describes the first membership report and the first leave
// src sent about group: "join v3 record 4/0 sources, leave v3 record 3/0 sources".
func igmpJoinLeave(c *capture, src, group netip.Addr) string {
	kind := func(e igmpEvent) string {
		if e.typ == igmpV3Report {
			return fmt.Sprintf("v3 record %d/%d sources", e.rec, e.nsrc)
		}
		return fmt.Sprintf("type %#x", e.typ)
	}
	join, leave := "none", "none"
	for _, e := range igmpAbout(c.snapshot(), src, group) {
		if e.join() && join == "none" {
			join = kind(e)
		}
		if e.leave() && leave == "none" {
			leave = kind(e)
		}
	}
	return "join " + join + ", leave " + leave
}
