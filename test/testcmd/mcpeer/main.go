// Command mcpeer is a test helper: one RDMA CM multicast member driven by
// line commands on stdin. It observes what mckey cannot — mckey senders
// post no receives — such as who receives a send-only member's datagrams,
// self-loopback with and without BLOCK_SELF_MCAST_LB, and delivery after a
// leave.
//
// Usage:
//
//	mcpeer -b 127.0.0.1 -m 239.1.2.3 [-o] [-l] [-S size] [-R receives]
//
// -b is the local address to bind, -m the IP multicast group, -o joins as a
// send-only full member, -l creates the QP with BLOCK_SELF_MCAST_LB, -S is
// the payload size of sends and receives (default 100), -R the number of
// receives kept posted (default 64).
//
// mcpeer resolves the group, creates a UD QP, posts the receives, joins and
// prints
//
//	joined qpn 0x<QPN in hex>
//
// then answers every command with exactly one line:
//
//	send N              post N signaled SEND_WITH_IMM (imm = own QPN), wait for
//	                    their completions → "sent N"
//	recv N TIMEOUT      wait until N receive completions arrived or TIMEOUT
//	                    (a Go duration) passed → "recv <got> from <qpn>:<count>,..."
//	                    counts by source QPN in hex, ascending ("-" when none);
//	                    then post the used receives again
//	quiet DURATION      wait DURATION → "quiet ok" if no receive completion
//	                    arrived, else "quiet got <n>"; then post the used
//	                    receives again
//	leave               leave the group → "left"
//	join                join it again (same flags) → "joined"
//	exit                leave, tear everything down → "bye", exit status 0
//
// The payload follows softrdma mckey's pattern (byte i is i*7+3), so an
// mckey --verify receiver accepts mcpeer's datagrams.
//
// Receive completions are checked (status success, opcode RECV, byte_len =
// 40 + size, GRH flag, imm = source QPN when present). Failures are
// answered "err <text>"; a failure during setup prints "err <text>" and
// exits with status 1. End of input is treated like exit.
package main

import (
	// Every kind of device (RoCEv2, InfiniBand, the kernel's with the rdmacore tag).
	_ "github.com/softrdma/softrdma/provider/all"

	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/softrdma/softrdma/test/testcmd/peerutil"

	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
)

// eventTimeout bounds every wait for an RDMA CM event.
const eventTimeout = 10 * time.Second

// sendBatch is the send CQ size: at most this many sends are in flight.
const sendBatch = 64

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is the whole command; it returns the exit status.
func run(args []string, in io.Reader, out, errOut io.Writer) int {
	fs := flag.NewFlagSet("mcpeer", flag.ContinueOnError)
	fs.SetOutput(errOut)
	bind := fs.String("b", "", "local address to bind (required)")
	group := fs.String("m", "", "IP multicast group (required)")
	sendOnly := fs.Bool("o", false, "join as a send-only full member")
	blockLB := fs.Bool("l", false, "create the QP with BLOCK_SELF_MCAST_LB")
	size := fs.Int("S", 100, "payload size of sends and receives")
	nrecv := fs.Int("R", 64, "number of receives kept posted")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	src, err1 := netip.ParseAddr(*bind)
	dst, err2 := netip.ParseAddr(*group)
	if err := errors.Join(err1, err2); err != nil || *size < 1 || *nrecv < 1 {
		fmt.Fprintf(errOut, "mcpeer: need -b and -m addresses, -S ≥ 1, -R ≥ 1 (%v)\n", err)
		return 2
	}
	p := &peer{
		out: out, size: *size, nrecv: *nrecv, sendOnly: *sendOnly, blockLB: *blockLB,
		src: rdmacm.UDPAddr(src), group: rdmacm.UDPAddr(dst),
	}
	defer p.close()
	if err := p.setup(); err != nil {
		p.reply("err %v", err)
		return 1
	}
	p.reply("joined qpn %#x", p.qp.Num())
	if p.serve(in) {
		p.reply("bye")
	}
	return 0
}

// peer is the member's state: one id with its QP, buffers and AH.
type peer struct {
	out      io.Writer
	size     int
	nrecv    int
	sendOnly bool
	blockLB  bool
	src      *net.UDPAddr
	group    *net.UDPAddr

	ch     *rdmacm.EventChannel
	id     *rdmacm.ID
	pd     *verbs.PD
	sendCQ *verbs.CQ
	recvCQ *verbs.CQ
	qp     *verbs.QP
	recvMR *verbs.MR
	sendMR *verbs.MR
	ah     *verbs.AH
	qkey   uint32
	joined bool
}

// reply writes one answer line.
func (p *peer) reply(format string, a ...any) {
	fmt.Fprintf(p.out, format+"\n", a...)
}

// slot is the size of one receive buffer: the GRH area and the payload.
func (p *peer) slot() int { return verbs.GRHLen + p.size }

// setup creates the id, resolves the group, creates the QP, posts the
// receives and joins.
func (p *peer) setup() error {
	var err error
	if p.ch, err = rdmacm.CreateEventChannel(); err != nil {
		return err
	}
	if p.id, err = rdmacm.CreateID(p.ch, p, rdmacm.PS_UDP); err != nil {
		return err
	}
	if err := p.id.ResolveAddr(p.src, p.group, 2*time.Second); err != nil {
		return err
	}
	if _, err := peerutil.Event(p.ch, rdmacm.EventAddrResolved); err != nil {
		return err
	}
	ctx := p.id.Verbs()
	if p.pd, err = ctx.AllocPD(); err != nil {
		return err
	}
	if p.sendCQ, err = ctx.CreateCQ(sendBatch); err != nil {
		return err
	}
	if p.recvCQ, err = ctx.CreateCQ(p.nrecv); err != nil {
		return err
	}
	attr := verbs.QPInitAttr{
		Context: p,
		SendCQ:  p.sendCQ,
		RecvCQ:  p.recvCQ,
		Cap:     verbs.QPCap{MaxSendWR: sendBatch, MaxRecvWR: p.nrecv, MaxSendSGE: 1, MaxRecvSGE: 1},
		QPType:  verbs.QPTypeUD,
	}
	if p.blockLB {
		attr.CreateFlags = verbs.CreateBlockSelfMcastLB
	}
	if err := p.id.CreateQPEx(p.pd, &attr); err != nil {
		return err
	}
	p.qp = p.id.QP()
	if p.recvMR, err = p.pd.RegMR(make([]byte, p.nrecv*p.slot()), verbs.AccessLocalWrite); err != nil {
		return err
	}
	payload := make([]byte, p.size)
	for i := range payload {
		payload[i] = byte(i*7 + 3) // mckey's pattern: an mckey --verify receiver accepts it
	}
	if p.sendMR, err = p.pd.RegMR(payload, verbs.AccessLocalWrite); err != nil {
		return err
	}
	for i := 0; i < p.nrecv; i++ {
		if err := p.postRecv(uint64(i)); err != nil {
			return err
		}
	}
	return p.join()
}

// postRecv posts the receive buffer slot i.
func (p *peer) postRecv(i uint64) error {
	wr := verbs.RecvWR{WRID: i, SGList: []verbs.SGE{p.recvMR.SGE(int(i)*p.slot(), p.slot())}}
	return p.qp.PostRecv(&wr)
}

// join joins the group and waits for the JOIN event; the QP is attached
// when the event is read (full members only). The first join creates the AH.
func (p *peer) join() error {
	flags := rdmacm.MCJoinFlagFullMember
	if p.sendOnly {
		flags = rdmacm.MCJoinFlagSendOnlyFullMember
	}
	attr := rdmacm.JoinMCAttrEx{
		CompMask:  rdmacm.JoinMCAttrAddress | rdmacm.JoinMCAttrJoinFlags,
		JoinFlags: flags,
		Addr:      p.group,
	}
	if err := p.id.JoinMulticastEx(&attr, p); err != nil {
		return err
	}
	param, err := peerutil.Event(p.ch, rdmacm.EventMulticastJoin)
	if err != nil {
		// The join record exists; drop it so that a later join starts clean.
		p.id.LeaveMulticast(p.group)
		return err
	}
	p.joined = true
	if p.ah == nil {
		if p.ah, err = p.pd.CreateAH(&param.AHAttr); err != nil {
			return err
		}
		p.qkey = param.QKey
	}
	return nil
}

// serve answers commands until exit or end of input; it reports whether
// the exit command ended it.
func (p *peer) serve(in io.Reader) bool {
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if f[0] == "exit" && len(f) == 1 {
			return true
		}
		if err := p.command(f); err != nil {
			p.reply("err %v", err)
		}
	}
	return false
}

// command runs one command other than exit and writes its answer.
func (p *peer) command(f []string) error {
	switch {
	case f[0] == "send" && len(f) == 2:
		n, err := count(f[1])
		if err != nil {
			return err
		}
		if err := p.send(n); err != nil {
			return err
		}
		p.reply("sent %d", n)
	case f[0] == "recv" && len(f) == 3:
		n, err := count(f[1])
		if err != nil {
			return err
		}
		d, err := time.ParseDuration(f[2])
		if err != nil {
			return err
		}
		by, got, err := p.receive(n, d)
		if err != nil {
			return err
		}
		p.reply("recv %d from %s", got, peerutil.FormatCounts(by))
	case f[0] == "quiet" && len(f) == 2:
		d, err := time.ParseDuration(f[1])
		if err != nil {
			return err
		}
		_, got, err := p.receive(-1, d)
		if err != nil {
			return err
		}
		if got == 0 {
			p.reply("quiet ok")
		} else {
			p.reply("quiet got %d", got)
		}
	case f[0] == "leave" && len(f) == 1:
		if !p.joined {
			return errors.New("not joined")
		}
		if err := p.id.LeaveMulticast(p.group); err != nil {
			return err
		}
		p.joined = false
		p.reply("left")
	case f[0] == "join" && len(f) == 1:
		if p.joined {
			return errors.New("already joined")
		}
		if err := p.join(); err != nil {
			return err
		}
		p.reply("joined")
	default:
		return fmt.Errorf("unknown command %q", strings.Join(f, " "))
	}
	return nil
}

// count parses a non-negative message count.
func count(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bad count %q", s)
	}
	return n, nil
}

// send posts n signaled SEND_WITH_IMM requests to the group, at most
// sendBatch at a time, and waits for every completion.
func (p *peer) send(n int) error {
	wr := verbs.SendWR{
		SGList:  []verbs.SGE{p.sendMR.SGE(0, p.size)},
		Opcode:  verbs.WRSendWithImm,
		Flags:   verbs.SendSignaled,
		ImmData: p.qp.Num(),
		UD:      verbs.UDWR{AH: p.ah, RemoteQPN: rdmacm.MulticastQPN, RemoteQKey: p.qkey},
	}
	var wc [sendBatch]verbs.WC
	for done := 0; done < n; {
		k := min(n-done, sendBatch)
		for i := 0; i < k; i++ {
			wr.WRID = uint64(done + i)
			if err := p.qp.PostSend(&wr); err != nil {
				return fmt.Errorf("post send %d: %w", done+i, err)
			}
		}
		for got := 0; got < k; {
			m, err := poll(p.sendCQ, wc[:k-got], eventTimeout)
			if err != nil {
				return fmt.Errorf("send completions: %d of %d: %w", done+got, n, err)
			}
			for _, c := range wc[:m] {
				if c.Status != verbs.WCSuccess || c.Opcode != verbs.WCOpSend {
					return fmt.Errorf("send completion %d: status %v opcode %d", c.WRID, c.Status, c.Opcode)
				}
			}
			got += m
		}
		done += k
	}
	return nil
}

// receive collects receive completions until n arrived (n < 0: never) or
// d passed, checks them and counts them by source QPN; it never consumes
// more than n completions. The consumed receives are posted again at the
// end, so that during one command at most the posted receives can be
// filled, however the datagrams are spread in time.
func (p *peer) receive(n int, d time.Duration) (by map[uint32]int, got int, err error) {
	by = map[uint32]int{}
	var repost []uint64
	defer func() {
		for _, i := range repost {
			if e := p.postRecv(i); e != nil && err == nil {
				err = fmt.Errorf("repost receive %d: %w", i, e)
			}
		}
	}()
	deadline := time.Now().Add(d)
	var wc [16]verbs.WC
	for n < 0 || got < n {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		want := len(wc)
		if n >= 0 {
			want = min(want, n-got)
		}
		m, err := poll(p.recvCQ, wc[:want], left)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				break
			}
			return nil, 0, err
		}
		for _, c := range wc[:m] {
			repost = append(repost, c.WRID)
			if err := p.check(&c); err != nil {
				return nil, 0, err
			}
			by[c.SrcQP]++
			got++
		}
	}
	return by, got, nil
}

// check verifies one receive completion.
func (p *peer) check(c *verbs.WC) error {
	switch {
	case c.Status != verbs.WCSuccess:
		return fmt.Errorf("receive completion: status %v", c.Status)
	case c.Opcode != verbs.WCOpRecv:
		return fmt.Errorf("receive completion: opcode %d", c.Opcode)
	case int(c.ByteLen) != p.slot():
		return fmt.Errorf("receive completion: byte_len %d, want %d", c.ByteLen, p.slot())
	case c.Flags&verbs.WCGRH == 0:
		return errors.New("receive completion: no GRH flag")
	case c.Flags&verbs.WCWithImm != 0 && c.ImmData != c.SrcQP:
		return fmt.Errorf("receive completion: imm %#x from QP %#x", c.ImmData, c.SrcQP)
	case c.QPNum != p.qp.Num():
		return fmt.Errorf("receive completion: qp_num %#x, want %#x", c.QPNum, p.qp.Num())
	}
	return nil
}

// poll waits up to d for at least one completion of cq and moves up to
// len(wc) of them into wc.
func poll(cq *verbs.CQ, wc []verbs.WC, d time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		m, err := cq.Poll(wc)
		if err != nil || m > 0 {
			return m, err
		}
		if err := cq.Wait(ctx); err != nil {
			return 0, err
		}
	}
}

// close leaves the group and releases every resource, in reverse order of
// creation; errors are of no interest any more.
func (p *peer) close() {
	if p.id != nil && p.joined {
		p.id.LeaveMulticast(p.group)
		p.joined = false
	}
	if p.ah != nil {
		p.ah.Destroy()
	}
	if p.id != nil && p.id.QP() != nil {
		p.id.DestroyQP()
	}
	for _, mr := range []*verbs.MR{p.recvMR, p.sendMR} {
		if mr != nil {
			mr.Dereg()
		}
	}
	for _, cq := range []*verbs.CQ{p.sendCQ, p.recvCQ} {
		if cq != nil {
			cq.Destroy()
		}
	}
	if p.pd != nil {
		p.pd.Dealloc()
	}
	if p.id != nil {
		p.id.Destroy()
	}
	if p.ch != nil {
		p.ch.Close()
	}
}
