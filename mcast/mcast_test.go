package mcast_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/mcast"
	_ "github.com/softrdma/softrdma/provider/all"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/provider/rxe"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/test/testsm"
)

func TestMain(m *testing.M) {
	if os.Getenv(peerVar) != "" {
		os.Exit(runPeer())
	}
	testenv.OwnNetns() // lo to this package alone
	testenv.ClearSoftRDMA()
	code := m.Run()
	rxe.CloseAll()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var lo = netip.MustParseAddr("127.0.0.1")

func randomGroup() netip.Addr {
	return netip.AddrFrom4([4]byte{239, 77, byte(rand.IntN(256)), byte(1 + rand.IntN(254))})
}

// payload is message i of a test stream: its number, then bytes that
// depend on it.
func payload(i, size int) []byte {
	b := make([]byte, max(size, 8))
	binary.BigEndian.PutUint64(b, uint64(i))
	for j := 8; j < len(b); j++ {
		b[j] = byte(i*7 + j)
	}
	return b
}

func check(b []byte) (int, error) {
	if len(b) < 8 {
		return 0, fmt.Errorf("message of %d bytes", len(b))
	}
	i := int(binary.BigEndian.Uint64(b))
	for j := 8; j < len(b); j++ {
		if b[j] != byte(i*7+j) {
			return i, fmt.Errorf("message %d: byte %d is %d", i, j, b[j])
		}
	}
	return i, nil
}

// members joins a sender and n receivers to a new group on lo; all close
// at the test's end.
func members(t *testing.T, ctx context.Context, n int) (snd *mcast.Conn, rcv []*mcast.Conn) {
	t.Helper()
	group := randomGroup()
	snd = join(t, ctx, group, mcast.Options{})
	t.Cleanup(func() { snd.Close() })
	for range n {
		r := join(t, ctx, group, mcast.Options{})
		t.Cleanup(func() { r.Close() })
		rcv = append(rcv, r)
	}
	return snd, rcv
}

// pair joins a sender and a receiver to a new group on lo; the sender
// waits for the receiver; both close at the test's end.
func pair(t *testing.T, ctx context.Context) (snd, rcv *mcast.Conn) {
	t.Helper()
	group := randomGroup()
	snd = join(t, ctx, group, mcast.Options{})
	t.Cleanup(func() { snd.Close() })
	rcv = join(t, ctx, group, mcast.Options{})
	t.Cleanup(func() { rcv.Close() })
	if err := snd.WaitReceivers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	return snd, rcv
}

func join(t *testing.T, ctx context.Context, group netip.Addr, o mcast.Options) *mcast.Conn {
	t.Helper()
	if !o.Local.IsValid() {
		o.Local = lo
	}
	c, err := mcast.Join(ctx, group, &o)
	if err != nil {
		t.Fatalf("join %v: %v", group, err)
	}
	return c
}

// receiveAll receives n messages and checks they are 0..n-1 in order.
func receiveAll(ctx context.Context, c *mcast.Conn, n int, sizes []int) error {
	buf := make([]byte, 1<<20)
	for want := range n {
		got, from, err := c.Receive(ctx, buf)
		if err != nil {
			return fmt.Errorf("receive message %d: %w", want, err)
		}
		if from == nil {
			return fmt.Errorf("message %d: no sender", want)
		}
		i, err := check(buf[:got])
		if err != nil {
			return err
		}
		if i != want || got != max(sizes[i], 8) {
			return fmt.Errorf("message %d of %d bytes where %d of %d was due", i, got, want, max(sizes[want], 8))
		}
	}
	return nil
}

func TestReliableLoopback(t *testing.T) {
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	snd, rcv := members(t, ctx, 3)
	const messages = 3000
	sizes := make([]int, messages)
	for i := range sizes {
		switch i % 10 {
		case 0:
			sizes[i] = rand.IntN(64 << 10) // several packets
		case 1:
			sizes[i] = 0
		default:
			sizes[i] = rand.IntN(snd.MTU())
		}
	}
	streamTest(t, ctx, snd, rcv, sizes)
	st := snd.Stats()
	t.Logf("sender: %+v", st)
	if err := snd.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
}

func TestShortBuffer(t *testing.T) {
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	snd, rcv := pair(t, ctx)
	if err := snd.Send(ctx, payload(0, 10000)); err != nil {
		t.Fatal(err)
	}
	n, _, err := rcv.Receive(ctx, make([]byte, 100))
	var sb *mcast.ShortBufferError
	if !errors.As(err, &sb) || !errors.Is(err, io.ErrShortBuffer) || sb.Need != 10000 || n != 0 {
		t.Fatalf("Receive into 100 bytes: %d, %v; want a ShortBufferError of 10000", n, err)
	}
	buf := make([]byte, sb.Need)
	n, _, err = rcv.Receive(ctx, buf)
	if err != nil || n != 10000 {
		t.Fatalf("Receive again: %d, %v", n, err)
	}
	if i, err := check(buf[:n]); err != nil || i != 0 {
		t.Fatalf("message %d: %v", i, err)
	}
}

func TestBadOptions(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		group netip.Addr
		o     mcast.Options
	}{
		{netip.MustParseAddr("10.0.0.1"), mcast.Options{Local: lo}},
		{randomGroup(), mcast.Options{Local: lo, Window: 2}},
		{randomGroup(), mcast.Options{Local: lo, MaxMessageSize: 1 << 30}},
	} {
		c, err := mcast.Join(ctx, tc.group, &tc.o)
		if err == nil {
			c.Close()
			t.Errorf("Join(%v, %+v) worked", tc.group, tc.o)
			continue
		}
		var oe *mcast.OpError
		if !errors.As(err, &oe) {
			t.Errorf("Join(%v, %+v): %T %v, not an OpError", tc.group, tc.o, err, err)
		}
	}
}

// dropUDP makes the namespace's input drop UDP 4791 datagrams at random,
// perMille of 1,000, and returns a func reading how many it dropped.
func dropUDP(t *testing.T, perMille int) func() int {
	t.Helper()
	rules := fmt.Sprintf(`table inet mcastloss {
	chain in {
		type filter hook input priority 0; policy accept;
		udp dport 4791 numgen random mod 1000 < %d counter drop
	}
}`, perMille)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		testenv.Require(t, "nft: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("nft", "delete", "table", "inet", "mcastloss").Run() })
	return func() int {
		out, err := exec.Command("nft", "list", "table", "inet", "mcastloss").CombinedOutput()
		if err != nil {
			t.Fatalf("nft list: %v: %s", err, out)
		}
		m := regexp.MustCompile(`counter packets (\d+)`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("no counter in %s", out)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
}

// TestReliableUnderLoss: every datagram on lo (multicast data, unicast
// NACKs, repairs, statuses) is dropped at random; every receiver still gets
// every message once, in order, and no event.
func TestReliableUnderLoss(t *testing.T) {
	for _, pm := range []int{10, 50} {
		t.Run(fmt.Sprintf("loss%.1f%%", float64(pm)/10), func(t *testing.T) {
			if !testenv.InNetns(t) {
				return
			}
			dropped := dropUDP(t, pm)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			snd, rcv := members(t, ctx, 3)
			const messages = 2000
			sizes := make([]int, messages)
			for i := range sizes {
				if i%10 == 0 {
					sizes[i] = rand.IntN(32 << 10)
				} else {
					sizes[i] = rand.IntN(1024)
				}
			}
			streamTest(t, ctx, snd, rcv, sizes)
			st := snd.Stats().Protocol
			d := dropped()
			t.Logf("dropped %d datagrams; sender: data %d, unicast repairs %d, multicast repairs %d, suppressed %d, NACKs %d",
				d, st.DataSent, st.RepairsUnicast, st.RepairsMulticast, st.RepairsSuppressed, st.NacksReceived)
			if d == 0 || st.RepairsUnicast+st.RepairsMulticast == 0 {
				t.Errorf("no loss to repair: dropped %d, repairs %d", d, st.RepairsUnicast+st.RepairsMulticast)
			}
		})
	}
}

// streamTest sends messages from snd to every receiver and checks each
// gets all of them in order.
func streamTest(t *testing.T, ctx context.Context, snd *mcast.Conn, rcv []*mcast.Conn, sizes []int) {
	t.Helper()
	if err := snd.WaitReceivers(ctx, len(rcv)); err != nil {
		t.Fatal(err)
	}
	messages := len(sizes)
	var wg sync.WaitGroup
	errs := make([]error, len(rcv))
	for i, r := range rcv {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = receiveAll(ctx, r, messages, sizes)
		}()
	}
	for i, s := range sizes {
		if err := snd.Send(ctx, payload(i, s)); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("receiver %d: %v", i, err)
		}
	}
}

// TestReliableIB runs a group on ports of an emulated InfiniBand subnet
// (an in-process softsm): joins through the SA, data through its switch.
func TestReliableIB(t *testing.T) {
	if !testenv.InNetns(t) {
		return
	}
	s, err := sm.New(testsm.SMConfig(t, sm.Config{Listen: "127.0.0.1:0", Logf: t.Logf})) // SOFTRDMA_TEST_SM=opensm: OpenSM in charge
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(context.Background())
	sdone := make(chan struct{})
	go func() { s.Run(sctx); close(sdone) }()
	defer func() { scancel(); <-sdone }()
	testsm.WaitSMUp(t, s)
	var activate time.Duration // provider/ib's default
	if testsm.OnOpenSM() {
		activate = testsm.OpenSMActivate // Active at OpenSM's next sweep
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var conns []*mcast.Conn
	group := randomGroup()
	for i := range 3 {
		local := netip.AddrFrom4([4]byte{127, 0, 9, byte(40 + i)})
		port, err := ib.Open(ib.Config{SM: s.FabricAddr().String(), Local: local, ActivateTimeout: activate})
		if err != nil {
			t.Fatal(err)
		}
		defer port.Close()
		c := join(t, ctx, group, mcast.Options{Local: local})
		defer c.Close()
		conns = append(conns, c)
	}
	if n := conns[0].DeviceName(); !strings.HasPrefix(n, "softib") && !strings.Contains(n, "ib") {
		t.Fatalf("device %q is not an IB port", n)
	}
	sizes := make([]int, 1000)
	for i := range sizes {
		sizes[i] = rand.IntN(3*conns[0].MTU() + 1)
	}
	streamTest(t, ctx, conns[0], conns[1:], sizes)
}

// TestUnreliable: raw datagrams, one per message, no header of the
// package: what a member sends arrives as it is, with its sender; a
// message over the MTU is refused with EMSGSIZE.
func TestUnreliable(t *testing.T) {
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	group := randomGroup()
	a := join(t, ctx, group, mcast.Options{Unreliable: true})
	defer a.Close()
	b := join(t, ctx, group, mcast.Options{Unreliable: true})
	defer b.Close()
	if err := a.Send(ctx, make([]byte, a.MTU()+1)); !errors.Is(err, syscall.EMSGSIZE) {
		t.Fatalf("oversized send: %v, want EMSGSIZE", err)
	}
	if _, err := a.WriteTo([]byte("hello"), mcast.GroupAddr{IP: group}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	n, from, err := b.ReadFrom(buf)
	if err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("ReadFrom: %q, %v", buf[:n], err)
	}
	if from.String() != a.LocalAddr().String() {
		t.Fatalf("from %v, want %v", from, a.LocalAddr())
	}
	// Its own datagram does not come back to the sender.
	a.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, _, err := a.ReadFrom(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("sender read its own: %q, %v", buf[:n], err)
	}
}

// TestSteadyStateAllocs: a message sent and received allocates nothing
// once the stream runs.
func TestSteadyStateAllocs(t *testing.T) {
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	snd, rcv := pair(t, ctx)
	msg := make([]byte, 1000)
	buf := make([]byte, 2000)
	bg := context.Background()
	round := func() {
		if err := snd.Send(bg, msg); err != nil {
			t.Fatal(err)
		}
		if _, _, err := rcv.Receive(bg, buf); err != nil {
			t.Fatal(err)
		}
	}
	for range 3000 {
		round()
	}
	a := testing.AllocsPerRun(2000, round)
	if raceEnabled {
		// The race detector makes sync.Pool (the RoCEv2 device's send
		// and receive batches) drop items at random.
		t.Skipf("%.3f allocations per message under the race detector, which defeats sync.Pool: run without -race", a)
	}
	if a > 0.05 {
		t.Errorf("%.3f allocations per message", a)
	}
}

// TestBatches: SendBatch packs small messages into shared packets and
// ReceiveBatch takes several at once; every message arrives once, in
// order, whole.
func TestBatches(t *testing.T) {
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	snd, rcv := pair(t, ctx)
	const n = 5000
	batch := make([][]byte, 0, 100)
	for i := range n {
		batch = append(batch, payload(i, 8+i%200))
		if len(batch) == cap(batch) || i == n-1 {
			if k, err := snd.SendBatch(ctx, batch); err != nil || k != len(batch) {
				t.Fatalf("SendBatch: %d, %v", k, err)
			}
			batch = batch[:0]
		}
	}
	msgs := make([]mcast.Message, 64)
	for i := range msgs {
		msgs[i].Buf = make([]byte, 300)
	}
	got, calls := 0, 0
	for got < n {
		k, err := rcv.ReceiveBatch(ctx, msgs)
		if err != nil {
			t.Fatalf("ReceiveBatch after %d: %v", got, err)
		}
		calls++
		for _, m := range msgs[:k] {
			i, err := check(m.Buf[:m.N])
			if err != nil || i != got || m.N != 8+i%200 || m.From == nil {
				t.Fatalf("message %d: %d of %d bytes, %v", got, i, m.N, err)
			}
			got++
		}
	}
	if st := snd.Stats().Protocol; st.DataSent >= n/4 {
		t.Errorf("%d messages took %d packets: not packed", n, st.DataSent)
	}
	if calls >= n {
		t.Errorf("%d calls for %d messages: no batch", calls, n)
	}
	t.Logf("%d messages in %d packets, %d ReceiveBatch calls", n, snd.Stats().Protocol.DataSent, calls)
}

// TestJoinByRoute: with no Options.Local the route to the group picks the
// device (as rdma_resolve_addr with no source); with no route, Join fails
// and says why.
func TestJoinByRoute(t *testing.T) {
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	group := randomGroup()
	var oe *mcast.OpError
	if c, err := mcast.Join(ctx, group, nil); err == nil {
		c.Close()
		t.Fatalf("joined %v with no route to it", group)
	} else if !errors.As(err, &oe) || !errors.Is(err, syscall.ENETUNREACH) && !errors.Is(err, syscall.EADDRNOTAVAIL) && !errors.Is(err, syscall.ENODEV) {
		t.Errorf("no route: %v, want an OpError with ENETUNREACH, EADDRNOTAVAIL or ENODEV", err)
	} else {
		t.Logf("no route: %v", err)
	}
	if out, err := exec.Command("ip", "route", "add", "224.0.0.0/4", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("ip route: %v: %s", err, out)
	}
	c, err := mcast.Join(ctx, group, nil)
	if err != nil {
		t.Fatalf("join by route: %v", err)
	}
	defer c.Close()
	if c.DeviceName() != "rxe_lo" {
		t.Errorf("device %q, want rxe_lo", c.DeviceName())
	}
}

// TestCloseUnblocks: Close ends a Receive waiting for a message and a Send
// waiting for window (its receiver reads nothing), each with
// net.ErrClosed, and Close itself returns within its Linger.
func TestCloseUnblocks(t *testing.T) {
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	group := randomGroup()
	snd := join(t, ctx, group, mcast.Options{Window: 4, Linger: 200 * time.Millisecond})
	rcv := join(t, ctx, group, mcast.Options{Window: 4})
	idle := join(t, ctx, randomGroup(), mcast.Options{})
	if err := snd.WaitReceivers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	sendErr, recvErr := make(chan error, 1), make(chan error, 1)
	go func() {
		msg := make([]byte, snd.MTU())
		for {
			if err := snd.Send(ctx, msg); err != nil {
				sendErr <- err
				return
			}
		}
	}()
	go func() {
		_, _, err := idle.Receive(ctx, make([]byte, 100))
		recvErr <- err
	}()
	// The sender fills the receiver's window and blocks.
	for snd.Stats().Protocol.Blocked == 0 {
		select {
		case err := <-sendErr:
			t.Fatalf("send: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	start := time.Now()
	snd.Close()
	idle.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v", d)
	}
	for name, ch := range map[string]chan error{"Send": sendErr, "Receive": recvErr} {
		select {
		case err := <-ch:
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("%s: %v, want net.ErrClosed", name, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s still blocked after Close", name)
		}
	}
	rcv.Close()
}
