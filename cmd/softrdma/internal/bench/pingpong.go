package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
)

// The latency part's two processes: a pinger sends to group A and waits
// for the reply on group B; the ponger waits on A and answers on B. Each
// message carries the ping's sequence number in its first 8 bytes, which
// the reply echoes and the pinger checks. A process is a plain UDP program
// (raw system calls: blocking recvfrom, or a busy MSG_DONTWAIT loop) or an
// RDMA CM program (GetRecvComp, or a busy CQ.Poll loop).

// Wait modes of the latency part.
const (
	WaitBlock = "block" // blocking recvfrom / rdma_get_recv_comp
	WaitPoll  = "poll"  // busy non-blocking recvfrom / ibv_poll_cq
)

// rttTimeout is how long a pinger waits for one reply before it counts
// the round trip lost and sends the next ping.
const rttTimeout = 500 * time.Millisecond

// pingPeer is one side of a ping-pong: send a message, receive one.
type pingPeer interface {
	// send sends buf's first size bytes (seq in the first 8).
	send(seq uint64) error
	// recv waits up to rttTimeout for a message and returns its sequence
	// number (ok false: timed out).
	recv() (seq uint64, ok bool, err error)
	close()
}

// newPingPeer opens one side: it listens on group in and sends to group
// out, in mode "udp", "rdma" or "ib", waiting as wait says.
func newPingPeer(req *rxRequest) (pingPeer, error) {
	in, err := netip.ParseAddr(req.Group)
	if err != nil {
		return nil, err
	}
	out, err := netip.ParseAddr(req.Group2)
	if err != nil {
		return nil, err
	}
	bind, err := netip.ParseAddr(req.Bind)
	if err != nil {
		return nil, err
	}
	if req.Wait != WaitBlock && req.Wait != WaitPoll {
		return nil, fmt.Errorf("unknown wait %q", req.Wait)
	}
	size := max(req.Size, 8)
	switch req.Mode {
	case "udp":
		port := uint16(udpPort)
		if req.Port != 0 {
			port = req.Port
		}
		return newUDPPeer(bind, in, out, port, size, req.Wait == WaitPoll)
	case "rdma", "ib":
		if req.Mode == "ib" {
			if _, err := ibPort(req.SM, bind); err != nil {
				return nil, err
			}
		}
		return newCMPeer(bind, in, out, size, req.Wait == WaitPoll)
	}
	return nil, fmt.Errorf("unknown mode %q", req.Mode)
}

// runPing makes warmup+count round trips and returns the round-trip times
// of the last count (lost: round trips without a reply in rttTimeout).
func runPing(p pingPeer, warmup, count int) (rtts []int64, lost int, err error) {
	rtts = make([]int64, 0, count)
	var seq uint64
	for i := 0; i < warmup+count; i++ {
		seq++
		t0 := time.Now()
		if err := p.send(seq); err != nil {
			return rtts, lost, err
		}
		for {
			got, ok, err := p.recv()
			if err != nil {
				return rtts, lost, err
			}
			if !ok {
				lost++
				break
			}
			if got != seq {
				continue // a late reply to a ping counted lost
			}
			if i >= warmup {
				rtts = append(rtts, int64(time.Since(t0)))
			}
			break
		}
		if lost > count/10+3 {
			return rtts, lost, fmt.Errorf("%d replies lost", lost)
		}
	}
	return rtts, lost, nil
}

// stopSeq is the sequence number of the pinger's last message: the
// ponger stops without answering it.
const stopSeq = ^uint64(0)

// runPong answers every ping with its sequence number until ctx ends or
// the pinger says stop.
func runPong(ctx context.Context, p pingPeer) (int, error) {
	n := 0
	for ctx.Err() == nil {
		seq, ok, err := p.recv()
		if err != nil {
			return n, err
		}
		if !ok {
			continue
		}
		if seq == stopSeq {
			break
		}
		if err := p.send(seq); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// udpPeer is the baseline: two plain UDP sockets driven with raw system
// calls, as a C program would (a blocking socket with SO_RCVTIMEO, or a
// non-blocking one polled).
type udpPeer struct {
	rfd, sfd int
	poll     bool
	dst      unix.RawSockaddrInet4
	sbuf     []byte
	rbuf     []byte
}

func newUDPPeer(bind, in, out netip.Addr, port uint16, size int, poll bool) (*udpPeer, error) {
	ifindex, err := ifindexOf(bind)
	if err != nil {
		return nil, err
	}
	p := &udpPeer{rfd: -1, sfd: -1, poll: poll, sbuf: make([]byte, size), rbuf: make([]byte, size+64)}
	fail := func(err error) (*udpPeer, error) { p.close(); return nil, err }
	if p.rfd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP); err != nil {
		return fail(err)
	}
	tv := unix.NsecToTimeval(int64(rttTimeout))
	for _, o := range [][3]int{
		{unix.SOL_SOCKET, unix.SO_REUSEPORT, 1}, // as the devices' sockets: they share 4791
		{unix.IPPROTO_IP, unix.IP_MULTICAST_ALL, 0},
	} {
		if err := unix.SetsockoptInt(p.rfd, o[0], o[1], o[2]); err != nil {
			return fail(err)
		}
	}
	if err := unix.SetsockoptTimeval(p.rfd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fail(err)
	}
	if err := unix.Bind(p.rfd, &unix.SockaddrInet4{Port: int(port)}); err != nil {
		return fail(err)
	}
	if err := unix.SetsockoptIPMreqn(p.rfd, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP,
		&unix.IPMreqn{Multiaddr: in.As4(), Ifindex: int32(ifindex)}); err != nil {
		return fail(err)
	}
	if p.sfd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP); err != nil {
		return fail(err)
	}
	if err := unix.SetsockoptIPMreqn(p.sfd, unix.IPPROTO_IP, unix.IP_MULTICAST_IF,
		&unix.IPMreqn{Address: bind.As4(), Ifindex: int32(ifindex)}); err != nil {
		return fail(err)
	}
	if err := unix.SetsockoptInt(p.sfd, unix.IPPROTO_IP, unix.IP_MULTICAST_LOOP, 1); err != nil {
		return fail(err)
	}
	p.dst.Family = unix.AF_INET
	p.dst.Addr = out.As4()
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&p.dst.Port))[:], port)
	return p, nil
}

func (p *udpPeer) send(seq uint64) error {
	binary.LittleEndian.PutUint64(p.sbuf, seq)
	for {
		_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(p.sfd), uintptr(unsafe.Pointer(&p.sbuf[0])), uintptr(len(p.sbuf)),
			0, uintptr(unsafe.Pointer(&p.dst)), unix.SizeofSockaddrInet4)
		switch e {
		case 0:
			return nil
		case unix.EINTR, unix.ENOBUFS:
			continue
		}
		return e
	}
}

func (p *udpPeer) recv() (uint64, bool, error) {
	var n uintptr
	var e syscall.Errno
	if p.poll {
		deadline := time.Now().Add(rttTimeout)
		for i := 0; ; i++ {
			n, _, e = unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(p.rfd), uintptr(unsafe.Pointer(&p.rbuf[0])), uintptr(len(p.rbuf)),
				unix.MSG_DONTWAIT, 0, 0)
			if e != unix.EAGAIN {
				break
			}
			if i&1023 == 1023 && time.Now().After(deadline) {
				return 0, false, nil
			}
		}
	} else {
		n, _, e = unix.Syscall6(unix.SYS_RECVFROM, uintptr(p.rfd), uintptr(unsafe.Pointer(&p.rbuf[0])), uintptr(len(p.rbuf)), 0, 0, 0)
		if e == unix.EAGAIN { // SO_RCVTIMEO
			return 0, false, nil
		}
	}
	if e == unix.EINTR {
		return 0, false, nil
	}
	if e != 0 {
		return 0, false, e
	}
	if n < 8 {
		return 0, false, fmt.Errorf("short datagram of %d bytes", n)
	}
	return binary.LittleEndian.Uint64(p.rbuf), true, nil
}

func (p *udpPeer) close() {
	for _, fd := range []int{p.rfd, p.sfd} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// cmPeer is an RDMA CM program: one UD id bound to the local address, its
// QP's CQs made by the CM (with completion channels, as librdmacm's), a
// full-member join of the group it listens on and a send-only join of the
// group it sends to. It waits with GetRecvComp (blocking) or polls the
// receive CQ in a loop; a send is signaled and its completion reaped with
// GetSendComp (there at once on softrdma's devices).
type cmPeer struct {
	ch      *rdmacm.EventChannel
	id      *rdmacm.ID
	mr      *verbs.MR
	buf     []byte
	in, out netip.Addr
	joined  []netip.Addr
	ah      *verbs.AH
	qkey    uint32
	size    int
	poll    bool
	slots   int
	swr     verbs.SendWR
	sge     [1]verbs.SGE
	rwr     verbs.RecvWR
	rsge    [1]verbs.SGE
	wc      [1]verbs.WC
	stall   *stallWatch // the blocking waits' timeout
}

// cmRecvSlots is the number of receive WRs a peer keeps posted.
const cmRecvSlots = 16

func newCMPeer(bind, in, out netip.Addr, size int, poll bool) (_ *cmPeer, err error) {
	p := &cmPeer{in: in, out: out, size: size, poll: poll, slots: cmRecvSlots}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if p.ch, err = rdmacm.CreateEventChannel(); err != nil {
		return nil, err
	}
	if p.id, err = rdmacm.CreateID(p.ch, nil, rdmacm.PS_UDP); err != nil {
		return nil, err
	}
	if err = p.id.BindAddr(rdmacm.UDPAddr(bind)); err != nil {
		return nil, fmt.Errorf("bind %v: %w", bind, err)
	}
	if err = p.id.CreateQP(nil, &verbs.QPInitAttr{QPType: verbs.QPTypeUD,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: p.slots, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return nil, fmt.Errorf("create qp: %w", err)
	}
	slot := verbs.GRHLen + size
	// A send slot, then the receive slots.
	p.buf = make([]byte, (1+p.slots)*slot)
	if p.mr, err = p.id.RegMsgs(p.buf); err != nil {
		return nil, err
	}
	for i := 1; i <= p.slots; i++ {
		if err = p.id.PostRecv(uint64(i), p.mr, i*slot, slot); err != nil {
			return nil, err
		}
	}
	ep := &endpoint{ch: p.ch, id: p.id}
	if err = ep.joinRecv(in); err != nil {
		return nil, err
	}
	p.joined = append(p.joined, in)
	if p.ah, p.qkey, err = ep.join(out, true); err != nil {
		return nil, err
	}
	p.joined = append(p.joined, out)
	p.sge[0] = p.mr.SGE(0, size)
	p.swr = verbs.SendWR{SGList: p.sge[:], Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		UD: verbs.UDWR{AH: p.ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: p.qkey}}
	p.rwr.SGList = p.rsge[:]
	if !poll {
		p.stall = newStallWatch()
	}
	return p, nil
}

func (p *cmPeer) send(seq uint64) error {
	binary.LittleEndian.PutUint64(p.buf, seq)
	p.swr.WRID = seq
	if err := p.id.QP().PostSend(&p.swr); err != nil {
		return err
	}
	if p.poll {
		cq := p.id.SendCQ()
		for {
			n, err := cq.Poll(p.wc[:])
			if err != nil {
				return err
			}
			if n == 1 {
				break
			}
		}
	} else {
		ctx := p.stall.begin()
		wc, err := p.id.GetSendComp(ctx)
		if p.stall.end(ctx) && err != nil {
			return fmt.Errorf("no send completion in %v", rttTimeout)
		}
		if err != nil {
			return err
		}
		p.wc[0] = wc
	}
	if p.wc[0].Status != verbs.WCSuccess {
		return fmt.Errorf("send completion: %v", p.wc[0].Status)
	}
	return nil
}

func (p *cmPeer) recv() (uint64, bool, error) {
	var wc verbs.WC
	if p.poll {
		cq := p.id.RecvCQ()
		deadline := time.Now().Add(rttTimeout)
		for i := 0; ; i++ {
			n, err := cq.Poll(p.wc[:])
			if err != nil {
				return 0, false, err
			}
			if n == 1 {
				wc = p.wc[0]
				break
			}
			if i&1023 == 1023 && time.Now().After(deadline) {
				return 0, false, nil
			}
		}
	} else {
		ctx := p.stall.begin()
		var err error
		wc, err = p.id.GetRecvComp(ctx)
		if p.stall.end(ctx) && err != nil {
			return 0, false, nil // timed out
		}
		if err != nil {
			return 0, false, err
		}
	}
	if wc.Status != verbs.WCSuccess {
		return 0, false, fmt.Errorf("receive completion: %v", wc.Status)
	}
	slot := verbs.GRHLen + p.size
	i := int(wc.WRID)
	if i < 1 || i > p.slots || int(wc.ByteLen) < verbs.GRHLen+8 {
		return 0, false, fmt.Errorf("receive completion: wr_id %d, %d bytes", wc.WRID, wc.ByteLen)
	}
	seq := binary.LittleEndian.Uint64(p.buf[i*slot+verbs.GRHLen:])
	if err := p.id.PostRecv(wc.WRID, p.mr, i*slot, slot); err != nil {
		return 0, false, err
	}
	return seq, true, nil
}

func (p *cmPeer) close() {
	if p.stall != nil {
		p.stall.close()
	}
	for _, g := range p.joined {
		p.id.LeaveMulticast(rdmacm.UDPAddr(g))
	}
	if p.ah != nil {
		p.ah.Destroy()
	}
	if p.mr != nil {
		p.mr.Dereg()
	}
	if p.id != nil {
		if p.id.QP() != nil {
			p.id.DestroyQP()
		}
		p.id.Destroy()
	}
	if p.ch != nil {
		p.ch.Close()
	}
	runtime.KeepAlive(p.buf)
}

// ponger is a running "pong".
type ponger struct {
	peer   pingPeer
	cancel context.CancelFunc
	done   chan struct{}
	n      int
	err    error
}

func startPong(req *rxRequest) (*ponger, error) {
	peer, err := newPingPeer(req)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &ponger{peer: peer, cancel: cancel, done: make(chan struct{})}
	runtime.GC() // as testing.B does before a benchmark: not during it
	go func() {
		defer close(p.done)
		p.n, p.err = runPong(ctx, peer)
	}()
	return p, nil
}

// stop ends the ponger (at once after the pinger's stop message, else
// within rttTimeout) and returns how many pings it answered.
func (p *ponger) stop() (int, string) {
	p.cancel()
	<-p.done
	p.peer.close()
	if p.err != nil {
		return p.n, p.err.Error()
	}
	return p.n, ""
}

// ping runs a "ping" request: it opens its side, makes the round trips,
// tells the ponger to stop and closes.
func ping(req *rxRequest) rxReply {
	var rep rxReply
	peer, err := newPingPeer(req)
	if err != nil {
		rep.Err = err.Error()
		return rep
	}
	defer peer.close()
	runtime.GC()
	rep.RTTs, rep.Lost, err = runPing(peer, req.Warmup, req.Count)
	if err != nil {
		rep.Err = err.Error()
	}
	if err := peer.send(stopSeq); err != nil && rep.Err == "" {
		rep.Err = err.Error()
	}
	return rep
}
