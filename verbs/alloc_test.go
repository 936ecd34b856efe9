package verbs_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
)

// TestDataPathAllocs checks that a multicast datagram sent and received
// through verbs and the rxe device on lo allocates nothing in steady state
// (post receive, post send, completions on both sides, the consumer
// reading the socket itself).
func TestDataPathAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("steady-state measurement")
	}
	e := newEnv(t)
	rx, tx := e.qp(t, 0), e.qp(t, 0)
	toRTS(t, rx, 7)
	toRTS(t, tx, 7)
	g := randMGID()
	if err := rx.AttachMcast(g, 0); err != nil {
		t.Fatal(err)
	}
	rbuf := make([]byte, 40+256)
	rmr, _ := e.pd.RegMR(rbuf, verbs.AccessLocalWrite)
	defer rmr.Dereg()
	sbuf := make([]byte, 256)
	smr, _ := e.pd.RegMR(sbuf, 0)
	defer smr.Dereg()
	ah, err := e.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: 1, GRH: verbs.GlobalRoute{DGID: g, HopLimit: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Destroy()
	rwr := &verbs.RecvWR{WRID: 1, SGList: []verbs.SGE{rmr.SGE(0, len(rbuf))}}
	swr := &verbs.SendWR{WRID: 2, Opcode: verbs.WRSendWithImm, Flags: verbs.SendSignaled, SGList: []verbs.SGE{smr.SGE(0, 256)},
		UD: verbs.UDWR{AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: 7}}
	var wc [4]verbs.WC
	round := func() {
		if err := rx.PostRecv(rwr); err != nil {
			t.Fatal(err)
		}
		if err := tx.PostSend(swr); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for got := 0; got < 2; {
			n, err := e.cq.Poll(wc[:])
			if err != nil {
				t.Fatal(err)
			}
			got += n
			if n == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%d of 2 completions after 10s", got)
				}
				runtime.Gosched()
			}
		}
	}
	for range 50 {
		round()
	}
	start := time.Now()
	for range 100 {
		round()
	}
	t.Logf("%v per round", time.Since(start)/100)
	// Only this goroutine's calls are counted: testing.AllocsPerRun also
	// counts what other goroutines of the process allocate meanwhile (and
	// rounds the average down). The receive goroutine's path has its own
	// allocation tests in provider/rxe.
	a := testenv.AllocsInCalls(200, round)
	if testenv.RaceEnabled {
		t.Skipf("%.2f allocations per datagram under -race, where sync.Pool drops buffers at random; .ci/run runs this test without -race", a)
	}
	if a > 0 {
		t.Errorf("%.2f allocations per datagram", a)
	}
}
