package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"

	"github.com/softrdma/softrdma/introspect"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
)

// member is one id of the demo.
type member struct {
	name     string
	sendOnly bool
	blockLB  bool
	id       *rdmacm.ID
	mr       *verbs.MR
	buf      []byte
	ah       *verbs.AH
	qkey     uint32
	sent     int
	recv     map[string]int // by sender name
}

const slot = 40 + 256 // one receive buffer: GRH area + the largest demo payload

func demo(args []string, out io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(out)
	group := fs.String("group", "", "IPv4 multicast group (default: a random 239.x.y.z)")
	bind := fs.String("bind", "127.0.0.1", "local address to bind (its interface carries the traffic)")
	count := fs.Int("count", 5, "messages each sender sends")
	size := fs.Int("size", 64, "payload bytes (at most 256)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *group == "" {
		*group = fmt.Sprintf("239.%d.%d.%d", 100+rand.IntN(100), rand.IntN(256), 1+rand.IntN(254))
	}
	if *size < 1 || *size > 256 || *count < 1 || *count > 1000 {
		fmt.Fprintln(out, "demo: -size must be 1..256 and -count 1..1000")
		return 2
	}
	g, err := netip.ParseAddr(*group)
	if err != nil || !g.Is4() || !g.IsMulticast() {
		fmt.Fprintf(out, "demo: %q is not an IPv4 multicast group\n", *group)
		return 2
	}
	src, err := netip.ParseAddr(*bind)
	if err != nil {
		fmt.Fprintf(out, "demo: bad -bind: %v\n", err)
		return 2
	}
	// Opt-in observability: SOFTRDMA_DEBUG_ADDR, SOFTRDMA_LOG.
	stop, err := introspect.FromEnv()
	if err != nil {
		fmt.Fprintf(out, "demo: %v\n", err)
	}
	defer stop()
	d := &demoRun{out: out, group: rdmacm.UDPAddr(g), src: rdmacm.UDPAddr(src), count: *count, size: *size}
	ok := d.run()
	if !ok {
		fmt.Fprintln(out, "demo: FAILED")
		return 1
	}
	fmt.Fprintln(out, "demo: all expectations held")
	return 0
}

type demoRun struct {
	out         io.Writer
	group, src  *net.UDPAddr
	count, size int
	ch          *rdmacm.EventChannel
	members     []*member
	byQPN       map[uint32]string
}

func (d *demoRun) logf(format string, a ...any) { fmt.Fprintf(d.out, format+"\n", a...) }

func (d *demoRun) run() bool {
	var err error
	d.ch, err = rdmacm.CreateEventChannel()
	if err != nil {
		d.logf("create event channel: %v", err)
		return false
	}
	defer d.ch.Close()
	d.members = []*member{
		{name: "receiver"},
		{name: "send-only", sendOnly: true},
		{name: "no-loopback", blockLB: true},
	}
	d.byQPN = map[uint32]string{}
	defer d.cleanup()
	d.logf("softrdma demo: group %v on %v, %d messages of %d bytes per sender", d.group.IP, d.src.IP, d.count, d.size)
	for _, m := range d.members {
		if !d.setup(m) {
			return false
		}
	}
	d.logf("")
	for _, m := range d.members {
		d.send(m)
	}
	d.collect()
	return d.report()
}

// nextEvent waits for one event and prints it.
func (d *demoRun) nextEvent(want rdmacm.EventType) (*rdmacm.Event, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ev, err := d.ch.GetEvent(ctx)
	if err != nil {
		d.logf("  get event: %v", err)
		return nil, false
	}
	m, _ := ev.ID.Context().(*member)
	d.logf("  %-12s %s status %d", m.name, ev.Event, ev.Status)
	if ev.Event != want {
		ev.Ack()
		return nil, false
	}
	return ev, true
}

func (d *demoRun) setup(m *member) bool {
	var err error
	if m.id, err = rdmacm.CreateID(d.ch, m, rdmacm.PS_UDP); err != nil {
		d.logf("create id: %v", err)
		return false
	}
	if err := m.id.ResolveAddr(d.src, d.group, 2*time.Second); err != nil {
		d.logf("%s: resolve addr: %v", m.name, err)
		return false
	}
	ev, ok := d.nextEvent(rdmacm.EventAddrResolved)
	if !ok {
		return false
	}
	ev.Ack()
	attr := verbs.QPInitAttr{
		Cap:    verbs.QPCap{MaxSendWR: d.count, MaxRecvWR: 4 * d.count, MaxSendSGE: 1, MaxRecvSGE: 1},
		QPType: verbs.QPTypeUD,
	}
	if m.blockLB {
		attr.CreateFlags = verbs.CreateBlockSelfMcastLB
	}
	if err := m.id.CreateQPEx(nil, &attr); err != nil {
		d.logf("%s: create qp: %v", m.name, err)
		return false
	}
	d.byQPN[m.id.QP().Num()] = m.name
	m.buf = make([]byte, 4*d.count*slot)
	if m.mr, err = m.id.RegMsgs(m.buf); err != nil {
		d.logf("%s: reg msgs: %v", m.name, err)
		return false
	}
	for i := 0; i < 4*d.count; i++ {
		if err := m.id.PostRecv(uint64(i), m.mr, i*slot, slot); err != nil {
			d.logf("%s: post recv: %v", m.name, err)
			return false
		}
	}
	flags := rdmacm.MCJoinFlagFullMember
	if m.sendOnly {
		flags = rdmacm.MCJoinFlagSendOnlyFullMember
	}
	join := rdmacm.JoinMCAttrEx{CompMask: rdmacm.JoinMCAttrAddress | rdmacm.JoinMCAttrJoinFlags, JoinFlags: flags, Addr: d.group}
	if err := m.id.JoinMulticastEx(&join, m.name); err != nil {
		d.logf("%s: join: %v", m.name, err)
		return false
	}
	if ev, ok = d.nextEvent(rdmacm.EventMulticastJoin); !ok {
		return false
	}
	p := ev.Param
	d.logf("  %-12s joined dgid %v qpn %#x qkey %#x context %v, QP %#x on %s%s", m.name, p.AHAttr.GRH.DGID, p.QPNum, p.QKey, p.PrivateData,
		m.id.QP().Num(), m.id.DeviceName(), map[bool]string{true: " (send-only: not attached)", false: ""}[m.sendOnly])
	m.qkey = p.QKey
	m.ah, err = m.id.PD().CreateAH(&p.AHAttr)
	ev.Ack()
	if err != nil {
		d.logf("%s: create ah: %v", m.name, err)
		return false
	}
	m.recv = map[string]int{}
	return true
}

func (d *demoRun) send(m *member) {
	sendBuf := make([]byte, d.size)
	copy(sendBuf, m.name)
	mr, err := m.id.PD().RegMR(sendBuf, verbs.AccessLocalWrite)
	if err != nil {
		d.logf("%s: reg mr: %v", m.name, err)
		return
	}
	defer mr.Dereg()
	qp := m.id.QP()
	for i := 0; i < d.count; i++ {
		wr := verbs.SendWR{
			WRID: uint64(i), SGList: []verbs.SGE{mr.SGE(0, d.size)}, Opcode: verbs.WRSendWithImm,
			ImmData: qp.Num(), Flags: verbs.SendSignaled,
			UD: verbs.UDWR{AH: m.ah, RemoteQPN: rdmacm.MulticastQPN, RemoteQKey: m.qkey},
		}
		if err := qp.PostSend(&wr); err != nil {
			d.logf("%s: post send: %v", m.name, err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		wc, err := m.id.GetSendComp(ctx)
		cancel()
		if err != nil || wc.Status != verbs.WCSuccess {
			d.logf("%s: send completion: %v %v", m.name, err, wc.Status)
			return
		}
		m.sent++
	}
}

// expected returns how many datagrams m should get from each sender.
func (d *demoRun) expected(m *member) map[string]int {
	want := map[string]int{}
	if m.sendOnly {
		return want // never attached
	}
	for _, s := range d.members {
		if s == m && m.blockLB {
			continue // its own multicast is blocked
		}
		want[s.name] = d.count
	}
	return want
}

func (d *demoRun) collect() {
	deadline := time.Now().Add(3 * time.Second)
	var wc [16]verbs.WC
	for {
		done := true
		for _, m := range d.members {
			cq := m.id.RecvCQ()
			n, _ := cq.Poll(wc[:])
			for _, c := range wc[:n] {
				if c.Opcode == verbs.WCOpRecv && c.Status == verbs.WCSuccess {
					m.recv[d.byQPN[c.SrcQP]]++
				}
			}
			total, want := 0, 0
			for _, v := range m.recv {
				total += v
			}
			for _, v := range d.expected(m) {
				want += v
			}
			if total < want {
				done = false
			}
		}
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Anything that should not arrive has had time to.
	time.Sleep(200 * time.Millisecond)
	for _, m := range d.members {
		n, _ := m.id.RecvCQ().Poll(wc[:])
		for _, c := range wc[:n] {
			m.recv[d.byQPN[c.SrcQP]]++
		}
	}
}

func (d *demoRun) report() bool {
	ok := true
	d.logf("")
	d.logf("%-12s %-10s %5s   %-34s %s", "member", "join", "sent", "received from (receiver/send-only/no-loopback)", "expected")
	for _, m := range d.members {
		join := "full"
		if m.sendOnly {
			join = "send-only"
		}
		want := d.expected(m)
		got := fmt.Sprintf("%d / %d / %d", m.recv["receiver"], m.recv["send-only"], m.recv["no-loopback"])
		exp := fmt.Sprintf("%d / %d / %d", want["receiver"], want["send-only"], want["no-loopback"])
		mark := "ok"
		if got != exp || m.sent != d.count || m.recv[""] > 0 {
			mark, ok = "MISMATCH", false
		}
		d.logf("%-12s %-10s %5d   %-34s %s  %s", m.name, join, m.sent, got, exp, mark)
	}
	d.logf("")
	for _, m := range d.members {
		if err := m.id.LeaveMulticast(d.group); err != nil {
			d.logf("%s: leave: %v", m.name, err)
			ok = false
		} else {
			d.logf("  %-12s left %v", m.name, d.group.IP)
		}
	}
	return ok
}

func (d *demoRun) cleanup() {
	for _, m := range d.members {
		if m.id == nil {
			continue
		}
		if m.ah != nil {
			m.ah.Destroy()
		}
		if m.id.QP() != nil {
			m.id.DestroyQP()
		}
		if m.mr != nil {
			m.mr.Dereg()
		}
		m.id.Destroy()
	}
}
