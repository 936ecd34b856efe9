package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"sync"
	"time"

	"github.com/softrdma/softrdma/provider/softverbs"

	"github.com/softrdma/softrdma/provider/rxe"
)

// FanoutResult is one fan-out case: one sender in this process, Receivers
// receiver processes, Size-byte payloads, measured Runs times for each mode
// with the modes interleaved (udp, rdma, then rdma, udp, …). Rates are
// medians over the runs; a rate "delivered" counts the datagrams that
// reached the receivers' buffers, summed over the receivers.
type FanoutResult struct {
	Kind      string  `json:"kind"` // "fanout"
	Receivers int     `json:"receivers"`
	Size      int     `json:"size"`
	Batch     int     `json:"batch"`
	Seconds   float64 `json:"seconds"` // send time of one run
	Runs      int     `json:"runs"`

	UDPSentPerS   float64 `json:"udp_sent_msgs_per_s"`
	UDPMsgsPerS   float64 `json:"udp_msgs_per_s"`
	UDPBytesPerS  float64 `json:"udp_bytes_per_s"`
	UDPLoss       float64 `json:"udp_loss"`
	RDMASentPerS  float64 `json:"rdma_sent_msgs_per_s"`
	RDMAMsgsPerS  float64 `json:"rdma_msgs_per_s"`
	RDMABytesPerS float64 `json:"rdma_bytes_per_s"`
	RDMALoss      float64 `json:"rdma_loss"`
	// RDMADeviceDrop are the datagrams the receivers' devices counted as
	// dropped (no receive WR, CQ full, bad ICRC, socket_drops) in the
	// median run: a lost datagram has a counter.
	RDMADeviceDrop uint64 `json:"rdma_device_drops"`
	// RDMALost are the datagrams of the median run sent and not delivered.
	RDMALost uint64 `json:"rdma_lost"`
	// RDMAUncounted are the datagrams lost beyond the devices' drop
	// counters, summed over the runs (the target is none).
	RDMAUncounted uint64 `json:"rdma_uncounted"`

	// CPU time per datagram: the sender process's per datagram sent, the
	// receiver processes' per datagram delivered (medians over runs).
	UDPTxCPUns  float64 `json:"udp_tx_cpu_ns_per_msg"`
	UDPRxCPUns  float64 `json:"udp_rx_cpu_ns_per_msg"`
	RDMATxCPUns float64 `json:"rdma_tx_cpu_ns_per_msg"`
	RDMARxCPUns float64 `json:"rdma_rx_cpu_ns_per_msg"`

	// Ratio is the median over runs of rdma delivered msgs/s divided by
	// udp delivered msgs/s of the same run pair; RatioMin/RatioMax the
	// spread.
	Ratio    float64 `json:"ratio"`
	RatioMin float64 `json:"ratio_min"`
	RatioMax float64 `json:"ratio_max"`
}

// fanoutRun is one measurement of one mode.
type fanoutRun struct {
	sent    uint64
	msgs    uint64
	bytes   uint64
	drops   uint64
	elapsed time.Duration // sending
	// span is from the first send to the last delivery seen: the
	// receivers read on after the sender stops, out of their socket
	// buffers (and a lossless fabric delivers what it holds).
	span  time.Duration
	txCPU int64 // ns, sender process
	rxCPU int64 // ns, all receiver processes
	// IB: the switch process's CPU time and discards, the sender's link
	// stall drops and waits for credit.
	swCPU      int64
	swDrops    uint64
	stallDrops uint64
	waits      uint64
}

func (r fanoutRun) txPerMsg() float64 { return float64(r.txCPU) / float64(max(r.sent, 1)) }
func (r fanoutRun) rxPerMsg() float64 { return float64(r.rxCPU) / float64(max(r.msgs, 1)) }
func (r fanoutRun) totalPerMsg() float64 {
	return float64(r.txCPU+r.rxCPU+r.swCPU) / float64(max(r.msgs, 1))
}

// rate and brate are per second of the delivery (span), srate per second
// of sending (elapsed).
func (r fanoutRun) rate() float64  { return per(r.msgs, r.span) }
func (r fanoutRun) brate() float64 { return per(r.bytes, r.span) }
func (r fanoutRun) srate() float64 { return per(r.sent, r.elapsed) }

// per returns v per second of d; 0 for a mode not measured.
func per(v uint64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(v) / d.Seconds()
}

// uncounted returns the datagrams of an rdma run lost without a drop
// counter of the receivers' devices.
func (r fanoutRun) uncounted(n int) uint64 {
	if lost := r.sent*uint64(n) - min(r.msgs, r.sent*uint64(n)); lost > r.drops {
		return lost - r.drops
	}
	return 0
}

func (r fanoutRun) loss(n int) float64 {
	if r.elapsed <= 0 {
		return 0 // not measured
	}
	if r.sent == 0 {
		return 1
	}
	return 1 - float64(r.msgs)/float64(r.sent*uint64(n))
}

// rxProc is a running receiver process.
type rxProc struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	lines  chan []byte
	stderr bytes.Buffer
}

func startRxProc(argv, env []string) (*rxProc, error) { return startRxProcOn(argv, env, -1) }

// startRxProcOn is startRxProc with the process pinned to cpu (< 0: not).
func startRxProcOn(argv, env []string, cpu int) (*rxProc, error) {
	p := &rxProc{lines: make(chan []byte, 4)}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = &p.stderr
	var err error
	if p.in, err = p.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := startOn(p.cmd, cpu); err != nil {
		return nil, err
	}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 4<<20) // a pinger's reply carries its round-trip times
		for sc.Scan() {
			p.lines <- slices.Clone(sc.Bytes())
		}
	}()
	return p, nil
}

// call sends one request and waits for its reply.
func (p *rxProc) call(req rxRequest) (rxReply, error) {
	b, _ := json.Marshal(req)
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		return rxReply{}, fmt.Errorf("receiver: %v (stderr: %s)", err, p.stderr.String())
	}
	select {
	case line, ok := <-p.lines:
		if !ok {
			return rxReply{}, fmt.Errorf("receiver exited (stderr: %s)", p.stderr.String())
		}
		var rep rxReply
		if err := json.Unmarshal(line, &rep); err != nil {
			return rxReply{}, fmt.Errorf("receiver reply %q: %v", line, err)
		}
		if rep.Err != "" {
			return rep, fmt.Errorf("receiver: %s", rep.Err)
		}
		return rep, nil
	case <-time.After(20 * time.Second):
		return rxReply{}, fmt.Errorf("receiver: no reply to %q", req.Op)
	}
}

func (p *rxProc) close() {
	done := make(chan struct{})
	go func() {
		p.call(rxRequest{Op: "exit"})
		p.in.Close()
		p.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

// fanout runs the fan-out cases.
type fanout struct {
	cfg   *Config
	procs []*rxProc
	ifidx int
	ep    *endpoint // the rdma sender
	dev   *rxe.Device
	ib    *ibSender // the IB part's subnet manager and sender
}

func (f *fanout) start() error {
	var err error
	if f.ifidx, err = ifindexOf(f.cfg.Bind); err != nil {
		return err
	}
	n := slices.Max(f.cfg.Receivers)
	for range n {
		p, err := startRxProc(f.cfg.RxCommand, f.cfg.RxEnv)
		if err != nil {
			f.stop()
			return fmt.Errorf("start receiver: %w", err)
		}
		f.procs = append(f.procs, p)
	}
	maxSize := slices.Max(f.cfg.Sizes)
	if f.ep, err = newEndpoint(f.cfg.Bind, f.cfg.Batch, 1, f.cfg.Batch*maxSize); err != nil {
		f.stop()
		return fmt.Errorf("sender: %w", err)
	}
	if f.dev, err = rxe.ForAddr(f.cfg.Bind); err != nil {
		f.stop()
		return err
	}
	return nil
}

func (f *fanout) stop() {
	f.stopIB()
	var wg sync.WaitGroup
	for _, p := range f.procs {
		wg.Add(1)
		go func() { defer wg.Done(); p.close() }()
	}
	wg.Wait()
	f.procs = nil
	if f.ep != nil {
		f.ep.close()
		f.ep = nil
	}
}

// measure runs one mode of one case.
func (f *fanout) measure(mode string, n, size int) (fanoutRun, error) {
	var r fanoutRun
	group := randGroup()
	req := rxRequest{Op: "start", Mode: mode, Group: group.String(), Bind: f.cfg.Bind.String(), Size: size, Slots: f.cfg.Slots}
	if mode == "ib" {
		req.Bind, req.SM = f.cfg.IBBind.String(), f.ib.addr
	}
	if err := f.each(n, req, nil); err != nil {
		f.each(n, rxRequest{Op: "stop"}, nil)
		return r, err
	}
	var send func() (int, error)
	switch mode {
	case "udp":
		s, err := newMmsgSender(f.cfg.Bind, group, f.ifidx, f.cfg.Batch, size)
		if err != nil {
			f.each(n, rxRequest{Op: "stop"}, nil)
			return r, err
		}
		defer s.close()
		send = s.send
	case "rdma", "ib":
		ep := f.ep
		if mode == "ib" {
			ep = f.ib.ep
		}
		ah, qkey, err := ep.join(group, true)
		if err != nil {
			f.each(n, rxRequest{Op: "stop"}, nil)
			return r, err
		}
		defer ep.leave(group)
		defer ah.Destroy()
		c := newSendChain(ep, ah, qkey, 0, f.cfg.Batch, size)
		qp := ep.qp
		send = func() (int, error) { return c.post(qp) }
	}
	var dev counted = f.dev
	var sw0 int64
	var swd0 uint64
	if mode == "ib" {
		dev = f.ib.dev
		var err error
		if sw0, swd0, err = f.smMark(); err != nil {
			f.each(n, rxRequest{Op: "stop"}, nil)
			return r, err
		}
	}
	ctr0 := dev.Counters()
	cpu0 := cpuTime()
	start := time.Now()
	for {
		k, err := send()
		r.sent += uint64(k)
		if err != nil {
			f.each(n, rxRequest{Op: "stop"}, nil)
			return r, err
		}
		el := time.Since(start)
		if el >= f.cfg.Duration {
			r.elapsed = el
			r.txCPU = cpuTime() - cpu0
			break
		}
		if f.cfg.Rate > 0 {
			if ahead := time.Duration(float64(r.sent)/float64(f.cfg.Rate)*1e9) - el; ahead > 200*time.Microsecond {
				time.Sleep(ahead)
			}
		}
	}
	if mode != "udp" {
		// Datagrams the kernel refused, and datagrams larger than the MTU
		// (completed, not sent), were counted as sent above.
		c1 := dev.Counters()
		r.sent -= c1.Get(softverbs.SendErrors) - ctr0.Get(softverbs.SendErrors)
		r.sent -= c1.Get(softverbs.OversizedSendDrops) - ctr0.Get(softverbs.OversizedSendDrops)
		r.stallDrops = c1.Get(softverbs.LinkStallDrops) - ctr0.Get(softverbs.LinkStallDrops)
		r.waits = c1.Get(softverbs.LinkWaits) - ctr0.Get(softverbs.LinkWaits)
	}
	// The receivers read on what waits in their socket buffers (up to
	// 64 MiB each) and a lossless fabric holds what it has not delivered
	// yet: wait until every datagram arrived, or nothing moved for a drain
	// time, so that only what was dropped counts as lost and the rate is
	// over the time the datagrams took to arrive.
	r.span = max(f.settle(n, r.sent*uint64(n)).Sub(start), r.elapsed)
	err := f.each(n, rxRequest{Op: "stop"}, func(rep rxReply) {
		r.msgs += rep.Msgs
		r.bytes += rep.Bytes
		r.drops += rep.Drops
		r.rxCPU += rep.CPUNs
	})
	if mode == "ib" && err == nil {
		sw1, swd1, merr := f.smMark()
		r.swCPU, r.swDrops, err = sw1-sw0, swd1-swd0, merr
	}
	return r, err
}

// settle waits until the first n receivers counted want datagrams in all,
// or their count stayed put for a drain time, and returns when the count
// was last seen to grow (within a millisecond), or to reach want.
func (f *fanout) settle(n int, want uint64) time.Time {
	last, moved := uint64(0), time.Now()
	for {
		var got uint64
		var mu sync.Mutex
		if f.each(n, rxRequest{Op: "count"}, func(rep rxReply) { mu.Lock(); got += rep.Msgs; mu.Unlock() }) != nil {
			return moved
		}
		now := time.Now()
		if got >= want {
			return now
		}
		if got != last {
			last, moved = got, now
		} else if now.Sub(moved) >= f.cfg.Drain {
			return moved
		}
		time.Sleep(min(f.cfg.Drain/10, time.Millisecond))
	}
}

// each sends req to the first n receivers at once and waits for every
// reply; add, when not nil, gets each.
func (f *fanout) each(n int, req rxRequest, add func(rxReply)) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for _, p := range f.procs[:n] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep, err := p.call(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
			if add != nil {
				add(rep)
			}
		}()
	}
	wg.Wait()
	return first
}

// runCase measures one (receivers, size) case in both modes, interleaved.
func (f *fanout) runCase(n, size int) (FanoutResult, error) {
	res := FanoutResult{Kind: "fanout", Receivers: n, Size: size, Batch: f.cfg.Batch, Seconds: f.cfg.Duration.Seconds(), Runs: f.cfg.Repeats}
	var udp, rdma []fanoutRun
	var ratios []float64
	for i := range f.cfg.Repeats {
		order := slices.Clone(f.cfg.Modes)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		var pair [2]fanoutRun
		for _, mode := range order {
			r, err := f.measure(mode, n, size)
			if err != nil {
				return res, fmt.Errorf("fan-out %s n=%d size=%d: %w", mode, n, size, err)
			}
			if mode == "udp" {
				pair[0] = r
			} else {
				pair[1] = r
			}
		}
		if slices.Contains(order, "udp") {
			udp = append(udp, pair[0])
		}
		if slices.Contains(order, "rdma") {
			rdma = append(rdma, pair[1])
		}
		if pair[0].msgs > 0 && pair[1].span > 0 {
			ratios = append(ratios, pair[1].rate()/pair[0].rate())
		}
	}
	var mu, mr fanoutRun
	if len(udp) > 0 {
		mu = medianRun(udp)
	}
	if len(rdma) > 0 {
		mr = medianRun(rdma)
	}
	res.UDPSentPerS, res.UDPMsgsPerS, res.UDPBytesPerS, res.UDPLoss = mu.srate(), mu.rate(), mu.brate(), mu.loss(n)
	res.RDMASentPerS, res.RDMAMsgsPerS, res.RDMABytesPerS, res.RDMALoss = mr.srate(), mr.rate(), mr.brate(), mr.loss(n)
	res.RDMADeviceDrop = mr.drops
	for _, r := range rdma {
		res.RDMAUncounted += r.uncounted(n)
	}
	if want := mr.sent * uint64(n); want > mr.msgs {
		res.RDMALost = want - mr.msgs
	}
	res.UDPTxCPUns, res.UDPRxCPUns = medianOf(udp, fanoutRun.txPerMsg), medianOf(udp, fanoutRun.rxPerMsg)
	res.RDMATxCPUns, res.RDMARxCPUns = medianOf(rdma, fanoutRun.txPerMsg), medianOf(rdma, fanoutRun.rxPerMsg)
	if len(ratios) > 0 {
		res.Ratio = median(ratios)
		res.RatioMin, res.RatioMax = slices.Min(ratios), slices.Max(ratios)
	}
	return res, nil
}

// medianRun returns the run with the median delivered rate.
func medianRun(rs []fanoutRun) fanoutRun {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b fanoutRun) int {
		switch {
		case a.rate() < b.rate():
			return -1
		case a.rate() > b.rate():
			return 1
		}
		return 0
	})
	return s[len(s)/2]
}

func medianOf(rs []fanoutRun, f func(fanoutRun) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	return median(v)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// randGroup returns a random group in 239.0.0.0/8 (administratively
// scoped), away from 239.0.0.0/24 and 239.255.255.0/24.
func randGroup() netip.Addr {
	return netip.AddrFrom4([4]byte{239, byte(1 + rand.IntN(254)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))})
}

// ifindexOf returns the index of the interface that owns local address a.
func ifindexOf(a netip.Addr) (int, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return 0, err
	}
	for _, ifi := range ifs {
		addrs, _ := ifi.Addrs()
		for _, x := range addrs {
			if p, err := netip.ParsePrefix(x.String()); err == nil && p.Addr() == a {
				return ifi.Index, nil
			}
		}
	}
	return 0, fmt.Errorf("no interface has address %v", a)
}
