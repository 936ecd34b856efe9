package bench

import (
	"fmt"
	"math"
	"runtime/metrics"
	"syscall"
)

// runStats are the Go runtime's counters that show where a peer's time
// goes between the device and the program: calls into C (cgo: each one
// leaves the P to the scheduler's judgement, and a call that lasts longer
// than a sysmon tick, 20 µs or more, finds its P handed off when it
// returns) and how long goroutines waited to run once runnable
// (/sched/latencies, sampled by the runtime), which includes that
// hand-off.
type runStats struct {
	samples []metrics.Sample
	hist    *metrics.Float64Histogram
	cpu     int64 // the process's CPU time (user and system), ns
}

var runStatNames = []string{"/cgo/go-to-c-calls:calls", "/sched/latencies:seconds", "/sched/threads/total:threads"}

func readRunStats() runStats {
	s := runStats{samples: make([]metrics.Sample, len(runStatNames))}
	for i, n := range runStatNames {
		s.samples[i].Name = n
	}
	metrics.Read(s.samples)
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.cpu = ru.Utime.Nano() + ru.Stime.Nano()
	}
	// The histogram is reused by the next Read: keep a copy.
	if h := s.samples[1].Value; h.Kind() == metrics.KindFloat64Histogram {
		c := *h.Float64Histogram()
		c.Counts = append([]uint64(nil), c.Counts...)
		s.samples[1].Value = metrics.Value{}
		s.hist = &c
	}
	return s
}

// line describes what happened since before, per round (a round trip,
// or an answer): "RUNTIME role=… rounds=… cgo_calls_per_round=…
// cpu_us_per_round=… sched_latency_samples=… p50_us=… p90_us=… p99_us=… threads=…".
func (s runStats) line(role string, before runStats, rounds int) string {
	cgo := float64(s.samples[0].Value.Uint64()-before.samples[0].Value.Uint64()) / float64(max(rounds, 1))
	var counts []uint64
	var total uint64
	if s.hist != nil && before.hist != nil && len(s.hist.Counts) == len(before.hist.Counts) {
		counts = make([]uint64, len(s.hist.Counts))
		for i := range counts {
			counts[i] = s.hist.Counts[i] - before.hist.Counts[i]
			total += counts[i]
		}
	}
	q := func(p float64) float64 {
		if total == 0 {
			return math.NaN()
		}
		want := uint64(math.Ceil(p * float64(total)))
		var acc uint64
		for i, c := range counts {
			acc += c
			if acc >= want {
				return s.hist.Buckets[i+1] * 1e6 // the bucket's upper bound
			}
		}
		return math.Inf(1)
	}
	cpu := float64(s.cpu-before.cpu) / 1e3 / float64(max(rounds, 1))
	return fmt.Sprintf("RUNTIME role=%s rounds=%d cgo_calls_per_round=%.1f cpu_us_per_round=%.1f sched_latency_samples=%d p50_us=%.1f p90_us=%.1f p99_us=%.1f threads=%d",
		role, rounds, cgo, cpu, total, q(0.5), q(0.9), q(0.99), s.samples[2].Value.Uint64())
}
