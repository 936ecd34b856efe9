package bench

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sa"
	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// The IB part measures the emulated InfiniBand subnet: fan-out through a
// softsm (its own process: SM, SA and switch) with the RoCEv2 path of the
// same run as the baseline, the SA's joins per second over the fabric,
// and the time the SA takes to create 16,000 groups.

// counted is a device with counters (rxe or IB).
type counted interface{ Counters() softverbs.Snapshot }

// subnet is a softsm running in this process (the SM process of the IB
// part).
type subnet struct {
	s      *sm.SM
	addr   string
	cancel context.CancelFunc
	done   chan error
}

// startSubnet starts the subnet manager: softsm's own (manager "" or
// sm.ManagerSoftsm) or OpenSM in charge (sm.ManagerOpenSM, Config.IBSM),
// then waits for OpenSM's SUBNET UP (ports attaching after it are made
// Active at OpenSM's next light sweep).
func startSubnet(manager string, viaSwitch bool) (*subnet, error) {
	s, err := sm.New(sm.Config{Listen: "127.0.0.1:0", SendOnlySupport: true, Manager: manager, ViaSwitch: viaSwitch})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	sub := &subnet{s: s, addr: s.FabricAddr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { sub.done <- s.Run(ctx) }()
	if up := s.OpenSMUp(); up != nil {
		select {
		case <-up:
		case <-time.After(ibActivate):
			sub.stop()
			return nil, fmt.Errorf("OpenSM: no SUBNET UP within %v", ibActivate)
		}
	}
	return sub, nil
}

// ibActivate bounds how long a port waits to be made Active (OpenSM's
// first sweeps take a few seconds on a loaded machine; softsm answers at
// once).
const ibActivate = 60 * time.Second

func (sub *subnet) stop() {
	sub.cancel()
	<-sub.done
}

// discards sums what the switch dropped or discarded.
func (sub *subnet) discards() uint64 {
	st := sub.s.Stats()
	n := st.UnknownSource + st.SendErrors
	for _, p := range st.Ports {
		n += p.Drops + p.XmitDiscards + p.RcvOverruns
	}
	return n
}

// ibPort returns this process's IB port at bind on the subnet at smAddr,
// opening it on first use.
func ibPort(smAddr string, bind netip.Addr) (*ib.Device, error) {
	if d := ib.ForAddr(bind); d != nil {
		return d, nil
	}
	if smAddr == "" {
		return nil, fmt.Errorf("ib: no subnet manager address")
	}
	return ib.Open(ib.Config{SM: smAddr, Local: bind, ActivateTimeout: ibActivate})
}

// IBFanoutResult is one fan-out case through softsm: one sender in this
// process, Receivers receiver processes, each with its own IB port, and
// the switch in a process of its own; the baseline is the RoCEv2 path
// (the "rdma" mode of the fan-out part) measured in the same run, the two
// modes interleaved. Rates are medians over the runs.
type IBFanoutResult struct {
	Kind      string  `json:"kind"` // "ib_fanout"
	Receivers int     `json:"receivers"`
	Size      int     `json:"size"`
	Batch     int     `json:"batch"`
	Seconds   float64 `json:"seconds"`
	Runs      int     `json:"runs"`

	RoCESentPerS float64 `json:"roce_sent_msgs_per_s"`
	RoCEMsgsPerS float64 `json:"roce_msgs_per_s"`
	RoCELoss     float64 `json:"roce_loss"`
	// RoCEUncounted are the RoCEv2 datagrams lost beyond the receivers'
	// drop counters, summed over the runs (the target is none).
	RoCEUncounted uint64  `json:"roce_uncounted"`
	IBSentPerS    float64 `json:"ib_sent_msgs_per_s"`
	IBMsgsPerS    float64 `json:"ib_msgs_per_s"`
	IBBytesPerS   float64 `json:"ib_bytes_per_s"`
	// IBLoss is 1 − delivered / (sent × receivers) of the median run;
	// IBWorstLoss the largest over the runs (the target is 0).
	IBLoss      float64 `json:"ib_loss"`
	IBWorstLoss float64 `json:"ib_worst_loss"`
	// Where IB datagrams were lost, summed over the runs: the receivers'
	// devices (no receive WR posted, CQ full), the switch (discards), the
	// sender's link (stall drops).
	IBDeviceDrops uint64 `json:"ib_device_drops"`
	IBSwitchDrops uint64 `json:"ib_switch_drops"`
	IBStallDrops  uint64 `json:"ib_stall_drops"`
	// IBWaits counts sends that waited for the switch's credit (the
	// sender held back), summed over the runs.
	IBWaits uint64 `json:"ib_link_waits"`

	// CPU time per datagram (medians over runs): the sender's per datagram
	// sent, the receivers' per datagram delivered, the switch's per
	// datagram sent, and all processes' together per datagram delivered.
	RoCETxCPUns    float64 `json:"roce_tx_cpu_ns_per_msg"`
	RoCERxCPUns    float64 `json:"roce_rx_cpu_ns_per_msg"`
	RoCETotalCPUns float64 `json:"roce_total_cpu_ns_per_msg"`
	IBTxCPUns      float64 `json:"ib_tx_cpu_ns_per_msg"`
	IBRxCPUns      float64 `json:"ib_rx_cpu_ns_per_msg"`
	IBSwitchCPUns  float64 `json:"ib_switch_cpu_ns_per_msg"`
	IBTotalCPUns   float64 `json:"ib_total_cpu_ns_per_msg"`

	// Ratio is the median over runs of IB delivered msg/s over RoCEv2
	// delivered msg/s of the same run pair; RatioMin/RatioMax the spread.
	Ratio    float64 `json:"ratio"`
	RatioMin float64 `json:"ratio_min"`
	RatioMax float64 `json:"ratio_max"`
}

// SAResult is the SA's speed: joins over the fabric (an RDMA CM id on an
// IB port joins Joins groups one after the other: join, SA Set and
// answer, MULTICAST_JOIN event, ack; then leaves them), and the SA alone
// creating Create groups (ib/sa's BenchmarkCreate16000Groups: one
// SubnAdmSet each, as many as an HCA's max_mcast_grp). The baseline is the
// same joins on the RoCEv2 device of the run.
type SAResult struct {
	Kind          string  `json:"kind"` // "sa"
	Joins         int     `json:"joins"`
	JoinsPerS     float64 `json:"joins_per_s"`
	JoinP50us     float64 `json:"join_p50_us"`
	JoinP99us     float64 `json:"join_p99_us"`
	LeavesPerS    float64 `json:"leaves_per_s"`
	RoCEJoinsPerS float64 `json:"roce_joins_per_s"`
	// Ratio is IB joins/s over RoCEv2 joins/s.
	Ratio         float64 `json:"ratio"`
	Create        int     `json:"create"`
	CreateSeconds float64 `json:"create_seconds"`
}

// ibSender is the sending side of the IB fan-out in this process.
type ibSender struct {
	sm   *rxProc // the subnet manager's process
	addr string  // its fabric address
	dev  *ib.Device
	ep   *endpoint
}

func (f *fanout) startIB() error {
	p, err := startRxProc(f.cfg.RxCommand, f.cfg.RxEnv)
	if err != nil {
		return fmt.Errorf("start subnet manager: %w", err)
	}
	f.ib = &ibSender{sm: p}
	rep, err := p.call(rxRequest{Op: "sm", Manager: f.cfg.IBSM, ViaSwitch: f.cfg.IBViaSwitch})
	if err != nil {
		return fmt.Errorf("subnet manager: %w", err)
	}
	f.ib.addr = rep.Addr
	if f.ib.dev, err = ibPort(rep.Addr, f.cfg.IBBind); err != nil {
		return err
	}
	maxSize := slices.Max(f.cfg.Sizes)
	if f.ib.ep, err = newEndpoint(f.cfg.IBBind, f.cfg.Batch, 1, f.cfg.Batch*maxSize); err != nil {
		return fmt.Errorf("ib sender: %w", err)
	}
	return nil
}

func (f *fanout) stopIB() {
	if f.ib == nil {
		return
	}
	if f.ib.ep != nil {
		f.ib.ep.close()
	}
	if f.ib.dev != nil {
		f.ib.dev.Close()
	}
	f.ib.sm.close()
	f.ib = nil
}

// smMark returns the subnet manager process's CPU time and discards.
func (f *fanout) smMark() (cpu int64, discards uint64, err error) {
	rep, err := f.ib.sm.call(rxRequest{Op: "mark"})
	return rep.CPUNs, rep.Discards, err
}

// runIBCase measures one (receivers, size) case as RoCEv2 and through
// softsm, interleaved.
func (f *fanout) runIBCase(n, size int) (IBFanoutResult, error) {
	res := IBFanoutResult{Kind: "ib_fanout", Receivers: n, Size: size, Batch: f.cfg.Batch, Seconds: f.cfg.Duration.Seconds(), Runs: f.cfg.Repeats}
	var roce, ibr []fanoutRun
	var ratios []float64
	for i := range f.cfg.Repeats {
		order := []string{"rdma", "ib"}
		if i%2 == 1 {
			order = []string{"ib", "rdma"}
		}
		var pair [2]fanoutRun
		for _, mode := range order {
			r, err := f.measure(mode, n, size)
			if err != nil {
				return res, fmt.Errorf("ib fan-out %s n=%d size=%d: %w", mode, n, size, err)
			}
			if mode == "rdma" {
				pair[0] = r
			} else {
				pair[1] = r
			}
		}
		roce = append(roce, pair[0])
		ibr = append(ibr, pair[1])
		res.IBDeviceDrops += pair[1].drops
		res.IBSwitchDrops += pair[1].swDrops
		res.IBStallDrops += pair[1].stallDrops
		res.IBWaits += pair[1].waits
		res.IBWorstLoss = max(res.IBWorstLoss, pair[1].loss(n))
		if pair[0].msgs > 0 {
			ratios = append(ratios, pair[1].rate()/pair[0].rate())
		}
	}
	mr, mi := medianRun(roce), medianRun(ibr)
	res.RoCESentPerS, res.RoCEMsgsPerS, res.RoCELoss = mr.srate(), mr.rate(), mr.loss(n)
	res.IBSentPerS, res.IBMsgsPerS, res.IBBytesPerS, res.IBLoss = mi.srate(), mi.rate(), mi.brate(), mi.loss(n)
	res.RoCETxCPUns, res.RoCERxCPUns = medianOf(roce, fanoutRun.txPerMsg), medianOf(roce, fanoutRun.rxPerMsg)
	res.RoCETotalCPUns = medianOf(roce, fanoutRun.totalPerMsg)
	for _, r := range roce {
		res.RoCEUncounted += r.uncounted(n)
	}
	res.IBTxCPUns, res.IBRxCPUns = medianOf(ibr, fanoutRun.txPerMsg), medianOf(ibr, fanoutRun.rxPerMsg)
	res.IBSwitchCPUns = medianOf(ibr, func(r fanoutRun) float64 { return float64(r.swCPU) / float64(max(r.sent, 1)) })
	res.IBTotalCPUns = medianOf(ibr, fanoutRun.totalPerMsg)
	if len(ratios) > 0 {
		res.Ratio = median(ratios)
		res.RatioMin, res.RatioMax = slices.Min(ratios), slices.Max(ratios)
	}
	return res, nil
}

func runIB(cfg *Config, w *writer, rep *Report) error {
	if len(cfg.RxCommand) == 0 {
		return fmt.Errorf("ib: no receiver command")
	}
	f := &fanout{cfg: cfg}
	if err := f.start(); err != nil {
		return err
	}
	defer f.stop()
	if err := f.startIB(); err != nil {
		return err
	}
	w.tablef("\nIB fan-out through softsm (its own process): 1 sender → N receiver processes, each its own IB port; RoCEv2 (rdma) is the baseline (medians of %d runs; ratio = ib/rdma delivered msg/s, [min–max])\n", cfg.Repeats)
	w.tablef("  CPU µs/msg: sender per datagram sent (tx), receivers per datagram delivered (rx), switch per datagram sent (sw), all processes per datagram delivered (all)\n")
	w.tablef("  %2s %5s | %11s %6s %9s %5s | %11s %11s %6s %6s %14s %5s | %6s %s\n",
		"N", "size", "rdma dlv/s", "loss", "tx/rx µs", "all", "ib sent/s", "ib dlv/s", "loss", "worst", "tx/rx/sw µs", "all", "ratio", "spread")
	mtu := verbs.MTU(fabric.PortMTU).Bytes()
	for _, n := range cfg.Receivers {
		for _, s := range cfg.Sizes {
			if s > mtu {
				w.tablef("  %2d %5d | skipped: larger than the subnet's MTU (%d)\n", n, s, mtu)
				continue
			}
			r, err := f.runIBCase(n, s)
			if err != nil {
				return err
			}
			rep.IBFanout = append(rep.IBFanout, r)
			w.tablef("  %2d %5d | %11.0f %5.1f%% %4.1f/%4.1f %5.1f | %11.0f %11.0f %5.2f%% %5.2f%% %4.1f/%4.1f/%4.1f %5.1f | %6.2f [%.2f–%.2f]\n",
				n, s, r.RoCEMsgsPerS, 100*r.RoCELoss, r.RoCETxCPUns/1e3, r.RoCERxCPUns/1e3, r.RoCETotalCPUns/1e3,
				r.IBSentPerS, r.IBMsgsPerS, 100*r.IBLoss, 100*r.IBWorstLoss, r.IBTxCPUns/1e3, r.IBRxCPUns/1e3, r.IBSwitchCPUns/1e3, r.IBTotalCPUns/1e3,
				r.Ratio, r.RatioMin, r.RatioMax)
			if r.IBDeviceDrops+r.IBSwitchDrops+r.IBStallDrops > 0 {
				w.tablef("       lost: %d at the receivers' devices (no receive WR, CQ full), %d at the switch, %d on the sender's stalled link\n",
					r.IBDeviceDrops, r.IBSwitchDrops, r.IBStallDrops)
			}
			w.json(r)
		}
	}
	s, err := measureSA(cfg, f.ib.dev)
	if err != nil {
		return fmt.Errorf("sa: %w", err)
	}
	rep.SA = &s
	who := "softsm"
	if f.cfg.IBSM == sm.ManagerOpenSM {
		who = "OpenSM's, relayed by softsm"
	}
	w.tablef("\nSA (%s): %d joins over the fabric, one after the other: %.0f joins/s (p50 %.1f µs, p99 %.1f µs), %.0f leaves/s; RoCEv2 baseline %.0f joins/s, ratio %.2f\n",
		who, s.Joins, s.JoinsPerS, s.JoinP50us, s.JoinP99us, s.LeavesPerS, s.RoCEJoinsPerS, s.Ratio)
	w.tablef("  the SA alone creates %d groups (one SubnAdmSet each) in %.3f s\n", s.Create, s.CreateSeconds)
	w.json(s)
	return nil
}

// measureSA times joins over the fabric on port dev (then on the RoCEv2
// device, the baseline) and the SA's creation of cfg.IBCreate groups.
func measureSA(cfg *Config, dev *ib.Device) (SAResult, error) {
	r := SAResult{Kind: "sa", Joins: cfg.IBJoins, Create: cfg.IBCreate}
	rate := func(bind netip.Addr) (joins, leaves float64, lat []time.Duration, err error) {
		e, err := newEndpoint(bind, 1, 1, 0)
		if err != nil {
			return 0, 0, nil, err
		}
		defer e.close()
		groups := uniqueGroups(cfg.IBJoins)
		start := time.Now()
		for _, g := range groups {
			t0 := time.Now()
			if err := joinOne(e, g); err != nil {
				return 0, 0, nil, err
			}
			lat = append(lat, time.Since(t0))
		}
		joins = float64(len(groups)) / time.Since(start).Seconds()
		start = time.Now()
		for _, g := range groups {
			if err := e.leave(g); err != nil {
				return 0, 0, nil, err
			}
		}
		return joins, float64(len(groups)) / time.Since(start).Seconds(), lat, nil
	}
	var lat []time.Duration
	var err error
	if r.JoinsPerS, r.LeavesPerS, lat, err = rate(dev.LocalAddr()); err != nil {
		return r, err
	}
	r.JoinP50us, r.JoinP99us = percentile(lat, 0.5), percentile(lat, 0.99)
	if r.RoCEJoinsPerS, _, _, err = rate(cfg.Bind); err != nil {
		return r, err
	}
	if r.RoCEJoinsPerS > 0 {
		r.Ratio = r.JoinsPerS / r.RoCEJoinsPerS
	}
	d, err := createGroups(cfg.IBCreate)
	r.CreateSeconds = d.Seconds()
	return r, err
}

// createGroups times an SA creating n groups for one port, one SubnAdmSet
// each (as ib/sa's BenchmarkCreate16000Groups).
func createGroups(n int) (time.Duration, error) {
	const guid = 0x0002c90000000001
	reqs := make([]mad.MAD, n)
	for i := range reqs {
		mgid := wire.GID{0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 12: byte(i >> 24), 13: byte(i >> 16), 14: byte(i >> 8), 15: byte(i)}
		reqs[i] = mad.NewSARequest(mad.MethodSet, mad.AttrMCMemberRecord, uint64(i+1), mad.CompCreateRequired)
		reqs[i].MCMemberRecord().Encode(&mad.MCMemberFields{MGID: mgid, PortGID: fabric.PortGID(fabric.DefaultSubnetPrefix, guid),
			QKey: 0x01234567, PKey: 0xFFFF, JoinState: mad.JoinFullMember})
	}
	s := sa.New(sa.Config{SubnetPrefix: fabric.DefaultSubnetPrefix})
	s.AddPort(sa.Port{GUID: guid, MTU: fabric.PortMTU, Rate: fabric.PortRate})
	start := time.Now()
	for _, r := range reqs {
		if resp := s.Handle(r, sa.From{GUID: guid}); len(resp) != 1 || resp[0].Status() != 0 {
			return time.Since(start), fmt.Errorf("create: no answer or status %v", resp)
		}
	}
	return time.Since(start), nil
}
