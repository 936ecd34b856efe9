package bench

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
)

// BenchmarkFanout runs fan-out cases of softrdma bench as Go benchmarks, so
// that two versions compare with benchstat: one sender (this process) to
// N receiver processes (this test binary re-executed), plain UDP sockets
// (udp) and the RoCEv2 device (rdma). One op is one measurement of 250 ms;
// run it with -benchtime 1x and -count: ns/op is the wall time per
// delivered datagram, rx-ns/msg the receivers' CPU time per delivered
// datagram, tx-ns/msg the sender's per datagram sent, dlv-msgs/s the
// delivered rate summed over the receivers and loss-% the datagrams sent
// and not delivered.
//
//	go test -run '^$' -bench Fanout -benchtime 1x -count 6 ./cmd/softrdma/internal/bench
func BenchmarkFanout(b *testing.B) {
	testenv.RequireBench(b)
	cfg := DefaultConfig()
	cfg.RxCommand = []string{os.Args[0]}
	cfg.RxEnv = []string{rxEnv, "GOMAXPROCS=1"}
	cfg.Receivers = []int{1, 2, 4}
	f := &fanout{cfg: &cfg}
	if err := f.start(); err != nil {
		b.Fatal(err)
	}
	defer f.stop()
	for _, n := range cfg.Receivers {
		for _, size := range []int{64, 1024, 4096} {
			for _, mode := range []string{"udp", "rdma"} {
				b.Run(fmt.Sprintf("%s/n=%d/size=%d", mode, n, size), func(b *testing.B) {
					var msgs, sent uint64
					var el time.Duration
					var tx, rx int64
					for range b.N {
						r, err := f.measure(mode, n, size)
						if err != nil {
							b.Fatal(err)
						}
						msgs, sent, el, tx, rx = msgs+r.msgs, sent+r.sent, el+r.span, tx+r.txCPU, rx+r.rxCPU
					}
					if msgs == 0 {
						b.Fatalf("nothing delivered")
					}
					b.ReportMetric(float64(el.Nanoseconds())/float64(msgs), "ns/op")
					b.ReportMetric(float64(rx)/float64(msgs), "rx-ns/msg")
					b.ReportMetric(float64(tx)/float64(sent), "tx-ns/msg")
					b.ReportMetric(float64(msgs)/el.Seconds(), "dlv-msgs/s")
					b.ReportMetric(100*(1-float64(msgs)/float64(sent*uint64(n))), "loss-%")
				})
			}
		}
	}
}
