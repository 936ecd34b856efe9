package sma

import (
	"encoding/binary"

	"github.com/softrdma/softrdma/ib/mad"
)

// handle answers an SMP at the node of port at (the port it arrived
// by): it fills s's data and returns the MAD status.
func (f *Fabric) handle(at *port, s mad.SMP) uint16 {
	m := s.MAD()
	if m.ClassVersion() != mad.SMPClassVersion {
		return mad.StatusBadVersion
	}
	set := false
	switch m.Method() {
	case mad.MethodGet:
	case mad.MethodSet:
		set = true
	default:
		return mad.StatusUnsupportedMethod
	}
	nd := at.node
	mod := m.AttrMod()
	d := s.Data()
	switch m.AttrID() {
	case mad.AttrNodeDescription:
		if set {
			return mad.StatusUnsupportedMethodAttr
		}
		clear(d)
		copy(d, nd.desc)
	case mad.AttrNodeInfo:
		if set {
			return mad.StatusUnsupportedMethodAttr
		}
		f.nodeInfo(d, at)
	case mad.AttrSwitchInfo:
		if nd.sw == nil {
			return mad.StatusUnsupportedMethodAttr
		}
		if set {
			f.setSwitchInfo(mad.SwitchInfo(d))
		}
		copy(d, nd.sw.info[:])
	case mad.AttrPortInfo:
		p := portByMod(at, mod)
		if p == nil {
			return mad.StatusInvalidField
		}
		var st uint16
		if set {
			st = f.setPortInfo(p, mad.PortInfo(d))
		}
		f.portInfo(d, p, at)
		return st
	case mad.AttrPKeyTable:
		p := at
		if nd.sw != nil {
			p = portByMod(at, mod>>16)
		}
		if p == nil || mod&0xFFFF != 0 || (nd.sw != nil && p.num != 0) {
			return mad.StatusInvalidField // one block; switch: port 0 only (no enforcement)
		}
		if set {
			copy(p.pkeys[:], d)
		}
		copy(d, p.pkeys[:])
	case mad.AttrGUIDInfo:
		if mod != 0 {
			return mad.StatusInvalidField
		}
		p := at
		if nd.sw != nil {
			p = nd.ports[0]
		}
		if set { // entry 0 is the port GUID, read-only
			copy(p.guids[8:], d[8:])
		}
		copy(d, p.guids[:])
	case mad.AttrSLtoVLTable:
		p, in := at, uint8(0)
		if nd.sw != nil {
			p, in = portByMod(at, mod&0xFF), uint8(mod>>8)
			if p == nil || int(in) >= len(nd.ports) {
				return mad.StatusInvalidField
			}
		}
		t := p.sl2vl[in]
		if t == nil {
			t = new([8]byte)
			p.sl2vl[in] = t
		}
		if set {
			copy(t[:], d)
		}
		clear(d)
		copy(d, t[:])
	case mad.AttrVLArbitration:
		block := mod >> 16
		p := at
		if nd.sw != nil {
			p = portByMod(at, mod&0xFFFF)
		}
		if p == nil || block < 1 || block > 4 {
			return mad.StatusInvalidField
		}
		if set {
			copy(p.vlarb[block-1][:], d)
		}
		copy(d, p.vlarb[block-1][:])
	case mad.AttrLinearFT:
		if nd.sw == nil {
			return mad.StatusUnsupportedMethodAttr
		}
		off := int(mod) * 64
		if mod >= LinearFDBCap/64 {
			return mad.StatusInvalidField
		}
		if set {
			copy(nd.sw.lft[off:off+64], d)
		}
		copy(d, nd.sw.lft[off:off+64])
	case mad.AttrMulticastFT:
		if nd.sw == nil {
			return mad.StatusUnsupportedMethodAttr
		}
		block, pos := int(mod&0x1FF), int(mod>>28)
		if mod&0x0FFFFE00 != 0 || block*32 >= MulticastFDBCap || pos*16 >= len(nd.ports) {
			return mad.StatusInvalidField
		}
		f.mftBlock(d, block, pos, set)
	default: // SMInfo (no SM on the switch and the CAs), Notice, vendor...
		return mad.StatusUnsupportedMethodAttr
	}
	return 0
}

// portByMod returns the port an attribute modifier names at a node: a
// switch's port mod, or a CA's port mod (0: the port the SMP came by).
func portByMod(at *port, mod uint32) *port {
	nd := at.node
	if nd.sw == nil && mod == 0 {
		return at
	}
	if mod >= uint32(len(nd.ports)) || nd.ports[mod] == nil {
		return nil
	}
	return nd.ports[mod]
}

// nodeInfo fills NodeInfo for an SMP that arrived by port at.
func (f *Fabric) nodeInfo(d []byte, at *port) {
	nd := at.node
	clear(d)
	ni := mad.NodeInfo(d)
	ni.SetBaseVersion(1)
	ni.SetClassVersion(1)
	ni.SetNodeType(nd.typ)
	ni.SetNumPorts(uint8(len(nd.ports) - 1))
	ni.SetSystemImageGUID(nd.guid)
	ni.SetNodeGUID(nd.guid)
	if nd.sw != nil {
		ni.SetPortGUID(nd.guid)
		ni.SetPartitionCap(32) // port 0's
	} else {
		ni.SetPortGUID(at.guid)
		ni.SetPartitionCap(32)
	}
	ni.SetDeviceID(0x5f7d)
	ni.SetRevision(1)
	ni.SetLocalPortNum(at.num)
}

// portInfo fills p's PortInfo for an SMP that came by port at:
// LocalPortNum is at's number (IBA 14.2.5.6: the port the SMP came in
// by; OpenSM skips the switch port it equals as the one leading back to
// itself). A switch's external ports show port 0's M_Key, GIDPrefix,
// LID, MasterSMLID and LMC (they have none of their own).
func (f *Fabric) portInfo(d []byte, p, at *port) {
	copy(d, p.pi[:])
	mad.PortInfo(d).SetLocalPortNum(at.num)
	if p.node.sw != nil && p.num != 0 {
		p0 := p.node.ports[0].pi[:]
		copy(d[0:20], p0[0:20])
		d[34] = d[34]&^7 | p0[34]&7
	}
}

// writable holds the PortInfo bits a Set takes (PortState and
// PortPhysicalState apart); extWritable those of a switch's external
// port.
var writable, extWritable [mad.PortInfoLen]byte

func init() {
	for i := range 20 { // M_Key, GIDPrefix, LID, MasterSMLID
		writable[i] = 0xFF
	}
	for i, m := range map[int]byte{
		26: 0xFF, 27: 0xFF, // M_KeyLeasePeriod
		29: 0xFF,                                                   // LinkWidthEnabled
		33: 0x0F,                                                   // LinkDownDefaultState
		34: 0xC7,                                                   // M_KeyProtectBits, LMC
		35: 0x0F,                                                   // LinkSpeedEnabled
		36: 0xFF,                                                   // NeighborMTU, MasterSMSL
		37: 0x0F,                                                   // InitType
		38: 0xFF,                                                   // VLHighLimit
		42: 0xFF,                                                   // VLStallCount, HOQLife
		43: 0xFF,                                                   // OperationalVLs, enforcement
		44: 0xFF, 45: 0xFF, 46: 0xFF, 47: 0xFF, 48: 0xFF, 49: 0xFF, // violations
		51: 0xFF, // ClientReregister, trap suppression, SubnetTimeOut
		53: 0xFF, // LocalPhyErrors, OverrunErrors
		63: 0x1F, // LinkSpeedExtEnabled
	} {
		writable[i] = m
	}
	extWritable = writable
	for i := range 20 {
		extWritable[i] = 0
	}
	extWritable[26], extWritable[27] = 0, 0
	extWritable[34] = 0
	extWritable[36] = 0xF0
	extWritable[51] = 0
}

// setPortInfo applies a SubnSet(PortInfo) to p; a state transition IBA
// does not allow leaves the port as it was (status 0x001C).
func (f *Fabric) setPortInfo(p *port, in mad.PortInfo) uint16 {
	pi := mad.PortInfo(p.pi[:])
	cur, want := pi.PortState(), in.PortState()
	up := pi.PhysState() == mad.PhysLinkUp
	switch want {
	case mad.PortNoChange:
	case mad.PortDown:
	case mad.PortArmed:
		if !up || (cur != mad.PortInit && cur != mad.PortArmed) {
			return mad.StatusInvalidField
		}
	case mad.PortActive:
		if !up || (cur != mad.PortArmed && cur != mad.PortActive) {
			return mad.StatusInvalidField
		}
	default:
		return mad.StatusInvalidField
	}
	if p.node.sw != nil && p.num == 0 && want != mad.PortNoChange && want != mad.PortActive {
		return mad.StatusInvalidField // base port 0 is always Active
	}
	mask := &writable
	if p.node.sw != nil && p.num != 0 {
		mask = &extWritable
	}
	oldLID, oldSM := pi.LID(), pi.MasterSMLID()
	for i := range p.pi {
		p.pi[i] = p.pi[i]&^mask[i] | in[i]&mask[i]
	}
	if pi.ClientReregister() {
		p.rereg++
		pi.SetClientReregister(false)
	}
	if lid, sm := pi.LID(), pi.MasterSMLID(); lid != oldLID || sm != oldSM {
		f.logf("sma: %s port %d: LID %d LMC %d SM LID %d", p.node.desc, p.num, lid, pi.LMC(), sm)
	}
	switch want {
	case mad.PortDown:
		p.setState(mad.PortDown)
		if up { // the link trains again
			p.setState(mad.PortInit)
			if q := p.peer; q != nil {
				q.setState(mad.PortDown)
				q.setState(mad.PortInit)
			}
		}
		mad.SwitchInfo(f.sw.sw.info[:]).SetPortStateChange(true)
	case mad.PortArmed, mad.PortActive:
		if cur != want {
			f.logf("sma: %s port %d: %s", p.node.desc, p.num, stateName(want))
		}
		p.setState(want)
	}
	return 0
}

// setSwitchInfo applies a SubnSet(SwitchInfo): LinearFDBTop, the default
// ports, LifeTimeValue, MulticastFDBTop; PortStateChange is cleared by
// writing 1.
func (f *Fabric) setSwitchInfo(in mad.SwitchInfo) {
	si := mad.SwitchInfo(f.sw.sw.info[:])
	si.SetLinearFDBTop(min(in.LinearFDBTop(), LinearFDBCap-1))
	copy(si[8:11], in[8:11])
	si.SetLifeTimeValue(in.LifeTimeValue())
	if in.PortStateChange() {
		si.SetPortStateChange(false)
	}
	si.SetMulticastFDBTop(in.MulticastFDBTop())
}

// mftBlock gets or sets 32 MLIDs' port masks of one position.
func (f *Fabric) mftBlock(d []byte, block, pos int, set bool) {
	mft := f.sw.sw.mft
	npos := (len(f.sw.ports) + 15) / 16
	for i := range 32 {
		e := &mft[block*32+i]
		if set {
			v := binary.BigEndian.Uint16(d[2*i:])
			if *e == nil && v == 0 {
				continue
			}
			if *e == nil {
				*e = make([]uint16, npos)
			}
			if old := (*e)[pos]; old != v {
				f.logf("sma: MFT %#04x ports %d-%d: %#04x -> %#04x", 0xC000+block*32+i, 16*pos, 16*pos+15, old, v)
			}
			(*e)[pos] = v
		}
		var v uint16
		if *e != nil {
			v = (*e)[pos]
		}
		binary.BigEndian.PutUint16(d[2*i:], v)
	}
}

// stateName names a PortState.
func stateName(s uint8) string {
	switch s {
	case mad.PortDown:
		return "Down"
	case mad.PortInit:
		return "Init"
	case mad.PortArmed:
		return "Armed"
	case mad.PortActive:
		return "Active"
	}
	return "state?"
}
