package sm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/simproto"
	"github.com/softrdma/softrdma/ib/sma"
	"github.com/softrdma/softrdma/ib/umadrmpp"
	"github.com/softrdma/softrdma/wire"
)

// OpenSM in charge (Config.Manager = ManagerOpenSM). The SM starts
// Debian's unmodified opensm under ibsim's libumad2sim.so against package
// ib/sma's model of the subnet (sma.Fabric behind an sma.Server on
// abstract unix sockets of a private name) and hands it the subnet:
//
//   - LIDs: a port's attach is answered with port_info only once OpenSM
//     has made the port Active; the port_info carries the LID OpenSM set
//     on the port and, as SMLID, its MasterSMLID (OpenSM's own port's
//     LID). Until then the attach (and every keepalive) goes unanswered,
//     so provider/ib's Open waits as a real HCA waits for its SM. A port
//     that OpenSM gives another LID, or a ClientReregister, gets a
//     port_info at once saying so (provider/ib: LIDChange,
//     ClientReregister). The model's CA ports come up without a LID, so
//     that OpenSM assigns every LID itself.
//   - SA: softsm's own SA does not answer. An IB packet to OpenSM's LID
//     is a management packet (it does not wait for credit); a UD packet
//     to QP1 with the GSI Q_Key and a SLID that is the LID the port was
//     told is relayed to OpenSM as the GMP a real HCA's QP1 would have
//     sent it from that port (SLID, source QP as in the packet), through
//     sma.Server.FromPort; OpenSM's answers, and any GMP it sends a CA
//     port (Reports), come back through sma.ServerConfig.ToPort as UD
//     packets from OpenSM's LID, QP1, so that the port's SA client takes
//     them unchanged. RMPP: OpenSM runs with softsm's RMPP layer after
//     libumad2sim.so in its LD_PRELOAD (package ib/umadrmpp, built with
//     the C compiler when OpenSM starts), which cuts an RMPP-active answer
//     into kernel-framed segments; softsm reassembles them (toPort) and
//     sends the answer to the port through its own RMPP sender (window,
//     ACKs, retransmission, its RMPP budgets), which takes the port's ACKs;
//     they never reach OpenSM. Without the layer (no C compiler) an answer
//     of one segment is framed here and a longer one is dropped, logged.
//   - Forwarding: by the tables OpenSM set (sma.Tables, an immutable
//     snapshot swapped atomically when OpenSM sets something): a unicast
//     DLID by the linear forwarding table to the port on that switch
//     port, a multicast DLID by the multicast forwarding table to every
//     attached port in its mask but the sender's. The credits and
//     head-of-queue rules are unchanged.
//
// OpenSM's files (opensm.conf, the log osm.log, opensm.out, its caches)
// are in a private temporary directory removed at Close, or in
// OpenSMConfig.Dir. Close kills OpenSM and waits for it.

// Managers (Config.Manager).
const (
	// ManagerSoftsm is softsm's own SM, SA and forwarding (the default,
	// also "").
	ManagerSoftsm = "softsm"
	// ManagerOpenSM puts OpenSM in charge (see opensm.go).
	ManagerOpenSM = "opensm"
)

// Where Debian installs OpenSM and umad2sim.
const (
	DefaultOpenSMPath   = "/usr/sbin/opensm"
	DefaultUmad2simPath = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so"
)

// OpenSMRelayQueue is how many SA MADs of ports may wait to be handed to
// OpenSM (OpenSM in charge); one more is dropped (Stats.OpenSMRelayDrops).
const OpenSMRelayQueue = 1024

// OpenSMConfig configures ManagerOpenSM.
type OpenSMConfig struct {
	// Path is the opensm binary ("" → opensm in PATH, else
	// DefaultOpenSMPath).
	Path string
	// Umad2sim is ibsim's preload library ("" → DefaultUmad2simPath, or
	// the first libumad2sim.so under /usr/lib/*/umad2sim/).
	Umad2sim string
	// Dir keeps OpenSM's files ("" → a private temporary directory,
	// removed at Close).
	Dir string
	// Socket is the abstract socket name base the model is served on,
	// OpenSM's IBSIM_SOCKNAME ("" → "softsm-opensm-" and random hex).
	Socket string
	// SweepInterval is OpenSM's sweep_interval in seconds (0 → 1): how
	// soon OpenSM's light sweep finds a port that attached.
	SweepInterval int
	// Verbose runs OpenSM with -V (every log line, flushed at once).
	Verbose bool
	// NoRMPPLayer runs OpenSM under libumad2sim.so alone, without
	// softsm's RMPP layer (as when no C compiler is found): an SA answer
	// of more than one RMPP segment (over 200 bytes of records) is then
	// dropped, logged, and the port's request times out.
	NoRMPPLayer bool
	// CC is the C compiler that builds the RMPP layer ("" → $CC, else
	// cc).
	CC string
}

// OpenSMRMPPIn is how many RMPP answers of OpenSM softsm reassembles at
// once (OpenSM in charge); a segment of one more is dropped, logged.
const OpenSMRMPPIn = 64

// osmRMPPIdle is how long an answer being reassembled waits for its next
// segment (they come back to back from OpenSM's RMPP layer) before a new
// one may take its place.
const osmRMPPIdle = 5 * time.Second

// extSM is the SM's side of OpenSM in charge.
type extSM struct {
	cfg   OpenSMConfig
	fab   *sma.Fabric
	srv   *sma.Server
	dir   string
	rmDir bool
	relay chan relayJob
	// relayDrops counts the ports' SA MADs dropped because OpenSMRelayQueue of
	// them waited for OpenSM already (Stats.OpenSMRelayDrops).
	relayDrops atomic.Uint64
	cmd        *exec.Cmd
	exited     chan struct{}
	started    atomic.Bool   // OpenSM was started (then exited closes when it ends)
	up         chan struct{} // closed when OpenSM logs SUBNET UP
	upOnce     sync.Once
	logRelay   limitedLog
	// Packets for which OpenSM's tables name no port (softsm -v).
	logNoRoute limitedLog
	// rmppLib is softsm's RMPP layer that OpenSM runs with ("" without).
	rmppLib string
	// rmppIn are the RMPP answers of OpenSM being reassembled, by port and
	// TID. Guarded by SM.mu.
	rmppIn map[rmppKey]*osmAnswer
}

// osmAnswer is an RMPP answer of OpenSM to a port being reassembled.
type osmAnswer struct {
	r    mad.Reassembler
	h    fabric.UDPacket // the answer's addressing
	last time.Time       // of the last segment
}

// extPort is what the SM told a port in OpenSM mode. Guarded by SM.mu.
type extPort struct {
	nonce   []byte // of the port's last attach: a late port_info's MAC
	credits int    // the port's window in its attach
	sent    bool   // a port_info went out since the port registered
	rereg   bool   // the next port_info carries ClientReregister
	lid     uint16 // in the last port_info
	smLID   uint16
	osmRR   int // OpenSM's ClientReregister Sets seen
}

// relayJob is an SA MAD of a port on its way to OpenSM.
type relayJob struct {
	guid uint64
	r    simproto.Request
}

// findFile returns the first of the paths that exists.
func findFile(paths ...string) string {
	for _, p := range paths {
		if p == "" {
			continue
		}
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	return ""
}

// newExt prepares OpenSM mode: it finds opensm and libumad2sim.so and
// binds the model's server socket. Nothing runs until start.
func (s *SM) newExt(cfg OpenSMConfig) (*extSM, error) {
	if cfg.Path == "" {
		if p, err := exec.LookPath("opensm"); err == nil {
			cfg.Path = p
		} else {
			cfg.Path = findFile(DefaultOpenSMPath)
		}
	}
	if cfg.Path == "" || findFile(cfg.Path) == "" {
		return nil, fmt.Errorf("sm: OpenSM in charge needs opensm (apt-get install opensm): not found (%s)", DefaultOpenSMPath)
	}
	if cfg.Umad2sim == "" {
		globbed, _ := filepath.Glob("/usr/lib/*/umad2sim/libumad2sim.so")
		cfg.Umad2sim = findFile(append([]string{DefaultUmad2simPath}, globbed...)...)
	}
	if cfg.Umad2sim == "" || findFile(cfg.Umad2sim) == "" {
		return nil, fmt.Errorf("sm: OpenSM in charge needs ibsim's libumad2sim.so (apt-get install libumad2sim0): not found (%s)", DefaultUmad2simPath)
	}
	if cfg.Socket == "" {
		var b [6]byte
		rand.Read(b[:])
		cfg.Socket = "softsm-opensm-" + hex.EncodeToString(b[:])
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = 1
	}
	x := &extSM{cfg: cfg, relay: make(chan relayJob, OpenSMRelayQueue), exited: make(chan struct{}), up: make(chan struct{}),
		rmppIn: make(map[rmppKey]*osmAnswer)}
	x.fab = sma.New(sma.Config{Ports: s, Logf: s.cfg.Logf})
	srv, err := sma.Listen(x.fab, sma.ServerConfig{Base: cfg.Socket, Logf: s.cfg.Logf, ToPort: s.toPort})
	if err != nil {
		return nil, err
	}
	x.srv = srv
	return x, nil
}

// start runs the model's server, the relay, the port updates and OpenSM.
func (s *SM) startExt() error {
	x := s.ext
	s.wg.Add(3)
	go func() {
		defer s.wg.Done()
		if err := x.srv.Run(context.Background()); err != nil {
			s.logf("OpenSM's server: %v", err)
		}
	}()
	go func() { defer s.wg.Done(); s.relayLoop() }()
	go func() { defer s.wg.Done(); s.extUpdateLoop() }()
	return s.startOpenSM()
}

// startOpenSM writes OpenSM's configuration and starts it under
// libumad2sim.so.
func (s *SM) startOpenSM() error {
	x := s.ext
	if x.cfg.Dir != "" {
		if err := os.MkdirAll(x.cfg.Dir, 0o700); err != nil {
			return fmt.Errorf("sm: OpenSM's directory: %w", err)
		}
		x.dir = x.cfg.Dir
	} else {
		d, err := os.MkdirTemp("", "softsm-opensm-")
		if err != nil {
			return fmt.Errorf("sm: OpenSM's directory: %w", err)
		}
		x.dir, x.rmDir = d, true
	}
	conf := filepath.Join(x.dir, "opensm.conf")
	if out, err := exec.Command(x.cfg.Path, "-c", conf).CombinedOutput(); err != nil {
		return fmt.Errorf("sm: %s -c: %v: %s", x.cfg.Path, err, strings.TrimSpace(string(out)))
	}
	b, err := os.ReadFile(conf)
	if err != nil {
		return fmt.Errorf("sm: OpenSM's configuration: %w", err)
	}
	set := map[string]string{
		"sweep_interval":  fmt.Sprint(x.cfg.SweepInterval),
		"force_log_flush": "TRUE",
		"log_max_size":    "64", // MB: OpenSM truncates its log beyond
		"dump_files_dir":  x.dir,
	}
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if k, _, ok := strings.Cut(l, " "); ok {
			if v, ok := set[k]; ok {
				lines[i] = k + " " + v
			}
		}
	}
	if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		return fmt.Errorf("sm: OpenSM's configuration: %w", err)
	}
	if x.cfg.NoRMPPLayer {
		s.logf("OpenSM runs without softsm's RMPP layer (NoRMPPLayer): an SA answer of more than one RMPP segment (over 200 bytes of records) cannot reach a port")
	} else if lib, err := umadrmpp.Build(context.Background(), x.dir, x.cfg.CC); err != nil {
		s.logf("OpenSM runs without softsm's RMPP layer, which could not be built: %v; an SA answer of more than one RMPP segment (over 200 bytes of records) cannot reach a port (docs/opensm.md)", err)
	} else {
		x.rmppLib = lib
	}
	out, err := os.Create(filepath.Join(x.dir, "opensm.out"))
	if err != nil {
		return fmt.Errorf("sm: OpenSM's output: %w", err)
	}
	defer out.Close()
	args := []string{"-F", conf, "-f", x.logPath()}
	if x.cfg.Verbose {
		args = append(args, "-V")
	}
	cmd := exec.Command(x.cfg.Path, args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = x.dir, out, out
	cmd.Env = append(os.Environ(), "IBSIM_SOCKNAME="+x.cfg.Socket, "OSM_TMP_DIR="+x.dir, "OSM_CACHE_DIR="+x.dir, "LD_PRELOAD="+x.preload())
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := startLocked(cmd, &s.wg, func(err error) {
		close(x.exited)
		select {
		case <-s.quit:
		default:
			s.logf("OpenSM exited: %v (see %s)", err, x.logPath())
		}
	}); err != nil {
		return fmt.Errorf("sm: start OpenSM: %w", err)
	}
	x.cmd = cmd
	x.started.Store(true)
	s.logf("OpenSM (pid %d) manages the subnet: socket %q, files in %s, LD_PRELOAD=%s", cmd.Process.Pid, x.cfg.Socket, x.dir, x.preload())
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.watchSubnetUp() }()
	return nil
}

// startLocked starts cmd, whose parent-death signal (Pdeathsig) must come
// only when this process ends, and calls exited with Wait's result when
// cmd ends (wg counts the waiting goroutine). The signal comes when the
// thread that started the child ends, not the process, and the Go runtime
// ends a thread whose goroutine exits locked to it (one that entered a
// network namespace, say): any thread may be the one a Start ran on, and
// OpenSM was killed mid-run that way (every SA request timed out from then
// on). So a goroutine locked to its thread starts cmd and waits for it:
// its thread runs nothing else and lives as long as cmd.
func startLocked(cmd *exec.Cmd, wg *sync.WaitGroup, exited func(error)) error {
	started := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited(cmd.Wait())
	}()
	return <-started
}

func (x *extSM) logPath() string { return filepath.Join(x.dir, "osm.log") }

// preload is the LD_PRELOAD OpenSM runs with: libumad2sim.so, and
// softsm's RMPP layer after it when it was built.
func (x *extSM) preload() string { return umadrmpp.Preload(x.cfg.Umad2sim, x.rmppLib) }

// watchSubnetUp closes x.up when OpenSM's log says SUBNET UP, reading
// the log as it grows.
func (s *SM) watchSubnetUp() {
	x := s.ext
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var (
		f    *os.File
		tail []byte
		buf  = make([]byte, 64<<10)
	)
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	const up = "SUBNET UP"
	for {
		select {
		case <-s.quit:
			return
		case <-x.exited:
			return
		case <-t.C:
		}
		if f == nil {
			var err error
			if f, err = os.Open(x.logPath()); err != nil {
				continue
			}
		}
		for {
			n, _ := f.Read(buf)
			if n == 0 {
				break
			}
			chunk := append(tail, buf[:n]...)
			if strings.Contains(string(chunk), up) {
				x.upOnce.Do(func() { close(x.up) })
				s.logf("OpenSM: SUBNET UP")
				return
			}
			tail = append(tail[:0], chunk[max(0, len(chunk)-len(up)):]...)
		}
	}
}

// stopExt kills OpenSM, waits for it and closes the model's server.
// Close calls it after closing quit.
func (s *SM) stopExt() {
	x := s.ext
	if x.cmd != nil {
		x.cmd.Process.Kill()
		<-x.exited
	}
	x.srv.Close()
}

// removeExtDir removes OpenSM's private directory (after every goroutine
// ended).
func (s *SM) removeExtDir() {
	if x := s.ext; x != nil && x.rmDir && x.dir != "" {
		os.RemoveAll(x.dir)
	}
}

// OpenSMRunning reports whether the OpenSM the SM started runs (false
// unless Config.Manager is ManagerOpenSM and Run started it).
func (s *SM) OpenSMRunning() bool {
	if s.ext == nil || !s.ext.started.Load() {
		return false
	}
	select {
	case <-s.ext.exited:
		return false
	default:
		return true
	}
}

// Model returns the model of the subnet OpenSM manages (nil unless
// Config.Manager is ManagerOpenSM): what OpenSM set, LIDs and tables.
func (s *SM) Model() *sma.Fabric {
	if s.ext == nil {
		return nil
	}
	return s.ext.fab
}

// OpenSMUp returns a channel closed when OpenSM logged SUBNET UP (nil
// unless Config.Manager is ManagerOpenSM).
func (s *SM) OpenSMUp() <-chan struct{} {
	if s.ext == nil {
		return nil
	}
	return s.ext.up
}

// OpenSMPreload returns the LD_PRELOAD value OpenSM runs with:
// libumad2sim.so, and after it softsm's RMPP layer when it was built ("" unless
// OpenSM runs). A umad tool (saquery) run with it and IBSIM_SOCKNAME set to
// OpenSMConfig.Socket gets OpenSM's multi-segment answers whole.
func (s *SM) OpenSMPreload() string {
	if s.ext == nil || !s.ext.started.Load() {
		return ""
	}
	return s.ext.preload()
}

// OpenSMDir returns the directory of OpenSM's files ("" unless OpenSM
// runs).
func (s *SM) OpenSMDir() string {
	if s.ext == nil {
		return ""
	}
	return s.ext.dir
}

// activeView reports whether OpenSM made the port Active with a unicast
// LID and SM LID of its own.
func activeView(v sma.PortView) bool {
	return v.State == mad.PortActive && unicast(v.LID) && unicast(v.SMLID) && v.LID != v.SMLID
}

func unicast(lid uint16) bool { return lid != 0 && lid < wire.MulticastLIDBase }

// linkChanged brings the model's ports up to date with the attached ones
// and has the switch tell OpenSM of the links that came up or went down
// (trap 128), as a switch does: OpenSM sweeps at once, not at its next
// light sweep.
func (x *extSM) linkChanged() {
	x.fab.Refresh()
	x.srv.Trap()
}

// extAttached answers an attach the SM took in OpenSM mode: a port_info
// once OpenSM made the port Active, else nothing yet (extUpdateLoop sends
// it when OpenSM does).
func (s *SM) extAttached(guid uint64, nonce []byte, from netip.AddrPort, rereg bool, credits int) {
	if rereg {
		s.ext.linkChanged() // the model finds the port now
	}
	v, ok := s.ext.fab.Port(guid)
	s.mu.Lock()
	p := s.byGUID[guid]
	if p == nil || p.addr != from {
		s.mu.Unlock()
		return
	}
	p.ext.nonce = append(p.ext.nonce[:0], nonce...)
	if rereg {
		p.ext = extPort{nonce: p.ext.nonce, credits: credits, rereg: true}
	}
	var reply []byte
	if ok && activeView(v) {
		reply = s.extPortInfoLocked(p, v)
	}
	s.mu.Unlock()
	if reply != nil {
		if _, err := s.fabric.WriteToUDPAddrPort(reply, from); err != nil {
			s.logf("port_info to %v: %v", from, err)
		}
	}
}

// extPortInfoLocked builds the port_info that tells p what OpenSM made of
// it and records it; an OpenSM ClientReregister after the port's first
// port_info restarts the link's counts at both ends (as a port registered
// anew). Caller holds mu.
func (s *SM) extPortInfoLocked(p *port, v sma.PortView) []byte {
	rereg := p.ext.rereg || (p.ext.sent && v.Reregisters > p.ext.osmRR)
	if rereg && p.ext.sent {
		p.ls.link.Reset(min(max(p.ext.credits, 0), fabric.MaxWindow), s.win)
	}
	switch {
	case !p.ext.sent:
		s.logf("port %#x: Active, LID %d (OpenSM's), SM LID %d", p.guid, v.LID, v.SMLID)
	case p.ext.lid != v.LID:
		s.logf("port %#x: OpenSM moved it from LID %d to LID %d", p.guid, p.ext.lid, v.LID)
	}
	p.ext.sent, p.ext.rereg = true, false
	p.ext.lid, p.ext.smLID, p.ext.osmRR = v.LID, v.SMLID, v.Reregisters
	win := 0
	if p.ls.link.On {
		win = s.win
	}
	return fabric.EncodeControl(s.sign(&fabric.Control{
		Type: fabric.TypePortInfo, GUID: p.guid, LID: v.LID, SMLID: v.SMLID,
		SubnetPrefix: s.prefix, PKeys: []uint16{fabric.DefaultPKey}, Epoch: s.epoch,
		MTU: fabric.PortMTU, Rate: fabric.PortRate, State: fabric.StateActive,
		ClientReregister: rereg, Credits: win,
		Session: s.session(p.addr, p.guid), SMGUID: s.cfg.SMGUID,
	}, p.ext.nonce))
}

// extUpdateLoop sends a port_info to every attached port whose LID, SM
// LID or registration OpenSM changed (or that OpenSM made Active), each
// time the model changed.
func (s *SM) extUpdateLoop() {
	x := s.ext
	for {
		select {
		case <-s.quit:
			return
		case <-x.fab.Changes():
		}
		s.mu.Lock()
		guids := make([]uint64, 0, len(s.byAddr))
		for _, p := range s.byAddr {
			guids = append(guids, p.guid)
		}
		s.mu.Unlock()
		views := make([]sma.PortView, len(guids))
		found := make([]bool, len(guids))
		for i, g := range guids {
			views[i], found[i] = x.fab.Port(g)
		}
		type out struct {
			b  []byte
			to netip.AddrPort
		}
		var outs []out
		s.mu.Lock()
		for i, g := range guids {
			p, v := s.byGUID[g], views[i]
			if p == nil || !p.attached() || !found[i] || !activeView(v) {
				continue
			}
			if p.ext.sent && v.LID == p.ext.lid && v.SMLID == p.ext.smLID && v.Reregisters <= p.ext.osmRR {
				continue
			}
			outs = append(outs, out{s.extPortInfoLocked(p, v), p.addr})
		}
		s.mu.Unlock()
		for _, o := range outs {
			if _, err := s.fabric.WriteToUDPAddrPort(o.b, o.to); err != nil {
				s.logf("port_info to %v: %v", o.to, err)
			}
		}
	}
}

// toSM reports whether dlid is the SM's (and its SA's): SMLID, or in
// OpenSM mode the LID OpenSM's port has.
func (s *SM) toSM(dlid uint16) bool {
	if s.ext == nil {
		return dlid == fabric.SMLID
	}
	l := s.ext.fab.Tables().HostLID
	return l != 0 && dlid == l
}

// relayFromFabric relays an SA MAD of port p to OpenSM (packetIn's and
// forwardHead's part for a packet to OpenSM's LID). Caller holds mu.
func (s *SM) relayFromFabric(b []byte, p *port) {
	var pkt fabric.Packet
	if err := fabric.Parse(b, &pkt); err != nil {
		p.c.drops.Add(1)
		s.logf("SA packet from %#x: %v", p.guid, err)
		return
	}
	ud := &pkt.UD
	if ud.BTH.DestQP() != fabric.SAQPN || ud.DETH.QKey() != fabric.SAQKey || len(ud.Payload) < mad.Len ||
		!p.ext.sent || pkt.LRH.SLID() != p.ext.lid {
		// A port speaks for itself only: its SLID is the LID OpenSM
		// gave it (OpenSM's SA knows the requester by it).
		p.c.drops.Add(1)
		s.limitedf(&s.logBad, time.Now(), "SA packet from %#x: DestQP %d Q_Key %#x payload %d SLID %d (its LID %d): dropped",
			p.guid, ud.BTH.DestQP(), ud.DETH.QKey(), len(ud.Payload), pkt.LRH.SLID(), p.ext.lid)
		return
	}
	p.c.sa.Add(1)
	if s.saDrop.Load() {
		return // SADrop: the SA falls silent, as softsm's own does
	}
	req := mad.MAD(ud.Payload[:mad.Len])
	if isRMPPControl(req) {
		// An ACK (STOP, ABORT) of an answer of OpenSM's that softsm sends
		// (toPort): the MAD layer's business, which softsm plays here;
		// OpenSM's SA would take it for a request.
		key := rmppKey{guid: p.guid, tid: req.TID()}
		if x := s.rmpp[key]; x != nil {
			s.rmppReceive(key, req, x.send)
		}
		return
	}
	src := s.saSourceOf(p)
	guid := p.guid
	if !s.saAllow(&p.saBudget, &p.tableBudget, src, s.sa.Broad(req), func() string { return fmt.Sprintf("port %#x (%v)", guid, p.addr) }) {
		return
	}
	r := simproto.Request(make([]byte, simproto.RequestLen))
	r.SetDLID(pkt.LRH.DLID())
	r.SetSLID(pkt.LRH.SLID())
	r.SetDQP(ud.BTH.DestQP())
	r.SetSQP(ud.DETH.SrcQP())
	r.SetLength(simproto.MADLen)
	copy(r.MAD(), req)
	if s.cfg.SADelay > 0 {
		// SADelay: OpenSM gets the request when the delay has passed, as
		// softsm's own SA processes it then.
		s.after(s.cfg.SADelay, func() { s.relayToOpenSM(guid, r) })
		return
	}
	s.relayToOpenSM(guid, r)
}

// relayToOpenSM queues the SA MAD r of the port guid for OpenSM, or drops
// it (counted, logged) when OpenSMRelayQueue wait already. Caller holds mu.
func (s *SM) relayToOpenSM(guid uint64, r simproto.Request) {
	select {
	case s.ext.relay <- relayJob{guid: guid, r: r}:
	default:
		s.ext.relayDrops.Add(1)
		s.limitedf(&s.ext.logRelay, time.Now(), "SA MAD from %#x: dropped, %d wait for OpenSM already", guid, OpenSMRelayQueue)
	}
}

// relayLoop hands the ports' SA MADs to OpenSM.
func (s *SM) relayLoop() {
	for {
		select {
		case <-s.quit:
			return
		case j := <-s.ext.relay:
			if err := s.ext.srv.FromPort(j.guid, j.r); err != nil {
				if errors.Is(err, sma.ErrUndelivered) {
					s.ext.relayDrops.Add(1)
				}
				s.limitedf(&s.ext.logRelay, time.Now(), "SA MAD from %#x: %v", j.guid, err)
			}
		}
	}
}

// toPort sends a GMP of OpenSM (an SA answer, a Report) to the port guid
// as a UD packet: a management packet, counted on the link, sent without
// credit (sma.ServerConfig.ToPort). The segments of an RMPP-active answer
// (from softsm's RMPP layer in OpenSM) are reassembled and the answer goes
// through softsm's RMPP sender.
func (s *SM) toPort(guid uint64, r simproto.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.byGUID[guid]
	if d == nil || !d.attached() || s.closed {
		return
	}
	h := fabric.UDPacket{
		DLID: r.DLID(), SLID: r.SLID(),
		UD: wire.UDHeader{PKey: fabric.DefaultPKey, DestQP: r.DQP(), QKey: fabric.SAQKey, SrcQP: r.SQP()},
	}
	m := mad.MAD(r.MAD()[:mad.Len])
	if m.RMPPFlags()&mad.RMPPFlagActive != 0 && m.IsResponse() {
		switch m.RMPPType() {
		case mad.RMPPTypeData:
			s.osmSegmentLocked(guid, h, m)
			return
		case 0:
			// An RMPP-active answer that nothing cut into segments:
			// OpenSM runs without softsm's RMPP layer. ibsim's protocol
			// carries the first 256 bytes of a MAD, so an answer of one
			// segment (at most 200 bytes of records) is framed here as
			// the kernel frames it; a longer one was cut to 256 bytes by
			// umad2sim, which gives its length as 256: one of 256 bytes
			// is whole only if its records fill the 200 bytes exactly.
			n, stride := r.Length(), int(m.AttrOffset())*8
			if n < mad.SAHeaderEnd || n > mad.Len || (n == mad.Len && (stride == 0 || mad.SADataLen%stride != 0)) {
				s.limitedf(&s.ext.logRelay, time.Now(), "OpenSM's RMPP answer to %#x (TID %#x): cut to %d bytes by umad2sim (softsm's RMPP layer is not running): dropped", guid, m.TID(), n)
				return
			}
			m = mad.RMPPSegments(m, m[mad.SAHeaderEnd:n])[0]
		}
	}
	s.osmSendLocked(guid, h, m)
}

// osmSendLocked sends m to the port guid with OpenSM's addressing h (a new
// PSN). Caller holds mu.
func (s *SM) osmSendLocked(guid uint64, h fabric.UDPacket, m mad.MAD) {
	d := s.byGUID[guid]
	if d == nil || !d.attached() || s.closed {
		return
	}
	h.UD.PSN = s.psn & 0xFFFFFF
	s.psn++
	out := make([]byte, fabric.PacketLen(len(m), false, false))
	fabric.EncodeUD(out, &h, m)
	d.ls.link.Sent(1)
	if _, err := s.fabric.WriteToUDPAddrPort(out, d.addr); err != nil {
		s.logf("OpenSM's MAD to %#x: %v", guid, err)
		return
	}
	d.c.tx.Add(1)
}

// osmSegmentLocked takes a segment of an RMPP answer of OpenSM to the
// port guid, cut by softsm's RMPP layer in OpenSM's process; once the
// answer is whole it goes to the port through softsm's RMPP sender, within
// the RMPP budgets of softsm's own SA (beyond them the port is answered
// 0x0100, TableBusy). Caller holds mu.
func (s *SM) osmSegmentLocked(guid uint64, h fabric.UDPacket, seg mad.MAD) {
	x := s.ext
	key := rmppKey{guid: guid, tid: seg.TID()}
	now := time.Now()
	a := x.rmppIn[key]
	if a == nil || seg.SegmentNumber() == 1 {
		if a == nil && len(x.rmppIn) >= OpenSMRMPPIn {
			for k, old := range x.rmppIn {
				if now.Sub(old.last) > osmRMPPIdle {
					delete(x.rmppIn, k)
				}
			}
		}
		if a == nil && len(x.rmppIn) >= OpenSMRMPPIn {
			s.limitedf(&x.logRelay, now, "OpenSM's RMPP answer to %#x (TID %#x): %d answers being reassembled already: dropped", guid, key.tid, OpenSMRMPPIn)
			return
		}
		a = &osmAnswer{h: h}
		x.rmppIn[key] = a
	}
	a.last = now
	done, data, err := a.r.Add(seg) // at most mad.MaxRMPPSegments
	if err != nil {
		delete(x.rmppIn, key)
		s.limitedf(&x.logRelay, now, "OpenSM's RMPP answer to %#x (TID %#x), segment %d: %v: dropped", guid, key.tid, seg.SegmentNumber(), err)
		return
	}
	if !done {
		return
	}
	delete(x.rmppIn, key)
	first := a.r.Header()
	// What the port asked, for a TableBusy answer: the answer's headers
	// with the request's method and no RMPP header.
	req := append(mad.MAD(nil), first[:mad.Len]...)
	req.SetMethod(req.Method() &^ mad.MethodResp)
	clear(req[mad.HeaderLen : mad.HeaderLen+mad.RMPPHeaderLen])
	p := s.byGUID[guid]
	if p == nil {
		return
	}
	send := func(m mad.MAD) { s.osmSendLocked(guid, a.h, m) }
	s.answer(key, req, mad.RMPPSegments(first, data), send, s.saSourceOf(p))
}

// extDestinations puts the ports a packet from p to dlid goes to by
// OpenSM's tables t (those in force when it arrived; nil: the current
// ones) into p's pending list: the unicast DLID's switch port,
// or the multicast DLID's mask but p's own port. Switch ports 0 and 1
// (the switch, OpenSM's host) lead to no port of the SM. Caller holds mu.
func (s *SM) extDestinations(p *port, dlid uint16, t *sma.Tables) {
	if t == nil {
		t = s.ext.fab.Tables()
	}
	ls := &p.ls
	if wire.IsMulticastLID(dlid) {
		for w, mask := range t.MulticastMask(dlid) {
			for mask != 0 {
				sp := w*16 + bits.TrailingZeros16(mask)
				mask &= mask - 1
				if sp < 2 || sp >= len(t.Ports) {
					continue
				}
				if d := s.byGUID[t.Ports[sp]]; d != nil && d != p && d.attached() {
					ls.pend = append(ls.pend, d)
				}
			}
		}
		return
	}
	if sp := t.UnicastPort(dlid); sp >= 2 {
		if d := s.byGUID[t.Ports[sp]]; d != nil && d.attached() {
			ls.pend = append(ls.pend, d)
		}
	}
}
