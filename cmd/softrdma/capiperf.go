package main

// The Go twin of perftest's ib_send_lat -c UD and ib_send_bw -c UD for
// softrdma bench's capi part: the same traffic (UD sends between two
// processes over rxe_lo, the peers' QP numbers and GIDs exchanged over
// TCP on 127.0.0.1) through the Go API, run as the hidden subcommand
// bench-ud.

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/softrdma/softrdma/verbs"
)

// udCommand is the hidden subcommand of the Go twin of perftest.
const udCommand = "bench-ud"

func init() {
	if len(os.Args) > 1 && os.Args[1] == udCommand {
		commands[udCommand] = command{run: udCmd}
	}
}

// udCmd: bench-ud lat|bw DEVICE PORT SIZE SECONDS [SERVER]: the client
// (with SERVER) prints "lat T_AVG_USEC ITERS" or "bw MSG_PER_SEC ITERS".
func udCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) < 5 || len(args) > 6 || (args[0] != "lat" && args[0] != "bw") {
		fmt.Fprintf(stderr, "usage: softrdma %s lat|bw DEVICE PORT SIZE SECONDS [SERVER]\n", udCommand)
		return 2
	}
	port, err1 := strconv.Atoi(args[2])
	size, err2 := strconv.Atoi(args[3])
	secs, err3 := strconv.ParseFloat(args[4], 64)
	if err1 != nil || err2 != nil || err3 != nil || size < 1 || size > 4096 || secs <= 0 {
		fmt.Fprintf(stderr, "%s: bad PORT, SIZE (1..4096) or SECONDS\n", udCommand)
		return 2
	}
	p := &udPeer{lat: args[0] == "lat", size: size, dur: time.Duration(secs * float64(time.Second))}
	server := ""
	if len(args) == 6 {
		server = args[5]
	}
	if err := p.run(stdout, args[1], port, server); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", udCommand, err)
		return 1
	}
	return 0
}

// The queue sizes of perftest's UD defaults: tx depth 128, rx depth 512,
// a signaled send every 100 in a bandwidth run, every one in a latency run.
const (
	udTxDepth = 128
	udRxDepth = 512
	udCQMod   = 100
	udQKey    = 0x11111111
)

type udPeer struct {
	lat  bool
	size int
	dur  time.Duration

	scq, rcq *verbs.CQ
	qp       *verbs.QP
	mr       *verbs.MR
	ah       *verbs.AH
	rqpn     uint32
	recv     []verbs.RecvWR
	rsge     []verbs.SGE
	send     verbs.SendWR
	ssge     [1]verbs.SGE
	wc       [16]verbs.WC
}

func (p *udPeer) setup(dev string) error {
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
	if p.scq, err = c.CreateCQ(udTxDepth); err != nil {
		return err
	}
	if p.rcq, err = c.CreateCQ(udRxDepth); err != nil {
		return err
	}
	p.qp, err = pd.CreateQP(&verbs.QPInitAttr{SendCQ: p.scq, RecvCQ: p.rcq, QPType: verbs.QPTypeUD,
		Cap: verbs.QPCap{MaxSendWR: udTxDepth, MaxRecvWR: udRxDepth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 236}})
	if err != nil {
		return err
	}
	if err := capiToRTS(p.qp); err != nil {
		return err
	}
	slot := verbs.GRHLen + p.size
	if p.mr, err = pd.RegMR(make([]byte, udRxDepth*slot+p.size), verbs.AccessLocalWrite); err != nil {
		return err
	}
	p.recv = make([]verbs.RecvWR, udRxDepth)
	p.rsge = make([]verbs.SGE, udRxDepth)
	for i := range p.recv {
		p.rsge[i] = p.mr.SGE(i*slot, slot)
		p.recv[i] = verbs.RecvWR{WRID: uint64(i), SGList: p.rsge[i : i+1]}
		if err := p.qp.PostRecv(&p.recv[i]); err != nil {
			return err
		}
	}
	p.ssge[0] = p.mr.SGE(udRxDepth*slot, p.size)
	return nil
}

// exchange swaps QP numbers and GIDs with the peer over TCP and makes the
// AH to it.
func (p *udPeer) exchange(port int, server string) (net.Conn, error) {
	var conn net.Conn
	var err error
	if server == "" {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return nil, err
		}
		conn, err = ln.Accept()
		ln.Close()
		if err != nil {
			return nil, err
		}
	} else {
		deadline := time.Now().Add(10 * time.Second)
		for {
			conn, err = net.Dial("tcp", net.JoinHostPort(server, strconv.Itoa(port)))
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			return nil, err
		}
	}
	gid, err := p.qp.PD().Context().QueryGID(1, 0)
	if err != nil {
		return nil, err
	}
	if _, err := fmt.Fprintf(conn, "%d %s\n", p.qp.Num(), hex.EncodeToString(gid[:])); err != nil {
		return nil, err
	}
	var rqpn uint32
	var rgid string
	if _, err := fmt.Fscanf(bufio.NewReader(conn), "%d %s\n", &rqpn, &rgid); err != nil {
		return nil, fmt.Errorf("peer's QP number and GID: %w", err)
	}
	b, err := hex.DecodeString(rgid)
	if err != nil || len(b) != 16 {
		return nil, fmt.Errorf("peer's GID %q", rgid)
	}
	var g verbs.GID
	copy(g[:], b)
	p.rqpn = rqpn
	p.ah, err = p.qp.PD().CreateAH(&verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: g, HopLimit: 1}, PortNum: 1})
	return conn, err
}

func (p *udPeer) run(w io.Writer, dev string, port int, server string) error {
	if err := p.setup(dev); err != nil {
		return err
	}
	conn, err := p.exchange(port, server)
	if err != nil {
		return err
	}
	defer conn.Close()
	p.send = verbs.SendWR{SGList: p.ssge[:], Opcode: verbs.WRSend,
		UD: verbs.UDWR{AH: p.ah, RemoteQPN: p.rqpn, RemoteQKey: udQKey}}
	if p.lat && p.size <= 236 {
		p.send.Flags |= verbs.SendInline
	}
	switch {
	case p.lat && server != "":
		return p.latClient(w)
	case p.lat:
		return p.latServer()
	case server != "":
		return p.bwClient(w)
	}
	return p.bwServer(w)
}

// recvOne polls the receive CQ until a message arrives (false: none
// until deadline) and reposts its buffer.
func (p *udPeer) recvOne(deadline time.Time) (bool, error) {
	for spins := 0; ; spins++ {
		k, err := p.rcq.Poll(p.wc[:1])
		if err != nil {
			return false, err
		}
		if k == 1 {
			if p.wc[0].Status != verbs.WCSuccess {
				return false, fmt.Errorf("receive completion %v", p.wc[0].Status)
			}
			return true, p.qp.PostRecv(&p.recv[p.wc[0].WRID])
		}
		if spins&1023 == 1023 && time.Now().After(deadline) {
			return false, nil
		}
	}
}

// sendOne posts one signaled send and polls its completion.
func (p *udPeer) sendOne() error {
	p.send.Flags |= verbs.SendSignaled
	if err := p.qp.PostSend(&p.send); err != nil {
		return err
	}
	for {
		k, err := p.scq.Poll(p.wc[:1])
		if err != nil {
			return err
		}
		if k == 1 {
			if p.wc[0].Status != verbs.WCSuccess {
				return fmt.Errorf("send completion %v", p.wc[0].Status)
			}
			return nil
		}
	}
}

// latClient sends a ping, waits for the pong, for the run's duration,
// and prints half the average round trip (perftest's t_avg).
func (p *udPeer) latClient(w io.Writer) error {
	start := time.Now()
	end := start.Add(p.dur)
	iters := 0
	for time.Now().Before(end) {
		if err := p.sendOne(); err != nil {
			return err
		}
		ok, err := p.recvOne(time.Now().Add(time.Second))
		if err != nil {
			return err
		}
		if ok {
			iters++
		}
	}
	el := time.Since(start)
	if iters == 0 {
		return fmt.Errorf("no round trip")
	}
	fmt.Fprintf(w, "lat %.3f %d\n", float64(el.Microseconds())/float64(iters)/2, iters)
	return nil
}

// latServer answers every ping until none came for a second.
func (p *udPeer) latServer() error {
	for {
		ok, err := p.recvOne(time.Now().Add(time.Second))
		if err != nil || !ok {
			return err
		}
		if err := p.sendOne(); err != nil {
			return err
		}
	}
}

// bwClient sends for the run's duration with udTxDepth sends
// outstanding, one in udCQMod signaled, and prints messages per second.
func (p *udPeer) bwClient(w io.Writer) error {
	start := time.Now()
	end := start.Add(p.dur)
	posted, done := 0, 0
	for {
		for posted-done < udTxDepth {
			p.send.Flags = 0
			if (posted+1)%udCQMod == 0 {
				p.send.Flags = verbs.SendSignaled
			}
			if err := p.qp.PostSend(&p.send); err != nil {
				return err
			}
			posted++
		}
		k, err := p.scq.Poll(p.wc[:])
		if err != nil {
			return err
		}
		for i := 0; i < k; i++ {
			if p.wc[i].Status != verbs.WCSuccess {
				return fmt.Errorf("send completion %v", p.wc[i].Status)
			}
			done += udCQMod
		}
		if time.Now().After(end) {
			break
		}
	}
	el := time.Since(start)
	fmt.Fprintf(w, "bw %.0f %d\n", float64(posted)/el.Seconds(), posted)
	return nil
}

// bwServer receives until nothing came for half a second and prints the
// messages per second between the first and the last.
func (p *udPeer) bwServer(w io.Writer) error {
	n := 0
	var first, last time.Time
	giveUp := time.Now().Add(p.dur + 10*time.Second)
	for spins := 0; ; spins++ {
		k, err := p.rcq.Poll(p.wc[:])
		if err != nil {
			return err
		}
		if k == 0 {
			if spins&1023 == 0 {
				if now := time.Now(); (n > 0 && now.Sub(last) > 500*time.Millisecond) || now.After(giveUp) {
					break
				}
			}
			continue
		}
		if n == 0 {
			first = time.Now()
		}
		for i := 0; i < k; i++ {
			if err := p.qp.PostRecv(&p.recv[p.wc[i].WRID]); err != nil {
				return err
			}
		}
		n += k
		last = time.Now()
	}
	if n < 2 {
		return fmt.Errorf("received %d messages", n)
	}
	fmt.Fprintf(w, "bw-rx %.0f %d\n", float64(n)/last.Sub(first).Seconds(), n)
	return nil
}
