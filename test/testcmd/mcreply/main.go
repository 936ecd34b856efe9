// Command mcreply is a test helper: an RDMA CM multicast full member that
// sends multicast requests and answers every request it receives with a
// unicast UD reply to the requester, the address handle built from the
// receive completion as an application would (the GRH area's source GID
// and the completion's source QPN; libibverbs' ibv_init_ah_from_wc refuses
// a datagram received on a multicast group). It is driven by line
// commands on stdin.
//
// Usage:
//
//	mcreply -b 127.0.0.1 -m 239.1.2.3
//
// -b is the local address to bind, -m the IP multicast group. mcreply
// resolves the group, creates a UD QP with BLOCK_SELF_MCAST_LB (it does not
// receive its own requests), posts its receives, joins as a full member and
// prints
//
//	joined qpn 0x<QPN in hex>
//
// then answers every command with exactly one line:
//
//	request N          multicast N requests (sequence numbers 0..N-1 of this
//	                   command's first) → "requested N"
//	wait N P TIMEOUT   keep answering until the requests of exactly P peers
//	                   arrived, N from each, and so did the replies of P
//	                   peers, N from each, or TIMEOUT passed → "done <counts>"
//	                   or "timeout <counts>"
//	counts             → "counts <counts>"
//	counters           the device's counters → "counters name=value ..."
//	exit               leave, tear down → "bye", exit status 0
//
// <counts> is "req <qpn>:<n>,... rep <qpn>:<n>,... dup <d> bad <b>": the
// requests received and the replies to this member's requests received by
// source QPN (hex, ascending; "-" when none), the number of datagrams
// received more than once (same source QPN and sequence number) and of
// malformed or failed completions. Replies are sent as soon as a request
// arrives, whatever command runs. End of input is treated like exit.
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
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/softrdma/softrdma/test/testcmd/peerutil"

	"github.com/softrdma/softrdma/provider/rxe"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
)

const (
	eventTimeout = 10 * time.Second
	msgLen       = 64  // payload of every send and receive
	nrecv        = 256 // receives kept posted
	nsend        = 128 // sends in flight at most
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is the whole command; it returns the exit status.
func run(args []string, in io.Reader, out, errOut io.Writer) int {
	fs := flag.NewFlagSet("mcreply", flag.ContinueOnError)
	fs.SetOutput(errOut)
	bind := fs.String("b", "", "local address to bind (required)")
	group := fs.String("m", "", "IP multicast group (required)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	src, err1 := netip.ParseAddr(*bind)
	dst, err2 := netip.ParseAddr(*group)
	if err := errors.Join(err1, err2); err != nil {
		fmt.Fprintf(errOut, "mcreply: need -b and -m addresses (%v)\n", err)
		return 2
	}
	m := &member{out: out, addr: src, src: rdmacm.UDPAddr(src), group: rdmacm.UDPAddr(dst),
		reqs: map[uint32]int{}, reps: map[uint32]int{}, seen: map[[3]uint32]bool{}}
	defer m.close()
	if err := m.setup(); err != nil {
		m.reply("err %v", err)
		return 1
	}
	m.reply("joined qpn %#x", m.qp.Num())
	cmds := make(chan string)
	go func() {
		defer close(cmds)
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			cmds <- sc.Text()
		}
	}()
	if err := m.serve(cmds); err != nil {
		m.reply("err %v", err)
		return 1
	}
	m.reply("bye")
	return 0
}

// member is the process's state: one id with its QP, buffers and counts.
type member struct {
	out   io.Writer
	addr  netip.Addr
	src   *net.UDPAddr
	group *net.UDPAddr

	ch     *rdmacm.EventChannel
	id     *rdmacm.ID
	pd     *verbs.PD
	sendCQ *verbs.CQ
	recvCQ *verbs.CQ
	qp     *verbs.QP
	recvMR *verbs.MR
	sendMR *verbs.MR
	mcAH   *verbs.AH
	qkey   uint32
	sgid   uint8 // the GID index of the bound address
	joined bool

	free   []int              // free send slots
	sendAH [nsend]*verbs.AH   // the reply AH of a send slot in flight
	seq    uint32             // next request sequence number
	reqs   map[uint32]int     // requests received by source QPN
	reps   map[uint32]int     // replies received by source QPN
	seen   map[[3]uint32]bool // (kind, source QPN, sequence)
	dup    int
	bad    int

	wait *waitSpec
}

// waitSpec is a wait command in progress.
type waitSpec struct {
	n, peers int
	deadline time.Time
}

func (m *member) reply(format string, a ...any) { fmt.Fprintf(m.out, format+"\n", a...) }

// setup creates the id, resolves the group, creates the QP, posts the
// receives and joins.
func (m *member) setup() error {
	var err error
	if m.ch, err = rdmacm.CreateEventChannel(); err != nil {
		return err
	}
	if m.id, err = rdmacm.CreateID(m.ch, m, rdmacm.PS_UDP); err != nil {
		return err
	}
	if err := m.id.ResolveAddr(m.src, m.group, 2*time.Second); err != nil {
		return err
	}
	if _, err := peerutil.Event(m.ch, rdmacm.EventAddrResolved); err != nil {
		return err
	}
	ctx := m.id.Verbs()
	if m.pd, err = ctx.AllocPD(); err != nil {
		return err
	}
	if m.sendCQ, err = ctx.CreateCQ(nsend); err != nil {
		return err
	}
	if m.recvCQ, err = ctx.CreateCQ(nrecv); err != nil {
		return err
	}
	attr := verbs.QPInitAttr{
		SendCQ:      m.sendCQ,
		RecvCQ:      m.recvCQ,
		Cap:         verbs.QPCap{MaxSendWR: nsend, MaxRecvWR: nrecv, MaxSendSGE: 1, MaxRecvSGE: 1},
		QPType:      verbs.QPTypeUD,
		CreateFlags: verbs.CreateBlockSelfMcastLB,
	}
	if err := m.id.CreateQPEx(m.pd, &attr); err != nil {
		return err
	}
	m.qp = m.id.QP()
	if m.recvMR, err = m.pd.RegMR(make([]byte, nrecv*slot), verbs.AccessLocalWrite); err != nil {
		return err
	}
	if m.sendMR, err = m.pd.RegMR(make([]byte, nsend*msgLen), verbs.AccessLocalWrite); err != nil {
		return err
	}
	for i := range nsend {
		m.free = append(m.free, i)
	}
	for i := range nrecv {
		if err := m.postRecv(uint64(i)); err != nil {
			return err
		}
	}
	jattr := rdmacm.JoinMCAttrEx{
		CompMask:  rdmacm.JoinMCAttrAddress | rdmacm.JoinMCAttrJoinFlags,
		JoinFlags: rdmacm.MCJoinFlagFullMember,
		Addr:      m.group,
	}
	if err := m.id.JoinMulticastEx(&jattr, m); err != nil {
		return err
	}
	param, err := peerutil.Event(m.ch, rdmacm.EventMulticastJoin)
	if err != nil {
		return err
	}
	m.joined = true
	if m.mcAH, err = m.pd.CreateAH(&param.AHAttr); err != nil {
		return err
	}
	m.qkey = param.QKey
	m.sgid = param.AHAttr.GRH.SGIDIndex
	return nil
}

// slot is the size of one receive buffer: the GRH area and the payload.
const slot = verbs.GRHLen + msgLen

func (m *member) postRecv(i uint64) error {
	wr := verbs.RecvWR{WRID: i, SGList: []verbs.SGE{m.recvMR.SGE(int(i)*slot, slot)}}
	return m.qp.PostRecv(&wr)
}

// serve runs commands and answers requests until exit or end of input.
func (m *member) serve(cmds <-chan string) error {
	var wc [16]verbs.WC
	for {
		if err := m.reapSends(false); err != nil {
			return err
		}
		n, err := m.recvCQ.Poll(wc[:])
		if err != nil {
			return err
		}
		for i := range wc[:n] {
			if err := m.received(&wc[i]); err != nil {
				return err
			}
		}
		m.checkWait()
		if n > 0 {
			continue
		}
		select {
		case line, ok := <-cmds:
			if !ok {
				return nil
			}
			if done, err := m.command(strings.Fields(line)); err != nil {
				m.reply("err %v", err)
			} else if done {
				return nil
			}
			continue
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		m.recvCQ.Wait(ctx) // a completion or the next look at the commands
		cancel()
	}
}

// command runs one command; done is true for exit.
func (m *member) command(f []string) (done bool, err error) {
	switch {
	case len(f) == 1 && f[0] == "exit":
		return true, nil
	case len(f) == 2 && f[0] == "request":
		n, err := strconv.Atoi(f[1])
		if err != nil || n < 0 {
			return false, fmt.Errorf("bad count %q", f[1])
		}
		for range n {
			if err := m.send(m.mcAH, verbs.MulticastQPN, fmt.Sprintf("req %d", m.seq), nil); err != nil {
				return false, err
			}
			m.seq++
		}
		m.reply("requested %d", n)
	case len(f) == 4 && f[0] == "wait":
		n, err1 := strconv.Atoi(f[1])
		p, err2 := strconv.Atoi(f[2])
		d, err3 := time.ParseDuration(f[3])
		if err := errors.Join(err1, err2, err3); err != nil {
			return false, err
		}
		m.wait = &waitSpec{n: n, peers: p, deadline: time.Now().Add(d)}
		m.checkWait()
	case len(f) == 1 && f[0] == "counts":
		m.reply("counts %s", m.counts())
	case len(f) == 1 && f[0] == "counters":
		d, err := rxe.ForAddr(m.addr)
		if err != nil {
			return false, err
		}
		c := d.Counters()
		var parts []string
		for i, desc := range softverbs.Schema() {
			parts = append(parts, fmt.Sprintf("%s=%d", desc.Name, c.Get(softverbs.Counter(i))))
		}
		m.reply("counters %s", strings.Join(parts, " "))
	default:
		return false, fmt.Errorf("unknown command %q", strings.Join(f, " "))
	}
	return false, nil
}

// checkWait answers a wait command that is complete or timed out.
func (m *member) checkWait() {
	w := m.wait
	if w == nil {
		return
	}
	full := func(by map[uint32]int) bool {
		if len(by) != w.peers {
			return false
		}
		for _, n := range by {
			if n != w.n {
				return false
			}
		}
		return true
	}
	switch {
	case full(m.reqs) && full(m.reps):
		m.reply("done %s", m.counts())
	case time.Now().After(w.deadline):
		m.reply("timeout %s", m.counts())
	default:
		return
	}
	m.wait = nil
}

func (m *member) counts() string {
	return fmt.Sprintf("req %s rep %s dup %d bad %d", peerutil.FormatCounts(m.reqs), peerutil.FormatCounts(m.reps), m.dup, m.bad)
}

// received handles one receive completion: a request is answered, a
// reply counted; the buffer is posted again.
func (m *member) received(c *verbs.WC) error {
	defer m.postRecv(c.WRID)
	if c.Status != verbs.WCSuccess || c.Opcode != verbs.WCOpRecv || c.Flags&verbs.WCGRH == 0 || int(c.ByteLen) != slot {
		m.bad++
		return nil
	}
	buf := m.recvMR.Buf()[int(c.WRID)*slot : int(c.WRID+1)*slot]
	grh, payload := buf[:verbs.GRHLen], buf[verbs.GRHLen:]
	f := strings.Fields(string(payload[:max(0, slices.Index(payload, 0))]))
	switch {
	case len(f) == 2 && f[0] == "req":
		seq, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			m.bad++
			return nil
		}
		if !m.count(0, c.SrcQP, uint32(seq), m.reqs) {
			return nil
		}
		// The reply's address: the GRH area's source, the sender's QPN.
		var dgid verbs.GID
		if grh[0]>>4 == 6 {
			copy(dgid[:], grh[8:24])
		} else {
			dgid = netip.AddrFrom16(netip.AddrFrom4([4]byte(grh[32:36])).As16()).As16()
		}
		ah, err := m.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: 1,
			GRH: verbs.GlobalRoute{DGID: dgid, SGIDIndex: m.sgid, HopLimit: 64}})
		if err != nil {
			return fmt.Errorf("reply AH to %v: %w", netip.AddrFrom16(dgid), err)
		}
		return m.send(ah, c.SrcQP, fmt.Sprintf("rep %d", seq), ah)
	case len(f) == 2 && f[0] == "rep":
		seq, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil || uint32(seq) >= m.seq {
			m.bad++
			return nil
		}
		m.count(1, c.SrcQP, uint32(seq), m.reps)
	default:
		m.bad++
	}
	return nil
}

// count records a datagram of kind from qpn with sequence number seq and
// reports whether it is the first.
func (m *member) count(kind, qpn, seq uint32, by map[uint32]int) bool {
	k := [3]uint32{kind, qpn, seq}
	if m.seen[k] {
		m.dup++
		return false
	}
	m.seen[k] = true
	by[qpn]++
	return true
}

// send posts one signaled send of text; own is destroyed on its
// completion.
func (m *member) send(ah *verbs.AH, qpn uint32, text string, own *verbs.AH) error {
	for len(m.free) == 0 {
		if err := m.reapSends(true); err != nil {
			return err
		}
	}
	i := m.free[len(m.free)-1]
	m.free = m.free[:len(m.free)-1]
	b := m.sendMR.Buf()[i*msgLen : (i+1)*msgLen]
	clear(b)
	copy(b, text)
	m.sendAH[i] = own
	wr := verbs.SendWR{
		WRID:   uint64(i),
		SGList: []verbs.SGE{m.sendMR.SGE(i*msgLen, msgLen)},
		Opcode: verbs.WRSend,
		Flags:  verbs.SendSignaled,
		UD:     verbs.UDWR{AH: ah, RemoteQPN: qpn, RemoteQKey: m.qkey},
	}
	return m.qp.PostSend(&wr)
}

// reapSends takes the send completions (waiting for one when block),
// freeing their slots.
func (m *member) reapSends(block bool) error {
	var wc [16]verbs.WC
	for {
		n, err := m.sendCQ.Poll(wc[:])
		if err != nil {
			return err
		}
		for _, c := range wc[:n] {
			if c.Status != verbs.WCSuccess {
				return fmt.Errorf("send completion %d: status %v", c.WRID, c.Status)
			}
			if ah := m.sendAH[c.WRID]; ah != nil {
				ah.Destroy()
				m.sendAH[c.WRID] = nil
			}
			m.free = append(m.free, int(c.WRID))
		}
		if n > 0 || !block {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), eventTimeout)
		err = m.sendCQ.Wait(ctx)
		cancel()
		if err != nil {
			return fmt.Errorf("send completions: %w", err)
		}
	}
}

// close leaves the group and releases every resource; errors are of no
// interest any more.
func (m *member) close() {
	if m.id != nil && m.joined {
		m.id.LeaveMulticast(m.group)
	}
	if m.qp != nil {
		m.reapSends(false)
	}
	for i, ah := range m.sendAH {
		if ah != nil {
			ah.Destroy()
			m.sendAH[i] = nil
		}
	}
	if m.mcAH != nil {
		m.mcAH.Destroy()
	}
	if m.id != nil && m.id.QP() != nil {
		m.id.DestroyQP()
	}
	for _, mr := range []*verbs.MR{m.recvMR, m.sendMR} {
		if mr != nil {
			mr.Dereg()
		}
	}
	for _, cq := range []*verbs.CQ{m.sendCQ, m.recvCQ} {
		if cq != nil {
			cq.Destroy()
		}
	}
	if m.pd != nil {
		m.pd.Dealloc()
	}
	if m.id != nil {
		m.id.Destroy()
	}
	if m.ch != nil {
		m.ch.Close()
	}
}
