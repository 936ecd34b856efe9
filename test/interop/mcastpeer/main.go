// Command mcastpeer is a test helper of the interop suite: a member of a
// reliable multicast group of package mcast, a sender or a receiver of a
// stream whose messages both sides derive from the same seed, so that the
// receiver checks every message's number, length and bytes.
//
//	mcastpeer -role recv -b 10.78.0.12 -m 239.1.2.3 -n 3000 -max 5000 [-device rxe0]
//	mcastpeer -role send -b 10.78.0.11 -m 239.1.2.3 -n 3000 -max 5000 -receivers 2 [-device rxe0]
//
// Built with -tags rdmacore it runs on the kernel's RDMA devices (a
// guest's rxe0) through rdma-core; without, on softrdma's RoCEv2 device of
// the interface. After the join it prints "device <name> mtu <bytes>" and
// fails (exit status 3) when -device is set and the Conn's device is not
// that one. A receiver then prints "ready"; a sender waits for -receivers
// receivers, prints "sending", sends and closes (its Close waits for the
// receivers' acks), and prints
//
//	sent n=<n> bytes=<b> elapsed_s=<s> repairs=<r> send_drops=<d>
//
// A receiver takes messages until it has -n and prints
//
//	received n=<n> bytes=<b> elapsed_s=<s> dups=<d> …
//
// with exit status 0 when every message came once, whole and in order;
// anything else (a wrong message, an event such as ErrLost or
// ErrPeerGone, -idle without a message) prints "fail <why>" and exits with
// status 1. Both print "progress <k>" every 500 messages.
package main

import (
	// Every kind of device (RoCEv2, InfiniBand, the kernel's with the rdmacore tag).
	_ "github.com/softrdma/softrdma/provider/all"

	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"time"

	"github.com/softrdma/softrdma/mcast"
)

func main() { os.Exit(run()) }

func run() int {
	role := flag.String("role", "recv", "send or recv")
	bind := flag.String("b", "", "local address")
	group := flag.String("m", "", "multicast group")
	n := flag.Int("n", 3000, "messages")
	maxSize := flag.Int("max", 5000, "largest message, bytes")
	seed := flag.Uint64("seed", 1, "seed of the message sizes (the same on every member)")
	receivers := flag.Int("receivers", 1, "receivers a sender waits for")
	device := flag.String("device", "", "the device the Conn must use (empty: any)")
	idle := flag.Duration("idle", 60*time.Second, "a receiver fails after this long without a message")
	timeout := flag.Duration("timeout", 240*time.Second, "the whole run")
	linger := flag.Duration("linger", 20*time.Second, "Options.Linger")
	flag.Parse()

	local, err := netip.ParseAddr(*bind)
	if err != nil {
		fmt.Println("fail -b:", err)
		return 2
	}
	grp, err := netip.ParseAddr(*group)
	if err != nil {
		fmt.Println("fail -m:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	c, err := mcast.Join(ctx, grp, &mcast.Options{Local: local, Linger: *linger, MaxMessageSize: max(*maxSize, 1)})
	if err != nil {
		fmt.Println("fail join:", err)
		return 1
	}
	defer c.Close()
	fmt.Printf("device %s mtu %d local %v\n", c.DeviceName(), c.MTU(), c.LocalAddr())
	if *device != "" && c.DeviceName() != *device {
		fmt.Printf("fail device %q, want %q\n", c.DeviceName(), *device)
		return 3
	}
	sizes := rand.New(rand.NewPCG(*seed, 0x6d63617374))
	if *role == "send" {
		return send(ctx, c, *n, *maxSize, *receivers, sizes)
	}
	return receive(ctx, c, *n, *maxSize, *idle, sizes)
}

// mtu is the lab's path MTU (rxe's and softrdma's active MTU on a
// 1500-byte link): the sizes do not depend on a member's own, so that
// every member draws the same.
const mtu = 1024

// size draws the next message's length: a third small (up to 200 bytes),
// a third around the MTU, a third up to max (several packets).
func size(r *rand.Rand, maxSize int) int {
	var s int
	switch r.IntN(3) {
	case 0:
		s = 1 + r.IntN(200)
	case 1:
		s = mtu/2 + r.IntN(mtu)
	default:
		s = 1 + r.IntN(maxSize)
	}
	return min(max(s, 1), maxSize)
}

// fill writes message i's bytes: its number, then a pattern of it.
func fill(b []byte, i int) {
	for k := range b {
		b[k] = byte(i*131 + k*7 + k>>8)
	}
	for k := 0; k < 4 && k < len(b); k++ {
		b[k] = byte(i >> (8 * k))
	}
}

func send(ctx context.Context, c *mcast.Conn, n, maxSize, receivers int, sizes *rand.Rand) int {
	if err := c.WaitReceivers(ctx, receivers); err != nil {
		fmt.Println("fail wait receivers:", err)
		return 1
	}
	fmt.Println("sending")
	start := time.Now()
	buf := make([]byte, maxSize)
	bytes := 0
	for i := range n {
		m := buf[:size(sizes, maxSize)]
		fill(m, i)
		if err := c.Send(ctx, m); err != nil {
			fmt.Printf("fail send %d: %v\n", i, err)
			return 1
		}
		bytes += len(m)
		if (i+1)%500 == 0 {
			fmt.Println("progress", i+1)
		}
	}
	if err := c.Close(); err != nil {
		fmt.Println("fail close:", err)
		return 1
	}
	st := c.Stats()
	fmt.Printf("sent n=%d bytes=%d elapsed_s=%.2f repairs=%d send_drops=%d receivers_gone=%d\n", n, bytes,
		time.Since(start).Seconds(), st.Protocol.RepairsUnicast+st.Protocol.RepairsMulticast, st.SendDrops, st.Protocol.ReceiversGone)
	return 0
}

func receive(ctx context.Context, c *mcast.Conn, n, maxSize int, idle time.Duration, sizes *rand.Rand) int {
	fmt.Println("ready")
	buf := make([]byte, maxSize)
	want := make([]byte, maxSize)
	var start time.Time
	bytes := 0
	var from *mcast.Addr
	for i := 0; i < n; {
		rctx, rcancel := context.WithTimeout(ctx, idle)
		k, a, err := c.Receive(rctx, buf)
		rcancel()
		var pe *mcast.PeerError
		switch {
		case errors.As(err, &pe):
			fmt.Printf("fail event after %d messages: %v\n", i, err)
			return 1
		case err != nil:
			fmt.Printf("fail receive after %d messages: %v\n", i, err)
			return 1
		}
		if i == 0 {
			start, from = time.Now(), a
		} else if a == nil || from == nil || *a != *from {
			fmt.Printf("fail message %d from %v, the stream's sender is %v\n", i, a, from)
			return 1
		}
		w := want[:size(sizes, maxSize)]
		fill(w, i)
		if k != len(w) || string(buf[:k]) != string(w) {
			got := -1
			if k >= 4 {
				got = int(buf[0]) | int(buf[1])<<8 | int(buf[2])<<16 | int(buf[3])<<24
			}
			fmt.Printf("fail message %d: %d bytes numbered %d, want %d bytes numbered %d\n", i, k, got, len(w), i)
			return 1
		}
		bytes += k
		i++
		if i%500 == 0 {
			fmt.Println("progress", i)
		}
	}
	st := c.Stats()
	if st.MessagesReceived != uint64(n) {
		fmt.Printf("fail %d messages counted, want %d\n", st.MessagesReceived, n)
		return 1
	}
	fmt.Printf("received n=%d bytes=%d elapsed_s=%.2f from=%v dups=%d nacks=%d recv_errors=%d source_mismatches=%d\n", n, bytes,
		time.Since(start).Seconds(), from, st.Protocol.Duplicates, st.Protocol.NacksSent, st.RecvErrors, st.SourceMismatches)
	return 0
}
