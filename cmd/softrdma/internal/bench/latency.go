package bench

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// The latency part: multicast ping-pong between two processes (see
// pingpong.go), 64 B and 1 KiB, blocking and busy-polling, on loopback,
// over a veth pair between two network namespaces (root only) and on the
// emulated IB subnet (loopback, through softsm's switch). Each RoCEv2 case
// runs against plain UDP sockets with the same wait in the same run, the
// modes interleaved; the IB cases against the RoCEv2 case of the same
// size and wait on loopback.

// LatencyResult is one latency case: Rounds round trips per run, Runs
// runs of each mode, the percentiles over all of them.
type LatencyResult struct {
	Kind   string `json:"kind"` // "latency"
	Link   string `json:"link"` // "lo" or "veth"
	Mode   string `json:"mode"` // "rdma" (RoCEv2) or "ib"
	Wait   string `json:"wait"` // WaitBlock or WaitPoll
	Size   int    `json:"size"`
	Rounds int    `json:"rounds"`
	Runs   int    `json:"runs"`
	Lost   int    `json:"lost"`

	P50us  float64 `json:"p50_us"`
	P99us  float64 `json:"p99_us"`
	P999us float64 `json:"p999_us"`
	// Base is the baseline: plain UDP sockets with the same wait (the
	// RoCEv2 case of the same size and wait for IB), BaseLost its lost
	// round trips.
	Base       string  `json:"base"`
	BaseP50us  float64 `json:"base_p50_us"`
	BaseP99us  float64 `json:"base_p99_us"`
	BaseP999us float64 `json:"base_p999_us"`
	BaseLost   int     `json:"base_lost"`
	// Ratio is the headline, the p50 ratio; then the ratios of each
	// percentile to the baseline's.
	Ratio     float64 `json:"ratio"`
	RatioP50  float64 `json:"ratio_p50"`
	RatioP99  float64 `json:"ratio_p99"`
	RatioP999 float64 `json:"ratio_p999"`
}

// latLink is a pair of processes that ping each other over one link.
type latLink struct {
	name       string
	bind       netip.Addr // the pinger's address
	pongBind   netip.Addr // the ponger's
	ping, pong *rxProc
	cleanup    func()
}

func (l *latLink) close() {
	for _, p := range []*rxProc{l.ping, l.pong} {
		if p != nil {
			p.close()
		}
	}
	if l.cleanup != nil {
		l.cleanup()
	}
}

// latProcs starts the pinger and ponger processes, with prefix (e.g. ip
// netns exec NS) before each's command, each on a CPU of its own when pin
// (pin.go).
func latProcs(cfg *Config, l *latLink, pingPrefix, pongPrefix []string, pin bool) error {
	pingCPU, pongCPU := -1, -1
	if pin {
		if a, b, ok := latCPUs(); ok {
			pingCPU, pongCPU = a, b
		}
	}
	var err error
	if l.ping, err = startRxProcOn(append(slices.Clone(pingPrefix), cfg.RxCommand...), cfg.LatEnv, pingCPU); err != nil {
		return err
	}
	if l.pong, err = startRxProcOn(append(slices.Clone(pongPrefix), cfg.RxCommand...), cfg.LatEnv, pongCPU); err != nil {
		return err
	}
	return nil
}

// vethNets are the addresses of the veth part: one /30 between the two
// namespaces (they exist inside them only).
var vethNets = [2]netip.Addr{netip.MustParseAddr("10.201.77.1"), netip.MustParseAddr("10.201.77.2")}

// vethLink creates two network namespaces joined by a veth pair and starts
// the pinger in one and the ponger in the other. The namespaces go with
// cleanup. It needs root and iproute2; skip says why it cannot run.
func vethLink(cfg *Config) (l *latLink, skip string, err error) {
	if os.Geteuid() != 0 {
		return nil, "not root (network namespaces)", nil
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, "no ip command (iproute2)", nil
	}
	pfx := fmt.Sprintf("srlat-%d-", os.Getpid())
	ns := [2]string{pfx + "a", pfx + "b"}
	l = &latLink{name: "veth", bind: vethNets[0], pongBind: vethNets[1]}
	l.cleanup = func() {
		for _, n := range ns {
			exec.Command("ip", "netns", "del", n).Run()
		}
	}
	run := func(args ...string) error {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	steps := [][]string{
		{"netns", "add", ns[0]}, {"netns", "add", ns[1]},
		{"-n", ns[0], "link", "add", "veth0", "type", "veth", "peer", "name", "veth1", "netns", ns[1]},
	}
	for i := range 2 {
		dev := fmt.Sprintf("veth%d", i)
		steps = append(steps,
			[]string{"-n", ns[i], "addr", "add", vethNets[i].String() + "/30", "dev", dev},
			[]string{"-n", ns[i], "link", "set", dev, "up"},
			[]string{"-n", ns[i], "link", "set", "lo", "up"})
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			l.cleanup()
			return nil, "", err
		}
	}
	if err := latProcs(cfg, l, []string{"ip", "netns", "exec", ns[0]}, []string{"ip", "netns", "exec", ns[1]}, cfg.LatPin); err != nil {
		l.close()
		return nil, "", err
	}
	return l, "", nil
}

// latRun is the samples of one mode of one case, over its runs.
type latRun struct {
	rtts []time.Duration
	lost int
}

// measureLatency runs one mode of a case once on link l, adding to r.
func measureLatency(cfg *Config, l *latLink, mode, wait string, size int, sm string, r *latRun) error {
	a, b := randGroup(), randGroup()
	for b == a {
		b = randGroup()
	}
	bind, pongBind := l.bind, l.pongBind
	if mode == "ib" {
		bind, pongBind = cfg.IBBind, cfg.IBBind
	}
	req := rxRequest{Op: "pong", Mode: mode, Wait: wait, Size: size, Bind: pongBind.String(), Group: a.String(), Group2: b.String(), SM: sm}
	if _, err := l.pong.call(req); err != nil {
		return fmt.Errorf("%s %s pong: %w", mode, wait, err)
	}
	req = rxRequest{Op: "ping", Mode: mode, Wait: wait, Size: size, Bind: bind.String(), Group: b.String(), Group2: a.String(), SM: sm,
		Count: cfg.LatRounds, Warmup: cfg.LatWarmup}
	rep, perr := l.ping.call(req)
	prep, serr := l.pong.call(rxRequest{Op: "pong-stop"})
	if perr != nil {
		return fmt.Errorf("%s %s %d B ping: %w", mode, wait, size, perr)
	}
	if serr != nil {
		return fmt.Errorf("%s %s %d B pong: %w", mode, wait, size, serr)
	}
	if prep.Pongs < len(rep.RTTs) {
		return fmt.Errorf("%s %s %d B: %d round trips timed but only %d pings answered", mode, wait, size, len(rep.RTTs), prep.Pongs)
	}
	for _, ns := range rep.RTTs {
		r.rtts = append(r.rtts, time.Duration(ns))
	}
	r.lost += rep.Lost
	return nil
}

// latCase measures one case: the modes interleaved, cfg.Repeats runs each.
func latCase(cfg *Config, l *latLink, modes [2]string, wait string, size int, sm string) (LatencyResult, error) {
	var runs [2]latRun
	for i := range cfg.Repeats {
		order := []int{0, 1}
		if i%2 == 1 {
			order = []int{1, 0}
		}
		for _, m := range order {
			if err := measureLatency(cfg, l, modes[m], wait, size, sm, &runs[m]); err != nil {
				return LatencyResult{}, err
			}
		}
	}
	res := LatencyResult{Kind: "latency", Link: l.name, Mode: modes[1], Wait: wait, Size: size,
		Rounds: cfg.LatRounds, Runs: cfg.Repeats, Base: modes[0]}
	res.BaseP50us, res.BaseP99us, res.BaseP999us = latPercentiles(runs[0].rtts)
	res.P50us, res.P99us, res.P999us = latPercentiles(runs[1].rtts)
	res.Lost, res.BaseLost = runs[1].lost, runs[0].lost
	res.RatioP50, res.RatioP99, res.RatioP999 = res.P50us/res.BaseP50us, res.P99us/res.BaseP99us, res.P999us/res.BaseP999us
	res.Ratio = res.RatioP50
	return res, nil
}

// latPercentiles returns p50, p99 and p99.9 in µs.
func latPercentiles(d []time.Duration) (p50, p99, p999 float64) {
	slices.Sort(d)
	return percentile(d, 0.5), percentile(d, 0.99), percentile(d, 0.999)
}

func runLatency(cfg *Config, w *writer, rep *Report) error {
	if len(cfg.RxCommand) == 0 {
		return fmt.Errorf("latency: no process command")
	}
	w.tablef("\nlatency: multicast ping-pong between two processes, %d round trips per run after %d warm-up, %d runs per mode, interleaved\n",
		cfg.LatRounds, cfg.LatWarmup, cfg.Repeats)
	w.tablef("  block: blocking recvfrom / rdma_get_recv_comp; poll: busy MSG_DONTWAIT recvfrom / ibv_poll_cq loop\n")
	if a, b, ok := latCPUs(); cfg.LatPin && ok {
		w.tablef("  lo, veth: the pinger on CPU %d, the ponger on CPU %d, both modes (-lat-pin=false: where the scheduler puts them)\n", a, b)
	} else {
		w.tablef("  lo, veth: the processes where the scheduler puts them\n")
	}
	if cfg.LatIB {
		w.tablef("  ib: its pinger, ponger and softsm where the scheduler puts them, both modes (a third process has no core of its own to go to)\n")
	}
	w.tablef("  %-5s %-5s %-5s %5s | %-5s %8s %8s %8s | %8s %8s %8s | %6s %6s %6s\n",
		"link", "mode", "wait", "size", "base", "p50 µs", "p99 µs", "p99.9", "p50 µs", "p99 µs", "p99.9", "×p50", "×p99", "×p99.9")
	print := func(r LatencyResult) {
		rep.Latency = append(rep.Latency, r)
		w.tablef("  %-5s %-5s %-5s %5d | %-5s %8.1f %8.1f %8.1f | %8.1f %8.1f %8.1f | %6.2f %6.2f %6.2f\n",
			r.Link, r.Mode, r.Wait, r.Size, r.Base, r.BaseP50us, r.BaseP99us, r.BaseP999us, r.P50us, r.P99us, r.P999us, r.RatioP50, r.RatioP99, r.RatioP999)
		if r.Lost+r.BaseLost > 0 {
			w.tablef("        lost round trips: %d (%s), %d (%s)\n", r.Lost, r.Mode, r.BaseLost, r.Base)
		}
		w.json(r)
	}
	var links []*latLink
	if cfg.LatLo {
		lo := &latLink{name: "lo", bind: cfg.Bind, pongBind: cfg.Bind}
		if err := latProcs(cfg, lo, nil, nil, cfg.LatPin); err != nil {
			lo.close()
			return err
		}
		defer lo.close()
		links = append(links, lo)
	}
	if cfg.LatVeth {
		veth, skip, err := vethLink(cfg)
		if err != nil {
			return err
		}
		if skip != "" {
			w.tablef("  veth: skipped: %s\n", skip)
		} else {
			defer veth.close()
			links = append(links, veth)
		}
	}
	for _, l := range links {
		for _, wait := range cfg.LatWaits {
			for _, s := range cfg.LatSizes {
				r, err := latCase(cfg, l, [2]string{"udp", "rdma"}, wait, s, "")
				if err != nil {
					return fmt.Errorf("latency %s: %w", l.name, err)
				}
				print(r)
			}
		}
	}
	if !cfg.LatIB {
		return nil
	}
	// The IB cases' processes, the RoCEv2 ones they are compared with
	// included, run where the scheduler puts them: pinning the pinger and
	// the ponger to the two cores of the 2-core VM would leave softsm's
	// switch, the third process every packet goes through, none of its
	// own (measured: IB blocking 2.8× RoCEv2 pinned, 1.9–2.3× not).
	lo := &latLink{name: "lo", bind: cfg.Bind, pongBind: cfg.Bind}
	if err := latProcs(cfg, lo, nil, nil, false); err != nil {
		lo.close()
		return err
	}
	defer lo.close()
	smp, err := startRxProc(cfg.RxCommand, cfg.RxEnv)
	if err != nil {
		return fmt.Errorf("start subnet manager: %w", err)
	}
	defer smp.close()
	smr, err := smp.call(rxRequest{Op: "sm", Manager: cfg.IBSM, ViaSwitch: cfg.IBViaSwitch})
	if err != nil {
		return err
	}
	for _, wait := range cfg.LatWaits {
		for _, s := range cfg.LatSizes {
			r, err := latCase(cfg, lo, [2]string{"rdma", "ib"}, wait, s, smr.Addr)
			if err != nil {
				return fmt.Errorf("latency ib: %w", err)
			}
			print(r)
		}
	}
	return nil
}

// The latency targets.
const (
	maxLatBlockP50 = 1.25 // RoCEv2, blocking, p50 vs plain UDP blocking
	maxLatBlockP99 = 1.5  // RoCEv2, blocking, p99
	maxLatPollP50  = 1.1  // RoCEv2, busy-poll, p50 vs plain UDP busy-poll
	maxLatPollP99  = 1.5  // RoCEv2, busy-poll, p99
	maxLatP999     = 2.0  // RoCEv2, either wait, p99.9: the tail the p99 targets leave out
	maxLatIBP50    = 2.0  // IB p50 vs RoCEv2's
)

// latencyTargets checks the latency cases: the worst case of each target.
func latencyTargets(rs []LatencyResult) []Target {
	var ts []Target
	check := func(name string, max float64, pick func(LatencyResult) bool, f func(LatencyResult) float64) {
		var worst *LatencyResult
		for i := range rs {
			if pick(rs[i]) && (worst == nil || f(rs[i]) > f(*worst)) {
				worst = &rs[i]
			}
		}
		if worst == nil {
			return
		}
		v := f(*worst)
		ts = append(ts, Target{Kind: "target", Name: name, Want: fmt.Sprintf("≤ %.2f×", max),
			Measured: fmt.Sprintf("%.2f× (worst: %s %s %d B)", v, worst.Link, worst.Wait, worst.Size), Met: v <= max})
	}
	roce := func(wait string) func(LatencyResult) bool {
		return func(r LatencyResult) bool { return r.Mode == "rdma" && r.Wait == wait }
	}
	p50 := func(r LatencyResult) float64 { return r.RatioP50 }
	check("latency RoCEv2 blocking p50 vs UDP", maxLatBlockP50, roce(WaitBlock), p50)
	check("latency RoCEv2 blocking p99 vs UDP", maxLatBlockP99, roce(WaitBlock), func(r LatencyResult) float64 { return r.RatioP99 })
	check("latency RoCEv2 busy-poll p50 vs UDP", maxLatPollP50, roce(WaitPoll), p50)
	check("latency RoCEv2 busy-poll p99 vs UDP", maxLatPollP99, roce(WaitPoll), func(r LatencyResult) float64 { return r.RatioP99 })
	check("latency RoCEv2 p99.9 vs UDP (either wait)", maxLatP999, func(r LatencyResult) bool { return r.Mode == "rdma" }, func(r LatencyResult) float64 { return r.RatioP999 })
	check("latency IB p50 vs RoCEv2", maxLatIBP50, func(r LatencyResult) bool { return r.Mode == "ib" }, p50)
	return ts
}
