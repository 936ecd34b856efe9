package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/bench"
)

// rxCommand is the hidden subcommand of a fan-out receiver process: bench
// re-executes this binary with it.
const rxCommand = "bench-rx"

func init() {
	commands["bench"] = command{
		summary: "measure the data path and the control plane against plain UDP multicast (softrdma bench -h)",
		run:     benchCmd,
	}
	// The receiver process's command is registered only when this process
	// is one, so that usage never lists it.
	if len(os.Args) > 1 && os.Args[1] == rxCommand {
		commands[rxCommand] = command{run: func(_ []string, stdout, stderr io.Writer) int {
			if err := bench.RunReceiver(os.Stdin, stdout); err != nil {
				fmt.Fprintln(stderr, err)
				return 1
			}
			return 0
		}}
	}
}

func benchCmd(args []string, stdout, stderr io.Writer) int {
	cfg := bench.DefaultConfig()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `usage: softrdma bench [flags]

Measures, in one run, softrdma against the kernel's own UDP multicast on the
same machine: fan-out from one sender to N receiver processes (delivered
messages/s and bytes/s, loss, ratio to plain sendmmsg/recvmmsg sockets), the
ICRC against hash/crc32, join/leave latency, groups per process and memory
per group and per QP, allocations per datagram; the round-trip latency of a
multicast ping-pong between two processes (blocking and busy-polling, on lo,
over a veth pair between two network namespaces, and on the IB subnet)
against plain UDP sockets with raw system calls; and the emulated InfiniBand
subnet: fan-out through a softsm against the RoCEv2 path (msg/s, CPU per
datagram, loss), SA joins/s and the time the SA takes to create 16,000
groups. Prints a table, then one JSON object per line per case (-json: only
the JSON lines).

`)
		fs.PrintDefaults()
	}
	quick := fs.Bool("quick", false, "a run of a few seconds: one receiver, 64-byte payloads, 200 groups")
	jsonOnly := fs.Bool("json", false, "print only the JSON lines")
	bind := fs.String("bind", cfg.Bind.String(), "local address; its interface carries the traffic (loopback by default)")
	parts := fs.String("parts", strings.Join(cfg.Parts, ","), "parts to run: icrc,allocs,control,latency,fanout,ib,capi,reliable (capi: C programs through the libraries against the Go API; reliable: reliable multicast against NORM, OpenPGM and plain UDP in network namespaces, root; neither in the default)")
	recv := fs.String("n", "", "receiver process counts, comma-separated (default 1,2,4)")
	sizes := fs.String("sizes", "", "payload sizes in bytes, comma-separated (default 64,256,1024,4096)")
	dur := fs.Duration("d", 0, "send time per mode and case (default 250ms)")
	repeats := fs.Int("repeats", 0, "runs per mode and case, interleaved; medians and the spread are printed (default 4)")
	batch := fs.Int("batch", cfg.Batch, "datagrams per sendmmsg and per chain of send WRs")
	rate := fs.Int("rate", 0, "limit the sender to this many datagrams/s (0: unlimited)")
	groups := fs.Int("groups", 0, "groups one process joins at once (default 10000)")
	modes := fs.String("modes", strings.Join(cfg.Modes, ","), "fan-out modes: udp (the baseline), rdma (RoCEv2); one alone gives no ratio (for a profiler)")
	rxProcs := fs.Int("rx-gomaxprocs", 1, "GOMAXPROCS of the receiver processes (0: Go's default, the number of cores)")
	slots := fs.Int("slots", cfg.Slots, "receive WRs an RDMA receiver keeps posted, each with a buffer of the payload size and the GRH")
	latSizes := fs.String("lat-sizes", "", "latency: payload sizes in bytes, comma-separated (default 64,1024)")
	latWaits := fs.String("lat-waits", "", "latency: waits, comma-separated: block (rdma_get_recv_comp), poll (ibv_poll_cq loop) (default both)")
	latLinks := fs.String("lat-links", "", "latency: links, comma-separated: lo, veth (two network namespaces, root), ib (the emulated subnet) (default all)")
	latRounds := fs.Int("lat-rounds", 0, "latency: timed round trips per run (default 3000)")
	fs.BoolVar(&cfg.LatPin, "lat-pin", cfg.LatPin, "latency: run the pinger and the ponger on a CPU each, as two hosts (false: where the scheduler puts them, sometimes both on one core)")
	capiDev := fs.String("capi-dev", "rxe_lo", "capi: the device of both paths")
	capiIters := fs.Int("capi-iters", 200000, "capi: ITERS of capibench (calls per case)")
	capiSecs := fs.Int("capi-secs", 2, "capi: perftest's -D and the Go twin's run time, in whole seconds")
	capiLibdir := fs.String("capi-libdir", os.Getenv("SOFTRDMA_LIBDIR"), "capi: the libraries' directory (default: as softrdma exec finds or builds them)")
	ibSM := fs.String("ib-sm", "softsm", "ib and the latency ib link: who manages the emulated subnet, softsm (its own SM) or opensm (OpenSM in charge: needs opensm and libumad2sim.so, see docs/opensm.md)")
	ibViaSwitch := fs.Bool("ib-via-switch", false, "ib and the latency ib link: every data packet through softsm's switch (softsm -via-switch), no direct forwarding")
	rel := relFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *ibSM != "softsm" && *ibSM != "opensm" {
		fmt.Fprintf(stderr, "bench: -ib-sm: unknown subnet manager %q (softsm, opensm)\n", *ibSM)
		return 2
	}
	if *quick {
		q := bench.QuickConfig()
		q.Batch, q.Bind = cfg.Batch, cfg.Bind
		cfg = q
	}
	var err error
	if cfg.Bind, err = netip.ParseAddr(*bind); err != nil {
		fmt.Fprintf(stderr, "bench: -bind: %v\n", err)
		return 2
	}
	cfg.Parts = nil
	capiPart := false
	for _, p := range strings.Split(*parts, ",") {
		if p == partCapi {
			capiPart = true
		} else {
			cfg.Parts = append(cfg.Parts, p)
		}
	}
	if *capiIters < 16 || *capiSecs < 1 || *capiSecs > 600 {
		fmt.Fprintln(stderr, "bench: -capi-iters must be ≥ 16 and -capi-secs 1..600")
		return 2
	}
	cfg.Modes = nil
	for _, m := range strings.Split(*modes, ",") {
		if m != "udp" && m != "rdma" {
			fmt.Fprintf(stderr, "bench: -modes: unknown mode %q\n", m)
			return 2
		}
		cfg.Modes = append(cfg.Modes, m)
	}
	if *recv != "" {
		if cfg.Receivers, err = intList(*recv, 1, 64); err != nil {
			fmt.Fprintf(stderr, "bench: -n: %v\n", err)
			return 2
		}
	}
	if *sizes != "" {
		if cfg.Sizes, err = intList(*sizes, 1, 4096); err != nil {
			fmt.Fprintf(stderr, "bench: -sizes: %v\n", err)
			return 2
		}
	}
	if *dur > 0 {
		cfg.Duration = *dur
	}
	if *repeats > 0 {
		cfg.Repeats = *repeats
	}
	if *groups > 0 {
		cfg.Groups = *groups
	}
	if *batch < 1 || *batch > 1024 || *rate < 0 || *slots < 64 || *slots > 1<<16 {
		fmt.Fprintln(stderr, "bench: -batch must be 1..1024, -rate ≥ 0 and -slots 64..65536")
		return 2
	}
	cfg.Batch, cfg.Rate, cfg.Slots, cfg.IBSM, cfg.IBViaSwitch = *batch, *rate, *slots, *ibSM, *ibViaSwitch
	if err := latencyFlags(&cfg, *latSizes, *latWaits, *latLinks, *latRounds); err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 2
	}
	if err := rel.apply(&cfg); err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 2
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	cfg.RxCommand = []string{exe, rxCommand}
	if *rxProcs > 0 {
		cfg.RxEnv = append(cfg.RxEnv, fmt.Sprintf("GOMAXPROCS=%d", *rxProcs))
	}
	cfg.JSON = stdout
	if !*jsonOnly {
		cfg.Table = stdout
		cfg.JSON = &deferred{}
	}
	start := time.Now()
	if len(cfg.Parts) > 0 {
		_, err = bench.Run(cfg)
	}
	if err == nil && capiPart {
		cc := capiConfig{dev: *capiDev, iters: *capiIters, secs: *capiSecs, repeats: 5, libdir: *capiLibdir, port: 18700}
		if *repeats > 0 {
			cc.repeats = *repeats
		}
		if *quick {
			cc.repeats, cc.iters, cc.secs = 1, min(cc.iters, 20000), min(cc.secs, 1)
		}
		err = runCapiPart(context.Background(), cc, cfg.Table, cfg.JSON, stderr)
	}
	if d, ok := cfg.JSON.(*deferred); ok {
		fmt.Fprintf(stdout, "\n%s", d.b.String())
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	if !*jsonOnly {
		fmt.Fprintf(stdout, "bench: done in %.1fs\n", time.Since(start).Seconds())
	}
	return 0
}

// latencyFlags applies the -lat-* flags to cfg.
func latencyFlags(cfg *bench.Config, sizes, waits, links string, rounds int) error {
	var err error
	if sizes != "" {
		if cfg.LatSizes, err = intList(sizes, 8, 4096); err != nil {
			return fmt.Errorf("-lat-sizes: %v", err)
		}
	}
	if waits != "" {
		cfg.LatWaits = nil
		for _, w := range strings.Split(waits, ",") {
			if w != bench.WaitBlock && w != bench.WaitPoll {
				return fmt.Errorf("-lat-waits: unknown wait %q (block, poll)", w)
			}
			cfg.LatWaits = append(cfg.LatWaits, w)
		}
	}
	if links != "" {
		cfg.LatLo, cfg.LatVeth, cfg.LatIB = false, false, false
		for _, l := range strings.Split(links, ",") {
			switch l {
			case "lo":
				cfg.LatLo = true
			case "veth":
				cfg.LatVeth = true
			case "ib":
				cfg.LatIB = true
			default:
				return fmt.Errorf("-lat-links: unknown link %q (lo, veth, ib)", l)
			}
		}
	}
	if rounds < 0 || rounds > 1000000 {
		return fmt.Errorf("-lat-rounds must be 0..1000000")
	} else if rounds > 0 {
		cfg.LatRounds = rounds
	}
	return nil
}

// relOpts are the flags of the reliable part.
type relOpts struct {
	receivers, sizes, loss, peers *string
	count                         *int
	rate                          *float64
	timeout                       *time.Duration
	normRate                      *float64
	normCC                        *bool
	pgmRate                       *int
}

func relFlags(fs *flag.FlagSet) *relOpts {
	d := bench.DefaultConfig()
	return &relOpts{
		receivers: fs.String("rel-receivers", "", "reliable: receiver process counts, comma-separated (default 1,2,4)"),
		sizes:     fs.String("rel-sizes", "", "reliable: message sizes in bytes, comma-separated (default 64,1024,65536)"),
		loss:      fs.String("rel-loss", "", "reliable: injected loss rates in per mille, comma-separated; loss 0 always runs (default 0,1,10,50)"),
		peers:     fs.String("rel-peers", "", "reliable: the peers to run, comma-separated (default every registered one: "+strings.Join(relPeerNames(), ",")+")"),
		count:     fs.Int("rel-count", 0, "reliable: messages per case (default 64 MiB/size, 1000..200000)"),
		rate:      fs.Float64("rel-rate", 0, "reliable: the sender's rate in messages/s (0: as fast as the peer's flow control lets it)"),
		timeout:   fs.Duration("rel-timeout", 0, "reliable: a receiver gives up after this long (default 60s)"),
		normRate:  fs.Float64("rel-norm-rate", d.RelNormRate, "reliable: NORM's transmit rate in bit/s (NORM-CC's upper bound with -rel-norm-cc)"),
		normCC:    fs.Bool("rel-norm-cc", false, "reliable: NORM with its congestion control (NORM-CC) instead of a fixed rate"),
		pgmRate:   fs.Int("rel-pgm-rate", d.RelPGMRate, "reliable: PGM's PGM_TXW_MAX_RTE in bytes/s"),
	}
}

func relPeerNames() []string {
	var out []string
	for _, p := range bench.ReliablePeers() {
		out = append(out, p.Name)
	}
	return out
}

// apply sets the reliable part's fields of cfg from the flags.
func (o *relOpts) apply(cfg *bench.Config) error {
	var err error
	if *o.receivers != "" {
		if cfg.RelReceivers, err = intList(*o.receivers, 1, 64); err != nil {
			return fmt.Errorf("-rel-receivers: %v", err)
		}
	}
	if *o.sizes != "" {
		if cfg.RelSizes, err = intList(*o.sizes, bench.RMsgHeader, 1<<20); err != nil {
			return fmt.Errorf("-rel-sizes: %v", err)
		}
	}
	if *o.loss != "" {
		if cfg.RelLoss, err = intList(*o.loss, 0, 1000); err != nil {
			return fmt.Errorf("-rel-loss: %v", err)
		}
	}
	if *o.peers != "" {
		cfg.RelPeers = strings.Split(*o.peers, ",")
	}
	if *o.count < 0 || *o.rate < 0 || *o.timeout < 0 || *o.normRate <= 0 || *o.pgmRate <= 0 {
		return fmt.Errorf("-rel-count, -rel-rate and -rel-timeout must be ≥ 0, -rel-norm-rate and -rel-pgm-rate > 0")
	}
	if *o.count > 0 {
		cfg.RelCount = *o.count
	}
	if *o.timeout > 0 {
		cfg.RelTimeout = *o.timeout
	}
	cfg.RelRate, cfg.RelNormRate, cfg.RelNormCC, cfg.RelPGMRate = *o.rate, *o.normRate, *o.normCC, *o.pgmRate
	return nil
}

// deferred keeps the JSON lines to print them after the table.
type deferred struct{ b strings.Builder }

func (d *deferred) Write(p []byte) (int, error) { return d.b.Write(p) }

func intList(s string, lo, hi int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		if v < lo || v > hi {
			return nil, fmt.Errorf("%d not in %d..%d", v, lo, hi)
		}
		out = append(out, v)
	}
	return out, nil
}
