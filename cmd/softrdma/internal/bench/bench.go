// Package bench is the machinery of `softrdma bench`: it measures the
// software RoCEv2 device against the kernel's own UDP multicast on the same
// machine, in the same run, and prints a table and one JSON line per case
// with the ratio to the baseline.
//
// Parts:
//   - fan-out: one sender (this process) to N receiver processes on one
//     interface (loopback by default), for several payload sizes, as plain
//     UDP multicast sockets (sendmmsg/recvmmsg, the baseline) and as RoCEv2
//     through the RDMA CM and verbs (chains of send WRs, receive WRs kept
//     posted), with the same batch sizes; the two modes alternate;
//   - icrc: the ICRC and the receive-side check against hash/crc32 over
//     the same bytes;
//   - control: join → MULTICAST_JOIN event latency and leave latency (the
//     kernel's IP_ADD_MEMBERSHIP as the baseline), joins per second, the
//     number of groups one process holds at once with the Go heap per
//     group, and the memory of a QP;
//   - allocs: allocations per datagram in steady state;
//   - reliable (not in the default run: root and the C peers' libraries):
//     reliable multicast side by side — one sender to N receiver processes
//     in network namespaces of their own, over a bridge, at injected loss
//     rates — for every registered Peer (plain UDP multicast as the
//     ceiling, NORM, OpenPGM, and softrdma's once registered; see
//     reliable.go and rmsg.go);
//   - ib: the emulated InfiniBand subnet: fan-out through softsm (a
//     process of its own) against the RoCEv2 path of the same run, with
//     its loss (the subnet is lossless: the target is none), the SA's
//     joins per second over the fabric and the time the SA takes to
//     create 16,000 groups.
//
// The receiver processes are started from Config.RxCommand and run
// RunReceiver.
package bench

import (
	// Every kind of device (RoCEv2, InfiniBand, the kernel's with the rdmacore tag).
	_ "github.com/softrdma/softrdma/provider/all"

	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/netip"
	"slices"
	"time"

	"github.com/softrdma/softrdma/provider/rxe"
)

// RecvBatch is the number of datagrams one recvmmsg reads, in the device
// (rxe.RecvBatch) and so in the baseline.
const RecvBatch = rxe.RecvBatch

// Parts of a run.
const (
	PartFanout  = "fanout"
	PartICRC    = "icrc"
	PartControl = "control"
	PartAllocs  = "allocs"
	PartIB      = "ib"
	PartLatency = "latency"
)

// Config chooses what a run measures.
type Config struct {
	// Bind is the local address: its interface carries the traffic.
	Bind netip.Addr
	// Parts to run (PartFanout, PartICRC, PartControl, PartAllocs,
	// PartIB).
	Parts []string

	// Receivers are the numbers of receiver processes of the fan-out cases.
	Receivers []int
	// Sizes are the payload sizes, in bytes (at most maxPayload).
	Sizes []int
	// Duration is how long one mode of one case sends.
	Duration time.Duration
	// Repeats is how many times each case is measured in each mode.
	Repeats int
	// Batch is the number of datagrams per sendmmsg and per chain of send
	// WRs.
	Batch int
	// Rate limits the sender to that many datagrams per second (0: as fast
	// as it can).
	Rate int
	// Slots is the number of receive WRs an RDMA receiver keeps posted:
	// 512 by default, perftest's default receive depth (ib_send_bw
	// --rx-depth). A deeper queue cycles through more memory than the
	// cache holds: 4,096 WRs of 4 KiB are 17 MB per receiver, whose
	// stores miss (90 ns more per 4-KiB datagram in one process alone).
	Slots int
	// Drain is how long the receivers' counts may stay put after the
	// sender stops before a case ends (they read on until they have all
	// that was sent).
	Drain time.Duration
	// Modes are the fan-out modes measured: "udp" (the baseline) and
	// "rdma" (RoCEv2); with one of them alone (for a profiler) no ratio is
	// computed.
	Modes []string
	// RxCommand starts a receiver process (argv), with RxEnv added to the
	// environment.
	RxCommand []string
	RxEnv     []string

	// ICRCTime is how long each ICRC measurement runs.
	ICRCTime time.Duration
	// JoinSamples is the number of join/leave pairs timed.
	JoinSamples int
	// Groups is the number of groups one process joins at once.
	Groups int
	// QPs is the number of QPs created to measure their memory.
	QPs int
	// AllocRuns is the number of rounds testing.AllocsPerRun averages.
	AllocRuns int

	// IBBind is the address of the IB part's ports (a loopback address
	// other than Bind: every process opens its own port there).
	IBBind netip.Addr
	// IBJoins is the number of groups joined over the fabric, one after the
	// other, for the SA's joins per second.
	IBJoins int
	// IBCreate is the number of groups the SA alone creates.
	IBCreate int
	// IBSM is who manages the subnet of the IB part and of the IB latency
	// link (ib/sm's Config.Manager): softsm's own SM ("" or "softsm") or
	// OpenSM in charge ("opensm", which needs opensm and libumad2sim.so).
	// The SA's create measurement (IBCreate) is softsm's SA code alone
	// either way.
	IBSM string
	// IBViaSwitch sends every data packet of softsm's subnet through
	// the switch (ib/sm's Config.ViaSwitch): no direct forwarding.
	IBViaSwitch bool

	// LatSizes are the payload sizes of the latency part, LatWaits its
	// wait modes (WaitBlock, WaitPoll); each case makes LatRounds timed
	// round trips per run after LatWarmup untimed ones, Repeats runs per
	// mode. LatLo runs the loopback cases, LatVeth the veth cases (root),
	// LatIB the IB subnet's (against RoCEv2 on loopback).
	// LatEnv is added to the environment of the ping and pong processes
	// (none by default: a program as a user runs it). LatPin runs the
	// pinger and the ponger on a CPU each, as two hosts would (pin.go;
	// nothing is pinned where the bench may use fewer than two CPUs).
	LatSizes  []int
	LatWaits  []string
	LatRounds int
	LatWarmup int
	LatLo     bool
	LatVeth   bool
	LatIB     bool
	LatEnv    []string
	LatPin    bool

	// The reliable part (PartReliable): RelReceivers receiver processes,
	// RelSizes message sizes, RelLoss injected loss rates in per mille
	// (loss 0 always runs: the first pass of the repair bytes), for the
	// peers named in RelPeers (all registered ones when empty). A case
	// sends RelCount messages, or when 0 RelBytes/size clamped to
	// 1000..RelMaxCount; RelRate paces the sender (messages/s, 0: as fast
	// as the peer's own flow control lets it). A receiver gives up after
	// RelTimeout, or RelIdle without a delivery (at most 1 s for a peer
	// that does not repair). RelNormRate is NORM's
	// transmit rate in bit/s (NORM-CC's upper bound with RelNormCC),
	// RelPGMRate PGM's PGM_TXW_MAX_RTE in bytes/s.
	RelReceivers []int
	RelSizes     []int
	RelLoss      []int
	RelPeers     []string
	RelCount     int
	RelBytes     int
	RelMaxCount  int
	RelRate      float64
	RelTimeout   time.Duration
	RelIdle      time.Duration
	RelNormRate  float64
	RelNormCC    bool
	RelPGMRate   int

	// Table, when not nil, gets the human-readable table as the run goes.
	Table io.Writer
	// JSON, when not nil, gets one JSON object per line per case.
	JSON io.Writer
}

// DefaultConfig is the default run: every part, N = 1, 2, 4 receivers,
// 64…4096-byte payloads (the IB part skips those above the subnet's 2048
// MTU), each case measured 4 times per mode for 250 ms, the modes
// alternating (about a minute and a half in all).
func DefaultConfig() Config {
	return Config{
		Bind:        netip.MustParseAddr("127.0.0.1"),
		Parts:       []string{PartICRC, PartAllocs, PartControl, PartLatency, PartFanout, PartIB},
		Receivers:   []int{1, 2, 4},
		Sizes:       []int{64, 256, 1024, 4096},
		Duration:    250 * time.Millisecond,
		Repeats:     4,
		Batch:       32,
		Slots:       512,
		Drain:       50 * time.Millisecond,
		Modes:       []string{"udp", "rdma"},
		ICRCTime:    100 * time.Millisecond,
		JoinSamples: 1000,
		Groups:      10000,
		QPs:         1000,
		AllocRuns:   200,
		IBBind:      netip.MustParseAddr("127.0.4.1"),
		IBJoins:     2000,
		IBCreate:    16000,
		LatSizes:    []int{64, 1024},
		LatWaits:    []string{WaitBlock, WaitPoll},
		LatRounds:   3000,
		LatWarmup:   200,
		LatLo:       true,
		LatVeth:     true,
		LatIB:       true,
		LatPin:      true,

		RelReceivers: []int{1, 2, 4},
		RelSizes:     []int{64, 1024, 65536},
		RelLoss:      []int{0, 1, 10, 50},
		RelBytes:     64 << 20,
		RelMaxCount:  200000,
		RelTimeout:   60 * time.Second,
		RelIdle:      10 * time.Second,
		RelNormRate:  relNormRate,
		RelPGMRate:   relPGMRate,
	}
}

// QuickConfig is a run of a few seconds that exercises every part: one
// receiver, 64-byte payloads, short measurements, 200 groups.
func QuickConfig() Config {
	c := DefaultConfig()
	c.Receivers = []int{1}
	c.Sizes = []int{64}
	c.Duration = 100 * time.Millisecond
	c.Repeats = 2
	c.ICRCTime = 5 * time.Millisecond
	c.JoinSamples = 50
	c.Groups = 200
	c.QPs = 50
	c.AllocRuns = 20
	c.IBJoins = 200
	c.LatSizes = []int{64}
	c.LatRounds = 300
	c.LatWarmup = 50
	c.LatVeth = false
	c.RelReceivers, c.RelSizes, c.RelLoss, c.RelCount = []int{1}, []int{1024}, []int{0, 10}, 2000
	return c
}

// Report holds every result of a run.
type Report struct {
	Fanout   []FanoutResult
	IBFanout []IBFanoutResult
	SA       *SAResult
	ICRC     []ICRCResult
	Join     *JoinResult
	Groups   *GroupsResult
	QP       *QPResult
	Allocs   []AllocsResult
	Latency  []LatencyResult
	Reliable []RelResult
	Targets  []Target
}

// Target is one of the performance targets, as measured.
type Target struct {
	Kind     string `json:"kind"` // "target"
	Name     string `json:"name"`
	Want     string `json:"want"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
	// Unmeasured says why the run could not judge the target (a -quick
	// run too small for it); Met is then false and means nothing.
	Unmeasured string `json:"unmeasured,omitempty"`
}

// Run measures what cfg asks for, writing the table and JSON lines as it
// goes, and returns every result. A part that fails ends the run with its
// error; the results so far are returned.
func Run(cfg Config) (*Report, error) {
	rep := &Report{}
	w := &writer{cfg: &cfg}
	w.tablef("softrdma bench: %s, batch %d, recvmmsg batch %d, %v per mode and case\n", cfg.Bind, cfg.Batch, RecvBatch, cfg.Duration)
	for _, part := range cfg.Parts {
		var err error
		switch part {
		case PartICRC:
			err = runICRC(&cfg, w, rep)
		case PartAllocs:
			err = runAllocs(&cfg, w, rep)
		case PartControl:
			err = runControl(&cfg, w, rep)
		case PartFanout:
			err = runFanout(&cfg, w, rep)
		case PartIB:
			err = runIB(&cfg, w, rep)
		case PartLatency:
			err = runLatency(&cfg, w, rep)
		case PartReliable:
			err = runReliable(&cfg, w, rep)
		default:
			err = fmt.Errorf("unknown part %q", part)
		}
		if err != nil {
			return rep, err
		}
	}
	rep.Targets = targets(rep)
	w.tablef("\ntargets\n")
	for _, t := range rep.Targets {
		mark := "MET"
		switch {
		case t.Unmeasured != "":
			mark = "NOT MEASURED (" + t.Unmeasured + ")"
		case !t.Met:
			mark = "NOT MET"
		}
		w.tablef("  %-44s want %-9s measured %-40s %s\n", t.Name, t.Want, t.Measured, mark)
		w.json(t)
	}
	return rep, nil
}

// writer prints the table and JSON lines.
type writer struct{ cfg *Config }

func (w *writer) tablef(format string, a ...any) {
	if w.cfg.Table != nil {
		fmt.Fprintf(w.cfg.Table, format, a...)
	}
}

func (w *writer) json(v any) {
	if w.cfg.JSON != nil {
		b, _ := json.Marshal(v)
		w.cfg.JSON.Write(append(b, '\n'))
	}
}

func runICRC(cfg *Config, w *writer, rep *Report) error {
	w.tablef("\nICRC (per datagram; ratio = crc32 time / ICRC time)\n")
	w.tablef("  %6s %7s %10s %10s %10s %7s\n", "size", "hashed", "ICRC ns", "crc32 ns", "solve ns", "ratio")
	for _, s := range cfg.Sizes {
		r := measureICRC(s, cfg.ICRCTime)
		rep.ICRC = append(rep.ICRC, r)
		w.tablef("  %6d %7d %10.1f %10.1f %10.1f %7.2f\n", r.Size, r.Hashed, r.ICRCNs, r.CRC32Ns, r.SolveNs, r.Ratio)
		w.json(r)
	}
	return nil
}

func runAllocs(cfg *Config, w *writer, rep *Report) error {
	w.tablef("\nallocations per datagram, steady state (send chain → receive → completions → repost)\n")
	for _, b := range slices.Compact([]int{1, cfg.Batch}) {
		for _, s := range slices.Compact([]int{cfg.Sizes[0], cfg.Sizes[len(cfg.Sizes)-1]}) {
			r, err := measureAllocs(cfg.Bind, s, b, cfg.AllocRuns)
			if err != nil {
				return err
			}
			rep.Allocs = append(rep.Allocs, r)
			w.tablef("  size %4d batch %3d: %.3f allocs/msg\n", r.Size, r.Batch, r.AllocsPerMsg)
			w.json(r)
		}
	}
	return nil
}

func runControl(cfg *Config, w *writer, rep *Report) error {
	j, err := measureJoin(cfg.Bind, cfg.JoinSamples)
	if err != nil {
		return fmt.Errorf("join latency: %w", err)
	}
	rep.Join = &j
	w.tablef("\ncontrol plane (%d join/leave pairs, no other group held)\n", j.Samples)
	w.tablef("  join→JOIN event  p50 %7.1f µs  p99 %7.1f µs   (kernel IP_ADD_MEMBERSHIP p50 %.1f µs, p99 %.1f µs)\n", j.JoinP50us, j.JoinP99us, j.KernP50us, j.KernP99us)
	w.tablef("  leave            p50 %7.1f µs  p99 %7.1f µs\n", j.LeaveP50us, j.LeaveP99us)
	w.json(j)

	g, err := measureGroups(cfg.Bind, cfg.Groups)
	if err != nil {
		return fmt.Errorf("groups: %w", err)
	}
	rep.Groups = &g
	w.tablef("  %d groups in one process: held %d, %d sockets, %.0f joins/s (p50 %.1f µs, p99 %.1f µs), %.0f leaves/s (p99 %.1f µs)\n",
		g.Groups, g.Held, g.Sockets, g.JoinsPerS, g.JoinP50us, g.JoinP99us, g.LeavesPerS, g.LeaveP99us)
	w.tablef("    Go heap %.0f B/group, goroutine stacks %.0f B/group, delivery to first/middle/last group: %v, heap left after leaving all: %d B\n",
		g.HeapPerGrp, g.StackPerGrp, g.Delivered, g.HeapLeft)
	w.tablef("    kernel baseline (plain sockets, 20 groups each): %.0f joins/s (p99 %.1f µs), %.0f leaves/s (p99 %.1f µs); ratio (joins/s) %.2f\n",
		g.KernJoinsPerS, g.KernJoinP99us, g.KernLeavesPerS, g.KernLeaveP99us, g.Ratio)
	if g.Err != "" {
		w.tablef("    stopped by: %s\n", g.Err)
	}
	w.json(g)

	q, err := measureQPs(cfg.Bind, cfg.QPs)
	if err != nil {
		return fmt.Errorf("qps: %w", err)
	}
	rep.QP = &q
	w.tablef("  %d idle UD QPs (16+16 WRs, RTS): Go heap %.0f B/QP, %.3f sockets/QP (a plain Go UDP socket: %.0f B)\n", q.Count, q.HeapPer, q.FDsPer, q.SockHeapPer)
	w.json(q)
	return nil
}

func runFanout(cfg *Config, w *writer, rep *Report) error {
	if len(cfg.RxCommand) == 0 {
		return fmt.Errorf("fan-out: no receiver command")
	}
	f := &fanout{cfg: cfg}
	if err := f.start(); err != nil {
		return err
	}
	defer f.stop()
	w.tablef("\nfan-out: 1 sender → N receiver processes, delivered datagrams summed over receivers (medians of %d runs; ratio = rdma/udp delivered msg/s, [min–max])\n", cfg.Repeats)
	w.tablef("  CPU µs/msg: the sender's per datagram sent (tx), the receivers' per datagram delivered (rx)\n")
	w.tablef("  %2s %5s | %11s %11s %6s %9s | %11s %11s %6s %7s %9s | %6s %s\n",
		"N", "size", "udp sent/s", "udp dlv/s", "loss", "tx/rx µs", "rdma sent/s", "rdma dlv/s", "loss", "MB/s", "tx/rx µs", "ratio", "spread")
	defer func() {
		if len(rep.Fanout) > 1 {
			w.tablef("  geomean over cases: ratio %.2f; CPU per datagram rdma/udp: sender %.2f, receivers %.2f\n",
				geomean(rep.Fanout, func(r FanoutResult) float64 { return r.Ratio }),
				geomean(rep.Fanout, func(r FanoutResult) float64 { return r.RDMATxCPUns / r.UDPTxCPUns }),
				geomean(rep.Fanout, func(r FanoutResult) float64 { return r.RDMARxCPUns / r.UDPRxCPUns }))
		}
	}()
	for _, n := range cfg.Receivers {
		for _, s := range cfg.Sizes {
			r, err := f.runCase(n, s)
			if err != nil {
				return err
			}
			rep.Fanout = append(rep.Fanout, r)
			w.tablef("  %2d %5d | %11.0f %11.0f %5.1f%% %4.1f/%4.1f | %11.0f %11.0f %5.1f%% %7.1f %4.1f/%4.1f | %6.2f [%.2f–%.2f]\n",
				n, s, r.UDPSentPerS, r.UDPMsgsPerS, 100*r.UDPLoss, r.UDPTxCPUns/1e3, r.UDPRxCPUns/1e3,
				r.RDMASentPerS, r.RDMAMsgsPerS, 100*r.RDMALoss, r.RDMABytesPerS/1e6, r.RDMATxCPUns/1e3, r.RDMARxCPUns/1e3, r.Ratio, r.RatioMin, r.RatioMax)
			w.json(r)
		}
	}
	return nil
}

// targets checks the results against the targets.
func targets(rep *Report) []Target {
	var ts []Target
	add := func(name, want, measured string, met bool) {
		ts = append(ts, Target{Kind: "target", Name: name, Want: want, Measured: measured, Met: met})
	}
	if fs := measuredFanout(rep.Fanout); len(fs) > 0 {
		ts = append(ts, fanoutTargets(fs)...)
	}
	ts = append(ts, latencyTargets(rep.Latency)...)
	if len(rep.Reliable) > 0 {
		ts = append(ts, reliableTargets(rep.Reliable)...)
	}
	if len(rep.IBFanout) > 0 {
		lo, lossy := rep.IBFanout[0], rep.IBFanout[0]
		for _, r := range rep.IBFanout {
			if r.Ratio < lo.Ratio {
				lo = r
			}
			if r.IBWorstLoss > lossy.IBWorstLoss {
				lossy = r
			}
		}
		add("IB fan-out msg/s vs RoCEv2 (worst case)", "≥ 0.50×", fmt.Sprintf("%.2f× (N=%d, %d B)", lo.Ratio, lo.Receivers, lo.Size), lo.Ratio >= 0.5)
		add("IB fan-out loss (worst run)", "0", fmt.Sprintf("%.4f%% (N=%d, %d B)", 100*lossy.IBWorstLoss, lossy.Receivers, lossy.Size), lossy.IBWorstLoss == 0)
		var uncounted, runs uint64
		for _, r := range rep.IBFanout {
			uncounted += r.RoCEUncounted
			runs += uint64(r.Runs)
		}
		add("IB part: RoCEv2 lost without a counter", "0", fmt.Sprintf("%d (%d runs)", uncounted, runs), uncounted == 0)
	}
	if s := rep.SA; s != nil {
		add("SA joins/s over the fabric", fmt.Sprintf("≥ %d", minSAJoinsPerS), fmt.Sprintf("%.0f", s.JoinsPerS), s.JoinsPerS >= minSAJoinsPerS)
		add(fmt.Sprintf("SA creates %d groups", s.Create), "< 1 s", fmt.Sprintf("%.3f s", s.CreateSeconds), s.CreateSeconds < 1)
	}
	if len(rep.Allocs) > 0 {
		worst := 0.0
		for _, a := range rep.Allocs {
			worst = max(worst, a.AllocsPerMsg)
		}
		add("allocations per datagram", "0", fmt.Sprintf("%.3f", worst), worst == 0)
	}
	if rep.Join != nil {
		add("join→JOIN event p99", "< 200 µs", fmt.Sprintf("%.1f µs", rep.Join.JoinP99us), rep.Join.JoinP99us < 200)
	}
	if g := rep.Groups; g != nil {
		add("groups held by one process", "≥ 10000", fmt.Sprintf("%d (delivery ok: %v)", g.Held, g.Delivered), g.Held >= 10000 && g.Delivered)
		add("Go heap per idle joined group", "< 2048 B", fmt.Sprintf("%.0f B at %d groups", g.HeapPerGrp, g.Held), g.HeapPerGrp < 2048 && g.Held >= 10000)
		if g.Groups < 10000 && g.Held == g.Groups {
			// The run asked for fewer groups than the targets are about.
			why := fmt.Sprintf("the run asked for %d groups", g.Groups)
			ts[len(ts)-2].Unmeasured, ts[len(ts)-1].Unmeasured = why, why
		}
	}
	return ts
}

// The fan-out targets of RoCEv2 against plain UDP multicast.
const (
	minFanoutGeomean = 0.95 // delivered msg/s, geometric mean of the cases
	minFanoutCase    = 0.85 // delivered msg/s, every case
	maxRxCPURatio    = 1.10 // receivers' CPU per delivered datagram
	maxTxCPURatio    = 1.05 // the sender's CPU per datagram sent
	maxExtraLoss     = 0.01 // loss above plain UDP's in the same case
)

// measuredFanout returns the fan-out cases measured in both modes.
func measuredFanout(rs []FanoutResult) []FanoutResult {
	var out []FanoutResult
	for _, r := range rs {
		if r.UDPMsgsPerS > 0 && r.RDMASentPerS > 0 {
			out = append(out, r)
		}
	}
	return out
}

// fanoutTargets checks the fan-out cases against the targets: the
// geometric mean of the cases and each case's worst, one line each.
func fanoutTargets(fs []FanoutResult) []Target {
	var ts []Target
	add := func(name, want, measured string, met bool) {
		ts = append(ts, Target{Kind: "target", Name: name, Want: want, Measured: measured, Met: met})
	}
	where := func(r FanoutResult) string { return fmt.Sprintf("N=%d, %d B", r.Receivers, r.Size) }
	// worst returns the case where f is worst (lowest when low is true).
	worst := func(f func(FanoutResult) float64, low bool) FanoutResult {
		w := fs[0]
		for _, r := range fs[1:] {
			if low && f(r) < f(w) || !low && f(r) > f(w) {
				w = r
			}
		}
		return w
	}
	ratio := func(r FanoutResult) float64 { return r.Ratio }
	g := geomean(fs, ratio)
	add("fan-out msg/s vs UDP (geomean of cases)", fmt.Sprintf("≥ %.2f×", minFanoutGeomean), fmt.Sprintf("%.2f×", g), g >= minFanoutGeomean)
	lo := worst(ratio, true)
	add("fan-out msg/s vs UDP (every case)", fmt.Sprintf("≥ %.2f×", minFanoutCase), fmt.Sprintf("%.2f× (%s)", lo.Ratio, where(lo)), lo.Ratio >= minFanoutCase)
	for _, c := range []struct {
		name string
		max  float64
		f    func(FanoutResult) float64
	}{
		{"receivers' CPU/datagram vs UDP", maxRxCPURatio, func(r FanoutResult) float64 { return r.RDMARxCPUns / r.UDPRxCPUns }},
		{"sender's CPU/datagram vs UDP", maxTxCPURatio, func(r FanoutResult) float64 { return r.RDMATxCPUns / r.UDPTxCPUns }},
	} {
		g := geomean(fs, c.f)
		hi := worst(c.f, false)
		add(c.name+" (geomean)", fmt.Sprintf("≤ %.2f×", c.max), fmt.Sprintf("%.2f× (worst %.2f×, %s)", g, c.f(hi), where(hi)), g <= c.max)
	}
	var uncounted, runs uint64
	for _, r := range fs {
		uncounted += r.RDMAUncounted
		runs += uint64(r.Runs)
	}
	add("lost datagrams without a device counter", "0", fmt.Sprintf("%d (%d runs)", uncounted, runs), uncounted == 0)
	extra := func(r FanoutResult) float64 { return r.RDMALoss - r.UDPLoss }
	hi := worst(extra, false)
	add("loss above UDP's (every case)", fmt.Sprintf("≤ %.0f point", 100*maxExtraLoss), fmt.Sprintf("%+.1f points (%s: %.1f%% vs %.1f%%)", 100*extra(hi), where(hi), 100*hi.RDMALoss, 100*hi.UDPLoss), extra(hi) <= maxExtraLoss)
	return ts
}

// minSAJoinsPerS is the target of the SA's joins per second over the
// fabric: an HCA's max_mcast_grp (16,000) joined in 10 s.
const minSAJoinsPerS = 1600

// geomean is the geometric mean of f over the results (positive values
// only).
func geomean(rs []FanoutResult, f func(FanoutResult) float64) float64 {
	sum, n := 0.0, 0
	for _, r := range rs {
		if v := f(r); v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v) {
			sum += math.Log(v)
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return math.Exp(sum / float64(n))
}

// maxPayload is the largest payload size of a run (Config.Sizes).
const maxPayload = 4096
