//go:build rdmacore && cgo

package rdmacore

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/verbs"
)

// TestSendCost measures the data path's cost per message on the kernel
// device: n UD sends of 64 bytes to a multicast group, a window of 64
// outstanding, every 16th signaled, completions busy-polled (the pattern
// of rdma-core's ib_send_bw -c UD). It runs only when
// SOFTRDMA_RDMACORE_SEND_COST=n is set: test/interop's TestKernelSendCost
// sets it in a guest and compares the figure with ib_send_bw in the same
// guest. It prints one line:
//
//	SENDCOST n=… wall_ns=… cpu_ns=… (per message)
func TestSendCost(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SOFTRDMA_RDMACORE_SEND_COST"))
	if n <= 0 {
		t.Skip("SOFTRDMA_RDMACORE_SEND_COST is not set: a measurement, run by test/interop's TestKernelSendCost")
	}
	e := newEnv(t)
	const window, signalEvery, size = 64, 16, 64
	cq, err := e.ctx.CreateCQ(2 * window)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, cq.Destroy()) })
	buf := make([]byte, size)
	mr, err := e.pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, mr.Dereg()) })
	qp, err := e.pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTypeUD,
		Cap: verbs.QPCap{MaxSendWR: 2 * window, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, qp.Destroy()) })
	toRTS(t, qp, e.port)
	group := netip.MustParseAddr("::ffff:239.77.0.1").As16()
	ah, err := e.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: e.port,
		GRH: verbs.GlobalRoute{DGID: verbs.GID(group), SGIDIndex: uint8(e.gid.Index), HopLimit: 64}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, ah.Destroy()) })
	wr := verbs.SendWR{Opcode: verbs.WRSend, SGList: []verbs.SGE{mr.SGE(0, size)},
		UD: verbs.UDWR{AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: testQKey}}
	var wc [16]verbs.WC
	run := func(count int) {
		outstanding := 0 // unsignaled ones count through their signaled successor
		for i := 0; i < count; i++ {
			for outstanding >= window {
				m, err := cq.Poll(wc[:])
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range wc[:m] {
					if c.Status != verbs.WCSuccess {
						t.Fatalf("send completion %v", c.Status)
					}
				}
				outstanding -= m * signalEvery
			}
			wr.WRID = uint64(i)
			wr.Flags = 0
			if (i+1)%signalEvery == 0 {
				wr.Flags = verbs.SendSignaled
			}
			if err := qp.PostSend(&wr); err != nil {
				t.Fatalf("send %d: %v", i, err)
			}
			outstanding++
		}
		for outstanding >= signalEvery {
			m, err := cq.Poll(wc[:])
			if err != nil {
				t.Fatal(err)
			}
			outstanding -= m * signalEvery
		}
	}
	run(1024) // warm up
	var r0, r1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	start := time.Now()
	run(n - n%signalEvery)
	wall := time.Since(start)
	syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	cpu := time.Duration(r1.Utime.Nano()-r0.Utime.Nano()) + time.Duration(r1.Stime.Nano()-r0.Stime.Nano())
	fmt.Printf("SENDCOST n=%d wall_ns=%.0f cpu_ns=%.0f\n", n, float64(wall.Nanoseconds())/float64(n), float64(cpu.Nanoseconds())/float64(n))
}
