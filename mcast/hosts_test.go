package mcast_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/mcast"
	"github.com/softrdma/softrdma/test/nettest"
	"github.com/softrdma/softrdma/test/testenv"
)

// The multi-host tests: each member is a process (this test binary run as
// a peer, see runPeer) in a network namespace of its own, the namespaces
// joined by a bridge; nftables drops datagrams at random on each host's
// input, independently.

const peerVar = "MCAST_TEST_PEER"

// peerResult is what a peer prints last, as one JSON line.
type peerResult struct {
	Role     string   `json:"role"`
	Got      []int    `json:"got,omitempty"` // message numbers, in order of arrival
	Events   []string `json:"events,omitempty"`
	Err      string   `json:"err,omitempty"`
	Sent     int      `json:"sent,omitempty"`
	Gone     uint64   `json:"receivers_gone,omitempty"`
	Evicts   uint64   `json:"evictions,omitempty"`
	Repairs  uint64   `json:"repairs,omitempty"`
	Elapsed  float64  `json:"elapsed_s,omitempty"`
	Blocked  uint64   `json:"blocked,omitempty"`
	Received uint64   `json:"received,omitempty"`
}

// runPeer is the peer process: its flags come from the environment.
func runPeer() int {
	fs := flag.NewFlagSet("peer", flag.ContinueOnError)
	role := fs.String("role", "recv", "send or recv")
	local := fs.String("local", "", "local address")
	group := fs.String("group", "", "group")
	n := fs.Int("n", 100, "messages")
	size := fs.Int("size", 1000, "largest message")
	receivers := fs.Int("receivers", 1, "receivers a sender waits for")
	slow := fs.Duration("slow", 0, "a receiver's pause after each message")
	stall := fs.Duration("maxstall", 0, "Options.MaxStall")
	peerTimeout := fs.Duration("peer-timeout", 0, "Options.PeerTimeout")
	window := fs.Int("window", 0, "Options.Window")
	idle := fs.Duration("idle", 20*time.Second, "a receiver ends after this long without anything")
	if err := fs.Parse(strings.Fields(os.Getenv(peerVar))); err != nil {
		return 2
	}
	res := peerResult{Role: *role}
	out := json.NewEncoder(os.Stdout)
	defer func() { out.Encode(res) }()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c, err := mcast.Join(ctx, netip.MustParseAddr(*group), &mcast.Options{
		Local: netip.MustParseAddr(*local), MaxStall: *stall, PeerTimeout: *peerTimeout, Window: *window})
	if err != nil {
		res.Err = err.Error()
		return 1
	}
	defer c.Close()
	start := time.Now()
	if *role == "send" {
		if err := c.WaitReceivers(ctx, *receivers); err != nil {
			res.Err = err.Error()
			return 1
		}
		fmt.Println("SENDING")
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range *n {
			if err := c.Send(ctx, payload(i, rng.IntN(*size+1))); err != nil {
				res.Err = err.Error()
				return 1
			}
			res.Sent++
			if res.Sent%100 == 0 {
				fmt.Println("SENT", res.Sent)
			}
		}
		c.Close()
		st := c.Stats()
		res.Elapsed = time.Since(start).Seconds()
		res.Gone, res.Evicts = st.Protocol.ReceiversGone, st.Protocol.Evictions
		res.Repairs = st.Protocol.RepairsUnicast + st.Protocol.RepairsMulticast
		res.Blocked = st.Protocol.Blocked
		return 0
	}
	fmt.Println("READY")
	buf := make([]byte, 1<<20)
	for len(res.Got) < *n {
		rctx, rcancel := context.WithTimeout(ctx, *idle)
		k, _, err := c.Receive(rctx, buf)
		rcancel()
		var pe *mcast.PeerError
		switch {
		case errors.As(err, &pe):
			res.Events = append(res.Events, pe.Err.Error())
			if errors.Is(err, mcast.ErrPeerGone) {
				return 0
			}
			continue
		case err != nil:
			res.Err = err.Error()
			return 1
		}
		i, err := check(buf[:k])
		if err != nil {
			res.Err = err.Error()
			return 1
		}
		res.Got = append(res.Got, i)
		if len(res.Got)%100 == 0 {
			fmt.Println("GOT", len(res.Got))
		}
		if *slow > 0 {
			time.Sleep(*slow)
		}
	}
	res.Received = c.Stats().MessagesReceived
	return 0
}

// hosts is a bridge and n host namespaces h1…hn on it (10.78.x.1<i>/24).
type hosts struct {
	t     *testing.T
	br    string
	ns    []string
	addrs []netip.Addr
}

func newHosts(t *testing.T, n int) *hosts {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Require(t, "needs root for network namespaces")
	}
	for _, c := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(c); err != nil {
			testenv.Require(t, "no %s: %v", c, err)
		}
	}
	base := fmt.Sprintf("%s%06x-", nettest.Prefix("mcast"), rand.Uint32()&0xffffff)
	h := &hosts{t: t, br: base + "br"}
	net3 := 1 + rand.IntN(250)
	t.Cleanup(func() {
		for _, ns := range append([]string{h.br}, h.ns...) {
			nettest.Delete(ns)
		}
	})
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", h.br)
	run("-n", h.br, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
	run("-n", h.br, "link", "set", "br0", "up")
	for i := 1; i <= n; i++ {
		ns := fmt.Sprintf("%sh%d", base, i)
		a := netip.AddrFrom4([4]byte{10, 78, byte(net3), byte(10 + i)})
		run("netns", "add", ns)
		run("-n", ns, "link", "set", "lo", "up")
		p := fmt.Sprintf("p%d", i)
		run("-n", h.br, "link", "add", p, "type", "veth", "peer", "name", "eth0", "netns", ns)
		run("-n", h.br, "link", "set", p, "master", "br0")
		run("-n", h.br, "link", "set", p, "up")
		run("-n", ns, "addr", "add", a.String()+"/24", "dev", "eth0")
		run("-n", ns, "link", "set", "eth0", "up")
		h.ns = append(h.ns, ns)
		h.addrs = append(h.addrs, a)
	}
	return h
}

// loss makes host i (0-based) drop incoming UDP at random, perMille.
func (h *hosts) loss(i, perMille int) {
	h.t.Helper()
	rules := fmt.Sprintf("table inet mcastloss { chain in { type filter hook input priority 0; policy accept; meta l4proto udp numgen random mod 1000 < %d counter drop; }; }", perMille)
	cmd := exec.Command("ip", "netns", "exec", h.ns[i], "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		h.t.Fatalf("nft in %s: %v: %s", h.ns[i], err, out)
	}
}

// peer is a running peer process.
type peer struct {
	cmd   *exec.Cmd
	lines chan string
	res   chan peerResult
	out   strings.Builder
	mu    sync.Mutex
}

// start starts a peer on host i with the given flags.
func (h *hosts) start(i int, args string) *peer {
	h.t.Helper()
	exe, err := os.Executable()
	if err != nil {
		h.t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", h.ns[i], exe)
	cmd.Env = testenv.CleanEnv(peerVar + "=-local " + h.addrs[i].String() + " " + args)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		h.t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	p := &peer{cmd: cmd, lines: make(chan string, 1024), res: make(chan peerResult, 1)}
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		var last peerResult
		for sc.Scan() {
			l := sc.Text()
			p.mu.Lock()
			if len(l) < 200 {
				fmt.Fprintln(&p.out, l)
			}
			p.mu.Unlock()
			if strings.HasPrefix(l, "{") {
				json.Unmarshal([]byte(l), &last)
				continue
			}
			select {
			case p.lines <- l:
			default:
			}
		}
		io.Copy(io.Discard, stdout)
		p.res <- last
		close(p.lines)
	}()
	return p
}

// waitLine waits for a line starting with prefix.
func (p *peer) waitLine(t *testing.T, prefix string, d time.Duration) {
	t.Helper()
	tm := time.NewTimer(d)
	defer tm.Stop()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("peer ended before %q:\n%s", prefix, p.output())
			}
			if strings.HasPrefix(l, prefix) {
				return
			}
		case <-tm.C:
			t.Fatalf("no %q within %v:\n%s", prefix, d, p.output())
		}
	}
}

func (p *peer) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// result waits for the peer's end and its result.
func (p *peer) result(t *testing.T, d time.Duration) peerResult {
	t.Helper()
	select {
	case r := <-p.res:
		p.cmd.Wait()
		return r
	case <-time.After(d):
		p.cmd.Process.Kill()
		t.Fatalf("peer did not end within %v:\n%s", d, p.output())
	}
	return peerResult{}
}

// inOrder checks got is lo, lo+1, … hi-1 (with gaps only where allowed).
func inOrder(got []int, from, to int) error {
	if len(got) != to-from {
		return fmt.Errorf("%d messages, want %d (%d..%d)", len(got), to-from, from, to-1)
	}
	for k, i := range got {
		if i != from+k {
			return fmt.Errorf("message %d is %d", from+k, i)
		}
	}
	return nil
}

func rootOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Require(t, "needs root for network namespaces")
	}
}

// TestHostsLossKilledReceiver: a sender and three receivers on four
// hosts, 1% loss on every host; one receiver is killed mid-stream. The
// others get every message in order; the sender goes on once the dead
// one's PeerTimeout passed.
func TestHostsLossKilledReceiver(t *testing.T) {
	rootOnly(t)
	h := newHosts(t, 4)
	for i := range 4 {
		h.loss(i, 10)
	}
	group := randomGroup()
	const n = 3000
	common := fmt.Sprintf("-group %v -n %d -size 3000 -peer-timeout 1s", group, n)
	var rcv []*peer
	for i := 1; i <= 3; i++ {
		p := h.start(i, "-role recv "+common)
		p.waitLine(t, "READY", 30*time.Second)
		rcv = append(rcv, p)
	}
	snd := h.start(0, "-role send -receivers 3 "+common)
	rcv[2].waitLine(t, "GOT 500", 60*time.Second)
	rcv[2].cmd.Process.Signal(syscall.SIGKILL)
	sr := snd.result(t, 90*time.Second)
	if sr.Err != "" || sr.Sent != n {
		t.Fatalf("sender: sent %d: %s\n%s", sr.Sent, sr.Err, snd.output())
	}
	if sr.Gone < 1 {
		t.Errorf("sender counted no receiver gone: %+v", sr)
	}
	for _, p := range rcv[:2] {
		r := p.result(t, 60*time.Second)
		if r.Err != "" || len(r.Events) > 0 {
			t.Errorf("receiver: %s %v", r.Err, r.Events)
		}
		if err := inOrder(r.Got, 0, n); err != nil {
			t.Errorf("receiver: %v", err)
		}
	}
	t.Logf("sender: %.2f s, %d repairs, %d receivers gone", sr.Elapsed, sr.Repairs, sr.Gone)
}

// TestHostsLateJoiner: a receiver that joins while the stream runs gets
// every message from one on, in order, to the end, and no event.
func TestHostsLateJoiner(t *testing.T) {
	rootOnly(t)
	h := newHosts(t, 3)
	group := randomGroup()
	const n = 4000
	common := fmt.Sprintf("-group %v -n %d -size 2000", group, n)
	early := h.start(1, "-role recv "+common)
	early.waitLine(t, "READY", 30*time.Second)
	snd := h.start(0, "-role send -receivers 1 "+common)
	snd.waitLine(t, "SENT 1000", 60*time.Second)
	late := h.start(2, "-role recv -idle 3s "+common)
	sr := snd.result(t, 90*time.Second)
	if sr.Err != "" {
		t.Fatalf("sender: %s", sr.Err)
	}
	if r := early.result(t, 60*time.Second); inOrder(r.Got, 0, n) != nil || r.Err != "" {
		t.Errorf("early receiver: %v %s", inOrder(r.Got, 0, n), r.Err)
	}
	lr := late.result(t, 60*time.Second)
	if len(lr.Got) == 0 {
		t.Fatalf("late receiver got nothing: %s\n%s", lr.Err, late.output())
	}
	if len(lr.Events) > 0 {
		t.Errorf("late receiver: events %v", lr.Events)
	}
	if err := inOrder(lr.Got, lr.Got[0], n); err != nil {
		t.Errorf("late receiver (from message %d): %v", lr.Got[0], err)
	}
	t.Logf("late receiver started at message %d of %d", lr.Got[0], n)
}

// TestHostsSlowReceiver: one receiver pauses after each message. Without
// MaxStall the sender waits for it (every message reaches everyone, at
// its pace); with MaxStall it evicts it: the slow one reports ErrEvicted
// and goes on at the live edge, in order, while the others get
// everything. MaxStall is 300 ms: a fast receiver that the loaded 2-core
// machine leaves without a core for 100 ms was evicted too (1405 of 1500).
func TestHostsSlowReceiver(t *testing.T) {
	rootOnly(t)
	for _, stall := range []time.Duration{0, 300 * time.Millisecond} {
		t.Run(fmt.Sprintf("maxstall=%v", stall), func(t *testing.T) {
			h := newHosts(t, 3)
			group := randomGroup()
			const n, window = 1500, 64
			common := fmt.Sprintf("-group %v -n %d -size 200 -window %d -maxstall %v -idle 3s", group, n, window, stall)
			fast := h.start(1, "-role recv "+common)
			slow := h.start(2, "-role recv -slow 2ms "+common)
			fast.waitLine(t, "READY", 30*time.Second)
			slow.waitLine(t, "READY", 30*time.Second)
			snd := h.start(0, "-role send -receivers 2 "+common)
			sr := snd.result(t, 120*time.Second)
			if sr.Err != "" || sr.Sent != n {
				t.Fatalf("sender: %d sent, %s", sr.Sent, sr.Err)
			}
			if r := fast.result(t, 60*time.Second); inOrder(r.Got, 0, n) != nil || len(r.Events) > 0 {
				t.Errorf("fast receiver: %v %v", inOrder(r.Got, 0, n), r.Events)
			}
			sl := slow.result(t, 60*time.Second)
			if stall == 0 {
				if err := inOrder(sl.Got, 0, n); err != nil || len(sl.Events) > 0 {
					t.Errorf("slow receiver: %v %v", err, sl.Events)
				}
				if sr.Elapsed < float64(n-window)*0.002*0.8 {
					t.Errorf("the sender took %.2f s: not paced by the slow receiver", sr.Elapsed)
				}
				t.Logf("paced by the slow receiver: %.2f s for %d messages", sr.Elapsed, n)
				return
			}
			if sr.Evicts == 0 {
				t.Fatalf("the sender evicted nobody (%.2f s)", sr.Elapsed)
			}
			evicted := 0
			for _, e := range sl.Events {
				if e == mcast.ErrEvicted.Error() || e == mcast.ErrLost.Error() {
					evicted++
				}
			}
			gaps := 0
			for k := 1; k < len(sl.Got); k++ {
				if sl.Got[k] <= sl.Got[k-1] {
					t.Fatalf("slow receiver: message %d after %d", sl.Got[k], sl.Got[k-1])
				}
				if sl.Got[k] != sl.Got[k-1]+1 {
					gaps++
				}
			}
			if evicted == 0 || gaps > evicted {
				t.Errorf("slow receiver: %d gaps, events %v", gaps, sl.Events)
			}
			t.Logf("sender %.2f s, %d evictions; slow receiver got %d messages, events %v", sr.Elapsed, sr.Evicts, len(sl.Got), sl.Events)
		})
	}
}

// TestHostsSenderDies: the sender is killed mid-stream; each receiver has
// a prefix of the stream, in order, then ErrPeerGone.
func TestHostsSenderDies(t *testing.T) {
	rootOnly(t)
	h := newHosts(t, 3)
	h.loss(1, 10)
	h.loss(2, 10)
	group := randomGroup()
	const n = 100000
	common := fmt.Sprintf("-group %v -n %d -size 500 -peer-timeout 500ms", group, n)
	var rcv []*peer
	for i := 1; i <= 2; i++ {
		p := h.start(i, "-role recv "+common)
		p.waitLine(t, "READY", 30*time.Second)
		rcv = append(rcv, p)
	}
	snd := h.start(0, "-role send -receivers 2 "+common)
	snd.waitLine(t, "SENT 2000", 60*time.Second)
	snd.cmd.Process.Signal(syscall.SIGKILL)
	for _, p := range rcv {
		r := p.result(t, 30*time.Second)
		if len(r.Events) == 0 || r.Events[len(r.Events)-1] != mcast.ErrPeerGone.Error() {
			t.Errorf("receiver: events %v, err %s; want ErrPeerGone last", r.Events, r.Err)
		}
		if len(r.Got) < 2000-1024 {
			t.Errorf("receiver: %d messages", len(r.Got))
		}
		// What it held beyond a packet it never got is delivered after
		// an ErrLost event.
		gaps, lost := 0, 0
		for k, i := range r.Got {
			if k == 0 && i != 0 || k > 0 && i <= r.Got[k-1] {
				t.Fatalf("receiver: message %d at %d", i, k)
			}
			if k > 0 && i != r.Got[k-1]+1 {
				gaps++
			}
		}
		for _, e := range r.Events {
			if e == mcast.ErrLost.Error() {
				lost++
			}
		}
		if gaps > lost {
			t.Errorf("receiver: %d gaps, events %v", gaps, r.Events)
		}
	}
}
