package sma

import (
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/simproto"
)

// Verdict says where the MAD Process was given goes.
type Verdict int

// Verdicts.
const (
	// Reply: the MAD, turned into its answer, goes back to its sender.
	Reply Verdict = iota
	// Timeout: the MAD went nowhere; it goes back to its sender as it
	// came, with status simproto.StatusTimeout.
	Timeout
	// Consumed: nothing goes anywhere (a TrapRepress, a Trap).
	Consumed
	// ToHost: the MAD is for a client of the SM host (SMInfo, which its
	// SM answers; a GMP to its LID): to its SM, or the client of the
	// destination QP.
	ToHost
)

// String names the verdict.
func (v Verdict) String() string {
	switch v {
	case Reply:
		return "reply"
	case Timeout:
		return "timeout"
	case Consumed:
		return "consumed"
	case ToHost:
		return "to-host"
	}
	return "verdict?"
}

// Process takes a request MAD a client of the SM host sent (r's MAD and
// addressing as umad2sim sends them) and, for Reply, turns r into the
// answer in place (addresses and QPs swapped, status 0). Responses
// (method bit 0x80) are the caller's to route, by TID; Process consumes
// them.
func (f *Fabric) Process(r simproto.Request) Verdict {
	m := mad.MAD(r.MAD())
	if m.BaseVersion() != mad.BaseVersion {
		return Timeout
	}
	if m.IsResponse() || m.Method() == mad.MethodTrapRepress || m.Method() == mad.MethodTrap {
		return Consumed
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	defer f.publishLocked() // before the unlock
	f.maybeRefresh(time.Now())
	if m.Method() == mad.MethodSet {
		f.dirty = true
	}
	src := f.host.ports[1]
	s := mad.SMP(m)
	var at *port
	switch m.MgmtClass() {
	case mad.ClassSubnDR:
		if s.Direction() || s.HopPointer() != 0 || s.HopCount() > mad.MaxHops ||
			s.DrSLID() != mad.PermissiveLID || s.DrDLID() != mad.PermissiveLID {
			return Timeout
		}
		at = routeDR(s, src)
	case mad.ClassSubnLID:
		if r.SLID() == 0 {
			r.SetSLID(lidOf(src))
		}
		at = f.routeLID(r.DLID(), src)
	default:
		if r.SLID() == 0 {
			r.SetSLID(lidOf(src))
		}
		if at = f.routeLID(r.DLID(), src); at != nil && at.node == f.host {
			return ToHost
		}
		return Timeout // no GMP agents on the switch and the CAs (yet)
	}
	if at == nil {
		return Timeout
	}
	if at.node == f.host && m.AttrID() == mad.AttrSMInfo {
		return ToHost
	}
	status := f.handle(at, s)
	m.SetMethod(mad.MethodGetResp)
	if s.IsDR() {
		s.SetDirection(true)
		s.SetDRStatus(status)
		s.SetHopPointer(0)
	} else {
		m.SetStatus(status)
	}
	dl, sl := r.DLID(), r.SLID()
	r.SetDLID(sl)
	r.SetSLID(dl)
	dq, sq := r.DQP(), r.SQP()
	r.SetDQP(sq)
	r.SetSQP(dq)
	r.SetStatus(0)
	r.SetLength(simproto.MADLen)
	return Reply
}

// routeDR walks a directed-route SMP's InitialPath from src (IBA
// C14-9): it leaves src's node by InitialPath[1] (for a CA: src itself),
// every later hop must leave a switch, and each hop's ingress port goes
// into ReturnPath. It returns the port the SMP arrives by at its
// destination (src for HopCount 0), or nil when the path leads nowhere.
func routeDR(s mad.SMP, src *port) *port {
	n := int(s.HopCount())
	path, ret := s.InitialPath(), s.ReturnPath()
	at := src
	for i := 1; i <= n; i++ {
		nd := at.node
		var out *port
		switch {
		case nd.typ == mad.NodeSwitch:
			pn := int(path[i])
			if pn == 0 || pn >= len(nd.ports) {
				return nil
			}
			out = nd.ports[pn]
		case i == 1 && path[i] == at.num:
			out = at
		default: // a CA in mid-path, or a source port that is not its own
			return nil
		}
		in := out.peer
		if in == nil || mad.PortInfo(out.pi[:]).PhysState() != mad.PhysLinkUp {
			return nil
		}
		ret[i] = in.num
		at = in
	}
	return at
}

// lidOf returns the LID of p's node's SMA: port 0's for a switch.
func lidOf(p *port) uint16 {
	if p.node.typ == mad.NodeSwitch {
		p = p.node.ports[0]
	}
	return mad.PortInfo(p.pi[:]).LID()
}

// hasLID reports whether dlid addresses p's SMA (its LID range, LMC).
func hasLID(p *port, dlid uint16) bool {
	if p.node.typ == mad.NodeSwitch {
		p = p.node.ports[0]
	}
	pi := mad.PortInfo(p.pi[:])
	lid := uint32(pi.LID())
	return lid != 0 && uint32(dlid) >= lid && uint32(dlid) < lid+1<<pi.LMC()
}

// routeLID follows dlid from src through the switch's linear forwarding
// table and returns the port the packet arrives by at the node whose LID
// it is, or nil.
func (f *Fabric) routeLID(dlid uint16, src *port) *port {
	if dlid == 0 || dlid >= 0xC000 {
		return nil
	}
	if hasLID(src, dlid) {
		return src
	}
	out := src
	for range mad.MaxHops {
		in := out.peer
		if in == nil || mad.PortInfo(out.pi[:]).PhysState() != mad.PhysLinkUp {
			return nil
		}
		if hasLID(in, dlid) {
			return in
		}
		nd := in.node
		if nd.typ != mad.NodeSwitch {
			return nil
		}
		e := int(nd.sw.lft[dlid])
		if e == 0 || e >= len(nd.ports) {
			return nil
		}
		out = nd.ports[e]
	}
	return nil
}

// RouteGMP says where a GMP (a MAD of a class other than the SM's) to
// dlid goes from the CA port fromGUID (0: from the SM host), routed by
// the switch's linear forwarding table: to the SM host (host), to a CA
// port (its GUID), or nowhere (ok false: no such CA port, no route).
// srcLID is the sending port's LID.
func (f *Fabric) RouteGMP(fromGUID uint64, dlid uint16) (guid uint64, host bool, srcLID uint16, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	defer f.publishLocked()
	f.maybeRefresh(time.Now())
	src := f.host.ports[1]
	if fromGUID != 0 {
		n := f.cas[fromGUID]
		if n == nil {
			return 0, false, 0, false
		}
		src = n.ports[1]
	}
	at := f.routeLID(dlid, src)
	if at == nil {
		return 0, false, lidOf(src), false
	}
	if at.node == f.host {
		return 0, true, lidOf(src), true
	}
	if at.node.typ != mad.NodeCA {
		return 0, false, lidOf(src), false // no GMP agents on the switch
	}
	return at.guid, false, lidOf(src), true
}
