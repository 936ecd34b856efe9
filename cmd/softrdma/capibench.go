package main

// The Go side of softrdma bench's capi part: the cases of
// testdata/capibench.c, the same calls and traffic through the Go API,
// run as the hidden subcommand bench-capi-go in a process of its own.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/softrdma/softrdma/verbs"
)

// capiGoCommand is the hidden subcommand of the Go twin of capibench.c.
const capiGoCommand = "bench-capi-go"

func init() {
	if len(os.Args) > 1 && os.Args[1] == capiGoCommand {
		commands[capiGoCommand] = command{run: func(args []string, stdout, stderr io.Writer) int {
			if len(args) != 2 {
				fmt.Fprintf(stderr, "usage: softrdma %s DEVICE ITERS\n", capiGoCommand)
				return 2
			}
			iters, err := strconv.Atoi(args[1])
			if err != nil || iters < capiChain {
				fmt.Fprintf(stderr, "%s: ITERS: want a number >= %d\n", capiGoCommand, capiChain)
				return 2
			}
			if err := capiGoBench(stdout, args[0], iters); err != nil {
				fmt.Fprintf(stderr, "%s: %v\n", capiGoCommand, err)
				return 1
			}
			return 0
		}}
	}
}

// The sizes of capibench.c.
const (
	capiQKey  = 0x11111111
	capiMsg   = 64
	capiSlots = 256
	capiChain = 16
	capiNoQPN = 0xfffff0
)

// capiSide is one QP of the bench with its CQs and buffers.
type capiSide struct {
	scq, rcq *verbs.CQ
	qp       *verbs.QP
	mr       *verbs.MR
	recv     [capiSlots]verbs.RecvWR
	rsge     [capiSlots][1]verbs.SGE
	send     [capiChain]verbs.SendWR
	ssge     [1]verbs.SGE
}

func capiToRTS(qp *verbs.QP) error {
	if err := qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, PortNum: 1, QKey: capiQKey},
		verbs.QPAttrState|verbs.QPAttrPKeyIdx|verbs.QPAttrPort|verbs.QPAttrQKey); err != nil {
		return err
	}
	if err := qp.Modify(&verbs.QPAttr{State: verbs.QPSRTR}, verbs.QPAttrState); err != nil {
		return err
	}
	return qp.Modify(&verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState|verbs.QPAttrSQPSN)
}

func newCapiSide(c *verbs.Context, pd *verbs.PD) (*capiSide, error) {
	s := &capiSide{}
	var err error
	if s.scq, err = c.CreateCQ(4 * capiSlots); err != nil {
		return nil, err
	}
	if s.rcq, err = c.CreateCQ(4 * capiSlots); err != nil {
		return nil, err
	}
	s.qp, err = pd.CreateQP(&verbs.QPInitAttr{SendCQ: s.scq, RecvCQ: s.rcq, QPType: verbs.QPTypeUD,
		Cap: verbs.QPCap{MaxSendWR: 2 * capiSlots, MaxRecvWR: 2 * capiSlots, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, err
	}
	if err := capiToRTS(s.qp); err != nil {
		return nil, err
	}
	if s.mr, err = pd.RegMR(make([]byte, capiSlots*(verbs.GRHLen+capiMsg)+capiMsg), verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	for i := range s.recv {
		s.rsge[i][0] = s.mr.SGE(i*(verbs.GRHLen+capiMsg), verbs.GRHLen+capiMsg)
		s.recv[i] = verbs.RecvWR{WRID: uint64(i), SGList: s.rsge[i][:]}
	}
	s.ssge[0] = s.mr.SGE(capiSlots*(verbs.GRHLen+capiMsg), capiMsg)
	return s, nil
}

func (s *capiSide) postRecv(slot int) error {
	s.recv[slot].Next = nil
	return s.qp.PostRecv(&s.recv[slot])
}

// postSends posts a chain of n sends to qpn, the last signaled when sig.
func (s *capiSide) postSends(ah *verbs.AH, qpn uint32, n int, sig bool) error {
	for i := 0; i < n; i++ {
		w := &s.send[i]
		*w = verbs.SendWR{WRID: uint64(i), SGList: s.ssge[:], Opcode: verbs.WRSend,
			UD: verbs.UDWR{AH: ah, RemoteQPN: qpn, RemoteQKey: capiQKey}}
		if sig && i == n-1 {
			w.Flags = verbs.SendSignaled
		}
		if i+1 < n {
			w.Next = &s.send[i+1]
		}
	}
	return s.qp.PostSend(&s.send[0])
}

var errCapiLost = errors.New("no completion within 5 s")

// waitCQ polls cq until it gave n successful completions, reposting a
// receive for each when s is not nil.
func waitCQ(cq *verbs.CQ, n int, s *capiSide, wc []verbs.WC) error {
	deadline := time.Now().Add(5 * time.Second)
	spins := 0
	for n > 0 {
		k, err := cq.Poll(wc)
		if err != nil {
			return err
		}
		for i := 0; i < k; i++ {
			if wc[i].Status != verbs.WCSuccess {
				return fmt.Errorf("completion status %v", wc[i].Status)
			}
			if s != nil {
				if err := s.postRecv(int(wc[i].WRID)); err != nil {
					return err
				}
			}
		}
		n -= k
		if spins++; k == 0 && spins&1023 == 0 && time.Now().After(deadline) {
			return errCapiLost
		}
	}
	return nil
}

// capiGoBench runs capibench.c's cases through the Go API on device dev
// and prints its lines.
func capiGoBench(w io.Writer, dev string, iters int) error {
	d := verbs.DeviceByName(dev)
	if d == nil {
		return fmt.Errorf("no device %s", dev)
	}
	c, err := d.Open()
	if err != nil {
		return err
	}
	pd, err := c.AllocPD()
	if err != nil {
		return err
	}
	a, err := newCapiSide(c, pd)
	if err != nil {
		return err
	}
	b, err := newCapiSide(c, pd)
	if err != nil {
		return err
	}
	gid, err := c.QueryGID(1, 0)
	if err != nil {
		return err
	}
	ah, err := pd.CreateAH(&verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: gid, HopLimit: 1}, PortNum: 1})
	if err != nil {
		return err
	}
	wc := make([]verbs.WC, capiChain)
	report := func(name string, d time.Duration, ops int) {
		fmt.Fprintf(w, "%s %.1f %d\n", name, float64(d.Nanoseconds())/float64(ops), ops)
	}

	t0 := time.Now()
	for i := 0; i < iters; i++ {
		if k, err := a.rcq.Poll(wc[:1]); k != 0 || err != nil {
			return fmt.Errorf("poll_empty: %d, %v", k, err)
		}
	}
	report("poll_empty", time.Since(t0), iters)

	t0 = time.Now()
	for i := 0; i < iters; i++ {
		if err := a.rcq.ReqNotify(false); err != nil {
			return err
		}
	}
	report("req_notify", time.Since(t0), iters)

	var total time.Duration
	ops := 0
	for ops < iters {
		t0 = time.Now()
		for i := 0; i < capiSlots; i++ {
			if err := a.postRecv(i); err != nil {
				return err
			}
		}
		total += time.Since(t0)
		ops += capiSlots
		if err := a.qp.Modify(&verbs.QPAttr{State: verbs.QPSReset}, verbs.QPAttrState); err != nil {
			return err
		}
		if err := capiToRTS(a.qp); err != nil {
			return err
		}
		for {
			if k, _ := a.rcq.Poll(wc); k == 0 {
				break
			}
		}
	}
	report("post_recv", total, ops)

	for i := 0; i < capiSlots; i++ {
		if err := a.postRecv(i); err != nil {
			return err
		}
		if err := b.postRecv(i); err != nil {
			return err
		}
	}
	rounds, lost := iters/16, 0
	t0 = time.Now()
	for i := 0; i < rounds; i++ {
		if err := a.postSends(ah, b.qp.Num(), 1, false); err != nil {
			return err
		}
		if err := waitCQ(b.rcq, 1, b, wc); err == errCapiLost {
			lost++
			continue
		} else if err != nil {
			return err
		}
		if err := b.postSends(ah, a.qp.Num(), 1, false); err != nil {
			return err
		}
		if err := waitCQ(a.rcq, 1, a, wc); err == errCapiLost {
			lost++
		} else if err != nil {
			return err
		}
	}
	report("pingpong", time.Since(t0), rounds)
	if lost > 0 {
		fmt.Fprintf(os.Stderr, "%s: pingpong: %d messages lost\n", capiGoCommand, lost)
	}

	chains := iters / capiChain
	t0 = time.Now()
	for i := 0; i < chains; i++ {
		if err := a.postSends(ah, b.qp.Num(), capiChain, true); err != nil {
			return err
		}
		if err := waitCQ(b.rcq, capiChain, b, wc); err != nil {
			return fmt.Errorf("stream: %w", err)
		}
		if err := waitCQ(a.scq, 1, nil, wc); err != nil {
			return fmt.Errorf("stream: send completion: %w", err)
		}
	}
	report("stream", time.Since(t0), chains*capiChain)

	t0 = time.Now()
	for i := 0; i < iters; i++ {
		if k, err := b.rcq.Poll(wc[:1]); k != 0 || err != nil {
			return fmt.Errorf("poll_idle: %d, %v", k, err)
		}
	}
	report("poll_idle", time.Since(t0), iters)

	t0 = time.Now()
	for i := 0; i < iters; i++ {
		if err := a.postSends(ah, capiNoQPN, 1, false); err != nil {
			return err
		}
	}
	report("post_send", time.Since(t0), iters)

	total, ops = 0, 0
	for ops < iters {
		for i := 0; i < capiSlots; i += capiChain {
			for j := 0; j < capiChain; j++ {
				a.send[j] = verbs.SendWR{SGList: a.ssge[:], Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
					UD: verbs.UDWR{AH: ah, RemoteQPN: capiNoQPN, RemoteQKey: capiQKey}}
				if j+1 < capiChain {
					a.send[j].Next = &a.send[j+1]
				}
			}
			if err := a.qp.PostSend(&a.send[0]); err != nil {
				return err
			}
		}
		got := 0
		t0 = time.Now()
		for got < capiSlots {
			k, err := a.scq.Poll(wc)
			if err != nil {
				return err
			}
			got += k
		}
		total += time.Since(t0)
		ops += capiSlots
	}
	report("poll_full", total, ops)

	return nil
}
