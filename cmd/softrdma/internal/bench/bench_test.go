package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/test/testsm"
	"golang.org/x/sys/unix"
)

// rxEnv makes the test binary a fan-out receiver process.
const rxEnv = "SOFTRDMA_BENCH_RX=1"

func TestMain(m *testing.M) {
	if os.Getenv("SOFTRDMA_BENCH_RX") == "1" {
		if err := RunReceiver(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	testenv.OwnNetns() // lo to this package alone
	testenv.ClearSoftRDMA()
	os.Exit(m.Run())
}

var lo = netip.MustParseAddr("127.0.0.1")

// TestQuick runs the quick configuration with this test binary as the
// receiver process and checks that every part reports and that each JSON
// line parses. It asserts no timing.
func TestQuick(t *testing.T) {
	testenv.RequireBench(t)
	cfg := QuickConfig()
	cfg.Groups = 100
	cfg.RxCommand = []string{os.Args[0]}
	cfg.RxEnv = []string{rxEnv}
	cfg.LatEnv = []string{rxEnv}
	kindsWanted := []string{"fanout", "icrc", "join", "groups", "qp", "allocs", "ib_fanout", "sa", "latency", "target"}
	cfg.IBViaSwitch = testsm.OnViaSwitch()
	if cfg.IBSM = testsm.SM(t); cfg.IBSM == sm.ManagerOpenSM || cfg.IBViaSwitch {
		// SOFTRDMA_TEST_SM=opensm or switch: the parts that start a
		// subnet manager (the other parts run in the default run and have
		// no SM).
		cfg.Parts, cfg.LatLo, cfg.LatVeth, cfg.LatIB = []string{PartIB, PartLatency}, false, false, true
		kindsWanted = []string{"ib_fanout", "sa", "latency", "target"}
	}
	var table, js bytes.Buffer
	cfg.Table, cfg.JSON = &table, &js
	rep, err := Run(cfg)
	if err != nil {
		t.Fatalf("%v\n%s", err, table.String())
	}
	t.Log("\n" + table.String())
	kinds := lineKinds(t, js.Bytes())
	for _, k := range kindsWanted {
		if kinds[k] == 0 {
			t.Errorf("no %q line", k)
		}
	}
	if cfg.IBSM != sm.ManagerOpenSM && !cfg.IBViaSwitch {
		if f := rep.Fanout[0]; f.UDPMsgsPerS <= 0 || f.RDMAMsgsPerS <= 0 {
			t.Errorf("fan-out delivered nothing: %+v", f)
		}
		if g := rep.Groups; g.Held != g.Groups || !g.Delivered {
			t.Errorf("groups: %+v", g)
		}
	}
	if f := rep.IBFanout[0]; f.IBMsgsPerS <= 0 || f.RoCEMsgsPerS <= 0 || f.IBSwitchCPUns <= 0 {
		t.Errorf("IB fan-out delivered nothing: %+v", f)
	}
	for _, l := range rep.Latency {
		if l.Mode == "ib" && (l.Rounds == 0 || l.P50us <= 0) {
			t.Errorf("IB latency case without round trips: %+v", l)
		}
	}
}

// TestSmoke runs the parts that stay in this process (ICRC, allocations,
// join/leave, groups, QP memory) at their smallest, in the default run:
// every part reports a JSON line with its ratio, and the groups are held
// and deliver. The multi-process fan-out runs in TestQuick.
func TestSmoke(t *testing.T) {
	cfg := QuickConfig()
	cfg.Parts = []string{PartICRC, PartAllocs, PartControl}
	cfg.Groups, cfg.QPs, cfg.JoinSamples, cfg.AllocRuns = 20, 10, 10, 5
	var table, js bytes.Buffer
	cfg.Table, cfg.JSON = &table, &js
	rep, err := Run(cfg)
	if err != nil {
		t.Fatalf("%v\n%s", err, table.String())
	}
	kinds := lineKinds(t, js.Bytes())
	for _, k := range []string{"icrc", "join", "groups", "qp", "allocs"} {
		if kinds[k] == 0 {
			t.Errorf("no %q line in:\n%s", k, js.String())
		}
	}
	if kinds["fanout"] != 0 || len(rep.Fanout) != 0 {
		t.Errorf("fan-out ran although not asked for")
	}
	if g := rep.Groups; g.Groups != 20 || g.Held != g.Groups || !g.Delivered {
		t.Errorf("groups: %+v", g)
	}
}

var sizes = []int{64, 256, 1024, 4096}

// BenchmarkLoopback moves datagrams from a sender to a receiver in this
// process over lo, a window of 32 at a time (send 32, wait for all 32): udp
// is plain sockets with sendmmsg/recvmmsg, rdma a chain of 32 send WRs to a
// QP with receive WRs posted. One op is one datagram.
func BenchmarkLoopback(b *testing.B) {
	const batch = 32
	for _, size := range sizes {
		b.Run(fmt.Sprintf("udp/size=%d", size), func(b *testing.B) {
			idx, err := ifindexOf(lo)
			if err != nil {
				b.Fatal(err)
			}
			g := randGroup()
			r, err := newMmsgReceiver(g, idx, RecvBatch)
			if err != nil {
				b.Fatal(err)
			}
			defer r.close()
			s, err := newMmsgSender(lo, g, idx, batch, size)
			if err != nil {
				b.Fatal(err)
			}
			defer s.close()
			r.conn.SetReadDeadline(time.Now().Add(time.Minute))
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				if _, err := s.send(); err != nil {
					b.Fatal(err)
				}
				for got := 0; got < batch; {
					n, err := r.rd.Read()
					if err != nil {
						b.Fatal(err)
					}
					got += n
				}
			}
		})
		b.Run(fmt.Sprintf("rdma/size=%d", size), func(b *testing.B) {
			l, err := newLoopback(lo, size, batch)
			if err != nil {
				b.Fatal(err)
			}
			defer l.close()
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				if err := l.round(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if l.lost > 0 {
				b.Logf("%d datagrams lost", l.lost)
			}
		})
	}
}

// BenchmarkSend sends to a group nobody joined, 32 datagrams per sendmmsg
// (udp) or per chain of send WRs (rdma): the sender's cost. One op is one
// datagram.
func BenchmarkSend(b *testing.B) {
	const batch = 32
	for _, size := range sizes {
		b.Run(fmt.Sprintf("udp/size=%d", size), func(b *testing.B) {
			idx, err := ifindexOf(lo)
			if err != nil {
				b.Fatal(err)
			}
			s, err := newMmsgSender(lo, randGroup(), idx, batch, size)
			if err != nil {
				b.Fatal(err)
			}
			defer s.close()
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				if _, err := s.send(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("rdma/size=%d", size), func(b *testing.B) {
			e, err := newEndpoint(lo, batch, 1, batch*size)
			if err != nil {
				b.Fatal(err)
			}
			defer e.close()
			g := randGroup()
			ah, qkey, err := e.join(g, true)
			if err != nil {
				b.Fatal(err)
			}
			defer e.leave(g)
			defer ah.Destroy()
			c := newSendChain(e, ah, qkey, 0, batch, size)
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				if _, err := c.post(e.qp); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkJoinLeave times one join (until its MULTICAST_JOIN event is
// retrieved, the QP attached) and one leave, on an id holding "held" other
// groups; "kernel" is IP_ADD_MEMBERSHIP + IP_DROP_MEMBERSHIP on a plain
// socket.
func BenchmarkJoinLeave(b *testing.B) {
	b.Run("kernel", func(b *testing.B) {
		idx, err := ifindexOf(lo)
		if err != nil {
			b.Fatal(err)
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer unix.Close(fd)
		for b.Loop() {
			m := unix.IPMreqn{Multiaddr: randGroup().As4(), Ifindex: int32(idx)}
			if err := unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, &m); err != nil {
				b.Fatal(err)
			}
			unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_DROP_MEMBERSHIP, &m)
		}
	})
	for _, held := range []int{0, 1000} {
		b.Run(fmt.Sprintf("rdma/held=%d", held), func(b *testing.B) {
			e, err := newEndpoint(lo, 1, 1, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer e.close()
			gs := uniqueGroups(held + 1)
			for _, g := range gs[1:] {
				if err := joinOne(e, g); err != nil {
					b.Fatal(err)
				}
			}
			for b.Loop() {
				if err := joinOne(e, gs[0]); err != nil {
					b.Fatal(err)
				}
				if err := e.id.LeaveMulticast(rdmacm.UDPAddr(gs[0])); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			for _, g := range gs[1:] {
				e.leave(g)
			}
		})
	}
}

// lineKinds counts the bench's JSON lines by kind; every line but a
// target's must carry a ratio.
func lineKinds(t *testing.T, js []byte) map[string]int {
	t.Helper()
	kinds := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(js))
	for sc.Scan() {
		var v struct {
			Kind  string   `json:"kind"`
			Ratio *float64 `json:"ratio"`
		}
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if v.Kind != "target" && v.Ratio == nil {
			t.Errorf("line without ratio: %s", sc.Text())
		}
		kinds[v.Kind]++
	}
	return kinds
}
