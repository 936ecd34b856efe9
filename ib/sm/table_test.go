package sm

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sa"
	"github.com/softrdma/softrdma/wire"
)

// The table attack: one port of a source with many ports asks the SA for
// a table whose size grows with the subnet (every path between every two
// ports is N×N records). The SA must keep answering the other ports'
// joins meanwhile, within provider/ib's SA timeout, and its memory must
// not grow with the table.

// tableAttackPorts is how many ports the table tests attach from one
// source address: the most one source may attach (DefaultMaxPortsPerSource),
// or SOFTSM_TABLE_PORTS (at least 3).
func tableAttackPorts() int {
	if n, err := strconv.Atoi(os.Getenv("SOFTSM_TABLE_PORTS")); err == nil && n > 2 {
		return min(n, DefaultMaxPortsPerSource)
	}
	return DefaultMaxPortsPerSource
}

// attachMany attaches n ports from ip: two fakePorts that can send SA
// requests and ACK RMPP segments (askers) and n-2 flood ports, attached
// again until every one is (a flood's first attaches may find the
// control queue full).
func attachMany(t *testing.T, s *SM, ip netip.Addr, n int) (askers [2]*fakePort, f *flooder) {
	t.Helper()
	for i := range askers {
		askers[i] = newFakePortAt(t, s.FabricAddr(), ip, 0x7300_0001+uint64(i))
	}
	f, err := flood(s.FabricAddr(), ip, 0x7400_0000, n-len(askers))
	t.Cleanup(f.close)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if got := s.attachedPorts(); got >= n {
			return askers, f
		} else if time.Now().After(deadline) {
			t.Fatalf("%d of %d ports attached", got, n)
		}
		time.Sleep(200 * time.Millisecond)
		f.again()
	}
}

// sendSA sends an SA MAD from flood port i (whose answers nobody reads).
func (f *flooder) sendSA(t *testing.T, i int, m mad.MAD) {
	t.Helper()
	h := &fabric.UDPacket{DLID: fabric.SMLID, SLID: 0x100,
		UD: wire.UDHeader{PKey: 0xFFFF, DestQP: fabric.SAQPN, QKey: fabric.SAQKey, SrcQP: fabric.SAQPN}}
	b := make([]byte, fabric.PacketLen(len(m), false, false))
	fabric.EncodeUD(b, h, m)
	if _, err := f.conns[i].WriteToUDPAddrPort(b, f.sm); err != nil {
		t.Fatal(err)
	}
}

// attachedPorts counts the attached ports.
func (s *SM) attachedPorts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byAddr)
}

// joinDirect makes each of guids a member of per groups (of 64), through
// the SA directly (setting up a table test quickly).
func joinDirect(t *testing.T, s *SM, guids []uint64, per int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, guid := range guids {
		for k := range per {
			g := wire.GID{0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 14: 0x74, 15: byte((i + k) % 64)}
			r := s.sa.Handle(mcReq(mad.MethodSet, mad.CompCreateRequired, g, guid, mad.JoinFullMember), sa.From{Raw: true})
			if len(r) != 1 || r[0].Status() != 0 {
				t.Fatalf("join of %#x: %v", guid, r)
			}
		}
	}
	s.rebuildMFT()
}

// tableQuery is one table query of the attack.
type tableQuery struct {
	name string
	req  func(attacker *fakePort) mad.MAD
}

var attackTID uint64 = 0x7AB1E000

func saReq(method uint8, attr uint16, comp uint64) mad.MAD {
	attackTID++
	return mad.NewSARequest(method, attr, attackTID, comp)
}

// tableQueries are the SA's queries whose answer grows with the subnet:
// every Get and GetTable it serves.
var tableQueries = []tableQuery{
	{"GetTable(PathRecord) comp mask 0", func(*fakePort) mad.MAD { return saReq(mad.MethodGetTable, mad.AttrPathRecord, 0) }},
	{"GetTable(PathRecord) from the attacker to every port", func(a *fakePort) mad.MAD {
		m := saReq(mad.MethodGetTable, mad.AttrPathRecord, mad.PathCompSGID)
		m.PathRecord().SetSGID(a.gid())
		return m
	}},
	{"Get(PathRecord) comp mask 0", func(*fakePort) mad.MAD { return saReq(mad.MethodGet, mad.AttrPathRecord, 0) }},
	{"GetTable(MCMemberRecord) trusted", func(*fakePort) mad.MAD {
		m := saReq(mad.MethodGetTable, mad.AttrMCMemberRecord, 0)
		m.SetSMKey(sa.DefaultSMKey)
		return m
	}},
	{"GetTable(MCMemberRecord)", func(*fakePort) mad.MAD { return saReq(mad.MethodGetTable, mad.AttrMCMemberRecord, 0) }},
	{"Get(MCMemberRecord) trusted", func(*fakePort) mad.MAD {
		m := saReq(mad.MethodGet, mad.AttrMCMemberRecord, 0)
		m.SetSMKey(sa.DefaultSMKey)
		return m
	}},
	{"GetTable(PathRecord) to a group", func(a *fakePort) mad.MAD {
		m := saReq(mad.MethodGetTable, mad.AttrPathRecord, mad.PathCompDGID)
		m.PathRecord().SetDGID(wire.GID{0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 14: 0x74, 15: 1})
		return m
	}},
	{"GetTable(ClassPortInfo)", func(*fakePort) mad.MAD { return saReq(mad.MethodGetTable, mad.AttrClassPortInfo, 0) }},
}

// TestTableAttack: 4,096 ports attached from one source address, its limit
// (each a member of 12 groups of 64). Four of them send SubnAdmGetTable(PathRecord)
// with component mask 0 (N×N paths), and 60 more every other query the SA
// serves, all at once. A probe port of another address joins and leaves a
// group all the while: each of its joins is answered within provider/ib's
// SA timeout, and the heap does not grow with the tables. Then each query
// is asked once more, alone, and its answer checked: a table beyond
// MaxTableRecords records (or 4 × as many candidates) is answered 0x0100,
// the others in full. (SOFTSM_TABLE_PORTS=1500 runs it with fewer ports:
// before the SA bounded its queries, the probe got no answer for 43 s and
// the attack allocated 2.1 GB.)
func TestTableAttack(t *testing.T) {
	n := tableAttackPorts()
	s := startSM(t, Config{PortTimeout: 5 * time.Minute, Logf: func(string, ...any) {}})
	src := netip.MustParseAddr("127.0.3.1")
	askers, f := attachMany(t, s, src, n)
	guids := []uint64{askers[0].guid, askers[1].guid}
	for i := range f.conns {
		guids = append(guids, 0x7400_0000+uint64(i))
	}
	joinDirect(t, s, guids, 12)
	probePort := newFakePort(t, s.FabricAddr(), 0x7300_0010)

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	stopProbe, joins := startProbe(t, probePort, mgid("ff12:4001:ffff::601:730"), probeTimeout)
	waitUntil(t, "the probe's first joins", func() bool { return joins() >= 3 })
	start := time.Now()
	for i := range 4 {
		f.sendSA(t, i, tableQueries[0].req(nil))
	}
	for i := 4; i < 64; i++ {
		f.sendSA(t, i, tableQueries[1+i%(len(tableQueries)-1)].req(askers[0]))
	}
	// The probe goes on until it joined 50 times after the attack began,
	// and for a second at least.
	begin := joins()
	for deadline := time.Now().Add(20 * time.Second); joins() < begin+50 || time.Since(start) < time.Second; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			break
		}
	}
	r := stopProbe()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	during := r.between(start, time.Now())
	grew := int64(after.TotalAlloc - before.TotalAlloc)
	st := s.Stats()
	t.Logf("%d ports from %v; during the attack (%v): probe %v; allocated %d MiB, heap %d → %d MiB; SA throttled %d, tables too large %d, busy %d",
		n, src, time.Since(start).Round(time.Millisecond), during, grew>>20, before.HeapInuse>>20, after.HeapInuse>>20,
		st.SAThrottled, st.TableTooLarge, st.TableBusy)
	if r.timeouts != 0 || len(r.bad) != 0 || len(during.lat) < 40 {
		t.Errorf("probe during the attack: %v (all: %v) %q", during, r, r.bad)
	}
	if mx := during.pct(1); mx >= probeTimeout {
		t.Errorf("probe join max %v during the attack", mx)
	}
	// Far below the N×N table (4,096 ports: 16.8 M records, 1 GB of
	// records and 1.4 GB of RMPP segments per query).
	if grew > 64<<20 {
		t.Errorf("%d MiB allocated during the attack", grew>>20)
	}
	if st.TableTooLarge == 0 {
		t.Error("no table refused as too large")
	}

	// Each query alone, four from each asker (its TableBurst).
	records := func(rs []mad.MAD) int {
		if len(rs) == 0 || rs[0].Status() != 0 || rs[0].RMPPFlags()&mad.RMPPFlagActive == 0 {
			return -1
		}
		data := int(rs[0].PayloadLength()) - 20*len(rs)
		if off := int(rs[0].AttrOffset()) * 8; off > 0 {
			return data / off
		}
		return 0
	}
	groups := len(s.Groups())
	want := []struct {
		status  uint16
		records int // of a GetTable answered 0 (-1: a Get)
	}{
		{mad.StatusNoResources, 0}, // N×N paths
		{0, n + 1},                 // a path to every port (and the probe)
		{0, -1},                    // a Get of a path: the first
		{mad.StatusNoResources, 0}, // 12 × N members
		{0, groups},                // a record per group
		{mad.StatusTooManyRecords, 0},
		{0, 1}, // the path to a group
		{mad.StatusReqInvalid, 0},
	}
	for i, q := range tableQueries {
		a := askers[i/4]
		rs := a.sa(q.req(a), false)
		got := rs[0].Status()
		if got != want[i].status {
			t.Errorf("%s: %s, want status %#04x", q.name, tableAnswer(rs), want[i].status)
			continue
		}
		if got == 0 && want[i].records >= 0 {
			if k := records(rs); k != want[i].records {
				t.Errorf("%s: %d records, want %d", q.name, k, want[i].records)
			}
		}
		t.Logf("%s: %s", q.name, tableAnswer(rs))
	}
}

// tableAnswer describes an SA answer (the first MAD, the records of an
// RMPP answer).
func tableAnswer(rs []mad.MAD) string {
	if len(rs) == 0 {
		return "no answer"
	}
	return fmt.Sprintf("status %#04x, %d MADs", rs[0].Status(), len(rs))
}

// TestSAThrottle: a port sending queries far beyond TableBurst gets
// TableBurst of them answered at once, the rest dropped, counted and
// logged; its joins, another class, are still answered.
func TestSAThrottle(t *testing.T) {
	var logs logRecorder
	s := startSM(t, Config{Logf: logs.logf(t)})
	p := newFakePort(t, s.FabricAddr(), 0x760001)
	const n = 40
	for range n {
		p.send(fabric.SMLID, false, s.SMGID(), fabric.SAQPN, fabric.SAQKey, saReq(mad.MethodGet, mad.AttrPathRecord, 0))
	}
	// Every query is taken (answered) or dropped.
	answered := 0
	for deadline := time.Now().Add(waitTimeout); uint64(answered)+s.Stats().SAThrottled < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d queries answered, %d dropped, of %d", answered, s.Stats().SAThrottled, n)
		}
		if p.recv(10*time.Millisecond) != nil {
			answered++
		}
	}
	if answered < TableBurst || answered > TableBurst+2*TableRate {
		t.Errorf("%d of %d queries answered, want %d (the burst) and what the rate added meanwhile", answered, n, TableBurst)
	}
	if !logs.has("queries (Get, GetTable) a second from the port") {
		t.Error("the throttle was not logged")
	}
	mustStatus(t, p.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, mgid("ff12:4001:ffff::601:760"), p.guid, mad.JoinFullMember), false), 0)
}

// TestTableTooLarge: with MaxTableRecords 8, the trusted GetTable of 10
// member records is answered 0x0100 (one MAD, no record), counted and
// logged; the table of the 6 groups is answered in full.
func TestTableTooLarge(t *testing.T) {
	var logs logRecorder
	s := rmppSM(t, Config{MaxTableRecords: 8, Logf: logs.logf(t)})
	rs := rawSA(t, s.SAAddr(), getTable(0x761), waitTimeout)
	mustStatus(t, rs, mad.StatusNoResources)
	q := mad.NewSARequest(mad.MethodGetTable, mad.AttrMCMemberRecord, 0x762, 0)
	if rs := rawSA(t, s.SAAddr(), q, waitTimeout); len(rs) != 2 || rs[0].Status() != 0 { // 6 × 56 bytes: 2 segments
		t.Fatalf("the table of the groups: %s", tableAnswer(rs))
	}
	if st := s.Stats(); st.TableTooLarge != 1 || st.TableBusy != 0 {
		t.Errorf("TableTooLarge %d TableBusy %d, want 1 and 0", st.TableTooLarge, st.TableBusy)
	}
	if !logs.has("answered 0x0100, more than 8 records") {
		t.Error("the refusal was not logged")
	}
}

// TestRMPPPerRequester: a requester with MaxRMPPPerRequester transfers in
// progress gets 0x0100 for one more GetTable (TableBusy); once one of its
// transfers ends, it gets its table.
func TestRMPPPerRequester(t *testing.T) {
	s := rmppSM(t, Config{RMPPTimeout: time.Minute})
	p := newRMPPPeer(t, s)
	var firsts []mad.MAD
	for i := range MaxRMPPPerRequester {
		tid := uint64(0x770 + i)
		p.write(getTable(tid))
		firsts = append(firsts, p.segment(tid, 1))
	}
	p.write(getTable(0x77F))
	if m := p.next(); m.TID() != 0x77F || m.Status() != mad.StatusNoResources || m.RMPPFlags()&mad.RMPPFlagActive != 0 {
		t.Fatalf("a third GetTable: tid %#x status %#04x RMPP flags %#x, want 0x0100", m.TID(), m.Status(), m.RMPPFlags())
	}
	if st := s.Stats(); st.TableBusy != 1 {
		t.Errorf("TableBusy %d, want 1", st.TableBusy)
	}
	p.write(mad.NewRMPPAbort(firsts[0], mad.RMPPStatusT2L))
	waitStats(t, s, "the aborted transfer ended", func(st Stats) bool { return st.RMPPAborts == 1 })
	p.write(getTable(0x780))
	p.segment(0x780, 1)
}
