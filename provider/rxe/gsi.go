package rxe

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
	"github.com/softrdma/softrdma/wire"
)

// QP1, the General Services Interface (driver.GSIPort): the RDMA CM's SIDR
// MADs. QP1 is a QP of the transport only: the verbs core never sees it.
// Its datagrams leave from a send socket of a QP of its own (whose QPN is
// never used: DETH SrcQP is 1) and arrive on the device's unicast sockets
// with DestQP 1; after rxe's checks (ICRC) and the GSI Q_Key they go to the
// agent. Every process of the user shares UDP 4791 and the kernel hands a
// datagram to one of them, so a MAD the agent of the process that read it
// does not take goes, by its key (driver.GSIRoute: a SIDR_REQ's service
// ID, a SIDR_REP's request ID), to the process that claimed the key, over
// a hand-over socket named after the key (handover.go's transport, of
// this user only: an abstract unix socket, both ends' credentials
// checked). A remote host therefore reaches only a claim of the user
// whose socket read its datagram, and no other local user can claim a key
// of this user's processes or read what is handed over.

// gsiQPN is QP1.
const gsiQPN = mad.GSIQPN

// gsiHopLimit is the hop limit of QP1's datagrams when the caller gives 0.
const gsiHopLimit = 64

// gsiName returns the abstract unix socket name of a claim (a variable:
// tests point it elsewhere).
var gsiName = func(key string) string {
	return "@softrdma/" + strconv.Itoa(os.Geteuid()) + "/gsi/" + key
}

// gsiPort is the device's QP1 while an agent has it open.
type gsiPort struct {
	d     *Device
	agent driver.GSIAgent
	q     *qp

	mu     sync.Mutex
	closed bool
	claims map[string]*handoverListener
	psn    uint32

	// The agent runs on a goroutine of its own, not on a receive path:
	// it may call into the device (its GID table, its sockets).
	in   chan gsiItem
	done chan struct{}
}

// gsiQueue bounds the MADs waiting for the agent; more are dropped.
const gsiQueue = 64

// gsiItem is a MAD for the agent: its copy, and the datagram with its
// forwarding header for a hand-over (nil when it was handed over).
type gsiItem struct {
	m   driver.GSIMAD
	fwd []byte
}

// OpenGSI opens QP1 for agent (driver.GSIPort).
func (d *Device) OpenGSI(agent driver.GSIAgent) (driver.GSI, error) {
	if agent == nil {
		return nil, d.errf(syscall.EINVAL, "open QP1: no agent")
	}
	dq, err := d.CreateQP(softverbs.DriverQPInit{Type: verbs.QPTypeUD})
	if err != nil {
		return nil, err
	}
	q := dq.(*qp)
	q.gsi = true
	g := &gsiPort{d: d, agent: agent, q: q, claims: map[string]*handoverListener{},
		in: make(chan gsiItem, gsiQueue), done: make(chan struct{})}
	if !d.gsi.CompareAndSwap(nil, g) {
		q.Destroy()
		return nil, d.errf(syscall.EBUSY, "open QP1: open already")
	}
	go g.serve()
	return g, nil
}

// Send sends one MAD from QP1 to QP1 of dst (driver.GSI).
func (g *gsiPort) Send(sgidIndex uint8, dst verbs.GID, hopLimit, tclass uint8, m []byte) error {
	if len(m) != mad.Len {
		return g.d.errf(syscall.EINVAL, "QP1 send: a MAD is %d bytes, not %d", mad.Len, len(m))
	}
	if hopLimit == 0 {
		hopLimit = gsiHopLimit
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return g.d.errf(syscall.EBADF, "QP1 send: closed")
	}
	g.psn = (g.psn + 1) & 0xFFFFFF
	psn := g.psn
	g.mu.Unlock()
	return g.d.sendGSI(g.q, psn, sgidIndex, dst, hopLimit, tclass, m)
}

// sendGSI sends the MAD m from q, a QP of QP1's, to QP1 of dst.
func (d *Device) sendGSI(q *qp, psn uint32, sgidIndex uint8, dst verbs.GID, hopLimit, tclass uint8, m []byte) error {
	ah := verbs.AHAttr{IsGlobal: true, PortNum: 1, GRH: verbs.GlobalRoute{
		DGID: dst, SGIDIndex: sgidIndex, HopLimit: hopLimit, TrafficClass: tclass,
	}}
	s := softverbs.UDSend{AH: &ah, RemoteQPN: gsiQPN, RemoteQKey: mad.GSIQKey, PSN: psn, Payload: m}
	if err := q.Send(&s); err != nil {
		return err
	}
	if s.Wire == 0 {
		return d.errf(syscall.EMSGSIZE, "QP1 send: larger than the active MTU")
	}
	return nil
}

// answerUnclaimed answers m, a SIDR_REQ that no process of this user
// claims and that no agent of this process took, with SIDR_REP
// UNSUPPORTED from a QP1 of its own, as the kernel's CM answers a request
// for a service nobody listens on (cm_sidr_req_handler): the requester
// learns at once, not after its resends, whichever process of the user
// read the request — one with an RDMA CM or one that only uses verbs. One
// answer at a time: a request that comes meanwhile is only dropped.
func (d *Device) answerUnclaimed(m driver.GSIMAD) {
	if mad.CheckCM(m.MAD) != nil || mad.MAD(m.MAD).AttrID() != mad.AttrSIDRReq || !d.answering.CompareAndSwap(false, true) {
		return
	}
	m.MAD = slices.Clone(m.MAD)
	d.wg.Add(1) // called on a receive path, itself in d.wg
	go func() {
		defer d.wg.Done()
		defer d.answering.Store(false)
		sgid, ok := d.gidIndexOf(m.Dst)
		if !ok {
			return
		}
		dq, err := d.CreateQP(softverbs.DriverQPInit{Type: verbs.QPTypeUD})
		if err != nil {
			return
		}
		q := dq.(*qp)
		q.gsi = true
		defer q.Destroy()
		rep := mad.SIDRReplyTo(mad.SIDRReq(m.MAD), mad.SIDRUnsupported)
		_ = d.sendGSI(q, 0, sgid, wire.GIDFromAddr(m.Src), m.HopLimit, m.TClass, rep)
	}()
}

// gidIndexOf returns the index of local address a's GID in port 1's table.
func (d *Device) gidIndexOf(a netip.Addr) (uint8, bool) {
	gid := wire.GIDFromAddr(a)
	for _, e := range d.currentInfo().gids {
		if e.GID == gid {
			return uint8(e.Index), true
		}
	}
	return 0, false
}

// Claim makes the MADs of key that other processes of this user read come
// to this device (driver.GSI).
func (g *gsiPort) Claim(key string) (func(), error) {
	d := g.d
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, d.errf(syscall.EBADF, "QP1 claim: closed")
	}
	if g.claims[key] != nil {
		return nil, d.errf(syscall.EADDRINUSE, "QP1 claim %s: held by this process", key)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Net: "unixpacket", Name: gsiName(key)})
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, d.errf(syscall.EADDRINUSE, "QP1 claim %s: held by another process", key)
		}
		return nil, d.errf(verbs.ErrnoOf(err), "QP1 claim %s: %v", key, err)
	}
	l := &handoverListener{ln: ln}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		ln.Close()
		return nil, d.errf(syscall.ENODEV, "QP1 claim: device closed")
	}
	d.wg.Add(1)
	d.mu.Unlock()
	go d.acceptGSI(l)
	g.claims[key] = l
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			if g.claims[key] == l {
				delete(g.claims, key)
			}
			g.mu.Unlock()
			l.close()
		})
	}, nil
}

// acceptGSI accepts the connections of other processes of this user to
// a claim's socket (the hand-over's checks: a connection from another
// user is closed and counted in untrusted_drops) and reads each on a
// goroutine of its own: QP1's MADs are few, and no consumer reads them
// (they are not unicast inputs of progress.go).
func (d *Device) acceptGSI(l *handoverListener) {
	defer d.wg.Done()
	uid := uint32(os.Geteuid())
	for {
		nc, err := l.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		var cred *unix.Ucred
		var cerr error
		if err := control(nc, func(fd int) error {
			cred, cerr = unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
			return nil
		}); err != nil || cerr != nil || cred.Uid != uid {
			d.core.Count(softverbs.UntrustedDrops, 1)
			nc.Close()
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			nc.Close()
			return
		}
		l.gsiConns = append(l.gsiConns, nc)
		l.mu.Unlock()
		d.wg.Add(1)
		go d.readGSI(l, nc)
	}
}

// readGSI reads the datagrams handed over on one claim connection until
// either end closes it, and checks and delivers each as one read on UDP
// 4791 (handleForwarded: ICRC, then deliverGSI).
func (d *Device) readGSI(l *handoverListener, nc *net.UnixConn) {
	defer d.wg.Done()
	defer func() {
		l.mu.Lock()
		l.gsiConns = slices.DeleteFunc(l.gsiConns, func(c *net.UnixConn) bool { return c == nc })
		l.mu.Unlock()
		nc.Close()
	}()
	r := newBlockReceiver(d, &sendBlock{}, nil)
	buf := make([]byte, fwdHdrLen+readBufLen+1)
	for {
		n, err := nc.Read(buf)
		if err != nil || n == 0 {
			return
		}
		r.countReceived(1, uint64(n))
		r.handleForwarded(buf[:n], n > fwdHdrLen+readBufLen)
	}
}

// holds reports whether this device claims key.
func (g *gsiPort) holds(key string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.claims[key] != nil
}

// Close closes QP1 and its claims (driver.GSI).
func (g *gsiPort) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	claims := g.claims
	g.claims = nil
	close(g.in)
	g.mu.Unlock()
	for _, l := range claims {
		l.close()
	}
	g.d.gsi.CompareAndSwap(g, nil)
	<-g.done
	g.q.Destroy()
	return nil
}

// serve runs the agent on the MADs queued by the receive paths until
// Close: a MAD it does not take goes to the process that claims its key,
// or back to it as unclaimed.
func (g *gsiPort) serve() {
	defer close(g.done)
	d := g.d
	for it := range g.in {
		if g.agent.Receive(&it.m) {
			continue
		}
		if it.fwd == nil {
			d.core.Count(softverbs.NoQPDrops, 1) // handed over, and not taken
			continue
		}
		key := driver.GSIRoute(it.m.MAD)
		if key == "" || g.holds(key) {
			d.core.Count(softverbs.NoQPDrops, 1)
			continue
		}
		switch err := forwardGSI(it.fwd, key); {
		case err == nil:
			d.core.Count(softverbs.Forwarded, 1)
		case noOwner(err):
			d.answerUnclaimed(it.m)
		default:
			d.core.Count(softverbs.ForwardDrops, 1)
		}
	}
}

// deliverGSI hands the checked datagram b (r.pkt) for QP1 to the agent's
// goroutine (gsiPort.serve), or, without an agent in this process, to the
// process of this user that claims its key; fwd: it was handed over
// already (never forwarded again).
func (r *receiver) deliverGSI(b []byte, v6, fwd bool) {
	d := r.d
	p := &r.pkt
	r.burst.Release() // no lock held over what follows
	if p.DETH.QKey() != mad.GSIQKey || len(p.Payload) < mad.Len {
		d.core.Count(softverbs.NoQPDrops, 1)
		return
	}
	if fwd {
		// As for a unicast datagram handed over: the peer's next
		// datagrams (an accepted connection's data, after a SIDR_REP)
		// should come straight here (peers.go), not through a process
		// that may exit before it hands them over.
		r.askPeer(v6)
	}
	var fb []byte
	if !fwd {
		if len(b) > readBufLen {
			d.core.Count(softverbs.ForwardDrops, 1)
			return
		}
		var h [fwdHdrLen]byte
		putFwdHdr(&h, &r.meta, v6)
		fb = append(append(make([]byte, 0, fwdHdrLen+len(b)), h[:]...), b...)
	}
	g := d.gsi.Load()
	if g == nil {
		key := driver.GSIRoute(p.Payload[:mad.Len])
		if fwd || key == "" {
			d.core.Count(softverbs.NoQPDrops, 1)
			return
		}
		switch err := forwardGSI(fb, key); {
		case err == nil:
			d.core.Count(softverbs.Forwarded, 1)
		case noOwner(err):
			d.core.Count(softverbs.NoOwnerDrops, 1)
			d.answerUnclaimed(driver.GSIMAD{
				Src: r.meta.src, Dst: r.meta.dst, SrcQP: p.DETH.SrcQP(), PKey: p.BTH.PKey(), QKey: p.DETH.QKey(),
				HopLimit: r.meta.ttl, TClass: r.meta.tos, MAD: p.Payload[:mad.Len],
			})
		default:
			d.core.Count(softverbs.ForwardDrops, 1)
		}
		return
	}
	it := gsiItem{fwd: fb, m: driver.GSIMAD{
		Src: r.meta.src, Dst: r.meta.dst, SrcQP: p.DETH.SrcQP(), PKey: p.BTH.PKey(), QKey: p.DETH.QKey(),
		HopLimit: r.meta.ttl, TClass: r.meta.tos, MAD: slices.Clone(p.Payload[:mad.Len]),
	}}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		d.core.Count(softverbs.NoQPDrops, 1)
		return
	}
	select {
	case g.in <- it:
	default:
		d.core.Count(softverbs.NoQPDrops, 1)
	}
}

// forwardGSI hands fb, a forwarding header and a datagram, to the process
// of this user that claims key. QP1's MADs are few: a connection each.
func forwardGSI(fb []byte, key string) error {
	hc, err := dialHandover(gsiName(key))
	if err != nil {
		return err
	}
	defer hc.c.Close()
	var serr error
	if err := hc.raw.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), fb, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, nil)
		return true
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("QP1 hand-over to %s: %w", key, serr)
	}
	return nil
}
