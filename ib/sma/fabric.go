// Package sma models the subnet management agents of softsm's emulated
// InfiniBand subnet, so that a real subnet manager (Debian's unmodified
// OpenSM, through ibsim's libumad2sim.so and the Server here) can manage
// it: it answers the SMPs an SM sends (SubnGet and SubnSet,
// directed-route and LID-routed) for every node of the subnet and keeps
// what the SM sets (LIDs, port states, forwarding tables) for the switch
// to forward by.
//
// The subnet (Fabric):
//
//	switch   one switch (softsm's), base switch port 0 (the switch's
//	         LID), Config.SwitchPorts external ports
//	SM host  a CA of its own, one port, on switch port 1: the node every
//	         Server client (OpenSM, ibnetdiscover) attaches to. Its node
//	         GUID is Config.HostGUID, its port GUID HostGUID+1
//	         (umad2sim derives a port's GID from node GUID + port number)
//	CAs      one CA node with one port per port Config.Ports lists
//	         (softsm's attached ports), each on the lowest free switch port
//	         from 2 while it is attached. Node GUID = port GUID,
//	         NodeDescription = the port's NodeDesc. A CA port reports the
//	         LID Ports gives it (softsm's) until an SM sets another
//
// Links are up (PortPhysicalState LinkUp) while the CA is attached; a port
// starts in Init and goes where the SM takes it: Armed from Init, Active
// from Armed, Down (then, the link being up, Init again) from any. A
// switch port whose link comes up or goes down sets SwitchInfo's
// PortStateChange (an SM's light sweep looks at it). The list of CA ports
// is read again at most every Config.Refresh, when an SMP comes.
//
// Routing, as IBA 14.2.2 and the kernel's smi.c do it for the paths
// through this subnet: a directed-route SMP (permissive DrSLID and DrDLID
// only) leaves the SM host by InitialPath[1] (its port), crosses only
// switches at hops 2..HopCount-1, records each hop's ingress port in
// ReturnPath and is answered by the node it ends at; the answer comes
// back with the D bit set, the same paths and HopPointer 0 (where the
// return path ends, at the requester). A LID-routed SMP goes by the
// switch's linear forwarding table as the SM set it. An SMP that goes
// nowhere (a bad path, a port without link, a LID no port has) is given
// back to its sender with simproto.StatusTimeout, as the kernel reports
// a send whose answer never came, never silently dropped (umad2sim has no
// timeouts of its own: its client would wait forever).
//
// Attributes (Get and, where writable, Set; the answer to a Set is the
// attribute as it is afterwards): NodeDescription, NodeInfo, SwitchInfo,
// PortInfo, P_KeyTable, GUIDInfo, SLtoVLMappingTable,
// VLArbitrationTable, LinearForwardingTable, MulticastForwardingTable.
// SMInfo goes to the SM of the node it reaches (a Server client that
// opened the issm device); elsewhere, and for any other attribute, the
// answer is status 0x000C (method/attribute combination unsupported); a
// method other than Get and Set, 0x0008; a bad attribute modifier or a
// Set the attribute cannot take (a port state transition IBA does not
// allow), 0x001C. TrapRepress and responses are consumed.
package sma

import (
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/simproto"
)

// Port is a CA port of the subnet: one of softsm's attached ports.
type Port struct {
	GUID     uint64
	NodeDesc string
	// LID is the LID the port reports before an SM sets one (0: none).
	LID uint16
}

// Ports lists the CA ports attached to the switch (ib/sm's SM
// implements it).
type Ports interface {
	CAPorts() []Port
}

// Defaults.
const (
	// DefaultSwitchPorts is Config.SwitchPorts's default: a 36-port
	// switch, 35 CA ports beside the SM host.
	DefaultSwitchPorts = 36
	// MaxSwitchPorts is the most external ports a switch has (NumPorts is
	// one byte, 255 is reserved).
	MaxSwitchPorts = 254
	// DefaultSwitchGUID and DefaultHostGUID are the switch's and the SM
	// host's node GUIDs.
	DefaultSwitchGUID = 0x5f7d_0000_0000_0100
	DefaultHostGUID   = 0x5f7d_0000_0000_0200
	// DefaultRefresh is Config.Refresh's default.
	DefaultRefresh = 100 * time.Millisecond
	// LinearFDBCap is the switch's unicast LID capacity (every unicast
	// LID), MulticastFDBCap its multicast one (MLIDs 0xC000..).
	LinearFDBCap    = 0xC000
	MulticastFDBCap = 4096
	// HostName is the SM host's node name (SIM_HOST) and NodeDescription.
	HostName = "softsm-smhost"
	// SwitchDesc is the switch's NodeDescription.
	SwitchDesc = "softsm switch"
	// DefaultGIDPrefix is every port's GIDPrefix until an SM sets one.
	DefaultGIDPrefix = 0xfe80_0000_0000_0000
)

// Config configures a Fabric.
type Config struct {
	// Ports lists the CA ports (nil: none).
	Ports Ports
	// SwitchPorts is the switch's number of external ports (0 →
	// DefaultSwitchPorts, at most MaxSwitchPorts, at least 1).
	SwitchPorts int
	// SwitchGUID and HostGUID are the switch's and the SM host's node
	// GUIDs (0 → the defaults).
	SwitchGUID, HostGUID uint64
	// Refresh is the least time between two readings of Ports (0 →
	// DefaultRefresh).
	Refresh time.Duration
	// Logf, if set, gets one line per topology change and state
	// transition.
	Logf func(format string, args ...any)
}

// node is a CA or the switch.
type node struct {
	typ   uint8
	guid  uint64
	desc  string
	ports []*port // by port number; a CA has no port 0
	sw    *switchState
}

// port is a port of a node.
type port struct {
	node *node
	num  uint8
	guid uint64
	pi   [mad.PortInfoLen]byte
	peer *port
	// P_Key table (one block), GUIDInfo block 0, SLtoVL tables by input
	// port, VLArbitration blocks 1..4.
	pkeys  [mad.SMPDataLen]byte
	guids  [mad.SMPDataLen]byte
	sl2vl  map[uint8]*[8]byte
	vlarb  [4][mad.SMPDataLen]byte
	states []uint8
	rereg  int
}

type switchState struct {
	info [mad.SMPDataLen]byte
	lft  []byte
	mft  [][]uint16 // by MLID-0xC000, then position
}

// Fabric is the subnet's management model.
type Fabric struct {
	cfg Config

	mu       sync.Mutex
	sw, host *node
	cas      map[uint64]*node // by port GUID
	refresh  time.Time
	full     bool // some port found no free switch port (logged once)
	hostIsSM bool
	// dirty: something changed since the last Tables snapshot.
	dirty   bool
	tables  atomic.Pointer[Tables]
	changes chan struct{}
	// linkChange: a CA port's link came up or went down since the last
	// trap (TakeTrap); trapTID numbers the traps.
	linkChange bool
	trapTID    uint64
}

// New returns the subnet with the CA ports cfg.Ports lists now.
func New(cfg Config) *Fabric {
	if cfg.SwitchPorts <= 0 {
		cfg.SwitchPorts = DefaultSwitchPorts
	}
	cfg.SwitchPorts = min(cfg.SwitchPorts, MaxSwitchPorts)
	if cfg.SwitchGUID == 0 {
		cfg.SwitchGUID = DefaultSwitchGUID
	}
	if cfg.HostGUID == 0 {
		cfg.HostGUID = DefaultHostGUID
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = DefaultRefresh
	}
	f := &Fabric{cfg: cfg, cas: map[uint64]*node{}, changes: make(chan struct{}, 1)}
	n := cfg.SwitchPorts
	sw := &node{typ: mad.NodeSwitch, guid: cfg.SwitchGUID, desc: SwitchDesc, sw: &switchState{
		lft: slices.Repeat([]byte{0xFF}, LinearFDBCap),
		mft: make([][]uint16, MulticastFDBCap),
	}}
	si := mad.SwitchInfo(sw.sw.info[:])
	si.SetLinearFDBCap(LinearFDBCap)
	si.SetMulticastFDBCap(MulticastFDBCap)
	si.SetMulticastFDBTop(0xBFFF) // none in use (IBA: below 0xC000)
	si.SetLifeTimeValue(18)
	binary.BigEndian.PutUint16(sw.sw.info[12:], 1) // LIDsPerPort
	sw.sw.info[10] = 0xFF                          // DefaultMulticastNotPrimaryPort: none
	sw.sw.info[9] = 0xFF                           // DefaultMulticastPrimaryPort: none
	for i := 0; i <= n; i++ {
		p := newPort(sw, uint8(i), 0)
		if i == 0 {
			p.guid = sw.guid
			pi := mad.PortInfo(p.pi[:])
			pi.SetCapabilityMask(mad.CapIsSystemImageGUID)
			pi.SetGIDPrefix(DefaultGIDPrefix)
			pi.SetPortState(mad.PortActive) // base SP0: always up
			pi.SetPhysState(mad.PhysLinkUp)
			p.states = []uint8{mad.PortActive}
		}
		sw.ports = append(sw.ports, p)
	}
	f.sw = sw
	f.host = newCA(cfg.HostGUID, cfg.HostGUID+1, HostName)
	link(sw.ports[1], f.host.ports[1])
	f.refreshLocked(time.Now())
	f.publishLocked()
	return f
}

// newCA returns a CA with one port, not linked.
func newCA(nodeGUID, portGUID uint64, desc string) *node {
	n := &node{typ: mad.NodeCA, guid: nodeGUID, desc: desc}
	p := newPort(n, 1, portGUID)
	pi := mad.PortInfo(p.pi[:])
	pi.SetCapabilityMask(mad.CapIsCMSupported | mad.CapIsClientReregistration | mad.CapIsSystemImageGUID)
	pi.SetGIDPrefix(DefaultGIDPrefix)
	binary.BigEndian.PutUint16(p.pkeys[:], 0xFFFF)
	binary.BigEndian.PutUint64(p.guids[:], portGUID)
	pi.SetGUIDCap(1)
	n.ports = []*port{nil, p}
	return n
}

// newPort returns port num of n with its link down.
func newPort(n *node, num uint8, guid uint64) *port {
	p := &port{node: n, num: num, guid: guid, sl2vl: map[uint8]*[8]byte{}}
	pi := mad.PortInfo(p.pi[:])
	pi.SetLocalPortNum(num)
	pi.SetLinkWidthEnabled(2)   // 4X
	pi.SetLinkWidthSupported(3) // 1X, 4X
	pi.SetLinkWidthActive(2)
	pi.SetLinkSpeedSupported(1) // 2.5 Gb/s: 4X SDR, softsm's 10 Gb/s
	pi.SetLinkSpeedActive(1)
	pi.SetLinkSpeedEnabled(1)
	pi.SetPortState(mad.PortDown)
	pi.SetPhysState(mad.PhysPolling)
	pi.SetLinkDownDefaultState(mad.PhysPolling)
	pi.SetNeighborMTU(4) // 2048, softsm's MTU
	pi.SetMTUCap(4)
	pi.SetVLCap(1) // VL0
	pi.SetVLArbitrationCaps(8, 8)
	pi.SetOperationalVLs(1)
	pi.SetRespTimeValue(8)
	return p
}

// link connects a and b and brings the link up: both ports go to Init.
func link(a, b *port) {
	a.peer, b.peer = b, a
	for _, p := range []*port{a, b} {
		pi := mad.PortInfo(p.pi[:])
		pi.SetPhysState(mad.PhysLinkUp)
		p.setState(mad.PortInit)
	}
}

// unlink takes a's link down.
func unlink(a *port) {
	if b := a.peer; b != nil {
		b.peer = nil
		mad.PortInfo(b.pi[:]).SetPhysState(mad.PhysPolling)
		b.setState(mad.PortDown)
	}
	a.peer = nil
	mad.PortInfo(a.pi[:]).SetPhysState(mad.PhysPolling)
	a.setState(mad.PortDown)
}

// setState sets the port's state and records the transition.
func (p *port) setState(s uint8) {
	pi := mad.PortInfo(p.pi[:])
	if pi.PortState() == s && len(p.states) > 0 {
		return
	}
	pi.SetPortState(s)
	p.states = append(p.states, s)
}

func (f *Fabric) logf(format string, args ...any) {
	if f.cfg.Logf != nil {
		f.cfg.Logf(format, args...)
	}
}

// Refresh reads the list of CA ports now.
func (f *Fabric) Refresh() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refreshLocked(time.Now())
	f.publishLocked()
}

// maybeRefresh reads the list of CA ports when Config.Refresh passed.
func (f *Fabric) maybeRefresh(now time.Time) {
	if now.Sub(f.refresh) >= f.cfg.Refresh {
		f.refreshLocked(now)
	}
}

func (f *Fabric) refreshLocked(now time.Time) {
	f.refresh = now
	if f.cfg.Ports == nil {
		return
	}
	list := f.cfg.Ports.CAPorts()
	seen := make(map[uint64]bool, len(list))
	for _, cp := range list {
		if cp.GUID != 0 && cp.GUID != f.sw.guid && cp.GUID != f.host.guid && cp.GUID != f.host.ports[1].guid {
			seen[cp.GUID] = true
		}
	}
	for guid, n := range f.cas {
		if seen[guid] {
			continue
		}
		p := n.ports[1]
		if sp := p.peer; sp != nil {
			f.logf("sma: CA port %#x left switch port %d", guid, sp.num)
			unlink(sp)
			mad.SwitchInfo(f.sw.sw.info[:]).SetPortStateChange(true)
			f.dirty, f.linkChange = true, true
		}
		delete(f.cas, guid)
		f.full = false
	}
	for _, cp := range list {
		if !seen[cp.GUID] {
			continue
		}
		if n, ok := f.cas[cp.GUID]; ok {
			n.desc = cp.NodeDesc
			continue
		}
		sp := f.freeSwitchPort()
		if sp == nil {
			if !f.full {
				f.full = true
				f.logf("sma: no free switch port for CA port %#x (%d ports): not in the subnet", cp.GUID, f.cfg.SwitchPorts)
			}
			continue
		}
		n := newCA(cp.GUID, cp.GUID, cp.NodeDesc)
		mad.PortInfo(n.ports[1].pi[:]).SetLID(cp.LID)
		f.cas[cp.GUID] = n
		link(sp, n.ports[1])
		mad.SwitchInfo(f.sw.sw.info[:]).SetPortStateChange(true)
		f.dirty, f.linkChange = true, true
		f.logf("sma: CA port %#x (%q) on switch port %d", cp.GUID, cp.NodeDesc, sp.num)
	}
}

// freeSwitchPort returns the lowest switch port from 2 without a link.
func (f *Fabric) freeSwitchPort() *port {
	for _, p := range f.sw.ports[2:] {
		if p.peer == nil {
			return p
		}
	}
	return nil
}

// SetHostIsSM sets the IsSM capability of the SM host's port (a client
// opened or closed the issm device).
func (f *Fabric) SetHostIsSM(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hostIsSM = on
	pi := mad.PortInfo(f.host.ports[1].pi[:])
	c := pi.CapabilityMask() &^ mad.CapIsSM
	if on {
		c |= mad.CapIsSM
	}
	pi.SetCapabilityMask(c)
}

// HostNodeInfo returns the SM host's NodeInfo as an SMP to its port
// would (umad2sim asks for it when a client connects).
func (f *Fabric) HostNodeInfo() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := make([]byte, mad.SMPDataLen)
	f.nodeInfo(b, f.host.ports[1])
	return b
}

// HostPortInfo returns the SM host's port's PortInfo.
func (f *Fabric) HostPortInfo() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := make([]byte, mad.SMPDataLen)
	f.portInfo(b, f.host.ports[1], f.host.ports[1])
	return b
}

// HostPKeys returns the SM host's port's P_Key table block 0.
func (f *Fabric) HostPKeys() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.host.ports[1].pkeys[:])
}

// PortView is what the subnet's SM made of one CA port.
type PortView struct {
	GUID uint64
	// SwitchPort is the switch port the CA hangs off.
	SwitchPort int
	// LID, LMC and SMLID are the port's PortInfo LID, LMC and
	// MasterSMLID; State its PortState.
	LID   uint16
	LMC   uint8
	SMLID uint16
	State uint8
	// States lists every state the port was in, from the one it came up
	// in (Init).
	States []uint8
	// Reregisters counts the SM's Sets with ClientReregister.
	Reregisters int
}

func (p *port) view() PortView {
	pi := mad.PortInfo(p.pi[:])
	v := PortView{GUID: p.guid, LID: pi.LID(), LMC: pi.LMC(), SMLID: pi.MasterSMLID(), State: pi.PortState(),
		States: slices.Clone(p.states), Reregisters: p.rereg}
	if p.peer != nil {
		v.SwitchPort = int(p.peer.num)
	}
	return v
}

// Port returns the view of the CA port with guid (false: none attached).
func (f *Fabric) Port(guid uint64) (PortView, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.cas[guid]
	if !ok {
		return PortView{}, false
	}
	return n.ports[1].view(), true
}

// PortLID returns the LID the SM set on the CA port with guid (0: none,
// or no such port).
func (f *Fabric) PortLID(guid uint64) uint16 {
	v, _ := f.Port(guid)
	return v.LID
}

// Ports returns the views of the CA ports, by switch port.
func (f *Fabric) Ports() []PortView {
	f.mu.Lock()
	defer f.mu.Unlock()
	var vs []PortView
	for _, p := range f.sw.ports[2:] {
		if p.peer != nil {
			vs = append(vs, p.peer.view())
		}
	}
	return vs
}

// Host returns the view of the SM host's port (on switch port 1).
func (f *Fabric) Host() PortView {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.host.ports[1].view()
}

// SwitchView is the switch as the SM configured it.
type SwitchView struct {
	GUID uint64
	// LID is switch port 0's LID.
	LID uint16
	// NumPorts is the number of external ports.
	NumPorts int
	// LinearFDBTop and MulticastFDBTop are SwitchInfo's.
	LinearFDBTop, MulticastFDBTop uint16
	// PortStates are the states of ports 0..NumPorts.
	PortStates []uint8
}

// Switch returns the switch's view.
func (f *Fabric) Switch() SwitchView {
	f.mu.Lock()
	defer f.mu.Unlock()
	si := mad.SwitchInfo(f.sw.sw.info[:])
	v := SwitchView{GUID: f.sw.guid, LID: mad.PortInfo(f.sw.ports[0].pi[:]).LID(), NumPorts: len(f.sw.ports) - 1,
		LinearFDBTop: si.LinearFDBTop(), MulticastFDBTop: si.MulticastFDBTop()}
	for _, p := range f.sw.ports {
		v.PortStates = append(v.PortStates, mad.PortInfo(p.pi[:]).PortState())
	}
	return v
}

// LFT returns the switch's linear forwarding table up to LinearFDBTop:
// entry l is the port for LID l, 0xFF for none.
func (f *Fabric) LFT() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	top := int(mad.SwitchInfo(f.sw.sw.info[:]).LinearFDBTop())
	return slices.Clone(f.sw.sw.lft[:min(top+1, len(f.sw.sw.lft))])
}

// MFT returns the switch ports in mlid's multicast forwarding table entry
// (nil for none, or an MLID beyond the table).
func (f *Fabric) MFT(mlid uint16) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if mlid < 0xC000 || int(mlid-0xC000) >= len(f.sw.sw.mft) {
		return nil
	}
	var ps []int
	for pos, mask := range f.sw.sw.mft[mlid-0xC000] {
		for b := range 16 {
			if mask&(1<<b) != 0 {
				ps = append(ps, pos*16+b)
			}
		}
	}
	return ps
}

// TakeTrap returns the trap the switch sends its SM when a CA port's
// link came up or went down since the last one, as a switch does (IBA
// 14.2.5.1, trap 128: link state change; OpenSM sweeps at once instead
// of at its next light sweep): a LID-routed Trap(Notice) SMP from the
// switch's LID to the master SM's LID its port 0 was given, with the
// M_Key it was given. ok is false when there is nothing to tell or no SM
// has configured the switch yet (its port 0 has no LID or no SM LID):
// that SM's first sweep finds the ports anyway.
func (f *Fabric) TakeTrap() (r simproto.Request, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.maybeRefresh(time.Now())
	pi := mad.PortInfo(f.sw.ports[0].pi[:])
	lid, smLID := pi.LID(), pi.MasterSMLID()
	if !f.linkChange || lid == 0 || smLID == 0 {
		return nil, false
	}
	f.linkChange = false
	f.trapTID++
	r = make(simproto.Request, simproto.RequestLen)
	r.SetDLID(smLID)
	r.SetSLID(lid)
	r.SetLength(simproto.MADLen)
	s := mad.SMP(r.MAD())
	m := s.MAD()
	m.SetBaseVersion(mad.BaseVersion)
	m.SetMgmtClass(mad.ClassSubnLID)
	m.SetClassVersion(mad.SMPClassVersion)
	m.SetMethod(mad.MethodTrap)
	m.SetTID(f.trapTID)
	m.SetAttrID(mad.AttrNotice)
	s.SetMKey(pi.MKey())
	n := mad.Notice(s.Data())
	n.SetGeneric(mad.NoticeUrgent, mad.ProducerSwitch)
	n.SetTrapNumber(mad.TrapLinkStateChange)
	n.SetIssuerLID(lid)
	binary.BigEndian.PutUint16(n.DataDetails(), lid)
	f.logf("sma: trap 128 (link state change) from the switch (LID %d) to the SM (LID %d)", lid, smLID)
	return r, true
}
