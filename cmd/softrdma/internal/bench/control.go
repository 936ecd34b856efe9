package bench

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/provider/rxe"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// JoinResult is the control plane's latency: a join (JoinMulticast until
// GetEvent returns its MULTICAST_JOIN, with the QP attached) and a leave
// (LeaveMulticast), each on a process holding no other group; the
// baseline is the kernel's own IP_ADD_MEMBERSHIP / IP_DROP_MEMBERSHIP on a
// plain socket.
type JoinResult struct {
	Kind       string  `json:"kind"` // "join"
	Samples    int     `json:"samples"`
	JoinP50us  float64 `json:"join_p50_us"`
	JoinP99us  float64 `json:"join_p99_us"`
	LeaveP50us float64 `json:"leave_p50_us"`
	LeaveP99us float64 `json:"leave_p99_us"`
	KernP50us  float64 `json:"kernel_join_p50_us"`
	KernP99us  float64 `json:"kernel_join_p99_us"`
	// Ratio is the kernel's join p50 divided by the join p50.
	Ratio float64 `json:"ratio"`
}

// GroupsResult is one process holding Groups groups at once: one id with a
// QP joins them all (the QP attached to each), then leaves them all.
type GroupsResult struct {
	Kind        string  `json:"kind"` // "groups"
	Groups      int     `json:"groups"`
	Held        int     `json:"held"` // groups joined before the first failure (= Groups when none failed)
	Err         string  `json:"err,omitempty"`
	Sockets     int     `json:"sockets"`      // file descriptors the groups took
	JoinsPerS   float64 `json:"joins_per_s"`  // join + JOIN event + ack, sequentially
	JoinP50us   float64 `json:"join_p50_us"`  // over the whole fill
	JoinP99us   float64 `json:"join_p99_us"`  // over the whole fill
	LeavesPerS  float64 `json:"leaves_per_s"` // leave, sequentially
	LeaveP99us  float64 `json:"leave_p99_us"` // over the whole drain
	HeapPerGrp  float64 `json:"heap_per_group_bytes"`
	StackPerGrp float64 `json:"stack_per_group_bytes"` // receive goroutines' stacks
	Delivered   bool    `json:"delivered"`             // datagrams to the first, middle and last group arrived
	HeapLeft    int64   `json:"heap_left_bytes"`       // heap still held after leaving all

	// The baseline: the same fill and drain with plain sockets holding 20
	// memberships each (IP_ADD_MEMBERSHIP / IP_DROP_MEMBERSHIP only).
	KernJoinsPerS  float64 `json:"kernel_joins_per_s"`
	KernJoinP99us  float64 `json:"kernel_join_p99_us"`
	KernLeavesPerS float64 `json:"kernel_leaves_per_s"`
	KernLeaveP99us float64 `json:"kernel_leave_p99_us"`
	// Ratio is softrdma's joins per second over the kernel's.
	Ratio float64 `json:"ratio"`
}

// QPResult is the memory of Count idle UD QPs in RTS (16 send and 16
// receive WRs each, sharing one CQ); the baseline is the Go heap of a
// plain UDP socket (net.ListenUDP).
type QPResult struct {
	Kind        string  `json:"kind"` // "qp"
	Count       int     `json:"count"`
	HeapPer     float64 `json:"heap_per_qp_bytes"`
	FDsPer      float64 `json:"fds_per_qp"`
	SockHeapPer float64 `json:"heap_per_udp_socket_bytes"`
	// Ratio is a socket's heap over a QP's.
	Ratio float64 `json:"ratio"`
}

func percentile(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(p * float64(len(s)-1))
	return float64(s[i].Nanoseconds()) / 1e3
}

// heap returns the live heap and stack bytes after full GCs: collections
// are repeated (up to 8) until the live heap stops shrinking, so that
// what the last collection freed late (pools' victim caches, finalizers)
// does not turn a growth into a negative figure.
func heap() (int64, int64) {
	var m runtime.MemStats
	last := int64(-1)
	for range 8 {
		runtime.GC()
		runtime.ReadMemStats(&m)
		if h := int64(m.HeapAlloc); last >= 0 && h >= last {
			break
		} else {
			last = h
		}
	}
	return int64(m.HeapAlloc), int64(m.StackInuse)
}

func openFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	return len(ents)
}

// uniqueGroups returns n distinct random groups in 239.0.0.0/8.
func uniqueGroups(n int) []netip.Addr {
	seen := make(map[netip.Addr]bool, n)
	out := make([]netip.Addr, 0, n)
	for len(out) < n {
		g := randGroup()
		if !seen[g] {
			seen[g] = true
			out = append(out, g)
		}
	}
	return out
}

// joinOne joins g on e's id and waits for the JOIN event (the QP is
// attached when it is retrieved), then acks it.
func joinOne(e *endpoint, g netip.Addr) error {
	if err := e.id.JoinMulticast(rdmacm.UDPAddr(g), nil); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), eventTimeout)
	ev, err := e.ch.GetEvent(ctx)
	cancel()
	if err != nil {
		return err
	}
	typ := ev.Event
	ev.Ack()
	if typ != rdmacm.EventMulticastJoin {
		return fmt.Errorf("join %v: %v", g, ev)
	}
	return nil
}

func measureJoin(bind netip.Addr, samples int) (JoinResult, error) {
	r := JoinResult{Kind: "join", Samples: samples}
	e, err := newEndpoint(bind, 1, 1, 0)
	if err != nil {
		return r, err
	}
	defer e.close()
	groups := uniqueGroups(samples)
	var join, leave []time.Duration
	for _, g := range groups {
		t0 := time.Now()
		if err := joinOne(e, g); err != nil {
			return r, err
		}
		t1 := time.Now()
		if err := e.leave(g); err != nil {
			return r, err
		}
		join = append(join, t1.Sub(t0))
		leave = append(leave, time.Since(t1))
	}
	r.JoinP50us, r.JoinP99us = percentile(join, 0.5), percentile(join, 0.99)
	r.LeaveP50us, r.LeaveP99us = percentile(leave, 0.5), percentile(leave, 0.99)

	ifindex, err := ifindexOf(bind)
	if err != nil {
		return r, err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return r, err
	}
	defer unix.Close(fd)
	var kern []time.Duration
	for _, g := range groups {
		m := unix.IPMreqn{Multiaddr: g.As4(), Ifindex: int32(ifindex)}
		t0 := time.Now()
		if err := unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, &m); err != nil {
			return r, err
		}
		kern = append(kern, time.Since(t0))
		unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_DROP_MEMBERSHIP, &m)
	}
	r.KernP50us, r.KernP99us = percentile(kern, 0.5), percentile(kern, 0.99)
	if r.JoinP50us > 0 {
		r.Ratio = r.KernP50us / r.JoinP50us
	}
	return r, nil
}

func measureGroups(bind netip.Addr, n int) (GroupsResult, error) {
	r := GroupsResult{Kind: "groups", Groups: n}
	dev, err := rxe.ForAddr(bind)
	if err != nil {
		return r, err
	}
	if dev.Attr().MaxMcastGrp < n {
		if err := dev.SetLimits(rxe.Options{MaxMcastGrp: n}); err != nil {
			return r, err
		}
		defer dev.SetLimits(rxe.Options{})
	}
	const slot = 40 + 64
	// Four receive slots, then the send slot.
	e, err := newEndpoint(bind, 4, 4, 4*slot+64)
	if err != nil {
		return r, err
	}
	defer e.close()
	groups := uniqueGroups(n)
	fd0 := openFDs()
	h0, s0 := heap()
	var join []time.Duration
	start := time.Now()
	for _, g := range groups {
		t0 := time.Now()
		if err := joinOne(e, g); err != nil {
			r.Err = err.Error()
			break
		}
		join = append(join, time.Since(t0))
	}
	r.Held = len(join)
	if el := time.Since(start); r.Held > 0 {
		r.JoinsPerS = float64(r.Held) / el.Seconds()
	}
	r.JoinP50us, r.JoinP99us = percentile(join, 0.5), percentile(join, 0.99)
	h1, s1 := heap()
	r.Sockets = openFDs() - fd0
	if r.Held > 0 {
		r.HeapPerGrp = float64(h1-h0) / float64(r.Held)
		r.StackPerGrp = float64(s1-s0) / float64(r.Held)
		r.Delivered = checkDelivery(e, groups[:r.Held])
	}
	var leave []time.Duration
	start = time.Now()
	for _, g := range groups[:r.Held] {
		t0 := time.Now()
		if err := e.leave(g); err != nil {
			return r, err
		}
		leave = append(leave, time.Since(t0))
	}
	if el := time.Since(start); r.Held > 0 {
		r.LeavesPerS = float64(r.Held) / el.Seconds()
	}
	r.LeaveP99us = percentile(leave, 0.99)
	h2, _ := heap()
	r.HeapLeft = h2 - h0
	if err := kernelGroups(bind, groups, &r); err != nil {
		return r, err
	}
	if r.KernJoinsPerS > 0 {
		r.Ratio = r.JoinsPerS / r.KernJoinsPerS
	}
	return r, nil
}

// kernelGroups fills and drains the groups with plain sockets, 20 (or
// net.ipv4.igmp_max_memberships) memberships per socket.
func kernelGroups(bind netip.Addr, groups []netip.Addr, r *GroupsResult) error {
	ifindex, err := ifindexOf(bind)
	if err != nil {
		return err
	}
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	per := 0
	var join, leave []time.Duration
	start := time.Now()
	for _, g := range groups {
		m := unix.IPMreqn{Multiaddr: g.As4(), Ifindex: int32(ifindex)}
		t0 := time.Now()
		if len(fds) == 0 || per == 20 {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			fds, per = append(fds, fd), 0
		}
		if err := unix.SetsockoptIPMreqn(fds[len(fds)-1], unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, &m); err != nil {
			return fmt.Errorf("kernel baseline: join #%d: %w", len(join), err)
		}
		per++
		join = append(join, time.Since(t0))
	}
	r.KernJoinsPerS = float64(len(groups)) / time.Since(start).Seconds()
	start = time.Now()
	for i, g := range groups {
		m := unix.IPMreqn{Multiaddr: g.As4(), Ifindex: int32(ifindex)}
		t0 := time.Now()
		unix.SetsockoptIPMreqn(fds[i/20], unix.IPPROTO_IP, unix.IP_DROP_MEMBERSHIP, &m)
		leave = append(leave, time.Since(t0))
	}
	r.KernLeavesPerS = float64(len(groups)) / time.Since(start).Seconds()
	r.KernJoinP99us, r.KernLeaveP99us = percentile(join, 0.99), percentile(leave, 0.99)
	return nil
}

// checkDelivery sends one datagram from e's QP to the first, middle and
// last of groups (e's QP is attached to all, and receives its own
// multicast) and reports whether all three arrived.
func checkDelivery(e *endpoint, groups []netip.Addr) bool {
	const slot = 40 + 64
	pick := []netip.Addr{groups[0], groups[len(groups)/2], groups[len(groups)-1]}
	ring, err := newRecvRing(e, 4, slot)
	if err != nil {
		return false
	}
	for _, g := range pick {
		// The IPv4-mapped MGID of the group, as the CM builds it.
		ah, err := e.id.PD().CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: 1,
			GRH: verbs.GlobalRoute{DGID: wire.RoCEv2MGID(g), HopLimit: 1}})
		if err != nil {
			return false
		}
		c := newSendChain(e, ah, rdmacm.UDPQKey, 4*slot, 1, 64)
		_, err = c.post(e.qp)
		ah.Destroy()
		if err != nil {
			return false
		}
	}
	got := 0
	deadline := time.Now().Add(2 * time.Second)
	for got < len(pick) && time.Now().Before(deadline) {
		m, _, n, err := ring.poll()
		if err != nil {
			return false
		}
		got += int(m)
		if n == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	return got == len(pick)
}

func measureQPs(bind netip.Addr, n int) (QPResult, error) {
	r := QPResult{Kind: "qp", Count: n}
	e, err := newEndpoint(bind, 1, 1, 0)
	if err != nil {
		return r, err
	}
	defer e.close()
	vctx := e.id.Verbs()
	cq, err := vctx.CreateCQ(16)
	if err != nil {
		return r, err
	}
	defer cq.Destroy()
	pd := e.id.PD()
	qps := make([]*verbs.QP, 0, n)
	defer func() {
		for _, q := range qps {
			q.Destroy()
		}
	}()
	fd0 := openFDs()
	h0, _ := heap()
	for range n {
		q, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTypeUD,
			Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			return r, err
		}
		qps = append(qps, q)
		for _, st := range []struct {
			a verbs.QPAttr
			m verbs.QPAttrMask
		}{
			{verbs.QPAttr{State: verbs.QPSInit, PortNum: 1, QKey: rdmacm.UDPQKey}, verbs.QPAttrState | verbs.QPAttrPKeyIdx | verbs.QPAttrPort | verbs.QPAttrQKey},
			{verbs.QPAttr{State: verbs.QPSRTR}, verbs.QPAttrState},
			{verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState | verbs.QPAttrSQPSN},
		} {
			if err := q.Modify(&st.a, st.m); err != nil {
				return r, err
			}
		}
	}
	h1, _ := heap()
	r.HeapPer = float64(h1-h0) / float64(n)
	r.FDsPer = float64(openFDs()-fd0) / float64(n)

	conns := make([]*net.UDPConn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	h0, _ = heap()
	for range n {
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(bind, 0)))
		if err != nil {
			return r, err
		}
		conns = append(conns, c)
	}
	h1, _ = heap()
	r.SockHeapPer = float64(h1-h0) / float64(n)
	if r.HeapPer > 0 {
		r.Ratio = r.SockHeapPer / r.HeapPer
	}
	return r, nil
}
