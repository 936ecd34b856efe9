// Command softsm runs the subnet manager of an emulated InfiniBand subnet:
// SM (LIDs, epochs), SA (MCMemberRecord joins and leaves, ClassPortInfo)
// and switch in one process. softrdma IB devices attach to its fabric
// address; with -sa-listen, tools query the SA on a raw SA port (a
// diagnostic that acts for whichever port a record names: loopback only
// unless -sa-allow-remote).
//
// Usage:
//
//	softsm [-listen 127.0.0.1:4792] [-sa-listen 127.0.0.1:4793 [-sa-allow-remote]]
//	       [-port GUID]... [-state FILE] [-no-sendonly-support]
//	       [-sa-delay D | -sa-timeout D] [-sa-drop] [-subnet-prefix P]
//	       [-port-timeout D] [-hoq-life D] [-vl-stall-count N] [-via-switch]
//	       [-max-ports-per-source N] [-max-groups-per-port N]
//	       [-max-groups-per-source N]
//	       [-max-memberships-per-port N] [-max-table-records N]
//	       [-key-file FILE] [-sm-umad2sim NAME] [-v]
//	       [-sm softsm|opensm [-opensm-dir DIR] [-opensm-sweep N]]
//
// With -sm opensm, Debian's unmodified OpenSM manages the subnet: softsm
// starts /usr/sbin/opensm (or opensm in PATH) under ibsim's
// libumad2sim.so against a model of its subnet (package ib/sma) on
// abstract unix sockets of a private random name, with its files in a
// private temporary directory (or -opensm-dir), and kills it when it
// stops. A port's attach is answered once OpenSM made the port Active,
// with the LID OpenSM gave it and OpenSM's LID as the SM's; the ports'
// SA requests go to OpenSM's SA and its answers back; the switch forwards
// by the forwarding tables OpenSM programs. -sa-listen, -sm-umad2sim and
// the SA's own options (-no-sendonly-support, the SA quotas) do not
// apply; -sa-delay hands the ports' SA MADs to OpenSM once it has passed;
// -sa-drop keeps them from OpenSM. softsm refuses to start, saying what is missing,
// without opensm (apt-get install opensm) or libumad2sim.so (apt-get
// install libumad2sim0). See package ib/sm (opensm.go).
//
// With -sm-umad2sim NAME, softsm also serves ibsim's server protocol on
// abstract unix sockets NAME:ctl, NAME:out<n> (package ib/sma): an
// unmodified OpenSM run with LD_PRELOAD=libumad2sim.so and
// IBSIM_SOCKNAME=NAME manages a model of the subnet (softsm's switch, a
// CA of its own on switch port 1, one CA per attached port) and softsm
// keeps what it sets; softsm's own SM stays in charge of LIDs and
// forwarding. Only this user's processes are served (the sockets'
// SCM_CREDENTIALS). Off by default.
//
// When its sockets are bound it prints one line to stdout,
//
//	softsm: listening fabric 127.0.0.1:4792 sa off
//
// (or "sa 127.0.0.1:4793" with the raw SA port)
// and serves until SIGTERM or SIGINT, then exits 0. It stops within
// milliseconds whatever the SA is doing (no SA query holds the SM's lock
// for long); should stopping still take longer than 5 s it exits 1, and a
// second signal ends it at once. Pre-registered ports
// (-port, repeatable) get LIDs 2, 3, … in order and GIDs <prefix>:<GUID>,
// e.g. -port 0x100001 → LID 2, fe80::10:1. With -state FILE the GUID → LID
// map survives restarts; groups never do (a restarted SM has a new epoch
// and only the IPoIB broadcast group).
//
// The switch is lossless: the links to the ports are flow controlled
// (credits), so a burst holds its sender back instead of being dropped. A
// packet waits at most -hoq-life for a port that gives no credit (a
// stalled or dead port), then it is discarded for that port; after
// -vl-stall-count such packets in a row the port is stalled and its
// packets are discarded at once for 8 × -hoq-life.
//
// Floods: softsm keeps answering when local processes flood it with
// attaches (see package ib/sm). One source IP address may have
// -max-ports-per-source ports attached (default 4096; processes on one
// host share 127.0.0.1 unless they bind other loopback addresses); a
// further attach is refused with reason source_limit. An attached port's
// address may send 16 control messages at once and 2 a second after;
// beyond, and when the queue of attaches from new addresses is full,
// control messages are dropped. At the SA a port may have created
// -max-groups-per-port groups that still exist (default 4096) and be a
// member of -max-memberships-per-port groups (default 8192), and the
// ports of one source address (the raw SA port's peers: each peer's
// address) may have created -max-groups-per-source groups together
// (default 4096, a quarter of the MLIDs); a join beyond is answered with
// MAD status 0x0100 (insufficient resources), as OpenSM answers when it
// runs out of MLIDs, so neither one port nor the ports one address may
// attach can take every MLID. 0 means the default, a negative value no
// cap.
//
// SA queries: one answer carries at most -max-table-records records
// (default 16384, every group the MLIDs allow); a Get or GetTable of
// MCMemberRecord or PathRecord that would answer more, or examine more than
// 4 × as many candidates (a GetTable(PathRecord) without source or
// destination examines N×N pairs of ports), is answered with MAD status
// 0x0100 and no record. Broad queries (naming no group, member or both
// ends of a path) are built by a goroutine of their own without the SM's
// lock, so joins of other ports go on meanwhile. A port may send 8192 SA
// requests at once and 32768 a second beyond (a source address 32768 and
// 65536), of them 4 broad queries at once and 2 a second (a source
// address 32 and 16); beyond, requests are dropped. A requester
// may have 2 RMPP transfers (GetTable answers) in progress, a source
// address 16 MiB of them, all sources 64 MiB; a GetTable beyond is
// answered 0x0100.
//
// Every refusal and
// drop is counted (sm.Stats) and logged with -v (throttles, drops and
// source refusals at most once a second with their counts).
//
// Forged source addresses: softsm answers an attach from an address that
// has not proven it receives there (see package ib/fabric, address
// validation) only with a retry no larger than the attach, carrying a
// cookie the port sends back; only then does it register the port and
// answer port_info. So a process that forges the source address of its
// datagrams (raw sockets, or another host when -listen is not loopback)
// can make softsm send the forged address no more bytes than it sent, and
// cannot take LIDs, ports or a source address's share of
// -max-ports-per-source. A port of the earlier protocol version is
// refused with reason "version". Retries and bad cookies are counted and
// logged with -v like the drops.
//
// The SM's address: ports send everything to it, so softsm never shares
// it (no SO_REUSEADDR, no SO_REUSEPORT) and refuses to start while
// someone else holds it, saying who (exit 1):
//
//	softsm: 127.0.0.1:4792 is held by uid 1001 (pid 4242 fakesm); refusing to start: address already in use
//
// With -key-file (or SOFTRDMA_SM_KEY_FILE) softsm proves to the ports
// that it holds the subnet's key: its port_info and refused answers carry
// a MAC over the nonce of the attach they answer. The file must be mode
// 600 (no access for group or others) and owned by softsm's user or root;
// give the ports the same file (SOFTRDMA_SM_KEY_FILE). Without a key, a
// port on the SM's host trusts the SM when the kernel says root or the
// port's own user owns the socket at the SM's address. See
// docs/security-sm.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/ib/sma"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// guidList is the repeatable -port flag.
type guidList []uint64

func (g *guidList) String() string {
	s := make([]string, len(*g))
	for i, v := range *g {
		s[i] = fmt.Sprintf("%#x", v)
	}
	return strings.Join(s, ",")
}

func (g *guidList) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 0, 64)
		if err != nil || n == 0 {
			return fmt.Errorf("bad GUID %q", f)
		}
		*g = append(*g, n)
	}
	return nil
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("softsm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg     sm.Config
		ports   guidList
		noSend  bool
		prefix  string
		verbose bool
		timeout time.Duration
		simName string
		osmDir  string
		osmSwp  int
	)
	fs.StringVar(&cfg.Listen, "listen", fabric.DefaultListen, "fabric UDP `address` the ports attach to")
	fs.StringVar(&cfg.SAListen, "sa-listen", "", "turn on the raw SA port (diagnostics, softrdma saquery) at UDP `address`, e.g. "+fabric.DefaultSAListen+
		": one datagram = one 256-byte SA MAD, acting for the port the record names; loopback only unless -sa-allow-remote")
	fs.BoolVar(&cfg.SAAllowRemote, "sa-allow-remote", false, "let -sa-listen bind a non-loopback address and answer non-loopback senders")
	fs.Var(&ports, "port", "pre-register a port `GUID` (repeatable, or comma-separated); LIDs are assigned in order from 2")
	fs.StringVar(&cfg.StateFile, "state", "", "keep GUID → LID assignments in `file` across restarts")
	fs.BoolVar(&noSend, "no-sendonly-support", false, "clear ClassPortInfo CapabilityMask2 bit 12 and refuse SendOnlyFullMember joins")
	fs.DurationVar(&cfg.SADelay, "sa-delay", 0, "answer every SA MAD only after `duration` (tests of slow SAs)")
	fs.DurationVar(&timeout, "sa-timeout", 0, "same as -sa-delay: how long the SA takes before it answers")
	fs.BoolVar(&cfg.SADrop, "sa-drop", false, "never answer SA MADs (tests of SA silence)")
	fs.StringVar(&prefix, "subnet-prefix", "0xfe80000000000000", "subnet `prefix` (64-bit)")
	fs.DurationVar(&cfg.PortTimeout, "port-timeout", fabric.PortTimeout, "forget a port silent for `duration` (longer than the ports' 1s keepalive)")
	fs.DurationVar(&cfg.HOQLife, "hoq-life", sm.DefaultHOQLife, "how long a packet may wait for a port that gives no credit before it is discarded for that port (IB head-of-queue lifetime)")
	fs.IntVar(&cfg.VLStallCount, "vl-stall-count", sm.DefaultVLStallCount, "packets in a row discarded for a port before all its packets are discarded for 8 × -hoq-life")
	fs.BoolVar(&cfg.ViaSwitch, "via-switch", false, "send every data packet through the switch (by default the ports send to each other by the routes the SM gives them, without the switch's hop; with -sm opensm always through the switch)")
	fs.IntVar(&cfg.MaxPortsPerSource, "max-ports-per-source", sm.DefaultMaxPortsPerSource, "most ports attached from one source IP address (`n`; negative: no cap); one more attach is refused (source_limit)")
	fs.IntVar(&cfg.MaxGroupsPerPort, "max-groups-per-port", sm.DefaultMaxGroupsPerPort, "most groups one port may have created that still exist (`n`; negative: no cap); one more create is answered 0x0100")
	fs.IntVar(&cfg.MaxGroupsPerSource, "max-groups-per-source", sm.DefaultMaxGroupsPerSource(0), "most groups the ports of one source address may have created together that still exist (`n`; negative: no cap); one more create is answered 0x0100")
	fs.IntVar(&cfg.MaxMembershipsPerPort, "max-memberships-per-port", sm.DefaultMaxMembershipsPerPort, "most groups one port may be a member of (`n`; negative: no cap); one more join is answered 0x0100")
	fs.IntVar(&cfg.MaxTableRecords, "max-table-records", sm.DefaultMaxTableRecords, "most records of one SA answer (`n`; negative: no cap); a query that would answer more, or examine 4 × as many candidates, is answered 0x0100")
	fs.StringVar(&simName, "sm-umad2sim", "", "serve ibsim's protocol on abstract unix sockets `name`:ctl… so that OpenSM under libumad2sim.so (IBSIM_SOCKNAME=name) manages a model of the subnet (this user's processes only)")
	fs.StringVar(&cfg.Manager, "sm", sm.ManagerSoftsm, "who manages the subnet: `softsm` (its own SM and SA) or opensm (starts OpenSM under libumad2sim.so and hands it LIDs, SA and forwarding tables)")
	fs.StringVar(&osmDir, "opensm-dir", "", "with -sm opensm: keep OpenSM's configuration, log (osm.log) and caches in `dir` (default: a private temporary directory, removed at exit)")
	fs.IntVar(&osmSwp, "opensm-sweep", 1, "with -sm opensm: OpenSM's sweep interval in `seconds` (how soon it finds a port that attached)")
	fs.BoolVar(&verbose, "v", false, "log attaches, detaches, SA requests and drops to stderr")
	keyFile := fs.String("key-file", os.Getenv(fabric.EnvKeyFile), "authenticate the SM to the ports with the key in `file` (mode 600, owned by this user or root; default $"+fabric.EnvKeyFile+")")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "softsm: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if cfg.HOQLife <= 0 || cfg.VLStallCount <= 0 {
		fmt.Fprintf(stderr, "softsm: -hoq-life and -vl-stall-count must be positive\n")
		return 2
	}
	if msg := checkDurations(cfg.PortTimeout, cfg.SADelay, timeout); msg != "" {
		fmt.Fprintf(stderr, "softsm: %s\n", msg)
		return 2
	}
	p, err := strconv.ParseUint(prefix, 0, 64)
	if err != nil {
		fmt.Fprintf(stderr, "softsm: bad -subnet-prefix %q\n", prefix)
		return 2
	}
	if timeout > 0 {
		cfg.SADelay = timeout
	}
	if *keyFile != "" {
		if cfg.Key, err = fabric.ReadKeyFile(*keyFile); err != nil {
			fmt.Fprintf(stderr, "softsm: %v\n", err)
			return 2
		}
	}
	if cfg.Manager == sm.ManagerOpenSM && simName != "" {
		fmt.Fprintf(stderr, "softsm: -sm-umad2sim serves a model to an OpenSM of your own; with -sm opensm softsm runs its own\n")
		return 2
	}
	cfg.OpenSM = sm.OpenSMConfig{Dir: osmDir, SweepInterval: osmSwp, Verbose: verbose}
	cfg.SubnetPrefix = p
	cfg.Ports = ports
	cfg.SendOnlySupport = !noSend
	if verbose {
		l := log.New(stderr, "softsm: ", log.Lmicroseconds)
		cfg.Logf = l.Printf
	}
	s, err := sm.New(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "softsm: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	sa := "off"
	if a := s.SAAddr(); a.IsValid() {
		sa = a.String()
	}
	fmt.Fprintf(stdout, "softsm: listening fabric %v sa %s\n", s.FabricAddr(), sa)
	if f, ok := stdout.(*os.File); ok {
		f.Sync()
	}
	if verbose {
		fmt.Fprintf(stderr, "softsm: epoch %#x, send-only support %v, %d pre-registered ports, fabric socket buffer %d bytes\n",
			s.Epoch(), cfg.SendOnlySupport, len(ports), s.Stats().SocketBuffer)
		fmt.Fprintf(stderr, "softsm: limits: %s\n", limits(cfg))
	}
	if simName != "" {
		f := sma.New(sma.Config{Ports: s, Logf: cfg.Logf})
		srv, err := sma.Listen(f, sma.ServerConfig{Base: simName, Logf: cfg.Logf})
		if err != nil {
			fmt.Fprintf(stderr, "softsm: -sm-umad2sim: %v\n", err)
			s.Close()
			return 1
		}
		served := make(chan error, 1)
		go func() { served <- srv.Run(ctx) }()
		defer func() {
			srv.Close()
			if err := <-served; err != nil {
				fmt.Fprintf(stderr, "softsm: -sm-umad2sim: %v\n", err)
			}
		}()
	}
	ran := make(chan struct{})
	defer close(ran)
	go stopping(ctx, stop, ran, stderr)
	if err := s.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "softsm: %v\n", err)
		return 1
	}
	return 0
}

// stopGrace is how long softsm may take to stop after SIGTERM or SIGINT
// (a variable for tests).
var stopGrace = 5 * time.Second

// exit ends the process (a variable for tests).
var exit = os.Exit

// stopping waits for the signal (ctx) unless Run returns first (ran): then
// a second signal ends the process at once (stop restores the default
// action), and when Run has not returned within stopGrace the process
// exits 1.
func stopping(ctx context.Context, stop func(), ran <-chan struct{}, stderr io.Writer) {
	select {
	case <-ctx.Done():
	case <-ran:
		return
	}
	stop()
	t := time.NewTimer(stopGrace)
	defer t.Stop()
	select {
	case <-ran:
	case <-t.C:
		fmt.Fprintf(stderr, "softsm: not stopped %v after the signal: exiting\n", stopGrace)
		exit(1)
	}
}

// limits describes the flood limits and quotas of cfg.
func limits(cfg sm.Config) string {
	f := func(v int) string {
		if v < 0 {
			return "no cap"
		}
		return fmt.Sprint(v)
	}
	return fmt.Sprintf("%s ports per source address, %s groups created and %s memberships per port, %s records per SA answer, %s groups created per source address",
		f(cfg.MaxPortsPerSource), f(cfg.MaxGroupsPerPort), f(cfg.MaxMembershipsPerPort), f(cfg.MaxTableRecords), f(cfg.MaxGroupsPerSource))
}

// checkDurations validates the duration flags: a port timeout must outlast
// the ports' keepalive interval (else every port is forgotten between two
// keepalives), and no delay is negative.
func checkDurations(portTimeout, saDelay, saTimeout time.Duration) string {
	switch {
	case portTimeout <= fabric.KeepaliveInterval:
		return fmt.Sprintf("-port-timeout %v: must be longer than the ports' keepalive interval (%v)", portTimeout, fabric.KeepaliveInterval)
	case saDelay < 0:
		return fmt.Sprintf("-sa-delay %v: negative duration", saDelay)
	case saTimeout < 0:
		return fmt.Sprintf("-sa-timeout %v: negative duration", saTimeout)
	}
	return ""
}
