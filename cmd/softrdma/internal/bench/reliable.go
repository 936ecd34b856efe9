package bench

import (
	"bufio"
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The reliable part (PartReliable, `softrdma bench -parts reliable`)
// compares implementations of reliable multicast side by side, in the same
// run, on the same machine: one sender to 1, 2 and 4 receiver processes,
// each in a network namespace of its own, joined by veth pairs to a bridge
// in another namespace, for several message sizes and injected loss
// rates. Each implementation is a Peer: a sender command and a receiver
// command sharing one command line and one output (PeerArgs, PeerLine,
// the message format of rmsg.go), so that any implementation plugs in.
//
// Built-in peers, C programs the part compiles with gcc at run time from
// rmpeers/ (a peer whose -dev package is missing is skipped, saying so):
//   - "udp": plain UDP multicast, the unreliable ceiling: sendmmsg batches
//     of 64 datagrams, messages larger than one datagram (1472 bytes)
//     chunked, a message delivered only when all its chunks arrived, no
//     repair;
//   - "norm": NORM (libnorm-dev), one NORM_OBJECT_STREAM with
//     NormStreamMarkEom after each message (NORM packs small messages into
//     full segments); ACK-based flow control, NORM's lossless mode: the
//     receivers are the sender's acking nodes and the sender keeps at most
//     its 2 MB stream buffer unacknowledged, setting a watermark every
//     eighth of it (as NORM's normStreamer example does; timer-based flow
//     control off — with it NORM is faster at 0 loss here but breaks the
//     stream, losing messages, at 5 % loss); a fixed transmit rate of
//     RelNormRate, 600 Mbit/s (NORM's default is 64 kbit/s; 500–800
//     Mbit/s was best here, faster rates overrun the receivers and the
//     repairs collapse the goodput) — or NORM-CC bounded by it with
//     RelNormCC; GRTT estimate 1 ms and GRTT max 1 ms (the default max of
//     10 s lets queueing inflate every NACK and ACK timer: 4 MB/s instead
//     of 22 MB/s at 1 % loss), backoff factor 0, segments of 1400 bytes
//     (unfragmented at MTU 1500), FEC blocks of 64 + 16 parity segments
//     sent on NACK, 4 MB socket buffers (net.core.rmem_max);
//   - "pgm": OpenPGM (libpgm-dev) over UDP encapsulation; PGM_TXW_MAX_RTE
//     raised to RelPGMRate, 200 MB/s (OpenPGM's examples use 400 kB/s;
//     1 GB/s overruns the receivers, which then lose what left the
//     window), transmit and receive windows of 65536 TPDUs, PGM_MTU 1500,
//     NAK back-off 2 ms, NAK repeat and RDATA wait 50 ms, 50 retries, SPMR
//     expiry 25 ms, heartbeat SPMs from 1 ms, 8 MB socket buffers; the
//     sender answers NAKs in a thread of its own (OpenPGM's daytime
//     example). PGM has no flow control from the receivers: a receiver
//     that falls a window behind loses messages. Debian's libpgm 5.3.128
//     crashes in pgm_send on an APDU larger than one TPDU, so a larger
//     message goes as one APDU per TPDU, joined by the receiver.
//
// The "softrdma" peer (package mcast) is registered by its program with
// RegisterReliablePeer; until it is, the targets say "NOT MEASURED".
//
// The topology: namespaces <tag>-<pid>-br (the bridge br0, multicast
// snooping off), -h0 (the sender) and -h1…-hN (one receiver each); each
// host's interface rm0 is one end of a veth pair whose other end is a
// port of br0, with 10.233.0.(i+1)/24 and the route 224.0.0.0/4 pinned
// to rm0; every peer binds to rm0 too. Nothing leaves these namespaces.
//
// Loss: in every host namespace an nftables rule on the input hook drops
// incoming UDP with `numgen random mod 1000 < L` (L per mille) and counts
// what it dropped. Lost bytes are the bytes dropped at the receivers'
// hosts as frames on the wire (the IP bytes nftables counts plus 14
// bytes of Ethernet header per packet); drops at the sender's host (its
// feedback) are counted apart. Wire bytes are the bytes every host sent
// into the bridge (the rx counters of the bridge's ports) between the go
// and the last JSON line. Repair bytes at loss L are the wire bytes at L
// minus the wire bytes of the same peer, receivers and size at loss 0 in
// the same run (the first pass: data and the feedback a lossless run
// needs), scaled by the message counts; the part always measures loss 0
// first for that. Repair per delivered byte divides by the bytes the
// receivers delivered (each receiver's copy counts); repair per lost
// byte by the lost bytes.
//
// Each receiver reports its first and last delivery; a case's goodput is
// the slowest receiver's distinct messages / (its last delivery − the
// sender's first send), its latency the worst receiver's p50 and p99 of
// send → delivery (CLOCK_MONOTONIC: the namespaces share it). Lost,
// reordered, duplicated and corrupted messages are summed over receivers.
// A sender that sends as fast as it can queues behind its own flow
// control: the latency includes that queueing (-rel-rate sets a rate).

// The tuned rates of NORM (bit/s) and PGM (bytes/s) on this machine (see
// the package doc of the part above).
const (
	relNormRate = 600e6
	relPGMRate  = 200_000_000
)

// PartReliable is the reliable-multicast comparison (root, and the C
// peers' libraries); it is not in the default parts.
const PartReliable = "reliable"

// Peer is one implementation of (reliable) multicast the reliable part
// runs: its sender and its receivers are commands with the common command
// line of PeerArgs.
type Peer struct {
	// Name is the peer's name in the table ("softrdma", "udp", "norm",
	// "pgm"); the targets compare "softrdma" with the others.
	Name string
	// Reliable says the peer promises ordered, lossless delivery (its lost,
	// reordered and duplicated counts must be 0).
	Reliable bool
	// Prepare, when not nil, readies the peer's programs (e.g. compiles
	// them into dir, a directory of its own) before its first case; skip
	// says why the peer cannot run on this machine.
	Prepare func(dir string) (skip string, err error)
	// Command returns the argv of the sender (a.Send) or of a receiver for
	// a (a.Args() is the common part of the command line). The command
	// runs inside the host's network namespace.
	Command func(a PeerArgs) []string
	// Tuning describes the peer's settings, for the table.
	Tuning string
}

var (
	relPeersMu sync.Mutex
	relPeers   []Peer
)

// RegisterReliablePeer adds a peer to the reliable part (after the
// built-in ones; a peer of the same name replaces the earlier one).
func RegisterReliablePeer(p Peer) {
	relPeersMu.Lock()
	defer relPeersMu.Unlock()
	if i := slices.IndexFunc(relPeers, func(q Peer) bool { return q.Name == p.Name }); i >= 0 {
		relPeers[i] = p
		return
	}
	relPeers = append(relPeers, p)
}

// ReliablePeers returns the registered peers: the built-in ones ("udp",
// "norm", "pgm") and those added with RegisterReliablePeer.
func ReliablePeers() []Peer {
	relPeersMu.Lock()
	defer relPeersMu.Unlock()
	return slices.Clone(relPeers)
}

//go:embed rmpeers/*.h rmpeers/*.c rmpeers/*.cpp
var rmpeersFS embed.FS

func init() {
	for _, p := range []struct {
		name, src, compiler, tuning string
		reliable                    bool
		flags, libs                 []string
		needHeader, pkg             string
	}{
		{name: "udp", src: "udp.c", compiler: "gcc", tuning: "sendmmsg batches of 64, 16 MB socket buffers, no repair (the ceiling)"},
		{name: "norm", src: "norm.cpp", compiler: "g++", reliable: true, flags: []string{"-std=gnu++17"}, libs: []string{"-lnorm"},
			needHeader: "normApi.h", pkg: "libnorm-dev"},
		{name: "pgm", src: "pgm.c", compiler: "gcc", reliable: true, flags: []string{"-I/usr/include/pgm-5.3"}, libs: []string{"-lpgm", "-lpthread"},
			needHeader: "pgm/pgm.h", pkg: "libpgm-dev"},
	} {
		bin := new(string)
		RegisterReliablePeer(Peer{
			Name:     p.name,
			Reliable: p.reliable,
			Tuning:   p.tuning,
			Prepare: func(dir string) (string, error) {
				if _, err := exec.LookPath(p.compiler); err != nil {
					return fmt.Sprintf("no %s to build the %s peer", p.compiler, p.name), nil
				}
				if err := writeRMPeers(dir); err != nil {
					return "", err
				}
				*bin = filepath.Join(dir, "rm-"+p.name)
				args := append([]string{"-O2", "-Wall"}, p.flags...)
				args = append(args, "-o", *bin, filepath.Join(dir, p.src))
				args = append(args, p.libs...)
				out, err := exec.Command(p.compiler, args...).CombinedOutput()
				if err != nil {
					if p.needHeader != "" && !hasHeader(p.compiler, p.flags, p.needHeader) {
						return fmt.Sprintf("%s not installed (no %s)", p.pkg, p.needHeader), nil
					}
					return "", fmt.Errorf("build %s peer: %v\n%s", p.name, err, out)
				}
				return "", nil
			},
			Command: func(a PeerArgs) []string { return append([]string{*bin}, a.Args()...) },
		})
	}
}

// writeRMPeers writes the C peers' sources into dir.
func writeRMPeers(dir string) error {
	ents, err := rmpeersFS.ReadDir("rmpeers")
	if err != nil {
		return err
	}
	for _, e := range ents {
		b, err := rmpeersFS.ReadFile("rmpeers/" + e.Name())
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// hasHeader reports whether the compiler finds header.
func hasHeader(compiler string, flags []string, header string) bool {
	lang := "c"
	if compiler == "g++" {
		lang = "c++"
	}
	cmd := exec.Command(compiler, append(slices.Clone(flags), "-E", "-x", lang, "-")...)
	cmd.Stdin = strings.NewReader("#include <" + header + ">\n")
	return cmd.Run() == nil
}

// RelResult is one case of the reliable part for one peer.
type RelResult struct {
	Kind      string `json:"kind"` // "reliable"
	Peer      string `json:"peer"`
	Reliable  bool   `json:"reliable"`
	Receivers int    `json:"receivers"`
	Size      int    `json:"size"`
	// LossPerMille is the injected loss, per mille of the UDP packets each
	// host receives.
	LossPerMille int   `json:"loss_per_mille"`
	Count        int   `json:"count"`
	Sent         int64 `json:"sent"`

	// MsgsPerS and BytesPerS are the goodput of the slowest receiver;
	// RxMsgsPerS each receiver's.
	MsgsPerS   float64   `json:"msgs_per_s"`
	BytesPerS  float64   `json:"bytes_per_s"`
	RxMsgsPerS []float64 `json:"rx_msgs_per_s"`
	// P50us and P99us: send → delivery, the worst receiver's.
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
	MaxUs float64 `json:"max_us"`
	// Summed over the receivers.
	Lost       int64 `json:"lost"`
	Reordered  int64 `json:"reordered"`
	Duplicated int64 `json:"duplicated"`
	Corrupted  int64 `json:"corrupted"`

	// WireBytes: every host's bytes into the bridge; SenderBytes the
	// sender host's part. BaseWireBytes: the same peer, receivers and size
	// at loss 0 (scaled to Count). RepairBytes = WireBytes −
	// BaseWireBytes (0 at loss 0).
	WireBytes     uint64 `json:"wire_bytes"`
	SenderBytes   uint64 `json:"sender_bytes"`
	BaseWireBytes uint64 `json:"base_wire_bytes"`
	RepairBytes   int64  `json:"repair_bytes"`
	// LostPkts and LostBytes: dropped at the receivers' hosts (frame
	// bytes); FeedbackDropped: packets dropped at the sender's host.
	LostPkts        uint64 `json:"lost_pkts"`
	LostBytes       uint64 `json:"lost_bytes"`
	FeedbackDropped uint64 `json:"feedback_dropped"`
	// RepairPerDelivered = RepairBytes / the bytes the receivers
	// delivered; RepairPerLost = RepairBytes / LostBytes.
	RepairPerDelivered float64 `json:"repair_per_delivered"`
	RepairPerLost      float64 `json:"repair_per_lost"`

	// Ratio is MsgsPerS over plain UDP multicast's in the same case (0
	// without a udp run).
	Ratio float64 `json:"ratio"`

	Seconds    float64  `json:"seconds"`
	SenderInfo string   `json:"sender_info,omitempty"`
	RxInfo     []string `json:"rx_info,omitempty"`
	// Err says why the case failed (a peer exited, timed out, …).
	Err string `json:"err,omitempty"`
}

// relCount is the message count of a case of size bytes.
func relCount(cfg *Config, size int) int {
	if cfg.RelCount > 0 {
		return cfg.RelCount
	}
	return min(max(cfg.RelBytes/size, 1000), cfg.RelMaxCount)
}

func runReliable(cfg *Config, w *writer, rep *Report) error {
	w.tablef("\nreliable multicast: 1 sender → N receiver processes, one network namespace each, veth pairs to a bridge; loss injected by nftables on every host's input (UDP)\n")
	if os.Geteuid() != 0 {
		w.tablef("  skipped: not root (network namespaces and nftables)\n")
		return nil
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			w.tablef("  skipped: no %s command\n", tool)
			return nil
		}
	}
	dir, err := os.MkdirTemp("", "softrdma-rel-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var peers []Peer
	for _, p := range ReliablePeers() {
		if len(cfg.RelPeers) > 0 && !slices.Contains(cfg.RelPeers, p.Name) {
			continue
		}
		if p.Prepare != nil {
			pd := filepath.Join(dir, p.Name)
			if err := os.MkdirAll(pd, 0o755); err != nil {
				return err
			}
			skip, err := p.Prepare(pd)
			if err != nil {
				return err
			}
			if skip != "" {
				w.tablef("  %s: skipped: %s\n", p.Name, skip)
				continue
			}
		}
		peers = append(peers, p)
	}
	for _, name := range cfg.RelPeers {
		if !slices.ContainsFunc(ReliablePeers(), func(p Peer) bool { return p.Name == name }) {
			w.tablef("  %s: no such peer (registered: %s)\n", name, strings.Join(peerNames(ReliablePeers()), ", "))
		}
	}
	if len(peers) == 0 {
		w.tablef("  no peer to run\n")
		return nil
	}
	for _, p := range peers {
		tuning := p.Tuning
		switch p.Name {
		case "norm":
			tuning = relNormTuning(cfg)
		case "pgm":
			tuning = relPGMTuning(cfg)
		}
		if tuning != "" {
			w.tablef("  %-8s %s\n", p.Name, tuning)
		}
	}
	losses := cfg.RelLoss
	if !slices.Contains(losses, 0) {
		losses = append([]int{0}, losses...) // the first pass of the repair bytes
	}
	slices.Sort(losses)
	w.tablef("  goodput: the slowest receiver's distinct messages/s from the sender's first send to its last delivery; latency send → delivery, the worst receiver's\n")
	w.tablef("  repair: wire bytes at this loss − at loss 0 (same peer, N, size); /dlv: per byte the receivers delivered, /lost: per byte dropped at the receivers\n")
	w.tablef("  %-8s %2s %6s %5s | %10s %9s %9s %9s | %7s %5s %5s | %8s %7s %10s %s\n",
		"peer", "N", "size", "loss", "msgs/s", "MB/s", "p50 µs", "p99 µs", "lost", "reord", "dup", "repair/dlv", "/lost", "dropped", "note")
	sweepStaleRel()
	port := 17000 + os.Getpid()%2000
	for _, n := range cfg.RelReceivers {
		net, err := newRelNet(n)
		if err != nil {
			return err
		}
		base := map[string]RelResult{}
		for _, size := range cfg.RelSizes {
			count := relCount(cfg, size)
			for li, loss := range losses {
				var group []RelResult
				for k := range peers {
					// Alternate the order of the peers from case to case.
					p := peers[(k+li+len(rep.Reliable))%len(peers)]
					port++
					r := runRelCase(cfg, net, p, n, size, loss, count, port)
					key := fmt.Sprintf("%s/%d", p.Name, size)
					if b, ok := base[key]; loss > 0 && ok && b.Err == "" && r.Err == "" {
						r.BaseWireBytes = uint64(float64(b.WireBytes) * float64(r.Count) / float64(b.Count))
						r.RepairBytes = int64(r.WireBytes) - int64(r.BaseWireBytes)
						dlv := float64(r.Size) * float64(int64(r.Count)*int64(n)-r.Lost)
						if dlv > 0 {
							r.RepairPerDelivered = float64(r.RepairBytes) / dlv
						}
						if r.LostBytes > 0 {
							r.RepairPerLost = float64(r.RepairBytes) / float64(r.LostBytes)
						}
					}
					if loss == 0 {
						base[key] = r
					}
					group = append(group, r)
				}
				// The table lists the peers in their registration order.
				slices.SortStableFunc(group, func(a, b RelResult) int {
					return slices.Index(peerNames(peers), a.Peer) - slices.Index(peerNames(peers), b.Peer)
				})
				if u := slices.IndexFunc(group, func(r RelResult) bool { return r.Peer == "udp" && r.Err == "" }); u >= 0 && group[u].MsgsPerS > 0 {
					for i := range group {
						group[i].Ratio = group[i].MsgsPerS / group[u].MsgsPerS
					}
				}
				for _, r := range group {
					rep.Reliable = append(rep.Reliable, r)
					printRel(w, r)
					w.json(r)
				}
			}
			w.tablef("\n")
		}
		net.close()
	}
	return nil
}

func peerNames(ps []Peer) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

func printRel(w *writer, r RelResult) {
	if r.Err != "" {
		w.tablef("  %-8s %2d %6d %4.1f%% | failed: %s\n", r.Peer, r.Receivers, r.Size, float64(r.LossPerMille)/10, r.Err)
		return
	}
	repair, perLost := "-", "-"
	if r.LossPerMille > 0 && r.BaseWireBytes > 0 {
		repair = fmt.Sprintf("%.4f", r.RepairPerDelivered)
		if r.LostBytes > 0 {
			perLost = fmt.Sprintf("%.2f", r.RepairPerLost)
		}
	}
	note := ""
	if r.Reliable && (r.Lost > 0 || r.Reordered > 0 || r.Duplicated > 0 || r.Corrupted > 0) {
		note = "NOT RELIABLE HERE"
	}
	if r.Corrupted > 0 {
		note += fmt.Sprintf(" corrupted %d", r.Corrupted)
	}
	w.tablef("  %-8s %2d %6d %4.1f%% | %10.0f %9.1f %9.0f %9.0f | %7d %5d %5d | %10s %7s %10s %s\n",
		r.Peer, r.Receivers, r.Size, float64(r.LossPerMille)/10, r.MsgsPerS, r.BytesPerS/1e6, r.P50us, r.P99us,
		r.Lost, r.Reordered, r.Duplicated, repair, perLost, fmt.Sprintf("%d/%d", r.LostPkts, r.FeedbackDropped), note)
}

// relNormTuning and relPGMTuning describe the NORM and PGM settings.
func relNormTuning(cfg *Config) string {
	mode := fmt.Sprintf("fixed rate %.0f Mbit/s", cfg.RelNormRate/1e6)
	if cfg.RelNormCC {
		mode = fmt.Sprintf("NORM-CC up to %.0f Mbit/s", cfg.RelNormRate/1e6)
	}
	return mode + ", ACK-based flow control (receivers = acking nodes, watermark every 1/8 of a 2 MB stream buffer), GRTT estimate and max 1 ms, backoff 0, segment 1400, FEC 64+16 on NACK, 4 MB socket buffers"
}

func relPGMTuning(cfg *Config) string {
	return fmt.Sprintf("UDP-encapsulated, PGM_TXW_MAX_RTE %.0f MB/s, windows 65536 TPDUs, MTU 1500, NAK back-off 2 ms, repeat/RDATA 50 ms, heartbeat SPM from 1 ms, 8 MB socket buffers, one TPDU per APDU", float64(cfg.RelPGMRate)/1e6)
}

// peerExtra returns the tuning flags of a built-in peer.
func peerExtra(cfg *Config, p Peer) map[string]string {
	switch p.Name {
	case "norm":
		e := map[string]string{"txrate": fmt.Sprint(cfg.RelNormRate)}
		if cfg.RelNormCC {
			e["cc"] = "1"
		}
		return e
	case "pgm":
		return map[string]string{"txrate": fmt.Sprint(cfg.RelPGMRate)}
	}
	return nil
}

// relNet is the reliable part's topology.
type relNet struct {
	br    string
	hosts []string     // [0] is the sender's
	addrs []netip.Addr // the hosts' addresses on rm0
}

const (
	relTag   = "srrel"
	relIface = "rm0"
)

var relGroup = netip.MustParseAddr("239.255.77.1")

// sweepStaleRel deletes the namespaces of dead runs.
func sweepStaleRel() {
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), relTag+"-")
		if !ok {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		var pid int
		if _, err := fmt.Sscan(pidStr, &pid); err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
			continue
		}
		exec.Command("ip", "netns", "del", e.Name()).Run()
	}
}

// newRelNet creates the bridge namespace and n+1 hosts.
func newRelNet(n int) (*relNet, error) {
	pfx := fmt.Sprintf("%s-%d-", relTag, os.Getpid())
	net := &relNet{br: pfx + "br"}
	for i := range n + 1 {
		net.hosts = append(net.hosts, fmt.Sprintf("%sh%d", pfx, i))
		net.addrs = append(net.addrs, netip.AddrFrom4([4]byte{10, 233, 0, byte(i + 1)}))
	}
	steps := [][]string{
		{"netns", "add", net.br},
		{"-n", net.br, "link", "set", "lo", "up"},
		{"-n", net.br, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0"},
		{"-n", net.br, "link", "set", "br0", "up"},
	}
	for i, h := range net.hosts {
		port := fmt.Sprintf("p%d", i)
		steps = append(steps,
			[]string{"netns", "add", h},
			[]string{"-n", net.br, "link", "add", port, "type", "veth", "peer", "name", relIface, "netns", h},
			[]string{"-n", net.br, "link", "set", port, "master", "br0", "up"},
			[]string{"-n", h, "link", "set", "lo", "up"},
			[]string{"-n", h, "addr", "add", net.addrs[i].String() + "/24", "dev", relIface},
			[]string{"-n", h, "link", "set", relIface, "up"},
			[]string{"-n", h, "route", "add", "224.0.0.0/4", "dev", relIface})
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			net.close()
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, strings.TrimSpace(string(out)))
		}
	}
	// No IPv6 chatter on the wire the part counts.
	for _, ns := range append([]string{net.br}, net.hosts...) {
		exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1").Run()
	}
	return net, nil
}

func (n *relNet) close() {
	for _, ns := range append(slices.Clone(n.hosts), n.br) {
		if out, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
			for _, f := range strings.Fields(string(out)) {
				var pid int
				if _, err := fmt.Sscan(f, &pid); err == nil && pid > 1 && pid != os.Getpid() {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		exec.Command("ip", "netns", "del", ns).Run()
	}
}

// setLoss installs the loss rule (and fresh counters) in every host.
func (n *relNet) setLoss(perMille int) error {
	rules := fmt.Sprintf(`flush ruleset
table inet srloss {
	counter dropped {}
	chain in {
		type filter hook input priority 0; policy accept;
		meta l4proto udp numgen random mod 1000 < %d counter name dropped drop
	}
}
`, perMille)
	for _, h := range n.hosts {
		cmd := exec.Command("ip", "netns", "exec", h, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(rules)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nft in %s: %v: %s", h, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// dropped reads a host's loss counter.
func (n *relNet) dropped(host int) (pkts, bytes uint64, err error) {
	out, err := exec.Command("ip", "netns", "exec", n.hosts[host], "nft", "-j", "list", "counter", "inet", "srloss", "dropped").Output()
	if err != nil {
		return 0, 0, fmt.Errorf("nft list counter: %v", err)
	}
	var v struct {
		Nftables []struct {
			Counter *struct {
				Packets uint64 `json:"packets"`
				Bytes   uint64 `json:"bytes"`
			} `json:"counter"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		return 0, 0, err
	}
	for _, e := range v.Nftables {
		if e.Counter != nil {
			return e.Counter.Packets, e.Counter.Bytes, nil
		}
	}
	return 0, 0, fmt.Errorf("no counter in %s", out)
}

// portBytes returns the bytes each host sent into the bridge (the rx
// counters of the bridge's ports p0…pN).
func (n *relNet) portBytes() ([]uint64, error) {
	out, err := exec.Command("ip", "-n", n.br, "-s", "-j", "link", "show").Output()
	if err != nil {
		return nil, fmt.Errorf("ip -s link: %v", err)
	}
	var links []struct {
		Ifname string `json:"ifname"`
		Stats  struct {
			Rx struct {
				Bytes uint64 `json:"bytes"`
			} `json:"rx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		return nil, err
	}
	b := make([]uint64, len(n.hosts))
	for _, l := range links {
		var i int
		if _, err := fmt.Sscanf(l.Ifname, "p%d", &i); err == nil && i >= 0 && i < len(b) {
			b[i] = l.Stats.Rx.Bytes
		}
	}
	return b, nil
}

// relProc is a peer process in a host namespace.
type relProc struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	ready  chan struct{}
	result chan PeerLine
	done   chan struct{}
	mu     sync.Mutex
	errb   bytes.Buffer
	other  []string // lines that are neither READY nor JSON
}

func startRelProc(ns string, argv []string) (*relProc, error) {
	p := &relProc{ready: make(chan struct{}), result: make(chan PeerLine, 1), done: make(chan struct{})}
	p.cmd = exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.cmd.Stderr = &lockedWriter{mu: &p.mu, b: &p.errb}
	var err error
	if p.in, err = p.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		readied := false
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "READY" && !readied:
				readied = true
				close(p.ready)
			case strings.HasPrefix(line, "{"):
				var l PeerLine
				if err := json.Unmarshal([]byte(line), &l); err != nil {
					p.note(fmt.Sprintf("bad JSON line %q: %v", line, err))
					continue
				}
				select {
				case p.result <- l:
				default:
				}
			default:
				p.note(line)
			}
		}
		p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *relProc) note(s string) {
	p.mu.Lock()
	p.other = append(p.other, s)
	p.mu.Unlock()
}

// why describes a process that failed: its stderr and stray output.
func (p *relProc) why() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := strings.TrimSpace(p.errb.String() + "\n" + strings.Join(p.other, "\n"))
	if len(s) > 400 {
		s = s[len(s)-400:]
	}
	return strings.ReplaceAll(s, "\n", " | ")
}

// end closes the process's stdin and kills it if it is still there
// after grace.
func (p *relProc) end(grace time.Duration) {
	p.in.Close()
	select {
	case <-p.done:
	case <-time.After(grace):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(b)
}

// runRelCase runs one case of one peer; a failure is in the result's Err.
func runRelCase(cfg *Config, net *relNet, p Peer, n, size, loss, count, port int) RelResult {
	r := RelResult{Kind: "reliable", Peer: p.Name, Reliable: p.Reliable, Receivers: n, Size: size, LossPerMille: loss, Count: count}
	fail := func(format string, a ...any) RelResult {
		r.Err = fmt.Sprintf(format, a...)
		return r
	}
	if err := net.setLoss(loss); err != nil {
		return fail("%v", err)
	}
	idle := cfg.RelIdle
	if !p.Reliable {
		idle = min(idle, time.Second) // nothing comes late without repair
	}
	args := PeerArgs{Group: relGroup, Port: port, Iface: relIface, Size: size, Count: count,
		Timeout: cfg.RelTimeout, Idle: idle, Extra: peerExtra(cfg, p)}
	var rxs []*relProc
	defer func() {
		for _, q := range rxs {
			q.end(2 * time.Second)
		}
	}()
	for i := 1; i <= n; i++ {
		a := args
		a.Addr = net.addrs[i]
		q, err := startRelProc(net.hosts[i], p.Command(a))
		if err != nil {
			return fail("start receiver %d: %v", i, err)
		}
		rxs = append(rxs, q)
	}
	deadline := time.After(15 * time.Second)
	for i, q := range rxs {
		select {
		case <-q.ready:
		case <-q.done:
			return fail("receiver %d exited before READY: %s", i+1, q.why())
		case <-deadline:
			return fail("receiver %d not READY after 15 s: %s", i+1, q.why())
		}
	}
	a := args
	a.Send, a.Addr, a.Rate, a.Receivers = true, net.addrs[0], cfg.RelRate, net.addrs[1:]
	tx, err := startRelProc(net.hosts[0], p.Command(a))
	if err != nil {
		return fail("start sender: %v", err)
	}
	defer tx.end(2 * time.Second)
	// Let the sender set up (NORM and PGM announce themselves) before the go.
	time.Sleep(200 * time.Millisecond)
	before, err := net.portBytes()
	if err != nil {
		return fail("%v", err)
	}
	start := time.Now()
	if _, err := io.WriteString(tx.in, "go\n"); err != nil {
		return fail("sender: %v: %s", err, tx.why())
	}
	timeout := time.After(cfg.RelTimeout + 10*time.Second)
	var sl PeerLine
	select {
	case sl = <-tx.result:
	case <-tx.done:
		// A process may print its line and exit at once: both are ready.
		select {
		case sl = <-tx.result:
		default:
			return fail("sender exited without its line: %s", tx.why())
		}
	case <-timeout:
		return fail("sender not done after %v: %s", cfg.RelTimeout+10*time.Second, tx.why())
	}
	var lines []PeerLine
	for i, q := range rxs {
		select {
		case l := <-q.result:
			lines = append(lines, l)
		case <-q.done:
			select {
			case l := <-q.result:
				lines = append(lines, l)
			default:
				return fail("receiver %d exited without its line: %s", i+1, q.why())
			}
		case <-timeout:
			return fail("receiver %d not done: %s", i+1, q.why())
		}
	}
	r.Seconds = time.Since(start).Seconds()
	after, err := net.portBytes()
	if err != nil {
		return fail("%v", err)
	}
	for i := range after {
		d := after[i] - before[i]
		r.WireBytes += d
		if i == 0 {
			r.SenderBytes = d
		}
	}
	for i := range net.hosts[:n+1] {
		pk, b, err := net.dropped(i)
		if err != nil {
			return fail("%v", err)
		}
		if i == 0 {
			r.FeedbackDropped = pk
		} else {
			r.LostPkts += pk
			r.LostBytes += b + 14*pk
		}
	}
	r.Sent, r.SenderInfo = sl.Sent, sl.Info
	r.MsgsPerS = math.Inf(1)
	for _, l := range lines {
		rate := 0.0
		if l.LastNs > sl.FirstNs && l.Distinct > 0 {
			rate = float64(l.Distinct) / (float64(l.LastNs-sl.FirstNs) / 1e9)
		}
		r.RxMsgsPerS = append(r.RxMsgsPerS, rate)
		r.MsgsPerS = min(r.MsgsPerS, rate)
		r.P50us = max(r.P50us, float64(l.P50Ns)/1e3)
		r.P99us = max(r.P99us, float64(l.P99Ns)/1e3)
		r.MaxUs = max(r.MaxUs, float64(l.MaxNs)/1e3)
		r.Lost += l.Lost
		r.Reordered += l.Reordered
		r.Duplicated += l.Duplicated
		r.Corrupted += l.Corrupted
		if l.Info != "" {
			r.RxInfo = append(r.RxInfo, l.Info)
		}
	}
	r.BytesPerS = r.MsgsPerS * float64(size)
	return r
}

// The targets of the reliable part: "softrdma" against the other peers.
const (
	relMinVsUDP     = 0.8 // goodput at loss 0 / plain UDP's
	relMinVsPeers   = 2.0 // goodput / the better of NORM and PGM, every loss rate
	relMaxP99Ratio  = 0.5 // p99 at 1 % loss / the better peer's
	relMaxRepair    = 1.5 // repair bytes / lost bytes, 4 receivers at 1 % loss
	relLossMax      = 50  // the reliability target holds up to 5 %
	relP99Loss      = 10  // 1 %
	relRepairRecv   = 4
	relRepairLoss   = 10
	relSoftrdmaPeer = "softrdma"
)

// reliableTargets checks the reliable part's results.
func reliableTargets(rs []RelResult) []Target {
	names := []string{
		"reliable: 0 lost, 0 reordered, 0 duplicated (loss ≤ 5 %)",
		"reliable: goodput at 0 loss vs plain UDP multicast",
		"reliable: goodput vs the better of NORM and PGM (every loss)",
		"reliable: p99 latency at 1 % loss vs the better peer's",
		"reliable: repair bytes / lost bytes (4 receivers, 1 % loss)",
	}
	wants := []string{"0", fmt.Sprintf("≥ %.1f×", relMinVsUDP), fmt.Sprintf("≥ %.1f×", relMinVsPeers), fmt.Sprintf("≤ %.1f×", relMaxP99Ratio), fmt.Sprintf("≤ %.1f×", relMaxRepair)}
	var ts []Target
	mine := map[string]RelResult{}
	others := map[string]RelResult{}
	key := func(r RelResult) string { return fmt.Sprintf("%d/%d/%d", r.Receivers, r.Size, r.LossPerMille) }
	for _, r := range rs {
		if r.Peer == relSoftrdmaPeer {
			mine[key(r)] = r
		} else {
			others[r.Peer+"/"+key(r)] = r
		}
	}
	if len(mine) == 0 {
		for i := range names {
			ts = append(ts, Target{Kind: "target", Name: names[i], Want: wants[i], Unmeasured: "softrdma peer missing"})
		}
		return ts
	}
	where := func(r RelResult) string {
		return fmt.Sprintf("N=%d, %d B, %.1f%%", r.Receivers, r.Size, float64(r.LossPerMille)/10)
	}
	add := func(i int, measured string, met bool, unmeasured string) {
		ts = append(ts, Target{Kind: "target", Name: names[i], Want: wants[i], Measured: measured, Met: met, Unmeasured: unmeasured})
	}
	// 1: reliability.
	var bad int64
	worst := ""
	failed := 0
	for _, r := range mine {
		if r.Err != "" {
			failed++
			continue
		}
		if r.LossPerMille <= relLossMax {
			if b := r.Lost + r.Reordered + r.Duplicated + r.Corrupted; b > 0 {
				bad += b
				worst = where(r)
			}
		}
	}
	m := fmt.Sprintf("%d bad messages", bad)
	if worst != "" {
		m += " (e.g. " + worst + ")"
	}
	if failed > 0 {
		m += fmt.Sprintf(", %d cases failed", failed)
	}
	add(0, m, bad == 0 && failed == 0, "")
	// 2–5: ratios, the worst case of each.
	type ratio struct {
		v     float64
		where string
	}
	lowest := func(rs []ratio, max bool) (ratio, bool) {
		if len(rs) == 0 {
			return ratio{}, false
		}
		w := rs[0]
		for _, r := range rs[1:] {
			if max && r.v > w.v || !max && r.v < w.v {
				w = r
			}
		}
		return w, true
	}
	var vsUDP, vsPeers, p99, repair []ratio
	for k, r := range mine {
		if r.Err != "" {
			continue
		}
		if u, ok := others["udp/"+k]; ok && r.LossPerMille == 0 && u.Err == "" && u.MsgsPerS > 0 {
			vsUDP = append(vsUDP, ratio{r.MsgsPerS / u.MsgsPerS, where(r)})
		}
		n, nok := others["norm/"+k]
		g, gok := others["pgm/"+k]
		nok, gok = nok && n.Err == "", gok && g.Err == ""
		if nok || gok {
			best := 0.0
			bestP99 := math.Inf(1)
			if nok {
				best, bestP99 = n.MsgsPerS, n.P99us
			}
			if gok {
				best, bestP99 = max(best, g.MsgsPerS), min(bestP99, g.P99us)
			}
			if best > 0 {
				vsPeers = append(vsPeers, ratio{r.MsgsPerS / best, where(r)})
			}
			if r.LossPerMille == relP99Loss && bestP99 > 0 {
				p99 = append(p99, ratio{r.P99us / bestP99, where(r)})
			}
		}
		if r.Receivers == relRepairRecv && r.LossPerMille == relRepairLoss && r.LostBytes > 0 && r.BaseWireBytes > 0 {
			repair = append(repair, ratio{r.RepairPerLost, where(r)})
		}
	}
	for i, c := range []struct {
		rs    []ratio
		max   bool
		limit float64
		why   string
	}{
		{vsUDP, false, relMinVsUDP, "no loss-0 case with udp"},
		{vsPeers, false, relMinVsPeers, "no case with norm or pgm"},
		{p99, true, relMaxP99Ratio, "no 1 % loss case with norm or pgm"},
		{repair, true, relMaxRepair, "no case of 4 receivers at 1 % loss"},
	} {
		w, ok := lowest(c.rs, c.max)
		if !ok {
			add(i+1, "", false, c.why)
			continue
		}
		met := w.v >= c.limit
		if c.max {
			met = w.v <= c.limit
		}
		add(i+1, fmt.Sprintf("%.2f× (worst: %s)", w.v, w.where), met, "")
	}
	return ts
}
