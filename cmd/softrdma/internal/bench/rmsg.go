package bench

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The reliable-multicast bench's message format, command line and output,
// shared by every peer (the C peers in rmpeers/rmsg.h hold the same).
//
// A message of Size bytes (at least RMsgHeader) starts with its sequence
// number (uint64 little-endian, 0..Count-1) and the time the sender handed
// it to its transport (int64 ns of CLOCK_MONOTONIC, which network
// namespaces share, little-endian); byte i ≥ RMsgHeader is
// uint8(seq*7 + i), which the receiver checks.

// RMsgHeader is the size of a reliable-bench message's header.
const RMsgHeader = 16

// MonoNow returns CLOCK_MONOTONIC in ns, the clock of the send times:
// the clock read once, plus the monotonic time since, which Go's runtime
// reads from the same clock through the vDSO (unix.ClockGettime is a
// system call each time).
func MonoNow() int64 { return monoBase + int64(time.Since(monoStart)) }

var monoStart, monoBase = func() (time.Time, int64) {
	var ts unix.Timespec
	t := time.Now()
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return t, ts.Nano()
}()

// FillRMsg writes message seq, sent at sendNs, into b (len(b) is its size).
func FillRMsg(b []byte, seq uint64, sendNs int64) {
	binary.LittleEndian.PutUint64(b, seq)
	binary.LittleEndian.PutUint64(b[8:], uint64(sendNs))
	x := byte(seq*7 + RMsgHeader)
	for i := RMsgHeader; i < len(b); i++ {
		b[i] = x
		x++
	}
}

// StampRMsg rewrites the send time of a filled message.
func StampRMsg(b []byte, sendNs int64) { binary.LittleEndian.PutUint64(b[8:], uint64(sendNs)) }

// ParseRMsg returns the sequence number and send time of b, and whether b
// is a well-formed message of size bytes.
func ParseRMsg(b []byte, size int) (seq uint64, sendNs int64, ok bool) {
	if len(b) != size || len(b) < RMsgHeader {
		return 0, 0, false
	}
	seq = binary.LittleEndian.Uint64(b)
	sendNs = int64(binary.LittleEndian.Uint64(b[8:]))
	x := byte(seq*7 + RMsgHeader)
	for _, c := range b[RMsgHeader:] {
		if c != x {
			return seq, sendNs, false
		}
		x++
	}
	return seq, sendNs, true
}

// PeerArgs is a peer's command line:
//
//	PEER send|recv -group G -port P -iface IF -addr A -size B -count N
//	     [-rate R] [-receivers A,B] [-timeout S] [-idle S] [peer flags]
//
// A receiver prints "READY" once it listens, then at its end one JSON
// line (a PeerLine), and may stay (answering its protocol) until its stdin
// closes. The sender reads one line from stdin (the harness's go, once
// every receiver is ready), sends Count messages, prints one JSON line and
// stays (serving repairs) until its stdin closes.
type PeerArgs struct {
	Send      bool         // the sender (else a receiver)
	Group     netip.Addr   // IPv4 multicast group
	Port      int          // UDP port
	Iface     string       // the interface, pinned
	Addr      netip.Addr   // the local address on Iface
	Size      int          // message size in bytes
	Count     int          // messages sent
	Rate      float64      // sender: messages/s, 0: as fast as the transport's own flow control allows
	Receivers []netip.Addr // sender: the receivers' addresses (for a protocol that names them)
	Timeout   time.Duration
	Idle      time.Duration // receiver: end after this long without a delivery
	// Extra holds the flags the common command line does not know (each
	// with one value), for the peer itself.
	Extra map[string]string
}

// Args returns the command line of a (args[0] is "send" or "recv").
func (a PeerArgs) Args() []string {
	role := "recv"
	if a.Send {
		role = "send"
	}
	args := []string{role, "-group", a.Group.String(), "-port", fmt.Sprint(a.Port), "-iface", a.Iface,
		"-addr", a.Addr.String(), "-size", fmt.Sprint(a.Size), "-count", fmt.Sprint(a.Count)}
	if a.Rate > 0 {
		args = append(args, "-rate", fmt.Sprint(a.Rate))
	}
	if len(a.Receivers) > 0 {
		var rs []string
		for _, r := range a.Receivers {
			rs = append(rs, r.String())
		}
		args = append(args, "-receivers", strings.Join(rs, ","))
	}
	if a.Timeout > 0 {
		args = append(args, "-timeout", fmt.Sprint(a.Timeout.Seconds()))
	}
	if a.Idle > 0 {
		args = append(args, "-idle", fmt.Sprint(a.Idle.Seconds()))
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range a.Extra {
			if !yield(k) {
				return
			}
		}
	}) {
		args = append(args, "-"+k, a.Extra[k])
	}
	return args
}

// ParsePeerArgs parses a peer's command line (args[0] is "send" or
// "recv"); flags it does not know go to Extra.
func ParsePeerArgs(args []string) (PeerArgs, error) {
	a := PeerArgs{Timeout: 120 * time.Second, Idle: 2 * time.Second, Extra: map[string]string{}}
	if len(args) == 0 || args[0] != "send" && args[0] != "recv" {
		return a, errors.New("peer: the first argument is send or recv")
	}
	a.Send = args[0] == "send"
	fs := flag.NewFlagSet("peer", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	group := fs.String("group", "", "")
	addr := fs.String("addr", "", "")
	recv := fs.String("receivers", "", "")
	timeout := fs.Float64("timeout", a.Timeout.Seconds(), "")
	idle := fs.Float64("idle", a.Idle.Seconds(), "")
	fs.IntVar(&a.Port, "port", 0, "")
	fs.StringVar(&a.Iface, "iface", "", "")
	fs.IntVar(&a.Size, "size", 0, "")
	fs.IntVar(&a.Count, "count", 0, "")
	fs.Float64Var(&a.Rate, "rate", 0, "")
	rest := args[1:]
	for len(rest) > 0 {
		if err := fs.Parse(rest); err == nil {
			break
		} else if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
			// A peer's own flag: find it and its value.
			i := slices.IndexFunc(rest, func(s string) bool { return strings.TrimLeft(s, "-") == name })
			if i < 0 || i+1 >= len(rest) {
				return a, fmt.Errorf("peer: flag -%s without a value", name)
			}
			a.Extra[name] = rest[i+1]
			rest = append(slices.Clone(rest[:i]), rest[i+2:]...)
		} else {
			return a, fmt.Errorf("peer: %v", err)
		}
	}
	var err error
	if a.Group, err = netip.ParseAddr(*group); err != nil || !a.Group.Is4() || !a.Group.IsMulticast() {
		return a, fmt.Errorf("peer: -group %q is not an IPv4 multicast address", *group)
	}
	if a.Addr, err = netip.ParseAddr(*addr); err != nil || !a.Addr.Is4() {
		return a, fmt.Errorf("peer: -addr %q is not an IPv4 address", *addr)
	}
	if *recv != "" {
		for _, s := range strings.Split(*recv, ",") {
			r, err := netip.ParseAddr(s)
			if err != nil {
				return a, fmt.Errorf("peer: -receivers: %v", err)
			}
			a.Receivers = append(a.Receivers, r)
		}
	}
	a.Timeout = time.Duration(*timeout * float64(time.Second))
	a.Idle = time.Duration(*idle * float64(time.Second))
	if a.Port <= 0 || a.Port > 65535 || a.Iface == "" || a.Size < RMsgHeader || a.Size > 1<<20 || a.Count < 1 {
		return a, errors.New("peer: -port, -iface, -size (16..1 MiB) and -count (≥ 1) are required")
	}
	return a, nil
}

// PeerLine is the JSON line a peer prints at its end: Role "send" (Count,
// Sent, FirstNs and LastNs: its first and last send) or "recv" (the rest;
// FirstNs and LastNs: its first and last delivery). Info is free text
// about the peer's settings or its own counters.
type PeerLine struct {
	Role       string `json:"role"`
	Peer       string `json:"peer"`
	Count      int64  `json:"count"`
	Size       int64  `json:"size"`
	Sent       int64  `json:"sent,omitempty"`
	Delivered  int64  `json:"delivered"`
	Distinct   int64  `json:"distinct"`
	Duplicated int64  `json:"duplicated"`
	Reordered  int64  `json:"reordered"`
	Corrupted  int64  `json:"corrupted"`
	Lost       int64  `json:"lost"`
	FirstNs    int64  `json:"first_ns"`
	LastNs     int64  `json:"last_ns"`
	P50Ns      int64  `json:"p50_ns"`
	P99Ns      int64  `json:"p99_ns"`
	MaxNs      int64  `json:"max_ns"`
	Info       string `json:"info"`
}

// RStats is a receiver's accounting of the messages its transport
// delivered: delivered, distinct, duplicated (a sequence number seen
// before), reordered (below the highest seen), corrupted (bad length or
// pattern), and the latency from send to delivery of each distinct
// message.
type RStats struct {
	count, size int
	seen        []bool
	lat         []int64
	line        PeerLine
	maxSeq      int64
}

// NewRStats returns the accounting of a receiver of count messages of
// size bytes.
func NewRStats(count, size int) *RStats {
	return &RStats{count: count, size: size, seen: make([]bool, count), lat: make([]int64, 0, count), maxSeq: -1}
}

// Deliver accounts for message b, handed over by the transport at nowNs
// (MonoNow).
func (s *RStats) Deliver(b []byte, nowNs int64) {
	s.line.Delivered++
	seq, sent, ok := ParseRMsg(b, s.size)
	if !ok || seq >= uint64(s.count) {
		s.line.Corrupted++
		return
	}
	if s.line.FirstNs == 0 {
		s.line.FirstNs = nowNs
	}
	s.line.LastNs = nowNs
	if s.seen[seq] {
		s.line.Duplicated++
		return
	}
	s.seen[seq] = true
	s.line.Distinct++
	s.lat = append(s.lat, nowNs-sent)
	if int64(seq) < s.maxSeq {
		s.line.Reordered++
	} else {
		s.maxSeq = int64(seq)
	}
}

// Done reports whether every message was delivered.
func (s *RStats) Done() bool { return s.line.Distinct == int64(s.count) }

// Line returns the receiver's JSON line.
func (s *RStats) Line(peer, info string) PeerLine {
	l := s.line
	l.Role, l.Peer, l.Info = "recv", peer, info
	l.Count, l.Size = int64(s.count), int64(s.size)
	l.Lost = int64(s.count) - l.Distinct
	lat := slices.Clone(s.lat)
	slices.Sort(lat)
	l.P50Ns, l.P99Ns = rankPct(lat, 50), rankPct(lat, 99)
	if len(lat) > 0 {
		l.MaxNs = lat[len(lat)-1]
	}
	return l
}

// rankPct is the nearest-rank percentile p of sorted values.
func rankPct(sorted []int64, p int) int64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	k := max((n*p+99)/100, 1)
	return sorted[k-1]
}
