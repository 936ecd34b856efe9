package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/softrdma/softrdma/provider/softverbs"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/provider/rxe"
)

// The fan-out receivers are processes of their own (the softrdma binary
// re-executed as "bench-rx"). The parent drives each one over its standard
// input and output, one JSON object per line: a request, then one reply.

// rxRequest is a request of the parent to a receiver process.
type rxRequest struct {
	// Op is "start" (join Group in Mode and count what arrives, then
	// reply), "count" (reply with the datagrams counted so far), "stop"
	// (stop counting, leave, reply with the counts) or "exit".
	Op string `json:"op"`
	// Manager is who manages the subnet an "sm" starts (ib/sm's
	// Config.Manager: "" or "softsm", "opensm").
	Manager string `json:"manager,omitempty"`
	// ViaSwitch turns direct forwarding off in the subnet an "sm"
	// starts (ib/sm's Config.ViaSwitch).
	ViaSwitch bool   `json:"via_switch,omitempty"`
	Mode      string `json:"mode,omitempty"` // "udp", "rdma" (RoCEv2) or "ib"
	Group     string `json:"group,omitempty"`
	Bind      string `json:"bind,omitempty"`
	Size      int    `json:"size,omitempty"`
	// Slots is the number of receive WRs an rdma receiver keeps posted.
	Slots int `json:"slots,omitempty"`
	// SM is the subnet manager's fabric address of an "ib" receiver: the
	// process opens an IB port at Bind on it (once; later cases reuse it).
	SM string `json:"sm,omitempty"`

	// The latency part's "pong" (answer on Group2 what arrives on Group
	// until "pong-stop") and "ping" (Warmup+Count round trips: send to
	// Group2, wait for the answer on Group) take Wait (WaitBlock or
	// WaitPoll) too.
	// Port is the UDP port of a "udp" peer (0: 4791, RoCEv2's; a host
	// whose kernel has an rxe device holds that one).
	Group2 string `json:"group2,omitempty"`
	Wait   string `json:"wait,omitempty"`
	Count  int    `json:"count,omitempty"`
	Warmup int    `json:"warmup,omitempty"`
	Port   uint16 `json:"port,omitempty"`
}

// The subnet manager process of the IB part is a receiver process too:
// "sm" starts a softsm (SM, SA and switch) in it and replies with its
// fabric address; "mark" replies with the process's CPU time so far and
// the switch's discards (packets it dropped or discarded: bad or
// unroutable packets, overruns, head-of-queue discards); "exit" stops it.

// rxReply is a receiver's answer.
type rxReply struct {
	Err   string `json:"err,omitempty"`
	Msgs  uint64 `json:"msgs"`
	Bytes uint64 `json:"bytes"`
	// Drops are the device's receive-side drops during the case (rdma):
	// no posted receive WR, CQ full, ICRC errors, and the socket's drops
	// for a full receive buffer (socket_drops).
	Drops uint64 `json:"drops,omitempty"`
	// CPUNs is the CPU time (user + system) the process used during the
	// case ("mark": since it started).
	CPUNs int64 `json:"cpu_ns"`
	// Addr is the fabric address of the subnet manager ("sm").
	Addr string `json:"addr,omitempty"`
	// Discards are the switch's drops and discards so far ("mark").
	Discards uint64 `json:"discards,omitempty"`
	// RTTs are a pinger's round-trip times in ns, Lost its round trips
	// without an answer; Pongs the answers a ponger sent ("pong-stop").
	RTTs  []int64 `json:"rtts,omitempty"`
	Lost  int     `json:"lost,omitempty"`
	Pongs int     `json:"pongs,omitempty"`
}

// rxCase is a receiver's state during one case.
type rxCase struct {
	msgs, bytes atomic.Uint64
	stop        atomic.Bool
	done        chan struct{}
	ctx         context.Context
	cancel      context.CancelFunc

	udp  *mmsgReceiver
	ep   *endpoint
	grp  netip.Addr
	cpu0 int64
	dev  counted
	ctr0 softverbs.Snapshot
	err  error
	mu   sync.Mutex
}

// RunReceiver is the receiver process of the fan-out benchmark: it serves
// the parent's requests read from in, one JSON object per line, and writes
// one JSON reply per request to out, until "exit" or the end of in.
func RunReceiver(in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	enc := json.NewEncoder(out)
	var cur *rxCase
	var sub *subnet
	var pong *ponger
	defer func() {
		if pong != nil {
			pong.stop()
		}
	}()
	// ring is the receive buffer of the rdma cases, kept from case to case
	// as a program keeps its registered memory: its pages are in memory
	// (a new buffer per case would fault them in during the measurement).
	var ring []byte
	defer func() {
		if sub != nil {
			sub.stop()
		}
	}()
	for sc.Scan() {
		var req rxRequest
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			return fmt.Errorf("bench-rx: %v", err)
		}
		var rep rxReply
		switch req.Op {
		case "start":
			if cur != nil {
				cur.finish()
			}
			var err error
			if cur, err = startRx(&req, &ring); err != nil {
				rep.Err = err.Error()
			}
		case "stop":
			if cur == nil {
				rep.Err = "not started"
				break
			}
			rep = cur.finish()
			cur = nil
		case "count":
			if cur != nil {
				rep.Msgs = cur.msgs.Load()
			}
		case "sm":
			if sub == nil {
				var err error
				if sub, err = startSubnet(req.Manager, req.ViaSwitch); err != nil {
					rep.Err = err.Error()
					break
				}
			}
			rep.Addr = sub.addr
		case "pong":
			if pong != nil {
				pong.stop()
			}
			var err error
			if pong, err = startPong(&req); err != nil {
				rep.Err = err.Error()
			}
		case "pong-stop":
			if pong == nil {
				rep.Err = "no pong running"
				break
			}
			rep.Pongs, rep.Err = pong.stop()
			pong = nil
		case "ping":
			rep = ping(&req)
		case "mark":
			rep.CPUNs = cpuTime()
			if sub != nil {
				rep.Discards = sub.discards()
			}
		case "exit":
			if cur != nil {
				cur.finish()
			}
			return enc.Encode(rep)
		default:
			rep.Err = fmt.Sprintf("unknown op %q", req.Op)
		}
		if err := enc.Encode(rep); err != nil {
			return err
		}
	}
	if cur != nil {
		cur.finish()
	}
	return sc.Err()
}

func startRx(req *rxRequest, ring *[]byte) (*rxCase, error) {
	group, err := netip.ParseAddr(req.Group)
	if err != nil {
		return nil, err
	}
	bind, err := netip.ParseAddr(req.Bind)
	if err != nil {
		return nil, err
	}
	c := &rxCase{done: make(chan struct{}), grp: group}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	started := false
	defer func() {
		if !started {
			c.cancel()
		}
	}()
	switch req.Mode {
	case "udp":
		ifindex, err := ifindexOf(bind)
		if err != nil {
			return nil, err
		}
		if c.udp, err = newMmsgReceiver(group, ifindex, RecvBatch); err != nil {
			return nil, err
		}
		go func() {
			defer close(c.done)
			c.udp.run(func(m, b uint64) { c.msgs.Add(m); c.bytes.Add(b) })
		}()
	case "rdma", "ib":
		if req.Mode == "ib" {
			if c.dev, err = ibPort(req.SM, bind); err != nil {
				return nil, err
			}
		} else if c.dev, err = rxe.ForAddr(bind); err != nil {
			return nil, err
		}
		slots := max(req.Slots, 64)
		slot := 40 + req.Size
		if len(*ring) < slots*slot {
			// Room for the largest payload from the start, its pages
			// faulted in here, in the setup, as an application
			// initializes its buffers and ibv_reg_mr pins them: a buffer
			// grown at the first 4096-byte case faulted 17 MB in during
			// that case's measurement (its receiver's CPU per datagram
			// nearly doubled, and it lost datagrams).
			*ring = make([]byte, slots*max(slot, 40+maxPayload))
			for i := 0; i < len(*ring); i += os.Getpagesize() {
				(*ring)[i] = 0
			}
		}
		if c.ep, err = newEndpointBuf(bind, 1, slots, (*ring)[:slots*slot]); err != nil {
			return nil, err
		}
		ring, err := newRecvRing(c.ep, slots, slot)
		if err != nil {
			c.ep.close()
			return nil, err
		}
		c.ctr0 = c.dev.Counters()
		if err := c.ep.joinRecv(group); err != nil {
			c.ep.close()
			return nil, err
		}
		go func() {
			defer close(c.done)
			c.rdmaLoop(ring)
		}()
	default:
		return nil, fmt.Errorf("unknown mode %q", req.Mode)
	}
	// A garbage collection now, as testing.B makes one before a
	// benchmark: a cycle that the setup's allocations (the QP's receive
	// queue, the CQ, the receive ring's WRs) trigger could otherwise run
	// during the measurement (it did in 1 of 30 rdma cases, none of 30
	// udp ones), in either mode.
	runtime.GC()
	// The CPU time counts from here: the data path, not the setup (socket,
	// QP, buffers, join, the collection), which nothing is sent during.
	c.cpu0 = cpuTime()
	started = true
	return c, nil
}

// rdmaLoop polls the receive CQ, reposting what it reaps, until stopped.
func (c *rxCase) rdmaLoop(r *recvRing) {
	for !c.stop.Load() {
		m, b, n, err := r.poll()
		if err != nil {
			c.setErr(err)
			return
		}
		if n > 0 {
			c.msgs.Add(m)
			c.bytes.Add(b)
			continue
		}
		if err := r.cq.Wait(c.ctx); err != nil {
			if c.ctx.Err() == nil {
				c.setErr(err)
			}
			return
		}
	}
}

func (c *rxCase) setErr(err error) {
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
}

// finish stops counting, leaves the group and returns the counts.
func (c *rxCase) finish() rxReply {
	c.stop.Store(true)
	c.cancel()
	if c.udp != nil {
		c.udp.close()
	}
	<-c.done
	rep := rxReply{Msgs: c.msgs.Load(), Bytes: c.bytes.Load(), CPUNs: cpuTime() - c.cpu0}
	if c.ep != nil {
		if err := c.ep.leave(c.grp); err != nil && c.err == nil {
			c.err = err
		}
		c1 := c.dev.Counters()
		for _, k := range []softverbs.Counter{softverbs.NoRecvWRDrops, softverbs.CQFullDrops, softverbs.ICRCErrors, softverbs.SocketDrops} {
			rep.Drops += c1.Get(k) - c.ctr0.Get(k)
		}
		c.ep.close()
	}
	if c.err != nil {
		rep.Err = c.err.Error()
	}
	return rep
}

// cpuTime returns the CPU time (user + system) of this process so far.
func cpuTime() int64 {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
