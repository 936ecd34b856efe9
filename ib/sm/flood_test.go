package sm

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
)

// The attach flood: processes open many UDP sockets and
// attach a fake port from each as fast as they can, while a legitimate
// port joins and leaves a group over the fabric. The SM must keep
// answering it.
//
// TestAttachFlood is the small flood every run makes (1,500 ports from
// three processes, attached again every 100 ms). The full flood, 50,000
// attaches from three processes, is a benchmark run on demand (in a
// network namespace of its own, as CI runs the tests):
//
//	unshare -n sh -c 'ip link set lo up && SOFTSM_FLOOD=1 go test -run TestAttachFloodFull -v ./ib/sm'
//
// (SOFTSM_FLOOD=N floods N attaches; SOFTSM_FLOOD_KEEPALIVE=1 attaches
// every port again every second, as live ports do; SOFTSM_FLOOD_SECONDS
// sets how long, 10). It prints the legitimate port's join p50/p99 during
// the flood, and while the attaches were being sent.

// probeTimeout is how long the probe waits for an SA answer before it
// counts a timeout: the hosts' SA client's wait (provider/ib's SATimeout).
// The full flood waits fullProbeTimeout only, to be strict.
const probeTimeout, fullProbeTimeout = 3 * time.Second, time.Second

// probeResult is what the legitimate port saw during a flood.
type probeResult struct {
	lat      []time.Duration // join (SubnAdmSet) round trips
	at       []time.Time     // when each join was sent
	timeouts int
	bad      []string // unexpected answers
	reregs   int      // keepalive answers that said the SM forgot the port
}

func (r *probeResult) pct(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	s := slices.Clone(r.lat)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

// between returns the joins sent in [from, to).
func (r *probeResult) between(from, to time.Time) *probeResult {
	w := &probeResult{}
	for i, t := range r.at {
		if !t.Before(from) && t.Before(to) {
			w.lat, w.at = append(w.lat, r.lat[i]), append(w.at, t)
		}
	}
	return w
}

func (r *probeResult) String() string {
	return fmt.Sprintf("%d joins: p50 %v p99 %v max %v, %d timeouts, %d unexpected answers, %d reregisters",
		len(r.lat), r.pct(0.5), r.pct(0.99), r.pct(1), r.timeouts, len(r.bad), r.reregs)
}

// saTry sends an SA MAD from the port and waits up to d for the answer
// with its TID (answers to earlier, timed-out requests are skipped).
func (p *fakePort) saTry(m mad.MAD, d time.Duration) (mad.MAD, bool) {
	smGID := fabric.PortGID(fabric.DefaultSubnetPrefix, DefaultSMGUID)
	p.send(fabric.SMLID, false, smGID, fabric.SAQPN, fabric.SAQKey, m)
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, false
		}
		b := p.recv(left)
		if b == nil {
			return nil, false
		}
		var pkt fabric.Packet
		if fabric.Parse(b, &pkt) != nil || len(pkt.UD.Payload) < mad.Len {
			continue
		}
		r := mad.MAD(pkt.UD.Payload[:mad.Len])
		if r.TID() == m.TID() {
			return append(mad.MAD(nil), r...), true
		}
	}
}

// probe joins and leaves a group from p (a keepalive every second, as a
// port does) until stop is closed.
func probe(p *fakePort, group [16]byte, stop <-chan struct{}, joins *atomic.Int64, timeout time.Duration) *probeResult {
	r := &probeResult{}
	lastKA := time.Now()
	for {
		select {
		case <-stop:
			return r
		default:
		}
		if time.Since(lastKA) >= fabric.KeepaliveInterval {
			lastKA = time.Now()
			p.sendControl(&fabric.Control{Type: fabric.TypeAttach, GUID: p.guid, NodeDesc: "probe"})
		}
	drain:
		for {
			select {
			case c := <-p.ctl:
				if c.Type == fabric.TypePortInfo && c.ClientReregister {
					r.reregs++
				}
			default:
				break drain
			}
		}
		t0 := time.Now()
		a, ok := p.saTry(mcReq(mad.MethodSet, mad.CompCreateRequired, group, p.guid, mad.JoinFullMember), timeout)
		switch {
		case !ok:
			r.timeouts++
			continue
		case a.Status() != 0:
			r.bad = append(r.bad, fmt.Sprintf("join status %#04x", a.Status()))
			continue
		}
		r.lat, r.at = append(r.lat, time.Since(t0)), append(r.at, t0)
		joins.Add(1)
		a, ok = p.saTry(mcReq(mad.MethodDelete, mad.CompJoinRequired, group, p.guid, mad.JoinFullMember), timeout)
		switch {
		case !ok:
			r.timeouts++
		case a.Status() != 0:
			r.bad = append(r.bad, fmt.Sprintf("leave status %#04x", a.Status()))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// flooder is a set of fake ports, each a UDP socket of its own.
type flooder struct {
	sm    netip.AddrPort
	conns []*net.UDPConn
	msgs  [][]byte
	wg    sync.WaitGroup
}

// flood opens n sockets bound to ip and attaches a fake port from each
// (GUIDs from base on) to the SM at sm, as fast as it can; of the answers
// only retries are read (and answered at once with the cookie, as a port
// does: the flood's sources are real, only forged ones stop at the
// retry). A full socket buffer at the SM drops attaches: a flood does not
// care.
func flood(sm netip.AddrPort, ip netip.Addr, base uint64, n int) (*flooder, error) {
	f := &flooder{sm: sm}
	for i := range n {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, 0)))
		if err != nil {
			return f, err
		}
		a := fabric.Control{Type: fabric.TypeAttach, GUID: base + uint64(i),
			NodeDesc: "flood " + strings.Repeat("x", 200), Credits: 64}
		b := fabric.EncodeControl(&a)
		f.conns, f.msgs = append(f.conns, c), append(f.msgs, b)
		f.wg.Add(1)
		go f.answerRetries(c, a)
		c.WriteToUDPAddrPort(b, sm)
	}
	return f, nil
}

// answerRetries sends attach a again with the cookie of every retry that
// comes to c, until c closes.
func (f *flooder) answerRetries(c *net.UDPConn, a fabric.Control) {
	defer f.wg.Done()
	buf := make([]byte, 1024)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		if r, err := fabric.DecodeControl(buf[:n]); err == nil && r.Type == fabric.TypeRetry {
			a.Cookie = r.Cookie
			c.WriteToUDPAddrPort(fabric.EncodeControl(&a), f.sm)
		}
	}
}

// again sends every fake port's attach again (a keepalive round).
func (f *flooder) again() {
	for i, c := range f.conns {
		c.WriteToUDPAddrPort(f.msgs[i], f.sm)
	}
}

func (f *flooder) close() {
	for _, c := range f.conns {
		c.Close()
	}
	f.wg.Wait()
}

// flooders runs three flooder processes (this test binary, see
// TestFloodHelper), each attaching n fake ports from a loopback address of
// its own (one address has fewer ephemeral ports than a flooder may need)
// and attaching them all again every interval. It returns when every
// flooder sent its first attaches; stop ends them.
func flooders(t *testing.T, sm netip.AddrPort, total int, interval time.Duration) (stop func()) {
	var procs []*exec.Cmd
	var ins []io.Closer
	stop = func() {
		for _, in := range ins {
			in.Close()
		}
		for _, p := range procs {
			p.Wait()
		}
		ins, procs = nil, nil
	}
	t.Cleanup(stop)
	var outs []*bufio.Reader
	for i := range 3 {
		n := total / 3
		if i == 2 {
			n = total - 2*(total/3)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestFloodHelper$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("softsmFloodHelper=%v,%v,%d,%d,%d", sm, floodAddr(i), 0x7000_0000+i<<24, n, interval.Milliseconds()))
		cmd.Stderr = os.Stderr
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs, ins, outs = append(procs, cmd), append(ins, in), append(outs, bufio.NewReader(out))
	}
	for i, o := range outs {
		line, err := o.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "flooded") {
			t.Fatalf("flooder %d: %q %v", i, line, err)
		}
	}
	return stop
}

// TestFloodHelper is a flooder process of flooders:
// "sm,ip,base,n,interval_ms" from the environment. It prints "flooded"
// once every port sent its first attach, then attaches them all again
// every interval until its stdin closes.
func TestFloodHelper(t *testing.T) {
	v := os.Getenv("softsmFloodHelper")
	if v == "" {
		t.Skip("a flooder process of TestAttachFlood")
	}
	a := strings.Split(v, ",")
	sm := netip.MustParseAddrPort(a[0])
	base, _ := strconv.ParseUint(a[2], 0, 64)
	n, _ := strconv.Atoi(a[3])
	ms, _ := strconv.Atoi(a[4])
	f, err := flood(sm, netip.MustParseAddr(a[1]), base, n)
	defer f.close()
	if err != nil {
		fmt.Printf("error %v\n", err)
		return
	}
	fmt.Println("flooded")
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(done) }()
	tick := time.NewTicker(time.Duration(ms) * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			f.again()
		}
	}
}

// TestAttachFlood: three flooder processes attach 1,500 fake ports and
// attach them again every 100 ms (ten times their keepalive) while
// a legitimate port joins and leaves a group: every SA request is
// answered, and quickly, and the port is never forgotten.
func TestAttachFlood(t *testing.T) {
	const ports, joins = 1500, 200
	s := startSM(t, Config{Logf: func(string, ...any) {}})
	legit := newFakePort(t, s.FabricAddr(), 0x500001)
	group := mgid("ff12:4001:ffff::601:301")
	stopProbe, count := startProbe(t, legit, group, probeTimeout)
	stopFlood := flooders(t, s.FabricAddr(), ports, 100*time.Millisecond)
	// The flood goes on until the probe made its joins during it and the
	// flood ports were throttled (past their ControlBurst).
	begin := count()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if count() >= begin+joins && s.Stats().ThrottledControls > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s of flood: %d joins, SM %+v", count()-begin, s.Stats().ThrottledControls)
		}
	}
	r := stopProbe()
	stopFlood()
	st := s.Stats()
	t.Logf("during the flood: %v; SM: %d ports, %d control messages throttled, %d dropped; %s",
		r, len(st.Ports), st.ThrottledControls, st.ControlDrops, udpDrops(s.FabricAddr().Port()))
	if r.timeouts != 0 || len(r.bad) != 0 || r.reregs != 0 {
		t.Errorf("legitimate port: %v %q", r, r.bad)
	}
	if len(st.Ports) < ports/2 {
		t.Errorf("%d flood ports attached", len(st.Ports)-1)
	}
	// A generous bound: 2 busy cores, the race detector.
	if p99 := r.pct(0.99); p99 > time.Second {
		t.Errorf("join p99 %v during the flood", p99)
	}
}

// udpDrops reports the drops of the UDP socket bound to port (from
// /proc/net/udp: the receive buffer was full) and the kernel's UDP
// receive buffer errors of the network namespace.
func udpDrops(port uint16) string {
	out := ""
	if b, err := os.ReadFile("/proc/net/udp"); err == nil {
		suffix := fmt.Sprintf(":%04X", port)
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) >= 13 && strings.HasSuffix(f[1], suffix) {
				out = "SM socket drops " + f[len(f)-1] + ", "
			}
		}
	}
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return out
	}
	var head []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "Udp: ") {
			continue
		}
		f := strings.Fields(l)
		if head == nil {
			head = f
			continue
		}
		for i, h := range head {
			if h == "RcvbufErrors" && i < len(f) {
				return out + "UDP RcvbufErrors " + f[i]
			}
		}
	}
	return out
}

// TestAttachFloodFull is the full flood: SOFTSM_FLOOD=1 (or the number of
// attaches) floods 50,000 attaches from three processes, which keep their
// sockets for SOFTSM_FLOOD_SECONDS (10) — with SOFTSM_FLOOD_KEEPALIVE=1
// attaching every port again every second, as ports keep alive; it
// prints the legitimate port's join latencies during the flood.
func TestAttachFloodFull(t *testing.T) {
	env := os.Getenv("SOFTSM_FLOOD")
	if env == "" {
		t.Skip("SOFTSM_FLOOD not set")
	}
	total := 50000
	if n, err := strconv.Atoi(env); err == nil && n > 1 {
		total = n
	}
	secs := 10
	if n, err := strconv.Atoi(os.Getenv("SOFTSM_FLOOD_SECONDS")); err == nil && n > 0 {
		secs = n
	}
	interval := time.Hour
	if os.Getenv("SOFTSM_FLOOD_KEEPALIVE") == "1" {
		interval = time.Second
	}
	s := startSM(t, Config{Logf: func(string, ...any) {}})
	legit := newFakePort(t, s.FabricAddr(), 0x500002)
	group := mgid("ff12:4001:ffff::601:302")
	// Before: the legitimate port alone.
	stop, _ := startProbe(t, legit, group, fullProbeTimeout)
	time.Sleep(time.Second)
	t.Logf("before the flood: %v", stop())

	stop, _ = startProbe(t, legit, group, fullProbeTimeout)
	start := time.Now()
	stopFlood := flooders(t, s.FabricAddr(), total, interval)
	sent := time.Since(start)
	// A new port attaches during the flood, as provider/ib does (its
	// attach again every second until a port_info), and joins.
	newcomer := newFakePortNoAttach(t, s.FabricAddr(), 0x500003)
	t0 := time.Now()
	var pi *fabric.Control
	for pi == nil && time.Since(t0) < 5*time.Second {
		newcomer.sendControl(&fabric.Control{Type: fabric.TypeAttach, GUID: newcomer.guid})
		select {
		case c := <-newcomer.ctl:
			pi = c
		case <-time.After(fabric.KeepaliveInterval):
		}
	}
	attachTook := time.Since(t0)
	if pi == nil || pi.Type != fabric.TypePortInfo {
		t.Errorf("a new port attaching during the flood: %+v after %v", pi, attachTook)
	} else {
		newcomer.mu.Lock()
		newcomer.lid = pi.LID
		newcomer.mu.Unlock()
		a, ok := newcomer.saTry(mcReq(mad.MethodSet, mad.CompCreateRequired, mgid("ff12:4001:ffff::601:303"), newcomer.guid, mad.JoinFullMember), fullProbeTimeout)
		if !ok || a.Status() != 0 {
			t.Errorf("the new port's join during the flood: answered %v", ok)
		}
		t.Logf("a new port attached during the flood after %v and joined", attachTook.Round(time.Microsecond))
	}
	time.Sleep(time.Duration(secs)*time.Second - time.Since(start))
	r := stop()
	stopFlood()
	st := s.Stats()
	t.Logf("%d attaches sent by 3 processes in %v, sockets kept %ds, attached again every %v; SM: %d ports, %d refused (source limit), %d (no LID), %d control messages throttled, %d dropped; %s",
		total, sent.Round(time.Millisecond), secs, interval, len(st.Ports), st.SourceLimitAttaches, st.NoLIDAttaches, st.ThrottledControls, st.ControlDrops, udpDrops(s.FabricAddr().Port()))
	t.Logf("during the flood (%v): %v", time.Since(start).Round(time.Millisecond), r)
	burst := r.between(start, start.Add(sent+time.Second))
	fmt.Printf("softsm attach flood (%d attaches from 3 processes, %d s, again every %v): legitimate join p50 %v p99 %v max %v, %d joins, %d timeouts; while the attaches were sent (+1 s): p50 %v p99 %v max %v, %d joins\n",
		total, secs, interval, r.pct(0.5), r.pct(0.99), r.pct(1), len(r.lat), r.timeouts, burst.pct(0.5), burst.pct(0.99), burst.pct(1), len(burst.lat))
	if r.timeouts != 0 || len(r.bad) != 0 || r.reregs != 0 {
		t.Errorf("legitimate port: %v %q", r, r.bad)
	}
	if p99 := r.pct(0.99); p99 > 50*time.Millisecond {
		t.Errorf("join p99 %v during the flood: want at most 50ms", p99)
	}
}

// floodAddr is flooder i's loopback address, 127.0.1.<i+1>.
func floodAddr(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 1, byte(i + 1)}) }

// startProbe runs probe on p until the returned stop is called (or the
// test ends); stop returns what it saw, joins how many joins it made.
func startProbe(t *testing.T, p *fakePort, group [16]byte, timeout time.Duration) (stop func() *probeResult, joins func() int) {
	done := make(chan struct{})
	res := make(chan *probeResult, 1)
	var n atomic.Int64
	go func() { res <- probe(p, group, done, &n, timeout) }()
	var once sync.Once
	var r *probeResult
	stop = func() *probeResult {
		once.Do(func() { close(done); r = <-res })
		return r
	}
	t.Cleanup(func() { stop() })
	return stop, func() int { return int(n.Load()) }
}
