package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/capture"
	"github.com/softrdma/softrdma/introspect"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
)

// config holds the parsed command line.
type config struct {
	connections  int
	messageSize  int
	messageCount int
	sender       bool
	unmapped     bool
	dst, src     string
	ps           rdmacm.PortSpace
	sendOnly     bool
	loopback     bool

	iface     string
	timeout   time.Duration
	noImm     bool
	verify    bool
	joinPause time.Duration
	pcap      string
}

type node struct {
	id        int
	cm        *rdmacm.ID
	connected bool
	pd        *verbs.PD
	cq        *verbs.CQ
	mr        *verbs.MR
	ah        *verbs.AH
	remoteQPN uint32
	remoteQK  uint32
	mem       []byte
	drops0    []uint64 // the device's counters when the receives (or sends) were posted (dropHint, sendDropHint)
}

type mckey struct {
	ctx          context.Context // canceled by SIGINT/SIGTERM
	cfg          config
	out, errOut  io.Writer
	channel      *rdmacm.EventChannel
	nodes        []*node
	connectsLeft int
	sendFailed   int // the status of failed sends (sendErrors), which survives the leaves
	dstAddr      net.Addr
	srcAddr      net.Addr
	// watch sees the group's datagrams on every interface of the host
	// while a RoCE receiver with --timeout waits (dropHint).
	watch *groupWatch
	// resolver looks up host names (nil: net.DefaultResolver); dnsDial
	// reaches the name servers when lookupError asks again (nil: a
	// net.Dialer). Tests point both at a fake name server.
	resolver *net.Resolver
	dnsDial  func(ctx context.Context, network, addr string) (net.Conn, error)
}

// atoi is C's atoi: leading white space, sign and digits; 0 otherwise.
func atoi(s string) int {
	s = strings.TrimLeft(s, " \t\n")
	end := 0
	for end < len(s) && (s[end] >= '0' && s[end] <= '9' || end == 0 && (s[end] == '-' || s[end] == '+')) {
		end++
	}
	n, _ := strconv.ParseInt(s[:end], 10, 32)
	return int(n)
}

// strtol0 is strtol(s, NULL, 0) for the port space.
func strtol0(s string) int64 {
	s = strings.TrimSpace(s)
	for end := len(s); end > 0; end-- {
		if n, err := strconv.ParseInt(s[:end], 0, 64); err == nil {
			return n
		}
	}
	return 0
}

// strerror renders an error the way glibc's strerror renders its errno
// (perror after a call that set none prints "Success").
func strerror(err error) string {
	if err == nil {
		return "Success"
	}
	var e syscall.Errno
	if !errors.As(err, &e) {
		return err.Error()
	}
	s := e.Error()
	if strings.HasPrefix(s, "errno ") {
		return "Unknown error " + strconv.Itoa(int(e))
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// errnoRet turns an error into the C return value of the failing call (-1).
func errnoRet(err error) int {
	if err == nil {
		return 0
	}
	return -1
}

// optString is rdma-core's mckey's getopt option string.
const optString = "m:M:sb:c:C:S:p:ol"

// longOpts returns the extensions' long options (see extensions).
func longOpts() []longOpt {
	return []longOpt{
		{"iface", true}, {"timeout", true}, {"no-imm", false}, {"verify", false}, {"join-pause", true}, {"pcap", true},
	}
}

// runContext is mckey with its arguments (args[0] is the program name),
// returning the exit status; when ctx is canceled (by a signal) mckey stops
// waiting, leaves its groups and returns.
func runContext(ctx context.Context, args []string, out, errOut io.Writer) int {
	cfg := config{connections: 1, messageSize: 100, messageCount: 10, ps: rdmacm.PS_UDP, loopback: true, joinPause: 3 * time.Second}
	// rdma-core's mckey ignores non-option arguments; glibc's getopt
	// permutes them behind the options unless POSIXLY_CORRECT is set (to
	// anything, even "").
	_, posix := os.LookupEnv("POSIXLY_CORRECT")
	opts, _, err := getopt(args[1:], optString, longOpts(), posix)
	if err != nil {
		fmt.Fprintf(errOut, "%s: %v\n", args[0], err)
		usage(out, args[0])
		return 1
	}
	for _, o := range opts {
		var perr error
		switch o.name {
		case "m":
			cfg.dst = o.arg
		case "M":
			cfg.unmapped, cfg.dst = true, o.arg
		case "s":
			cfg.sender = true
		case "b":
			cfg.src = o.arg
		case "c":
			cfg.connections = atoi(o.arg)
		case "C":
			cfg.messageCount = atoi(o.arg)
		case "S":
			cfg.messageSize = atoi(o.arg)
		case "p":
			cfg.ps = rdmacm.PortSpace(strtol0(o.arg))
		case "o":
			cfg.sendOnly = true
		case "l":
			cfg.loopback = false
		case "iface":
			cfg.iface = o.arg
		case "timeout":
			cfg.timeout, perr = parseDuration(o.arg)
		case "no-imm":
			cfg.noImm = true
		case "verify":
			cfg.verify = true
		case "join-pause":
			cfg.joinPause, perr = parseDuration(o.arg)
		case "pcap":
			cfg.pcap = o.arg
		}
		if perr != nil {
			fmt.Fprintf(errOut, "%s: --%s: %v\n", args[0], o.name, perr)
			usage(out, args[0])
			return 1
		}
	}
	if cfg.iface != "" && cfg.src == "" {
		a, err := ifaceAddr(cfg.iface)
		if err != nil {
			fmt.Fprintf(errOut, "mckey: --iface %s: %v\n", cfg.iface, err)
			return 1
		}
		cfg.src = a
	}
	if cfg.unmapped && cfg.src == "" {
		fmt.Fprintf(out, "unmapped multicast address requires binding to source address\n")
		return 1
	}
	if cfg.unmapped {
		// rdma-core would join MGID :: after inet_pton failed.
		if _, err := verbs.ParseGID(cfg.dst); err != nil {
			fmt.Fprintf(errOut, "mckey: -M %s: not an IPv6 address (an MGID such as ff12:401b::1)\n", cfg.dst)
			return 1
		}
	}
	// Observability (extensions): SOFTRDMA_DEBUG_ADDR / SOFTRDMA_LOG, --pcap.
	stopIntrospect, err := introspect.FromEnv()
	if err != nil {
		fmt.Fprintf(errOut, "mckey: %v\n", err)
	}
	defer stopIntrospect()
	if cfg.pcap != "" {
		stopCapture, err := startCapture(cfg.pcap)
		if err != nil {
			fmt.Fprintf(errOut, "mckey: --pcap %s: %v\n", cfg.pcap, err)
			return 1
		}
		defer stopCapture()
	}
	t := &mckey{ctx: ctx, cfg: cfg, out: out, errOut: errOut, connectsLeft: cfg.connections}
	t.channel, err = rdmacm.CreateEventChannel()
	if err != nil {
		fmt.Fprintf(errOut, "failed to create RDMA CM event channel: %s\n", strerror(err))
		why(errOut, err)
		return 1
	}
	defer t.channel.Close()
	if cfg.connections < 0 {
		// rdma-core's malloc of a negative count fails.
		fmt.Fprintf(out, "mckey: unable to allocate memory for test nodes\n")
		return 1
	}
	if err := t.allocNodes(); err != nil {
		// rdma-core exits silently here; say why.
		fmt.Fprintf(errOut, "mckey: rdma_create_id (port space %#x): %s\n", int(cfg.ps), strerror(err))
		why(errOut, err)
		return 1
	}
	ret := t.run()
	if ctx.Err() != nil {
		// Interrupted: the groups are left; the caller dies of the signal.
		t.watch.stop()
		t.destroyNodes()
		fmt.Fprintf(errOut, "mckey: interrupted: left %d group(s)\n", len(t.nodes))
		return ret
	}
	fmt.Fprintf(out, "test complete\n")
	t.watch.stop()
	t.destroyNodes()
	fmt.Fprintf(out, "return status %d\n", ret)
	return ret
}

// parseDuration parses a duration flag; negative durations are refused.
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err == nil && d < 0 {
		err = fmt.Errorf("negative duration %s", s)
	}
	return d, err
}

// ifaceAddr returns the first IPv4 (else IPv6) address of an interface.
func ifaceAddr(name string) (string, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return "", err
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return "", err
	}
	var v6 string
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			if p.Addr().Is4() {
				return p.Addr().String(), nil
			}
			if v6 == "" {
				v6 = p.Addr().String()
			}
		}
	}
	if v6 != "" {
		return v6, nil
	}
	return "", fmt.Errorf("no address on %s", name)
}

func (t *mckey) allocNodes() error {
	for i := 0; i < t.cfg.connections; i++ {
		n := &node{id: i}
		id, err := rdmacm.CreateID(t.channel, n, t.cfg.ps)
		if err != nil {
			for _, m := range t.nodes {
				m.cm.Destroy()
			}
			t.nodes = nil
			return err
		}
		n.cm = id
		t.nodes = append(t.nodes, n)
	}
	return nil
}

func (t *mckey) connectError() { t.connectsLeft-- }

// getAddr is getaddrinfo(host, NULL, NULL, ...): numeric addresses, or a
// host name through the resolver. A failure prints gai_strerror's text for
// it; the error value is the EAI code (see lookupError).
func (t *mckey) getAddr(host string) (net.Addr, int) {
	if a, err := netip.ParseAddr(host); err == nil {
		return &net.UDPAddr{IP: a.AsSlice(), Zone: a.Zone()}, 0
	}
	code := eaiNoName // getaddrinfo(NULL, NULL, …): no -m
	if host != "" {
		ips, err := t.resolverOrDefault().LookupIP(t.ctx, "ip", host)
		if err == nil && len(ips) > 0 {
			return &net.UDPAddr{IP: ips[0]}, 0
		}
		code = t.lookupError(host, err)
	}
	fmt.Fprintf(t.out, "getaddrinfo failed (%s) - invalid hostname or IP address\n", gaiStrerror(code))
	return nil, code
}

func (t *mckey) run() int {
	cfg := &t.cfg
	role := "server"
	if cfg.sender {
		role = "client"
	}
	fmt.Fprintf(t.out, "mckey: starting %s\n", role)
	if cfg.src != "" {
		a, ret := t.getAddr(cfg.src)
		if ret != 0 {
			return ret
		}
		t.srcAddr = a
	}
	if cfg.unmapped {
		ib := &rdmacm.IBAddr{}
		if g, err := verbs.ParseGID(cfg.dst); err == nil {
			ib.GID = g
		}
		t.dstAddr = ib
	} else {
		a, ret := t.getAddr(cfg.dst)
		if ret != 0 {
			return ret
		}
		t.dstAddr = a
	}
	fmt.Fprintf(t.out, "mckey: joining\n")
	for _, n := range t.nodes {
		if t.srcAddr != nil {
			if err := n.cm.BindAddr(t.srcAddr); err != nil {
				fmt.Fprintf(t.errOut, "mckey: addr bind failure: %s\n", strerror(err))
				t.bindHint(err)
				t.connectError()
				return -1
			}
		}
		var ret int
		var err error
		if cfg.unmapped {
			ret, err = t.addrHandler(n)
		} else {
			err = n.cm.ResolveAddr(t.srcAddr, t.dstAddr, 2000*time.Millisecond)
			ret = errnoRet(err)
		}
		if ret != 0 {
			fmt.Fprintf(t.errOut, "mckey: resolve addr failure: %s\n", strerror(err))
			t.joinHint(err)
			t.resolveHint(err)
			t.connectError()
			return ret
		}
	}
	ret := t.connectEvents()
	var ext int // a failure of an extension (--timeout, --verify) survives the leaves
	if ret == 0 {
		ret = t.transfer()
		if ret == -int(syscall.ETIMEDOUT) || ret == -int(syscall.EIO) || (ret != 0 && ret == t.sendFailed) {
			ext = ret
		}
	}
	// As rdma-core's mckey: the last leave's result is the return status.
	for _, n := range t.nodes {
		if err := n.cm.LeaveMulticast(t.dstAddr); err != nil {
			fmt.Fprintf(t.errOut, "mckey: failure leaving: %s\n", strerror(err))
			ret = -1
		} else {
			ret = 0
		}
	}
	if ret == 0 && ext != 0 {
		ret = ext
	}
	return ret
}

// transfer runs the part after every id joined: the background event
// reader, the pause, and the data transfers.
func (t *mckey) transfer() int {
	ctx, cancel := context.WithCancel(t.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ev, err := t.channel.GetEvent(ctx)
			if err != nil {
				return
			}
			switch ev.Event {
			case rdmacm.EventMulticastError, rdmacm.EventAddrChange:
				fmt.Fprintf(t.out, "mckey: event: %s, status: %d\n", ev.Event, ev.Status)
			}
			ev.Ack()
		}
	}()
	defer func() { cancel(); <-done }()

	select {
	case <-time.After(t.cfg.joinPause):
	case <-t.ctx.Done():
		return -int(syscall.EINTR)
	}
	if t.cfg.messageCount == 0 {
		return 0
	}
	if t.cfg.sender {
		fmt.Fprintf(t.out, "initiating data transfers\n")
		for _, n := range t.nodes {
			if _, vals, ok := n.cm.Verbs().Device().Counters(); ok && n.connected {
				n.drops0 = vals
			}
			if ret := t.postSends(n); ret != 0 {
				return ret
			}
		}
		if t.sendFailed = t.sendErrors(); t.sendFailed != 0 {
			return t.sendFailed
		}
		t.sendDropHint()
	} else {
		fmt.Fprintf(t.out, "receiving data transfers\n")
		if ret := t.pollCQs(); ret != 0 {
			return ret
		}
	}
	fmt.Fprintf(t.out, "data transfers complete\n")
	return 0
}

func (t *mckey) connectEvents() int {
	ret := 0
	for t.connectsLeft > 0 && ret == 0 {
		ev, err := t.channel.GetEvent(t.ctx)
		if err != nil {
			if t.ctx.Err() != nil {
				return -int(syscall.EINTR)
			}
			fmt.Fprintf(t.errOut, "rdma_get_cm_event: %s\n", strerror(err))
			return -1
		}
		ret = t.cmaHandler(ev)
		ev.Ack()
	}
	return ret
}

func (t *mckey) cmaHandler(ev *rdmacm.Event) int {
	n, _ := ev.ID.Context().(*node)
	switch ev.Event {
	case rdmacm.EventAddrResolved:
		ret, _ := t.addrHandler(n)
		return ret
	case rdmacm.EventMulticastJoin:
		return t.joinHandler(n, &ev.Param)
	case rdmacm.EventAddrError, rdmacm.EventRouteError, rdmacm.EventMulticastError:
		fmt.Fprintf(t.out, "mckey: event: %s, error: %d\n", ev.Event, ev.Status)
		if ev.Event == rdmacm.EventAddrError {
			t.addrErrorHint(ev.Status)
		}
		if ev.Err != nil { // the cause behind a status of -1, which says nothing
			fmt.Fprintf(t.errOut, "mckey: %s: %v\n", ev.Event, ev.Err)
		}
		t.connectError()
		return ev.Status
	}
	return 0
}

func (t *mckey) verifyTestParams(n *node) int {
	pa, err := n.cm.Verbs().QueryPort(n.cm.PortNum())
	if err != nil {
		return -1
	}
	if mtu := pa.ActiveMTU.Bytes(); t.cfg.messageCount != 0 && t.cfg.messageSize > mtu {
		fmt.Fprintf(t.out, "mckey: message_size %d is larger than active mtu %d\n", t.cfg.messageSize, mtu)
		return -int(syscall.EINVAL)
	}
	return 0
}

func (t *mckey) initNode(n *node) (int, error) {
	ctx := n.cm.Verbs()
	pd, err := ctx.AllocPD()
	if err != nil {
		fmt.Fprintf(t.out, "mckey: unable to allocate PD\n")
		return -int(syscall.ENOMEM), err
	}
	n.pd = pd
	cqe := 2
	if t.cfg.messageCount != 0 {
		cqe = t.cfg.messageCount * 2
	}
	if n.cq, err = ctx.CreateCQ(cqe); err != nil {
		fmt.Fprintf(t.out, "mckey: unable to create CQ\n")
		why(t.errOut, err)
		return -int(syscall.ENOMEM), err
	}
	wr := max(t.cfg.messageCount, 1)
	attr := verbs.QPInitAttr{
		Context: n,
		SendCQ:  n.cq,
		RecvCQ:  n.cq,
		Cap:     verbs.QPCap{MaxSendWR: wr, MaxRecvWR: wr, MaxSendSGE: 1, MaxRecvSGE: 1},
		QPType:  verbs.QPTypeUD,
	}
	if !t.cfg.loopback {
		attr.CreateFlags = verbs.CreateBlockSelfMcastLB
	}
	if err := n.cm.CreateQPEx(pd, &attr); err != nil {
		fmt.Fprintf(t.errOut, "mckey: unable to create QP: %s\n", strerror(err))
		why(t.errOut, err)
		return -1, err
	}
	if ret := t.createMessage(n); ret != 0 {
		fmt.Fprintf(t.out, "mckey: failed to create messages: %d\n", ret)
		return ret, nil
	}
	return 0, nil
}

func (t *mckey) createMessage(n *node) int {
	if t.cfg.messageSize == 0 {
		t.cfg.messageCount = 0
	}
	if t.cfg.messageCount == 0 {
		return 0
	}
	if t.cfg.messageSize < 0 {
		fmt.Fprintf(t.out, "failed message allocation\n")
		return -1
	}
	slots := 1
	if t.cfg.verify && !t.cfg.sender {
		// --verify gives every receive its own slot, so a payload is read
		// only after its completion and never while the next one lands.
		slots = t.cfg.messageCount
	}
	n.mem = make([]byte, slots*(t.cfg.messageSize+verbs.GRHLen))
	// softrdma's sender fills the payload with a pattern --verify checks.
	fillPattern(n.mem[:t.cfg.messageSize])
	mr, err := n.pd.RegMR(n.mem, verbs.AccessLocalWrite)
	if err != nil {
		fmt.Fprintf(t.out, "failed to reg MR\n")
		return -1
	}
	n.mr = mr
	return 0
}

// fillPattern writes the payload pattern of softrdma's mckey sender.
func fillPattern(b []byte) {
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
}

func (t *mckey) postRecvs(n *node) int {
	if t.cfg.messageCount == 0 {
		return 0
	}
	slot := t.cfg.messageSize + verbs.GRHLen
	for i := 0; i < t.cfg.messageCount; i++ {
		wr := verbs.RecvWR{WRID: uint64(n.id), SGList: []verbs.SGE{n.mr.SGE(0, slot)}}
		if t.cfg.verify {
			wr.WRID, wr.SGList[0] = uint64(i), n.mr.SGE(i*slot, slot)
		}
		if err := n.cm.QP().PostRecv(&wr); err != nil {
			fmt.Fprintf(t.out, "failed to post receives: %d\n", errnoOf(err))
			return errnoOf(err)
		}
	}
	return 0
}

// errnoOf is the errno of a failed call, as C's ret/errno.
func errnoOf(err error) int { return int(verbs.ErrnoOf(err)) }

func (t *mckey) postSends(n *node) int {
	if !n.connected || t.cfg.messageCount == 0 {
		return 0
	}
	qp := n.cm.QP()
	wr := verbs.SendWR{
		WRID:    uint64(n.id),
		SGList:  []verbs.SGE{n.mr.SGE(0, t.cfg.messageSize)},
		Opcode:  verbs.WRSendWithImm,
		ImmData: qp.Num(),
		UD:      verbs.UDWR{AH: n.ah, RemoteQPN: n.remoteQPN, RemoteQKey: n.remoteQK},
	}
	if t.cfg.noImm {
		wr.Opcode, wr.ImmData = verbs.WRSend, 0
	}
	for i := 0; i < t.cfg.messageCount; i++ {
		if err := qp.PostSend(&wr); err != nil {
			fmt.Fprintf(t.out, "failed to post sends: %d\n", errnoOf(err))
			return errnoOf(err)
		}
	}
	return 0
}

func (t *mckey) addrHandler(n *node) (int, error) {
	if n.id == 0 && t.cfg.src == "" && !t.cfg.unmapped {
		t.landedHint(n)
	}
	if ret := t.verifyTestParams(n); ret != 0 {
		t.connectError()
		return ret, syscall.Errno(-ret)
	}
	if ret, err := t.initNode(n); ret != 0 {
		t.connectError()
		if err == nil {
			err = syscall.ENOMEM // the message buffer (malloc sets errno)
		}
		return ret, err
	}
	if !t.cfg.sender {
		if ret := t.postRecvs(n); ret != 0 {
			t.connectError()
			return ret, syscall.Errno(ret)
		}
		if _, vals, ok := n.cm.Verbs().Device().Counters(); ok {
			n.drops0 = vals
		}
		t.startWatch()
	}
	flags := rdmacm.MCJoinFlagFullMember
	if t.cfg.sendOnly {
		flags = rdmacm.MCJoinFlagSendOnlyFullMember
	}
	attr := rdmacm.JoinMCAttrEx{CompMask: rdmacm.JoinMCAttrAddress | rdmacm.JoinMCAttrJoinFlags, JoinFlags: flags, Addr: t.dstAddr}
	if err := n.cm.JoinMulticastEx(&attr, n); err != nil {
		fmt.Fprintf(t.errOut, "mckey: failure joining: %s\n", strerror(err))
		t.joinHint(err)
		t.connectError()
		return -1, err
	}
	return 0, nil
}

func (t *mckey) joinHandler(n *node, p *rdmacm.UDParam) int {
	fmt.Fprintf(t.out, "mckey: joined dgid: %s mlid 0x%x sl %d\n", p.AHAttr.GRH.DGID, p.AHAttr.DLID, p.AHAttr.SL)
	n.remoteQPN, n.remoteQK = p.QPNum, p.QKey
	ah, err := n.pd.CreateAH(&p.AHAttr)
	if err != nil {
		fmt.Fprintf(t.out, "mckey: failure creating address handle\n")
		t.connectError()
		return -1
	}
	n.ah = ah
	n.connected = true
	t.connectsLeft--
	return 0
}

// sendErrors reports the sends that failed. rdma-core's mckey posts its
// sends unsignaled and never polls for them, so a send the device could
// not transmit (no route to the group: ENETUNREACH) went unnoticed and the
// run said "data transfers complete". A failed send completes even
// unsignaled (as rxe completes it), at once on softrdma's devices: the
// completions already queued are read, and a failure ends the run with
// the errno the device gave.
func (t *mckey) sendErrors() int {
	var wc [8]verbs.WC
	ret := 0
	for _, n := range t.nodes {
		if !n.connected {
			continue
		}
		failed := 0
		var first verbs.WC
		for {
			k, err := n.cq.Poll(wc[:])
			if err != nil || k == 0 {
				break
			}
			for _, c := range wc[:k] {
				if c.Status != verbs.WCSuccess {
					if failed == 0 {
						first = c
					}
					failed++
				}
			}
		}
		if failed == 0 {
			continue
		}
		errno := syscall.EIO
		if first.VendorErr != 0 {
			errno = syscall.Errno(first.VendorErr)
		}
		fmt.Fprintf(t.errOut, "mckey: %d of %d sends to %s failed: %s (vendor_err %d: %s)\n",
			failed, t.cfg.messageCount, t.cfg.dst, first.Status, first.VendorErr, strerror(errno))
		ret = -int(errno)
	}
	return ret
}

// pollCQs waits for message_count completions on every joined node. With
// --timeout it gives up after that long without a completion (-ETIMEDOUT);
// with --verify it checks every completion.
func (t *mckey) pollCQs() int {
	var wc [8]verbs.WC
	for _, n := range t.nodes {
		if !n.connected {
			continue
		}
		for done := 0; done < t.cfg.messageCount; {
			k, err := n.cq.Poll(wc[:])
			if err != nil {
				fmt.Fprintf(t.out, "mckey: failed polling CQ: %d\n", -errnoOf(err))
				return -errnoOf(err)
			}
			for i := 0; i < k; i++ {
				if t.cfg.verify {
					if msg := t.check(n, &wc[i]); msg != "" {
						fmt.Fprintf(t.out, "mckey: message %d: %s\n", done+i+1, msg)
						return -int(syscall.EIO)
					}
				}
			}
			done += k
			if k > 0 || done >= t.cfg.messageCount {
				continue
			}
			ctx, cancel := t.ctx, context.CancelFunc(func() {})
			if t.cfg.timeout > 0 {
				ctx, cancel = context.WithTimeout(ctx, t.cfg.timeout)
			}
			err = n.cq.Wait(ctx)
			cancel()
			if t.ctx.Err() != nil {
				return -int(syscall.EINTR)
			}
			if err != nil {
				fmt.Fprintf(t.out, "mckey: receive timeout: %d of %d messages\n", done, t.cfg.messageCount)
				t.dropHint(n, done)
				return -int(syscall.ETIMEDOUT)
			}
		}
		if t.cfg.verify {
			fmt.Fprintf(t.out, "mckey: verified %d messages\n", t.cfg.messageCount)
		}
	}
	return 0
}

// check verifies one receive completion (--verify).
func (t *mckey) check(n *node, wc *verbs.WC) string {
	switch {
	case wc.Status != verbs.WCSuccess:
		return "status " + wc.Status.String()
	case wc.Opcode != verbs.WCOpRecv:
		return fmt.Sprintf("opcode %d", wc.Opcode)
	case int(wc.ByteLen) != verbs.GRHLen+t.cfg.messageSize:
		return fmt.Sprintf("byte_len %d, want %d", wc.ByteLen, verbs.GRHLen+t.cfg.messageSize)
	case wc.Flags&verbs.WCGRH == 0:
		return "no GRH flag"
	case wc.Flags&verbs.WCWithImm != 0 && wc.ImmData != wc.SrcQP:
		return fmt.Sprintf("imm %#x != src_qp %#x", wc.ImmData, wc.SrcQP)
	}
	want := make([]byte, t.cfg.messageSize)
	fillPattern(want)
	off := int(wc.WRID) * (verbs.GRHLen + t.cfg.messageSize)
	got := n.mem[off+verbs.GRHLen : off+verbs.GRHLen+t.cfg.messageSize]
	if string(got) != string(want) {
		return "payload differs from the pattern"
	}
	return ""
}

func (t *mckey) destroyNodes() {
	for _, n := range t.nodes {
		if n.cm == nil {
			continue
		}
		if n.ah != nil {
			n.ah.Destroy()
		}
		if n.cm.QP() != nil {
			n.cm.DestroyQP()
		}
		if n.cq != nil {
			n.cq.Destroy()
		}
		if n.mr != nil {
			n.mr.Dereg()
		}
		if n.pd != nil {
			n.pd.Dealloc()
		}
		n.cm.Destroy()
	}
}

// startCapture writes what every device of the process sends and receives
// to a pcap file (--pcap): Ethernet frames of the RoCEv2 devices, or IB
// packets of the InfiniBand ports when SOFTRDMA_SM names a subnet; the
// returned function stops and closes it.
func startCapture(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	lt := verbs.LinkTypeEthernet
	if os.Getenv("SOFTRDMA_SM") != "" {
		lt = verbs.LinkTypeInfiniBand
	}
	c, err := capture.Start(f, capture.Options{LinkType: lt})
	if err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		c.Stop()
		f.Close()
	}, nil
}
