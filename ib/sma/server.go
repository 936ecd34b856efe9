package sma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/simproto"
)

// ServerConfig configures a Server.
type ServerConfig struct {
	// Base is the socket name prefix, the clients' IBSIM_SOCKNAME (""
	// → simproto.DefaultBase, ibsim's default).
	Base string
	// UIDs are the users whose clients are served (nil: the server's
	// own user only). Abstract unix sockets have no permissions: every
	// process of the network namespace can send to them, so every
	// datagram's sender is checked (SCM_CREDENTIALS) and the others'
	// are dropped.
	UIDs []uint32
	// Logf, if set, gets one line per client event and per dropped
	// datagram.
	Logf func(format string, args ...any)
	// ToPort, if set, takes the GMPs the SM host's clients send to a CA
	// port (the SA's answers and Reports, routed by the switch's linear
	// forwarding table; the Request's addressing as the CA would receive
	// it: SLID the SM host's LID); r is the caller's only during the
	// call. Without it such GMPs time out (no GMP agents on the CAs).
	ToPort func(guid uint64, r simproto.Request)
}

// writeWait bounds a send to a client whose socket queue is full.
const writeWait = time.Second

// ErrUndelivered is the error (wrapped) of a MAD that FromPort could not
// hand its client: the client is gone, or its socket took nothing for a
// second (a stopped or busy OpenSM).
var ErrUndelivered = errors.New("sma: MAD not delivered")

// Server serves ibsim's server protocol (package simproto) to
// libumad2sim.so clients: OpenSM, ibnetdiscover or any libibumad program
// run with LD_PRELOAD=libumad2sim.so and IBSIM_SOCKNAME=Base. Every
// client attaches to the SM host (SIM_HOST unset, HostName or the SM
// host's NodeDescription; any other node is refused: the CAs are
// softsm's ports, of other processes) and its MADs go to the Fabric.
// Answers go back to the sender; a request for the SM host's SM
// (SMInfo, a GMP to its QP0/1) goes to the client that opened the issm
// device, a request for another QP to the client that connected with it,
// and a response to the client whose id its TID carries (bits 63..48,
// stamped on every request as ibsim does). Datagrams that are not a
// whole Ctl or Request, or come from another user than
// ServerConfig.UIDs, are dropped.
type Server struct {
	f    *Fabric
	cfg  ServerConfig
	ctl  *net.UnixConn
	uids []uint32

	mu      sync.Mutex
	clients [simproto.MaxClients]*client
	closed  bool
	wg      sync.WaitGroup
	// The requests relayed to CA ports that wait for their answers (a
	// Report waits for its ReportResp): by TID, the CA asked and when.
	// Only that CA's answer goes back (FromPort), once.
	asked map[uint64]askedCA
}

// askedCA is a request relayed to a CA port.
type askedCA struct {
	guid uint64
	at   time.Time
}

// Bounds of Server.asked: an entry lasts askedTTL at most (an SM gives up
// on an answer long before), and at most maxAsked wait at once (beyond,
// the answer to a further request is refused: fail closed).
const (
	askedTTL = time.Minute
	maxAsked = 4096
)

// client is a connected umad2sim client.
type client struct {
	id      int
	pid     uint32
	ctlAddr string // its control socket's name ("@...")
	qp      uint32
	issm    bool
	conn    *net.UnixConn // <Base>:out<id>, connected to <Base>:in<pid>
}

// Listen binds the control socket <Base>:ctl (abstract) for f.
func Listen(f *Fabric, cfg ServerConfig) (*Server, error) {
	if cfg.Base == "" {
		cfg.Base = simproto.DefaultBase
	}
	uids := cfg.UIDs
	if uids == nil {
		uids = []uint32{uint32(os.Getuid())}
	}
	c, err := listenAbstract(simproto.CtlName(cfg.Base), "")
	if err != nil {
		return nil, err
	}
	return &Server{f: f, cfg: cfg, ctl: c, uids: uids}, nil
}

// listenAbstract binds the abstract unix datagram socket name (and
// connects it to peer, when not empty) with SO_PASSCRED on.
func listenAbstract(name, peer string) (*net.UnixConn, error) {
	laddr := &net.UnixAddr{Net: "unixgram", Name: "@" + name}
	var (
		c   *net.UnixConn
		err error
	)
	if peer == "" {
		c, err = net.ListenUnixgram("unixgram", laddr)
	} else {
		c, err = net.DialUnix("unixgram", laddr, &net.UnixAddr{Net: "unixgram", Name: "@" + peer})
	}
	if err != nil {
		return nil, fmt.Errorf("sma: socket %q: %w", name, err)
	}
	rc, err := c.SyscallConn()
	if err == nil {
		cerr := rc.Control(func(fd uintptr) {
			err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
		})
		if cerr != nil {
			err = cerr
		}
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("sma: SO_PASSCRED on %q: %w", name, err)
	}
	return c, nil
}

func (s *Server) logf(format string, args ...any) {
	if s.cfg.Logf != nil {
		s.cfg.Logf(format, args...)
	}
}

// Base returns the socket name prefix clients need (IBSIM_SOCKNAME).
func (s *Server) Base() string { return s.cfg.Base }

// Run serves until ctx ends or Close; it returns when every client's
// goroutine ended.
func (s *Server) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	buf := make([]byte, simproto.CtlLen+1)
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred))
	var err error
	for {
		n, oobn, _, from, rerr := s.ctl.ReadMsgUnix(buf, oob)
		if rerr != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if !closed {
				err = rerr
			}
			break
		}
		if !s.credOK(oob[:oobn]) || n != simproto.CtlLen || from == nil || from.Name == "" {
			s.logf("sma: control datagram dropped (%d bytes, from %v)", n, from)
			continue
		}
		c := simproto.Ctl(buf[:n])
		if c.Magic() != simproto.Magic {
			s.logf("sma: control datagram with bad magic %#x dropped", c.Magic())
			continue
		}
		s.control(c, from)
		s.ctl.SetWriteDeadline(time.Now().Add(writeWait))
		// Go reports an abstract name up to its first NUL after the
		// leading one; umad2sim's names end in a NUL (simproto).
		to := &net.UnixAddr{Net: "unixgram", Name: from.Name + "\x00"}
		if _, werr := s.ctl.WriteToUnix(c, to); werr != nil {
			s.logf("sma: control answer to %s: %v", from.Name, werr)
		}
	}
	s.Close()
	s.wg.Wait()
	return err
}

// Close stops the server: its sockets close and the clients are
// forgotten.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for i, c := range s.clients {
		if c != nil {
			c.conn.Close()
			s.clients[i] = nil
		}
	}
	return s.ctl.Close()
}

// credOK reports whether a datagram's SCM_CREDENTIALS name a user the
// server serves.
func (s *Server) credOK(oob []byte) bool {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return false
	}
	for i := range msgs {
		if cred, err := unix.ParseUnixCredentials(&msgs[i]); err == nil {
			return slices.Contains(s.uids, cred.Uid)
		}
	}
	return false
}

// control handles one control message and turns c into its answer.
func (s *Server) control(c simproto.Ctl, from *net.UnixAddr) {
	typ := c.Type()
	d := c.Data()
	if typ == simproto.TypeConnect {
		if !s.connect(simproto.ClientInfo(d[:simproto.ClientInfoLen]), from.Name) {
			c.SetType(simproto.TypeError)
		}
		return
	}
	s.mu.Lock()
	var cl *client
	if id := c.ClientID(); id < simproto.MaxClients {
		cl = s.clients[id]
	}
	if cl == nil || cl.ctlAddr != from.Name {
		s.mu.Unlock()
		c.SetType(simproto.TypeError)
		return
	}
	if typ == simproto.TypeDisconnect {
		s.dropLocked(cl, "disconnected")
		s.mu.Unlock()
		return
	}
	if typ == simproto.TypeSetIsSM {
		cl.issm = binary.NativeEndian.Uint32(d) != 0
		sm := false
		for _, o := range s.clients {
			sm = sm || (o != nil && o.issm)
		}
		s.mu.Unlock()
		s.f.SetHostIsSM(sm)
		return
	}
	s.mu.Unlock()
	switch typ {
	case simproto.TypeGetVendor:
		clear(d)
		v := simproto.Vendor(d)
		v.SetPartID(0x5f7d)
		v.SetHWVer(1)
		v.SetFWVer(1)
	case simproto.TypeGetNodeInfo:
		copy(d, s.f.HostNodeInfo())
	case simproto.TypeGetPortInfo: // one port: whatever d[0] asks
		copy(d, s.f.HostPortInfo())
	case simproto.TypeGetPKeys:
		copy(d, s.f.HostPKeys())
	case simproto.TypeGetGUID:
		clear(d)
		binary.NativeEndian.PutUint64(d, s.f.cfg.HostGUID)
	case simproto.TypeGetGID:
		pi := mad.PortInfo(s.f.HostPortInfo())
		clear(d)
		binary.BigEndian.PutUint64(d, pi.GIDPrefix())
		binary.BigEndian.PutUint64(d[8:], s.f.cfg.HostGUID+1)
	case simproto.TypeGetPort:
		pi := mad.PortInfo(s.f.HostPortInfo())
		clear(d)
		binary.NativeEndian.PutUint16(d, pi.LID())
		d[2] = pi.PortState()
	default:
		c.SetType(simproto.TypeError)
	}
}

// connect attaches a client to the SM host; ci becomes the answer.
func (s *Server) connect(ci simproto.ClientInfo, ctlAddr string) bool {
	pid := ci.ID()
	if node := ci.NodeID(); node != "" && node != HostName {
		s.logf("sma: client pid %d asks for node %q: only %q takes clients", pid, node, HostName)
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	id := -1
	for i, c := range s.clients {
		if c == nil && id < 0 {
			id = i
		}
		if c != nil && ci.IsSM() && c.issm {
			s.logf("sma: client pid %d: the SM host has an SM (client %d)", pid, c.id)
			return false
		}
	}
	if id < 0 {
		s.logf("sma: client pid %d: all %d client slots taken", pid, simproto.MaxClients)
		return false
	}
	conn, err := listenAbstract(simproto.OutName(s.cfg.Base, id), simproto.InName(s.cfg.Base, pid))
	if err != nil {
		s.logf("sma: client pid %d: %v", pid, err)
		return false
	}
	c := &client{id: id, pid: pid, ctlAddr: ctlAddr, qp: ci.QP(), issm: ci.IsSM(), conn: conn}
	s.clients[id] = c
	ci.SetID(uint32(id))
	ci.SetNodeID(HostName)
	s.logf("sma: client %d (pid %d) attached to %s", id, pid, HostName)
	s.wg.Add(1)
	go s.serveClient(c)
	return true
}

// dropLocked forgets a client.
func (s *Server) dropLocked(c *client, why string) {
	if s.clients[c.id] != c {
		return
	}
	s.clients[c.id] = nil
	c.conn.Close()
	s.logf("sma: client %d (pid %d) %s", c.id, c.pid, why)
	if c.issm {
		s.f.SetHostIsSM(false) // lock order: s.mu, then the Fabric's
	}
}

// serveClient reads a client's MADs until its socket closes.
func (s *Server) serveClient(c *client) {
	defer s.wg.Done()
	buf := make([]byte, simproto.RequestLen+1)
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred))
	for {
		n, oobn, _, _, err := c.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			return
		}
		if !s.credOK(oob[:oobn]) || n != simproto.RequestLen {
			s.logf("sma: client %d: datagram dropped (%d bytes)", c.id, n)
			continue
		}
		s.dispatch(c, simproto.Request(buf[:n]))
	}
}

// dispatch routes one MAD of client c.
func (s *Server) dispatch(c *client, r simproto.Request) {
	m := mad.MAD(r.MAD())
	if s.cfg.ToPort != nil && m.BaseVersion() == mad.BaseVersion &&
		m.MgmtClass() != mad.ClassSubnDR && m.MgmtClass() != mad.ClassSubnLID {
		if s.gmp(c, r) {
			return
		}
	}
	if m.IsResponse() {
		if to := s.client(int(m.TID() >> 48)); to != nil {
			s.send(to, r)
		}
		return
	}
	m.SetTID(m.TID()&(1<<48-1) | uint64(c.id)<<48)
	orig := slices.Clone(r)
	switch s.f.Process(r) {
	case Reply:
		s.send(c, r)
	case Timeout:
		s.timeout(c, orig)
	case Consumed:
	case ToHost:
		if to := s.hostClient(m.MgmtClass(), r.DQP()); to != nil {
			s.send(to, r)
		} else {
			s.timeout(c, orig)
		}
	}
}

// gmp hands a GMP of client c that the switch routes to a CA port to
// ToPort and reports whether it did; a request that goes nowhere times
// out (reported done too). Everything else is dispatch's.
func (s *Server) gmp(c *client, r simproto.Request) bool {
	m := mad.MAD(r.MAD())
	guid, host, srcLID, ok := s.f.RouteGMP(0, r.DLID())
	switch {
	case host:
		// To a client of the SM host: dispatch's. A client leaves SLID
		// 0 ("the sender's port's"): the host's LID, as to a CA, so that
		// the receiver can answer (an RMPP ACK of saquery to OpenSM).
		if r.SLID() == 0 {
			r.SetSLID(srcLID)
		}
		return false
	case !ok:
		if m.IsResponse() {
			return false // by its TID, as before
		}
		s.timeout(c, slices.Clone(r))
		return true
	}
	if r.SLID() == 0 {
		r.SetSLID(srcLID)
	}
	if !m.IsResponse() {
		// Stamped as every request of a client: the CA's answer comes
		// back by it (FromPort), from that CA only.
		m.SetTID(m.TID()&(1<<48-1) | uint64(c.id)<<48)
		s.noteAsked(m.TID(), guid)
	}
	r.SetStatus(0)
	s.cfg.ToPort(guid, r)
	return true
}

// FromPort takes a GMP that the CA port guid sends (r's MAD and
// addressing as the SM host's client is to receive it: SLID the port's
// LID, SQP its QP; DLID and DQP where it goes). A request that the
// switch's linear forwarding table routes to the SM host goes to the
// client of its destination QP (QP0 and QP1: the SM host's SM, OpenSM,
// whose SA answers at QP1); a response goes to the client whose id its
// TID carries (the requester of a Report). Anything else is dropped and
// FromPort reports why.
func (s *Server) FromPort(guid uint64, r simproto.Request) error {
	if len(r) != simproto.RequestLen {
		return fmt.Errorf("sma: a GMP of %d bytes", len(r))
	}
	m := mad.MAD(r.MAD())
	if m.BaseVersion() != mad.BaseVersion || m.MgmtClass() == mad.ClassSubnDR || m.MgmtClass() == mad.ClassSubnLID {
		return fmt.Errorf("sma: not a GMP (base version %d, class %#x)", m.BaseVersion(), m.MgmtClass())
	}
	if m.IsResponse() {
		if !s.takeAsked(m.TID(), guid) {
			// Another port's answer, or one to nothing asked: a port could
			// otherwise answer for another (a Report's subscriber would
			// then never see the Report, whose SM stops sending it).
			return fmt.Errorf("sma: response of %#x to no request of its own (TID %#x)", guid, m.TID())
		}
		to := s.client(int(m.TID() >> 48))
		if to == nil {
			return fmt.Errorf("sma: response for no client (TID %#x)", m.TID())
		}
		return s.send(to, r)
	}
	_, host, _, ok := s.f.RouteGMP(guid, r.DLID())
	if !ok || !host {
		return fmt.Errorf("sma: GMP from %#x to LID %d: no route to the SM host", guid, r.DLID())
	}
	to := s.hostClient(m.MgmtClass(), r.DQP())
	if to == nil {
		return fmt.Errorf("sma: GMP from %#x to QP %d: no client of the SM host takes it", guid, r.DQP())
	}
	r.SetStatus(0)
	return s.send(to, r)
}

// noteAsked records that the request tid went to the CA port guid.
func (s *Server) noteAsked(tid, guid uint64) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.asked == nil {
		s.asked = make(map[uint64]askedCA)
	}
	if _, ok := s.asked[tid]; !ok && len(s.asked) >= maxAsked {
		for k, a := range s.asked {
			if now.Sub(a.at) > askedTTL {
				delete(s.asked, k)
			}
		}
		if len(s.asked) >= maxAsked {
			return
		}
	}
	s.asked[tid] = askedCA{guid, now}
}

// takeAsked reports whether the CA port guid was asked the request tid
// (within askedTTL), and forgets it.
func (s *Server) takeAsked(tid, guid uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.asked[tid]
	if !ok || a.guid != guid {
		return false
	}
	delete(s.asked, tid)
	return time.Since(a.at) <= askedTTL
}

// timeout gives r back to c as a send whose answer never came.
func (s *Server) timeout(c *client, r simproto.Request) {
	r.SetStatus(simproto.StatusTimeout)
	s.send(c, r)
}

// client returns the client with id, or nil.
func (s *Server) client(id int) *client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id < 0 || id >= len(s.clients) {
		return nil
	}
	return s.clients[id]
}

// hostClient returns the client a request for the SM host goes to: the
// SM for SMPs and QP0/QP1, else the client of QP dqp.
func (s *Server) hostClient(class uint8, dqp uint32) *client {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.clients {
		if c == nil {
			continue
		}
		if class == mad.ClassSubnDR || class == mad.ClassSubnLID || dqp <= 1 {
			if c.issm {
				return c
			}
		} else if c.qp == dqp {
			return c
		}
	}
	return nil
}

// Trap sends the switch's trap, if it has one (Fabric.TakeTrap), to the
// SM host's SM: softsm calls it when a port attached or detached.
func (s *Server) Trap() {
	r, ok := s.f.TakeTrap()
	if !ok {
		return
	}
	if to := s.hostClient(mad.ClassSubnLID, 0); to != nil {
		s.send(to, r)
	}
}

// send writes r to client c; a client whose socket is gone is forgotten.
func (s *Server) send(c *client, r simproto.Request) error {
	c.conn.SetWriteDeadline(time.Now().Add(writeWait))
	_, err := c.conn.Write(r)
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOTCONN) {
		s.mu.Lock()
		s.dropLocked(c, "is gone")
		s.mu.Unlock()
		return fmt.Errorf("%w: client %d is gone", ErrUndelivered, c.id)
	}
	s.logf("sma: client %d: send: %v", c.id, err)
	return fmt.Errorf("%w: client %d: %v", ErrUndelivered, c.id, err)
}
