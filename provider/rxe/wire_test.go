package rxe

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/net/bpf"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// TestSentFramesOnTheWire captures the device's datagrams with a plain
// UDP socket joined to the group and checks every field and the ICRC,
// recomputed over the IPv4 header the kernel sent (ID 0, DF). As root it
// also reads the real IP/UDP headers from a packet socket on lo.
func TestSentFramesOnTheWire(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	// A socket with the options of the device's, as package net's (to
	// read it with a deadline).
	capConn, err := mmsg.ListenUDP("udp4", "0.0.0.0:"+strconv.Itoa(wire.UDPPort), recvSockSetup(false))
	if err != nil {
		t.Fatal(err)
	}
	defer capConn.Close()
	if err := joinGroup(capConn, g, lo.Index); err != nil {
		t.Fatal(err)
	}
	var pkt *packetCapture
	if os.Geteuid() == 0 {
		if pkt, err = newPacketCapture(lo.Index, g); err != nil {
			t.Logf("no packet socket: %v", err)
		} else {
			defer pkt.close()
		}
	}

	q := newQP(t, d, newFakeRx(), 0, 0x1234)
	qi := q.drv.(*qp)
	// Walk the QP again to RTS with a send PSN about to wrap.
	for _, m := range []struct {
		a verbs.QPAttr
		m verbs.QPAttrMask
	}{
		{verbs.QPAttr{State: verbs.QPSReset}, verbs.QPAttrState},
		{verbs.QPAttr{State: verbs.QPSInit, QKey: 0x1234, PortNum: 1}, verbs.QPAttrState | verbs.QPAttrQKey | verbs.QPAttrPort | verbs.QPAttrPKeyIdx},
		{verbs.QPAttr{State: verbs.QPSRTR}, verbs.QPAttrState},
		{verbs.QPAttr{State: verbs.QPSRTS, SQPSN: 0xFFFFFE}, verbs.QPAttrState | verbs.QPAttrSQPSN},
	} {
		if err := q.Modify(&m.a, m.m); err != nil {
			t.Fatal(err)
		}
	}
	// Flows that differ in TTL, TOS or length, and back to an earlier one
	// (the QP keeps the last flow's headers and ICRC prefix).
	sends := []softverbs.UDSend{
		{RemoteQPN: verbs.MulticastQPN, RemoteQKey: 0x80010000, Payload: []byte("abc"), Solicited: true},
		{RemoteQPN: verbs.MulticastQPN, RemoteQKey: 0x01234567, Payload: bytes.Repeat([]byte{0xA5}, 1024), HasImm: true, Imm: 0x01020304},
		{RemoteQPN: verbs.MulticastQPN, RemoteQKey: 0xFFFFFFFF, Payload: nil},
		{RemoteQPN: verbs.MulticastQPN, RemoteQKey: 0x80010000, Payload: []byte("xyz")},
		{RemoteQPN: verbs.MulticastQPN, RemoteQKey: 0x80010000, Payload: []byte("xyz!")},
		{RemoteQPN: verbs.MulticastQPN, RemoteQKey: 0x80010000, Payload: []byte("xyz!")},
	}
	hops := []uint8{10, 11, 12, 10, 10, 13}
	tcs := []uint8{0, 4, 8, 0, 0, 0}
	for i, s := range sends {
		ah := mcastAH(g)
		ah.GRH.HopLimit = hops[i]
		ah.GRH.TrafficClass = tcs[i]
		s.AH = ah
		if err := q.Send(&s); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 9000)
	oob := make([]byte, 512)
	capConn.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i, s := range sends {
		var b []byte
		var m rxMeta
		for {
			n, oobn, _, from, err := capConn.ReadMsgUDPAddrPort(buf, oob)
			if err != nil {
				t.Fatalf("capture: %v", err)
			}
			var name [16]byte
			name[0] = unix.AF_INET
			binary.BigEndian.PutUint16(name[2:], from.Port())
			a := from.Addr().Unmap().As4()
			copy(name[4:], a[:])
			parseRxMeta(&m, name[:], oob[:oobn], false)
			if m.dst == g {
				b = buf[:n]
				break
			}
		}
		var p wire.Packet
		if err := wire.ParseUD(b, &p); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		wantOp := wire.OpUDSendOnly
		if s.HasImm {
			wantOp = wire.OpUDSendOnlyImm
		}
		psn := (0xFFFFFE + uint32(i)) & 0xFFFFFF
		if p.BTH.Opcode() != wantOp || p.BTH.Solicited() != s.Solicited || p.BTH.PKey() != 0xFFFF ||
			p.BTH.DestQP() != wire.MulticastQPN || p.BTH.PSN() != psn || p.BTH.TVer() != 0 || p.BTH.AckReq() ||
			p.BTH[4] != 0 || p.BTH.PadCount() != -len(s.Payload)&3 || p.BTH.MigReq() {
			t.Errorf("frame %d BTH % x", i, []byte(p.BTH))
		}
		if p.DETH.QKey() != s.RemoteQKey || p.DETH.SrcQP() != q.QPN() || p.DETH[4] != 0 {
			t.Errorf("frame %d DETH % x", i, []byte(p.DETH))
		}
		if !bytes.Equal(p.Payload, s.Payload) || p.HasImm != s.HasImm || p.Imm != s.Imm {
			t.Errorf("frame %d payload/imm", i)
		}
		if m.src != netip.MustParseAddr("127.0.0.1") || m.srcPort != qi.blk.port4 || m.ttl != hops[i] || m.tos != tcs[i] {
			t.Errorf("frame %d meta %+v (send port %d)", i, m, qi.blk.port4)
		}
		var iph [20]byte
		ip := wire.IPv4(iph[:])
		ip.Encode(wire.IPv4Fields{TOS: m.tos, TotalLength: uint16(28 + len(b)), ID: 0, DF: true, TTL: m.ttl, Protocol: 17, Src: m.src, Dst: m.dst})
		var udph [8]byte
		udp := wire.UDP(udph[:])
		udp.Encode(m.srcPort, wire.UDPPort, uint16(8+len(b)))
		if got := wire.ICRCv4(ip, udp, p.Body); got != p.ICRC {
			t.Errorf("frame %d ICRC %#x, recomputed %#x", i, p.ICRC, got)
		}

		if pkt != nil {
			raw := pkt.next(t, g)
			rip := wire.IPv4(raw[:20])
			rudp := wire.UDP(raw[20:28])
			if rip.ID() != 0 || !rip.DF() || rip.TTL() != hops[i] || rip.TOS() != tcs[i] ||
				rudp.Checksum() != 0 || rudp.SrcPort() != qi.blk.port4 || rudp.DstPort() != wire.UDPPort ||
				!bytes.Equal(raw[28:], b) {
				t.Errorf("frame %d on the wire: % x", i, raw[:28])
			}
			if got := wire.ICRCv4(rip, rudp, raw[28:len(raw)-4]); got != wire.GetICRC(raw[len(raw)-4:]) {
				t.Errorf("frame %d wire ICRC mismatch", i)
			}
		}
	}
	if pkt != nil {
		t.Logf("%d frames also checked on a packet socket", len(sends))
	}
}

// packetCapture reads IPv4 packets of one interface from an AF_PACKET
// socket (root only).
type packetCapture struct{ fd int }

// newPacketCapture opens an AF_PACKET socket on the interface that takes
// only IPv4 UDP datagrams to port 4791 of group: a kernel filter, so that
// other traffic on a busy lo cannot fill its buffer and push the frames
// the test waits for out.
func newPacketCapture(ifindex int, group netip.Addr) (*packetCapture, error) {
	proto := int(htons(unix.ETH_P_IP))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, proto)
	if err != nil {
		return nil, err
	}
	g4 := group.As4()
	prog, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 0, Size: 1},
		bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0xf0},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 0x40, SkipTrue: 8},
		bpf.LoadAbsolute{Off: 9, Size: 1},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 17, SkipTrue: 6},
		bpf.LoadAbsolute{Off: 16, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: binary.BigEndian.Uint32(g4[:]), SkipTrue: 4},
		bpf.LoadMemShift{Off: 0},
		bpf.LoadIndirect{Off: 2, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(wire.UDPPort), SkipTrue: 1},
		bpf.RetConstant{Val: 0xffff},
		bpf.RetConstant{Val: 0},
	})
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	filter := make([]unix.SockFilter, len(prog))
	for i, in := range prog {
		filter[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifindex}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	tv := unix.Timeval{Sec: 5}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	return &packetCapture{fd: fd}, nil
}

func (c *packetCapture) close() { unix.Close(c.fd) }

// next returns the next UDP 4791 packet to group (IP header onwards).
func (c *packetCapture) next(t *testing.T, group netip.Addr) []byte {
	t.Helper()
	buf := make([]byte, 70000)
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, _, err := unix.Recvfrom(c.fd, buf, 0)
		if err == unix.EINTR && time.Now().Before(deadline) {
			continue // a runtime signal, not the end of the wait
		}
		if err != nil {
			t.Fatalf("packet capture: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("packet capture: no RoCEv2 frame to %v within 5s", group)
		}
		b := buf[:n]
		if n < 28 || b[0] != 0x45 || b[9] != 17 {
			continue
		}
		ip := wire.IPv4(b)
		if ip.Dst() != group || wire.UDP(b[20:]).DstPort() != wire.UDPPort {
			continue
		}
		return append([]byte(nil), b...)
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// buildOOB4 leaves out what the send socket does anyway: the source and
// interface of a datagram to a group from the socket's multicast source
// address, and TOS 0; everything else is spelled out.
func TestBuildOOB4(t *testing.T) {
	mcSrc, other := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	group, peer := netip.MustParseAddr("239.1.2.3"), netip.MustParseAddr("10.0.0.9")
	type want struct {
		pktinfo  netip.Addr // invalid: no IP_PKTINFO
		ttl, tos int        // -1: no control message
	}
	for _, c := range []struct {
		src, dst netip.Addr
		ttl, tos uint8
		want     want
	}{
		{mcSrc, group, 64, 0, want{netip.Addr{}, 64, -1}},
		{mcSrc, group, 1, 0x28, want{netip.Addr{}, 1, 0x28}},
		{other, group, 64, 0, want{other, 64, -1}},
		{mcSrc, peer, 64, 0, want{mcSrc, 64, -1}},
		{mcSrc, group, 0, 0, want{netip.Addr{}, -1, -1}},
	} {
		var b [sendOOBSpace]byte
		oob := buildOOB4(b[:], 7, c.src, c.dst, mcSrc, c.ttl, c.tos)
		msgs, err := unix.ParseSocketControlMessage(oob)
		if err != nil {
			t.Fatal(err)
		}
		got := want{netip.Addr{}, -1, -1}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.IP_PKTINFO:
				if ifx := binary.NativeEndian.Uint32(m.Data[0:4]); ifx != 7 {
					t.Errorf("%+v: pktinfo ifindex %d", c, ifx)
				}
				got.pktinfo = netip.AddrFrom4([4]byte(m.Data[4:8]))
			case unix.IP_TTL:
				got.ttl = int(binary.NativeEndian.Uint32(m.Data))
			case unix.IP_TOS:
				got.tos = int(binary.NativeEndian.Uint32(m.Data))
			default:
				t.Errorf("%+v: control message %d", c, m.Header.Type)
			}
		}
		if got != c.want {
			t.Errorf("src %v dst %v ttl %d tos %#x: got %+v, want %+v", c.src, c.dst, c.ttl, c.tos, got, c.want)
		}
	}
}
