package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"sync/atomic"
	"time"

	"github.com/softrdma/softrdma/mcast"
)

// The "softrdma" peer of the reliable part: package mcast (reliable, its
// defaults but the window) over the RoCEv2 device of the host's interface.

// McastPeerWindow is the softrdma peer's mcast.Options.Window.
const McastPeerWindow = 256

// mcastSendBatch is how many messages the softrdma peer hands SendBatch
// at once (the udp peer's sendmmsg batch).
const mcastSendBatch = 64

// McastPeer returns the reliable part's "softrdma" peer, whose commands
// are argv0 (this binary) with the hidden subcommand sub, which runs
// RunMcastPeer.
func McastPeer(argv0, sub string) Peer {
	return Peer{
		Name:     "softrdma",
		Reliable: true,
		Command: func(a PeerArgs) []string {
			return append([]string{argv0, sub}, a.Args()...)
		},
		Tuning: fmt.Sprintf("mcast defaults (NACK after ≤300 µs, repair timeout 4 ms, heartbeat 1-100 ms), window %d packets, SendBatch of up to %d messages and 64 KiB, ReceiveBatch of as many, GOMAXPROCS=1, the device's MTU (1024 on the bench's veth)", McastPeerWindow, mcastSendBatch),
	}
}

// RunMcastPeer is the softrdma peer's process: a sender or a receiver of
// the reliable part (PeerArgs' command line and protocol) on package
// mcast.
func RunMcastPeer(args []string, stdin io.Reader, stdout io.Writer) error {
	a, err := ParsePeerArgs(args)
	if err != nil {
		return err
	}
	// One P: the peers are several processes on a few cores, and a
	// second P mostly spins and hands goroutines between threads (measured:
	// 4 receivers of 1 KiB messages on 2 cores, 36k msg/s with one P
	// against 25k with two). SOFTRDMA_BENCH_PROCS overrides it.
	procs := 1
	if v := os.Getenv("SOFTRDMA_BENCH_PROCS"); v != "" {
		fmt.Sscan(v, &procs)
	}
	runtime.GOMAXPROCS(procs)
	if dir := os.Getenv("SOFTRDMA_BENCH_CPUPROFILE"); dir != "" {
		// A CPU profile of this peer in that directory.
		f, err := os.CreateTemp(dir, fmt.Sprintf("mcast-%v-*.pprof", args[0]))
		if err != nil {
			return err
		}
		defer f.Close()
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.Timeout)
	defer cancel()
	c, err := mcast.Join(ctx, a.Group, &mcast.Options{Local: a.Addr, Window: McastPeerWindow, MaxMessageSize: max(a.Size, 1<<20)})
	if err != nil {
		return err
	}
	defer c.Close()
	in := bufio.NewReader(stdin)
	out := json.NewEncoder(stdout)
	if a.Send {
		return mcastSender(ctx, c, a, in, out)
	}
	fmt.Fprintln(stdout, "READY")
	st := NewRStats(a.Count, a.Size)
	// The receive ends after a.Idle without a delivery: a watchdog, not a
	// context per Receive.
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	var last atomic.Int64
	last.Store(MonoNow())
	go func() {
		t := time.NewTicker(a.Idle / 4)
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-t.C:
				if time.Duration(MonoNow()-last.Load()) > a.Idle {
					rcancel()
					return
				}
			}
		}
	}()
	msgs := make([]mcast.Message, mcastSendBatch)
	for i := range msgs {
		msgs[i].Buf = make([]byte, a.Size+1)
	}
	for !st.Done() {
		k, err := c.ReceiveBatch(rctx, msgs)
		now := MonoNow()
		var pe *mcast.PeerError
		if errors.As(err, &pe) {
			if errors.Is(err, mcast.ErrPeerGone) {
				break
			}
			continue // the loss shows in the counts
		}
		if err != nil {
			break // idle, or the deadline
		}
		for _, m := range msgs[:k] {
			st.Deliver(m.Buf[:m.N], now)
		}
		last.Store(now)
	}
	rcancel()
	s := c.Stats()
	info := fmt.Sprintf("nacks %d, dup packets %d, window %d, mtu %d", s.Protocol.NacksSent, s.Protocol.Duplicates, McastPeerWindow, c.MTU())
	if err := out.Encode(st.Line("softrdma", info)); err != nil {
		return err
	}
	// Stay a member (acking, answering the sender's end) until the
	// harness closes stdin.
	io.Copy(io.Discard, in)
	return nil
}

func mcastSender(ctx context.Context, c *mcast.Conn, a PeerArgs, in *bufio.Reader, out *json.Encoder) error {
	if err := c.WaitReceivers(ctx, len(a.Receivers)); err != nil {
		return err
	}
	if _, err := in.ReadString('\n'); err != nil {
		return fmt.Errorf("no go from the harness: %w", err)
	}
	line := PeerLine{Role: "send", Peer: "softrdma", Count: int64(a.Count), Size: int64(a.Size)}
	var gap time.Duration
	// Batches of up to mcastSendBatch messages and 64 KiB, as the udp
	// peer's sendmmsg of 64 datagrams (a batch of large messages would
	// make its last ones wait for the others).
	batch := max(1, min(mcastSendBatch, 64<<10/a.Size))
	if a.Rate > 0 {
		gap, batch = time.Duration(float64(time.Second)/a.Rate), 1
	}
	// Batches of messages, as the udp peer's sendmmsg batches: each
	// stamped when its batch goes.
	msgs := make([][]byte, batch)
	for i := range msgs {
		msgs[i] = make([]byte, a.Size)
	}
	start := time.Now()
	for i := 0; i < a.Count; i += batch {
		if gap > 0 {
			if d := time.Until(start.Add(time.Duration(i) * gap)); d > 0 {
				time.Sleep(d)
			}
		}
		k := min(batch, a.Count-i)
		now := MonoNow()
		for j := range k {
			FillRMsg(msgs[j], uint64(i+j), now)
		}
		if _, err := c.SendBatch(ctx, msgs[:k]); err != nil {
			return err
		}
		if i == 0 {
			line.FirstNs = now
		}
		line.LastNs = now
		line.Sent += int64(k)
	}
	s := c.Stats().Protocol
	line.Info = fmt.Sprintf("repairs %d unicast + %d multicast (%d bytes), %d suppressed, nacks %d, blocked %d times %.3f s, packets %d",
		s.RepairsUnicast, s.RepairsMulticast, s.RepairBytes, s.RepairsSuppressed, s.NacksReceived, s.Blocked, float64(s.BlockedNs)/1e9, s.DataSent)
	if err := out.Encode(line); err != nil {
		return err
	}
	// Serve repairs until the harness closes stdin; then Close lingers
	// until the receivers have everything.
	io.Copy(io.Discard, in)
	return nil
}
