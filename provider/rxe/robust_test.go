package rxe

import (
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// injector is a plain UDP socket on 127.0.0.1 that sends crafted RoCEv2
// datagrams to a group on lo. With IP_PMTUDISC_DO the kernel sends DF=1
// and ID 0, so crafted ICRCs are right.
type injector struct {
	conn *net.UDPConn
	port uint16
}

func newInjector(t *testing.T) *injector {
	t.Helper()
	c, err := mmsg.ListenUDP("udp4", "127.0.0.1:0", func(fd int) error {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO); err != nil {
			return err
		}
		lo, err := net.InterfaceByName("lo")
		if err != nil {
			return err
		}
		return unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_MULTICAST_IF, &unix.IPMreqn{Ifindex: int32(lo.Index)})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &injector{conn: c, port: uint16(c.LocalAddr().(*net.UDPAddr).Port)}
}

// craft builds a UD datagram to group with a valid ICRC; mutate, when not
// nil, changes the headers before the ICRC is computed.
func (in *injector) craft(group netip.Addr, h wire.UDHeader, payload []byte, mutate func(b []byte)) []byte {
	b := make([]byte, wire.UDLen(len(payload), h.HasImm))
	n := wire.EncodeUD(b, &h, payload)
	if mutate != nil {
		mutate(b[:n])
	}
	var iph [20]byte
	ip := wire.IPv4(iph[:])
	ip.Encode(wire.IPv4Fields{
		TotalLength: uint16(28 + len(b)), DF: true, TTL: 1, Protocol: 17,
		Src: netip.MustParseAddr("127.0.0.1"), Dst: group,
	})
	var udph [8]byte
	udp := wire.UDP(udph[:])
	udp.Encode(in.port, wire.UDPPort, uint16(8+len(b)))
	wire.PutICRC(b[n:], wire.ICRCv4(ip, udp, b[:n]))
	return b
}

func (in *injector) send(t *testing.T, group netip.Addr, b []byte) {
	t.Helper()
	if _, err := in.conn.WriteToUDPAddrPort(b, netip.AddrPortFrom(group, wire.UDPPort)); err != nil {
		t.Fatal(err)
	}
}

func TestReceiveRobustness(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	gEmpty := randGroup()
	const qkey = 0x0BADF00D
	rx := newFakeRx()
	q := newQP(t, d, rx, 0, qkey)
	if err := q.AttachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	// QPs whose receive queue drops: buffers of 100 bytes, no WR posted.
	gSmall, gNoWR := randGroup(), randGroup()
	small := newQP(t, d, &fakeRx{ch: make(chan delivery, 16), bufLen: 100}, 0, qkey)
	noWR := newQP(t, d, &fakeRx{ch: make(chan delivery, 16), noWR: true}, 0, qkey)
	if err := small.AttachMcast(mgid(gSmall), 0); err != nil {
		t.Fatal(err)
	}
	if err := noWR.AttachMcast(mgid(gNoWR), 0); err != nil {
		t.Fatal(err)
	}
	// A second group the device is a member of (CM reference) with no QP.
	if err := d.IncGroup(gEmpty); err != nil {
		t.Fatal(err)
	}
	defer d.DecGroup(gEmpty)
	in := newInjector(t)
	good := wire.UDHeader{PKey: 0xFFFF, DestQP: wire.MulticastQPN, QKey: qkey, SrcQP: 0x123456, PSN: 7}
	payload := []byte("payload bytes")

	// Sanity: a well-formed datagram is delivered, with the GRH area of
	// the header the kernel sent (ID 0, DF, TTL 1).
	in.send(t, g, in.craft(g, good, payload, nil))
	got := rx.wait(t)
	if string(got.payload) != string(payload) || got.srcQP != 0x123456 {
		t.Fatalf("sanity delivery %+v", got)
	}
	if ip := wire.IPv4(got.grh[20:]); ip.ID() != 0 || !ip.DF() || ip.TTL() != 1 || ip.Checksum() != ip.CalculateChecksum() {
		t.Errorf("grh % x", got.grh)
	}
	// A P_Key of a limited member of the default partition is accepted.
	lim := good
	lim.PKey = 0x7FFF
	in.send(t, g, in.craft(g, lim, payload, nil))
	rx.wait(t)
	eventually(t, "two deliveries counted", func() bool { return d.Counters().Get(softverbs.Delivered) == 2 })

	withICRC := func(b []byte, f func(b []byte)) []byte { f(b); return b }
	type tc struct {
		name  string
		group netip.Addr
		frame func() []byte
		setup func()
		field func(c softverbs.Snapshot) uint64
	}
	cases := []tc{
		{"truncated 10 bytes", g, func() []byte { return make([]byte, 10) },
			nil, func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.TruncatedDrops) }},
		{"truncated before ICRC", g, func() []byte { return in.craft(g, good, nil, nil)[:22] },
			nil, func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.TruncatedDrops) }},
		{"bad ICRC", g, func() []byte {
			return withICRC(in.craft(g, good, payload, nil), func(b []byte) { b[len(b)-1] ^= 1 })
		}, nil, func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.ICRCErrors) }},
		{"corrupted payload", g, func() []byte {
			return withICRC(in.craft(g, good, payload, nil), func(b []byte) { b[25] ^= 0x40 })
		}, nil, func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.ICRCErrors) }},
		{"wrong Q_Key", g, func() []byte {
			h := good
			h.QKey = qkey + 1
			return in.craft(g, h, payload, nil)
		}, nil, func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.QKeyViolations) }},
		{"wrong P_Key", g, func() []byte {
			h := good
			h.PKey = 0x1234
			return in.craft(g, h, payload, nil)
		}, nil, func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.PKeyViolations) }},
		{"TVer 1", g, func() []byte {
			return in.craft(g, good, payload, func(b []byte) { b[1] |= 1 })
		}, nil, func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.TVerDrops) }},
		{"DestQP 0", g, func() []byte {
			h := good
			h.DestQP = 0
			return in.craft(g, h, payload, nil)
		}, nil, func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.DestQP0Drops) }},
		{"RC opcode", g, func() []byte {
			return in.craft(g, good, payload, func(b []byte) { b[0] = 0x04 })
		}, nil, func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.OpcodeDrops) }},
		{"unknown unicast QPN", g, func() []byte {
			h := good
			h.DestQP = 0x000102
			return in.craft(g, h, payload, nil)
		}, nil, func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.NoQPDrops) }},
		{"group without QP", gEmpty, func() []byte { return in.craft(gEmpty, good, payload, nil) },
			nil, func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.NoGroupDrops) }},
		{"payload longer than the receive buffer", gSmall, func() []byte { return in.craft(gSmall, good, make([]byte, 200), nil) },
			nil, func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.TooLongDrops) }},
		{"no receive WR", gNoWR, func() []byte { return in.craft(gNoWR, good, payload, nil) },
			nil, func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.NoRecvWRDrops) }},
		{"QP in reset", g, func() []byte { return in.craft(g, good, payload, nil) },
			func() {
				if err := q.Modify(&verbs.QPAttr{State: verbs.QPSReset}, verbs.QPAttrState); err != nil {
					t.Fatal(err)
				}
			}, func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.NotReadyDrops) }},
		{"QP in init", g, func() []byte { return in.craft(g, good, payload, nil) },
			func() {
				if err := q.Modify(&verbs.QPAttr{State: verbs.QPSInit, QKey: qkey, PortNum: 1}, verbs.QPAttrState|verbs.QPAttrQKey|verbs.QPAttrPort|verbs.QPAttrPKeyIdx); err != nil {
					t.Fatal(err)
				}
			}, func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.NotReadyDrops) }},
		{"QP in error", g, func() []byte { return in.craft(g, good, payload, nil) },
			func() {
				if err := q.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
					t.Fatal(err)
				}
			}, func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.NotReadyDrops) }},
		{"datagram larger than any RoCEv2 packet", g, func() []byte { return make([]byte, 6000) },
			func() {
				// Back to RTS (through RESET) for the garbage below.
				for _, m := range []struct {
					a verbs.QPAttr
					m verbs.QPAttrMask
				}{
					{verbs.QPAttr{State: verbs.QPSReset}, verbs.QPAttrState},
					{verbs.QPAttr{State: verbs.QPSInit, QKey: qkey, PortNum: 1}, verbs.QPAttrState | verbs.QPAttrQKey | verbs.QPAttrPort | verbs.QPAttrPKeyIdx},
					{verbs.QPAttr{State: verbs.QPSRTR}, verbs.QPAttrState},
					{verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState | verbs.QPAttrSQPSN},
				} {
					if err := q.Modify(&m.a, m.m); err != nil {
						t.Fatal(err)
					}
				}
			},
			func(c softverbs.Snapshot) uint64 { return c.Get(softverbs.OversizedRecvDrops) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.setup != nil {
				c.setup()
			}
			before := d.Counters()
			in.send(t, c.group, c.frame())
			eventually(t, c.name+" counted", func() bool { return c.field(d.Counters()) == c.field(before)+1 })
			after := d.Counters()
			if after.Get(softverbs.RcvdPkts) != before.Get(softverbs.RcvdPkts)+1 || after.Get(softverbs.Delivered) != before.Get(softverbs.Delivered) {
				t.Errorf("before %+v\nafter %+v", before, after)
			}
			rx.none(t, 0)
		})
	}

	// Garbage: random datagrams never panic and are all accounted for.
	before := d.Counters()
	r := rand.New(rand.NewPCG(1, 2))
	const n = 300
	for i := 0; i < n; i++ {
		b := make([]byte, r.IntN(120))
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		if i%2 == 0 && len(b) >= 32 {
			// A plausible header with a random rest: the ICRC check of a
			// socket receiver, which solves for the unknown IP ID, lets a
			// random frame through with probability 2^-15, so the Q_Key
			// is wrong too, and such a frame counts as a Q_Key violation.
			h := good
			h.QKey = qkey ^ 0x100
			copy(b, in.craft(g, h, nil, nil)[:20])
		}
		in.send(t, g, b)
	}
	drops := func(c softverbs.Snapshot) uint64 {
		return malformed(c) + c.Get(softverbs.ICRCErrors) + c.Get(softverbs.NoQPDrops) + c.Get(softverbs.NoGroupDrops) + c.Get(softverbs.QKeyViolations) + c.Get(softverbs.PKeyViolations)
	}
	// RcvdPkts counts a datagram before its verdict: wait for every verdict
	// (a drop, or a delivery, which would fail below).
	eventually(t, "garbage read and judged", func() bool {
		c := d.Counters()
		return c.Get(softverbs.RcvdPkts) >= before.Get(softverbs.RcvdPkts)+n &&
			drops(c)-drops(before)+c.Get(softverbs.Delivered)-before.Get(softverbs.Delivered) >= n
	})
	rx.none(t, 0)
	after := d.Counters()
	if after.Get(softverbs.Delivered) != before.Get(softverbs.Delivered) {
		t.Errorf("garbage delivered")
	}
	if drops(after)-drops(before) != n {
		t.Errorf("%d of %d garbage datagrams counted as drops", drops(after)-drops(before), n)
	}
}

// malformed sums the drops of datagrams that do not parse as RoCEv2 UD.
func malformed(c softverbs.Snapshot) uint64 {
	return c.Get(softverbs.TruncatedDrops) + c.Get(softverbs.TVerDrops) + c.Get(softverbs.OpcodeDrops) +
		c.Get(softverbs.DestQP0Drops) + c.Get(softverbs.OversizedRecvDrops)
}

// FuzzReceive feeds arbitrary datagrams to the receive path.
func FuzzReceive(f *testing.F) {
	in := &injector{port: 40000}
	g := netip.MustParseAddr("239.1.2.3")
	f.Add(in.craft(g, wire.UDHeader{PKey: 0xFFFF, DestQP: wire.MulticastQPN, QKey: 1, SrcQP: 2}, []byte("abc"), nil), uint8(64))
	f.Add([]byte{0x64, 0, 0xff, 0xff}, uint8(1))
	// One device and QP for every input: lo's, with the receive socket of
	// the group the QP is attached to (no datagram is sent).
	if d := existing("lo"); d != nil {
		d.Close()
	}
	d, err := ForName("lo")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { d.Close() })
	q := newManualQP(f, d, verbs.CreateBlockSelfMcastLB, 1)
	if err := q.qp.AttachMcast(mgid(g), 0); err != nil {
		f.Fatal(err)
	}
	d.mu.Lock()
	s := d.mships[g].sock
	d.mu.Unlock()
	f.Fuzz(func(t *testing.T, b []byte, ttl uint8) {
		r := newReceiver(d, s, nil)
		name := make([]byte, 16)
		name[0], name[2], name[3] = 2, 40000>>8, 40000&0xff
		copy(name[4:], []byte{127, 0, 0, 1})
		oob := make([]byte, 128)
		k := putOrigDst(oob, g)
		k += putCmsgInt(oob[k:], unix.IPPROTO_IP, unix.IP_TTL, int(ttl))
		before := d.Counters()
		r.receiveOne(b, name, oob[:k])
		q.recycle()
		after := d.Counters()
		if after.Get(softverbs.RcvdPkts) != before.Get(softverbs.RcvdPkts)+1 {
			t.Fatalf("counters %v → %v", before, after)
		}
		// Every datagram lands in exactly one outcome.
		var outcomes uint64
		for c := range softverbs.Schema() {
			switch softverbs.Counter(c) {
			case softverbs.RcvdPkts, softverbs.RcvdBytes, softverbs.SentPkts, softverbs.SentBytes:
				continue
			}
			outcomes += after[c] - before[c]
		}
		if outcomes != 1 {
			t.Fatalf("%d outcomes for one datagram: %v → %v", outcomes, before, after)
		}
	})
}
