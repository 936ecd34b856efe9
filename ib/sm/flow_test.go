package sm

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// statsOf returns the switch's counters of one port.
func statsOf(s *SM, guid uint64) PortStats {
	for _, p := range s.Stats().Ports {
		if p.GUID == guid {
			return p
		}
	}
	return PortStats{}
}

// TestLosslessBurst: a burst far larger than every window goes from a
// sender through the switch to a receiver whose window is small: the
// sender is held back by credits, nothing is lost or discarded. The
// lifetime is IB's infinite one (an hour): with the default 268 ms a test
// receiver off the CPU that long under -race and load loses, as an IB
// switch would discard (TestStalledPortBound covers that).
func TestLosslessBurst(t *testing.T) {
	s := startSM(t, Config{HOQLife: time.Hour})
	tx := newFlowPort(t, s.FabricAddr(), 0x200001, 16, true)
	rx := newFlowPort(t, s.FabricAddr(), 0x200002, 4, true)
	group := mgid("ff12:4001:ffff::601:204")
	r := mustStatus(t, rawSA(t, s.SAAddr(), mcReq(mad.MethodSet, mad.CompCreateRequired, group, rx.guid, mad.JoinFullMember), waitTimeout), 0)
	mlid := r.MCMemberRecord().MLID()
	const n = 200
	done := make(chan struct{})
	go func() {
		defer close(done)
		tx.sendCredited(n, mlid, true, group, wire.MulticastQPN, 0x01234567, []byte("burst"))
	}()
	for i := range n {
		if rx.recv(waitTimeout) == nil {
			t.Fatalf("received %d of %d", i, n)
		}
	}
	<-done
	st := statsOf(s, rx.guid)
	if !st.FlowControl || st.XmitDiscards != 0 || st.TxPackets != n {
		t.Errorf("receiver's counters %+v", st)
	}
	if st := statsOf(s, tx.guid); st.RcvOverruns != 0 || st.Forwarded != n || st.Drops != 0 {
		t.Errorf("sender's counters %+v", st)
	}
}

// TestStalledPortBound: one member of a group gives no credit (a stalled
// or dead port). A packet waits for it at the head of the sender's queue
// for HOQLife only and is then discarded for it; after VLStallCount such
// packets in a row the port is stalled and packets for it are discarded at
// once. The other member gets every packet, and the sender is held back,
// not dropped.
func TestStalledPortBound(t *testing.T) {
	// The lifetime is what the port with credit may take to return it:
	// on a loaded machine under -race its goroutine was once off the CPU
	// for more than 30 ms, and it lost a packet.
	const hoq = 150 * time.Millisecond
	var logMu sync.Mutex
	var logged []string
	logf := func(format string, args ...any) {
		logMu.Lock()
		logged = append(logged, fmt.Sprintf(format, args...))
		logMu.Unlock()
		t.Logf(format, args...)
	}
	s := startSM(t, Config{HOQLife: hoq, VLStallCount: 2, Logf: logf})
	tx := newFlowPort(t, s.FabricAddr(), 0x200011, 16, true)
	ok := newFlowPort(t, s.FabricAddr(), 0x200012, 8, true)
	stuck := newFlowPort(t, s.FabricAddr(), 0x200013, 4, false)
	group := mgid("ff12:4001:ffff::601:205")
	r := mustStatus(t, rawSA(t, s.SAAddr(), mcReq(mad.MethodSet, mad.CompCreateRequired, group, ok.guid, mad.JoinFullMember), waitTimeout), 0)
	mlid := r.MCMemberRecord().MLID()
	mustStatus(t, rawSA(t, s.SAAddr(), mcReq(mad.MethodSet, mad.CompJoinRequired, group, stuck.guid, mad.JoinFullMember), waitTimeout), 0)
	const n = 200
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tx.sendCredited(n, mlid, true, group, wire.MulticastQPN, 0x01234567, []byte("to both"))
	}()
	for i := range n {
		if ok.recv(waitTimeout) == nil {
			t.Fatalf("the port with credit received %d of %d", i, n)
		}
	}
	<-done
	elapsed := time.Since(start)
	// The stuck port got its window, the rest was discarded for it: the
	// first VLStallCount packets after HOQLife each, then at once.
	waitFor(t, func() bool { st := statsOf(s, stuck.guid); return st.TxPackets+st.XmitDiscards == n })
	st := statsOf(s, stuck.guid)
	if st.TxPackets != 4 || st.XmitDiscards != n-4 || st.XmitWaits < 2 {
		t.Errorf("stuck port's counters %+v", st)
	}
	// The discards are logged, naming the port (at most a line a second).
	logMu.Lock()
	said := slices.ContainsFunc(logged, func(l string) bool {
		return strings.Contains(l, fmt.Sprintf("port %#x", stuck.guid)) && strings.Contains(l, "discarded: no credit for the head-of-queue lifetime")
	})
	logMu.Unlock()
	if !said {
		t.Errorf("no log line of the stuck port's discards in %q", logged)
	}
	// The lines add up to the port's discards (the last ones within a
	// second after the previous line).
	re := regexp.MustCompile(fmt.Sprintf(`^port %#x \(LID \d+\): (\d+) packets for it discarded`, stuck.guid))
	waitFor(t, func() bool {
		logMu.Lock()
		defer logMu.Unlock()
		sum := 0
		for _, l := range logged {
			if m := re.FindStringSubmatch(l); m != nil {
				n, _ := strconv.Atoi(m[1])
				sum += n
			}
		}
		return sum == n-4
	})
	if st := statsOf(s, ok.guid); st.TxPackets != n || st.XmitDiscards != 0 {
		t.Errorf("good port's counters %+v", st)
	}
	if st := statsOf(s, tx.guid); st.RcvOverruns != 0 || st.Drops != 0 {
		t.Errorf("sender's counters %+v", st)
	}
	// The burst waited for the stuck port twice (VLStallCount × HOQLife),
	// then passed while the port was stalled.
	if elapsed < 2*hoq {
		t.Errorf("burst took %v, less than the 2 head-of-queue waits of %v", elapsed, hoq)
	}
	t.Logf("burst of %d with a stalled member: %v", n, elapsed)
}

// TestOverrunCounted: a port that sends beyond its credit (and the room
// kept for management packets) overruns its input queue: the packets
// beyond are dropped and counted, the queue stays bounded.
func TestOverrunCounted(t *testing.T) {
	s := startSM(t, Config{HOQLife: time.Minute})
	tx := newFlowPort(t, s.FabricAddr(), 0x200021, 16, true)
	stuck := newFlowPort(t, s.FabricAddr(), 0x200022, 4, false)
	group := mgid("ff12:4001:ffff::601:206")
	r := mustStatus(t, rawSA(t, s.SAAddr(), mcReq(mad.MethodSet, mad.CompCreateRequired, group, stuck.guid, mad.JoinFullMember), waitTimeout), 0)
	tx.mu.Lock()
	credits := tx.link.Credits()
	tx.mu.Unlock()
	n := credits + mgmtSlack + 50
	for range n { // ignoring credit
		tx.send(r.MCMemberRecord().MLID(), true, group, wire.MulticastQPN, 0x01234567, []byte("flood"))
	}
	waitFor(t, func() bool { return statsOf(s, tx.guid).RxPackets == uint64(n) })
	if st := statsOf(s, tx.guid); st.RcvOverruns != 50 {
		t.Errorf("overruns %d, want 50 (credit %d, room %d, sent %d): %+v", st.RcvOverruns, credits, mgmtSlack, n, st)
	}
}

// TestSwitchStallDiscardsNothing: the head-of-queue lifetime counts what
// reaches the switch, not the switch's own delays. A receiving port's
// credit that reached the fabric socket within the lifetime but was read
// only after it (the switch was descheduled or stopped meanwhile) must
// not discard the packet that waited for it. Before, the forwarder's
// timer ran first after such a stall and discarded: TestIBBurstLossless
// delivered 9,999 of 10,000 under load, and a softsm stopped (SIGSTOP)
// for 400 ms at a time lost 1–2 of 10,000 in 3 of 10 bursts.
func TestSwitchStallDiscardsNothing(t *testing.T) {
	// The lifetime must outlast the steps between the head's first wait
	// and the credit's arrival on a loaded machine.
	const hoq = 300 * time.Millisecond
	s := startSM(t, Config{HOQLife: hoq})
	tx := newFlowPort(t, s.FabricAddr(), 0x200031, 16, true)
	rx := newFlowPort(t, s.FabricAddr(), 0x200032, 4, false)
	group := mgid("ff12:4001:ffff::601:207")
	r := mustStatus(t, rawSA(t, s.SAAddr(), mcReq(mad.MethodSet, mad.CompCreateRequired, group, rx.guid, mad.JoinFullMember), waitTimeout), 0)
	mlid := r.MCMemberRecord().MLID()
	for range 5 { // within tx's credit; rx's window takes 4
		tx.send(mlid, true, group, wire.MulticastQPN, 0x01234567, []byte("stall"))
	}
	for i := range 4 {
		if rx.recv(waitTimeout) == nil {
			t.Fatalf("received %d of the window's 4", i)
		}
	}
	waitFor(t, func() bool { return statsOf(s, rx.guid).XmitWaits >= 1 }) // the 5th waits for rx's credit

	// Stall the switch's reading: the reader handles one datagram and
	// then waits for fmu, reading nothing more.
	s.fmu.Lock()
	unlocked := false
	defer func() {
		if !unlocked {
			s.fmu.Unlock()
		}
	}()
	poke, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer poke.Close()
	before := s.unknownSrc.Load()
	if _, err := poke.WriteToUDPAddrPort(make([]byte, 64), s.FabricAddr()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return s.unknownSrc.Load() > before })
	// rx gives credit at once: it reaches the fabric socket and waits
	// there, unread.
	rx.mu.Lock()
	rx.sendFlow(rx.link.Answer(rx.win))
	rx.mu.Unlock()
	// The stall itself: the switch does nothing for longer than the
	// lifetime (the condition under test, not a wait for a result).
	time.Sleep(2 * hoq)
	s.fmu.Unlock()
	unlocked = true

	if rx.recv(waitTimeout) == nil {
		t.Fatalf("the packet that waited for rx's credit did not come: %+v", statsOf(s, rx.guid))
	}
	if st := statsOf(s, rx.guid); st.XmitDiscards != 0 || st.TxPackets != 5 {
		t.Errorf("rx's counters %+v", st)
	}
}

// TestSocketDropsCounted: datagrams the kernel drops because the fabric
// socket's buffer is full never reach the switch's counters of a port;
// Stats counts them (SocketDrops) and -v logs them.
func TestSocketDropsCounted(t *testing.T) {
	var logMu sync.Mutex
	var logged []string
	s := startSM(t, Config{Logf: func(format string, args ...any) {
		logMu.Lock()
		logged = append(logged, fmt.Sprintf(format, args...))
		logMu.Unlock()
	}})
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The reader stops at mu after its first batch; the socket fills.
	s.mu.Lock()
	b := make([]byte, 64)
	sent := 0
	for ; s.socketDrops() == 0; sent++ {
		if sent == 2_000_000 {
			s.mu.Unlock()
			t.Fatalf("no drop on the fabric socket after %d datagrams", sent)
		}
		if _, err := c.WriteToUDPAddrPort(b, s.FabricAddr()); err != nil {
			s.mu.Unlock()
			t.Fatal(err)
		}
	}
	s.mu.Unlock()
	if st := s.Stats(); st.SocketDrops == 0 {
		t.Errorf("SocketDrops 0 after %d datagrams into a full socket", sent)
	}
	waitFor(t, func() bool {
		logMu.Lock()
		defer logMu.Unlock()
		return slices.ContainsFunc(logged, func(l string) bool { return strings.Contains(l, "fabric socket: the kernel dropped") })
	})
}

// TestSABypassesBlockedData: a port's SA request is a management packet
// (VL15): it is answered while the port's data packets wait at the head
// of its input queue for a port that gives no credit. Before, it waited
// behind them for the head-of-queue lifetime (an mckey leave timed out
// with a lifetime of an hour).
func TestSABypassesBlockedData(t *testing.T) {
	s := startSM(t, Config{HOQLife: time.Hour})
	tx := newFlowPort(t, s.FabricAddr(), 0x200041, 16, true)
	stuck := newFlowPort(t, s.FabricAddr(), 0x200042, 4, false)
	group := mgid("ff12:4001:ffff::601:208")
	r := mustStatus(t, rawSA(t, s.SAAddr(), mcReq(mad.MethodSet, mad.CompCreateRequired, group, stuck.guid, mad.JoinFullMember), waitTimeout), 0)
	mlid := r.MCMemberRecord().MLID()
	for range 6 { // within tx's credit; the stuck port takes 4
		tx.send(mlid, true, group, wire.MulticastQPN, 0x01234567, []byte("blocked"))
	}
	waitFor(t, func() bool { return statsOf(s, stuck.guid).XmitWaits >= 1 }) // the head waits
	answers := tx.sa(mcReq(mad.MethodGet, mad.CompMGID|mad.CompPortGID, group, stuck.guid, 0), false)
	if len(answers) != 1 || answers[0].Status() != 0 {
		t.Fatalf("SA answers %v", answers)
	}
	if st := statsOf(s, tx.guid); st.SARequests != 1 {
		t.Errorf("sender's counters %+v", st)
	}
}

// TestNoMarkerStillDiscards: when the switch cannot send itself a marker
// (no loopback), the clock decides the head-of-queue lifetime, and a
// port that gives no credit still cannot hold its senders forever.
func TestNoMarkerStillDiscards(t *testing.T) {
	s := startSM(t, Config{HOQLife: 50 * time.Millisecond})
	s.mu.Lock()
	s.markAddr = netip.MustParseAddrPort("[2001:db8::1]:1") // an IPv4 socket refuses it (EAFNOSUPPORT): nothing is sent
	s.mu.Unlock()
	tx := newFlowPort(t, s.FabricAddr(), 0x200051, 16, true)
	stuck := newFlowPort(t, s.FabricAddr(), 0x200052, 4, false)
	group := mgid("ff12:4001:ffff::601:209")
	r := mustStatus(t, rawSA(t, s.SAAddr(), mcReq(mad.MethodSet, mad.CompCreateRequired, group, stuck.guid, mad.JoinFullMember), waitTimeout), 0)
	mlid := r.MCMemberRecord().MLID()
	for range 5 {
		tx.send(mlid, true, group, wire.MulticastQPN, 0x01234567, []byte("no marker"))
	}
	waitFor(t, func() bool { return statsOf(s, stuck.guid).XmitDiscards == 1 })
	if st := s.Stats(); st.SendErrors == 0 {
		t.Errorf("the refused marker is not counted: %+v", st)
	}
}

// TestSAMADsKeepTheLinkGranted: SA MADs take the port's credit like any
// packet but never queue; the switch grants it back, so a port that sends
// only SA MADs (joins and leaves, no data) for many windows on end gets
// every one answered (without the grant the MADs past a window and the
// management slack were overruns, and the port's leaves timed out).
func TestSAMADsKeepTheLinkGranted(t *testing.T) {
	s := startSM(t, Config{})
	tx := newFlowPort(t, s.FabricAddr(), 0x200061, 16, true)
	group := mgid("ff12:4001:ffff::601:209")
	s.mu.Lock()
	n := 3*s.win + 2*mgmtSlack + 8
	s.mu.Unlock()
	for i := range n {
		answers := tx.sa(mcReq(mad.MethodGet, mad.CompMGID, group, tx.guid, 0), false)
		if len(answers) != 1 {
			t.Fatalf("SA MAD %d of %d: answers %v", i+1, n, answers)
		}
	}
	if st := statsOf(s, tx.guid); st.RcvOverruns != 0 || st.SARequests != uint64(n) {
		t.Fatalf("port counters %+v, want %d SA requests and no overrun", st, n)
	}
}
