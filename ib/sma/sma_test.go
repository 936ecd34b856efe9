package sma

import (
	"encoding/binary"
	"slices"
	"testing"

	"go.uber.org/goleak"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/simproto"
	"github.com/softrdma/softrdma/test/testenv"
)

func TestMain(m *testing.M) {
	testenv.OwnNetns() // the abstract unix sockets to this package alone
	goleak.VerifyTestMain(m)
}

// portList is a fixed Ports.
type portList []Port

func (l portList) CAPorts() []Port { return l }

var cas = portList{{GUID: 0xa1, NodeDesc: "ca1", LID: 2}, {GUID: 0xa2, NodeDesc: "ca2", LID: 3}, {GUID: 0xa3, NodeDesc: "ca3", LID: 4}}

func newFabric(t *testing.T) *Fabric {
	t.Helper()
	return New(Config{Ports: cas, SwitchPorts: 8})
}

// drSMP builds a directed-route SMP request as OpenSM sends it through
// umad2sim: DLID/SLID 0xFFFF, QP0 to QP0.
func drSMP(method uint8, attr uint16, mod uint32, path ...byte) simproto.Request {
	r := simproto.Request(make([]byte, simproto.RequestLen))
	r.SetDLID(0xFFFF)
	r.SetSLID(0xFFFF)
	r.SetSQP(0)
	r.SetLength(simproto.MADLen)
	s := mad.SMP(r.MAD())
	m := s.MAD()
	m.SetBaseVersion(1)
	m.SetMgmtClass(mad.ClassSubnDR)
	m.SetClassVersion(1)
	m.SetMethod(method)
	m.SetTID(0x1234)
	m.SetAttrID(attr)
	m.SetAttrMod(mod)
	s.SetDrSLID(0xFFFF)
	s.SetDrDLID(0xFFFF)
	if len(path) > 0 {
		s.SetHopCount(uint8(len(path) - 1))
		copy(s.InitialPath(), path)
	}
	return r
}

// lidSMP builds a LID-routed SMP request to dlid.
func lidSMP(method uint8, attr uint16, mod uint32, dlid uint16) simproto.Request {
	r := drSMP(method, attr, mod)
	r.SetDLID(dlid)
	r.SetSLID(0)
	m := mad.MAD(r.MAD())
	m.SetMgmtClass(mad.ClassSubnLID)
	mad.SMP(m).SetDrSLID(0)
	mad.SMP(m).SetDrDLID(0)
	return r
}

// TestDirectedRoute walks InitialPaths through the subnet: SM host —
// switch port 1; CAs on switch ports 2..4.
func TestDirectedRoute(t *testing.T) {
	f := newFabric(t)
	for _, c := range []struct {
		name     string
		path     []byte
		verdict  Verdict
		nodeGUID uint64
		local    uint8
		ret      []byte // ReturnPath[1..HopCount]
	}{
		{"the SM host itself", []byte{0}, Reply, DefaultHostGUID, 1, nil},
		{"the switch", []byte{0, 1}, Reply, DefaultSwitchGUID, 1, []byte{1}},
		{"a CA", []byte{0, 1, 3}, Reply, 0xa2, 1, []byte{1, 1}},
		{"back to the SM host", []byte{0, 1, 1}, Reply, DefaultHostGUID, 1, []byte{1, 1}},
		{"through the SM host", []byte{0, 1, 1, 1}, Timeout, 0, 0, nil},
		{"through a CA", []byte{0, 1, 2, 1}, Timeout, 0, 0, nil},
		{"the SM host's port is 1", []byte{0, 2}, Timeout, 0, 0, nil},
		{"a switch port without link", []byte{0, 1, 7}, Timeout, 0, 0, nil},
		{"a switch port beyond NumPorts", []byte{0, 1, 9}, Timeout, 0, 0, nil},
		{"switch port 0 is no egress", []byte{0, 1, 0}, Timeout, 0, 0, nil},
	} {
		r := drSMP(mad.MethodGet, mad.AttrNodeInfo, 0, c.path...)
		r.SetSQP(0)
		r.SetDQP(0)
		v := f.Process(r)
		if v != c.verdict {
			t.Errorf("%s: %v, want %v", c.name, v, c.verdict)
			continue
		}
		if v != Reply {
			continue
		}
		s := mad.SMP(r.MAD())
		if s.MAD().Method() != mad.MethodGetResp || !s.Direction() || s.DRStatus() != 0 || s.HopPointer() != 0 ||
			int(s.HopCount()) != len(c.path)-1 || r.DLID() != 0xFFFF || r.SLID() != 0xFFFF || r.Length() != simproto.MADLen {
			t.Errorf("%s: method %#x D %v status %#x hop pointer %d count %d dlid %#x", c.name, s.MAD().Method(), s.Direction(), s.DRStatus(), s.HopPointer(), s.HopCount(), r.DLID())
		}
		ni := mad.NodeInfo(s.Data())
		if ni.NodeGUID() != c.nodeGUID || ni.LocalPortNum() != c.local {
			t.Errorf("%s: NodeGUID %#x port %d, want %#x port %d", c.name, ni.NodeGUID(), ni.LocalPortNum(), c.nodeGUID, c.local)
		}
		if got := s.ReturnPath()[1 : 1+len(c.ret)]; !slices.Equal(got, c.ret) {
			t.Errorf("%s: return path %v, want %v", c.name, got, c.ret)
		}
		if !slices.Equal(s.InitialPath()[:len(c.path)], c.path) {
			t.Errorf("%s: initial path changed: %v", c.name, s.InitialPath()[:len(c.path)])
		}
	}
	// Not a request as a requester sends it: dropped as timeouts.
	for name, mod := range map[string]func(mad.SMP){
		"hop pointer set":   func(s mad.SMP) { s.SetHopPointer(1) },
		"D bit set":         func(s mad.SMP) { s.SetDirection(true) },
		"hop count 64":      func(s mad.SMP) { s.SetHopCount(64) },
		"DrSLID a LID":      func(s mad.SMP) { s.SetDrSLID(1) },
		"base version 2":    func(s mad.SMP) { s.MAD().SetBaseVersion(2) },
		"GMP to no one":     func(s mad.SMP) { s.MAD().SetMgmtClass(mad.ClassSubnAdm) },
		"response consumed": func(s mad.SMP) { s.MAD().SetMethod(mad.MethodGetResp) },
	} {
		r := drSMP(mad.MethodGet, mad.AttrNodeInfo, 0, 0, 1)
		mod(mad.SMP(r.MAD()))
		want := Timeout
		if name == "response consumed" {
			want = Consumed
		}
		if v := f.Process(r); v != want {
			t.Errorf("%s: %v, want %v", name, v, want)
		}
	}
}

// set sends a SubnSet by directed route and returns the answer's status.
func set(t *testing.T, f *Fabric, attr uint16, mod uint32, data []byte, path ...byte) uint16 {
	t.Helper()
	r := drSMP(mad.MethodSet, attr, mod, path...)
	copy(mad.SMP(r.MAD()).Data(), data)
	if v := f.Process(r); v != Reply {
		t.Fatalf("Set %#x: %v", attr, v)
	}
	return mad.SMP(r.MAD()).DRStatus()
}

// get sends a SubnGet by directed route and returns status and data.
func get(t *testing.T, f *Fabric, attr uint16, mod uint32, path ...byte) (uint16, []byte) {
	t.Helper()
	r := drSMP(mad.MethodGet, attr, mod, path...)
	if v := f.Process(r); v != Reply {
		t.Fatalf("Get %#x: %v", attr, v)
	}
	s := mad.SMP(r.MAD())
	return s.DRStatus(), slices.Clone(s.Data())
}

func portInfoWith(lid, sm uint16, state uint8) []byte {
	pi := mad.PortInfo(make([]byte, mad.PortInfoLen))
	pi.SetLID(lid)
	pi.SetMasterSMLID(sm)
	pi.SetPortState(state)
	return pi
}

// TestPortStates: Armed from Init, Active from Armed, nothing else.
func TestPortStates(t *testing.T) {
	f := newFabric(t)
	ca := []byte{0, 1, 2}
	if st := set(t, f, mad.AttrPortInfo, 0, portInfoWith(7, 1, mad.PortActive), ca...); st != mad.StatusInvalidField {
		t.Fatalf("Active from Init: status %#x", st)
	}
	if v, _ := f.Port(0xa1); v.LID != 2 || v.State != mad.PortInit {
		t.Fatalf("a refused Set changed the port: %+v", v)
	}
	for _, s := range []uint8{mad.PortNoChange, mad.PortArmed, mad.PortActive, mad.PortActive} {
		if st := set(t, f, mad.AttrPortInfo, 0, portInfoWith(7, 1, s), ca...); st != 0 {
			t.Fatalf("state %d: status %#x", s, st)
		}
	}
	if st := set(t, f, mad.AttrPortInfo, 0, portInfoWith(7, 1, mad.PortArmed), ca...); st != mad.StatusInvalidField {
		t.Fatalf("Armed from Active: status %#x", st)
	}
	v, _ := f.Port(0xa1)
	if v.LID != 7 || v.SMLID != 1 || v.State != mad.PortActive || !slices.Equal(v.States, []uint8{mad.PortInit, mad.PortArmed, mad.PortActive}) || v.SwitchPort != 2 {
		t.Fatalf("port %+v", v)
	}
	// Down: the link trains again, both ends back in Init.
	if st := set(t, f, mad.AttrPortInfo, 2, portInfoWith(0, 0, mad.PortDown), 0, 1); st != 0 {
		t.Fatalf("Down: status %#x", st)
	}
	v, _ = f.Port(0xa1)
	if v.State != mad.PortInit || !slices.Equal(v.States[len(v.States)-2:], []uint8{mad.PortDown, mad.PortInit}) {
		t.Fatalf("after Down: %+v", v)
	}
	// A switch's external port has port 0's LID; PortStateChange is set.
	set(t, f, mad.AttrPortInfo, 0, portInfoWith(9, 1, 0), 0, 1)
	_, d := get(t, f, mad.AttrPortInfo, 3, 0, 1)
	if pi := mad.PortInfo(d); pi.LID() != 9 || pi.LocalPortNum() != 1 || pi.PortState() != mad.PortInit {
		t.Fatalf("switch port 3: LID %d local port %d state %d", pi.LID(), pi.LocalPortNum(), pi.PortState())
	}
	_, d = get(t, f, mad.AttrSwitchInfo, 0, 0, 1)
	if !mad.SwitchInfo(d).PortStateChange() {
		t.Fatal("PortStateChange not set by a link down")
	}
	si := make([]byte, 64)
	mad.SwitchInfo(si).SetPortStateChange(true)
	mad.SwitchInfo(si).SetLinearFDBTop(9)
	set(t, f, mad.AttrSwitchInfo, 0, si, 0, 1)
	if sw := f.Switch(); sw.LinearFDBTop != 9 || sw.LID != 9 {
		t.Fatalf("switch %+v", sw)
	}
	if _, d = get(t, f, mad.AttrSwitchInfo, 0, 0, 1); mad.SwitchInfo(d).PortStateChange() {
		t.Fatal("PortStateChange not cleared by writing 1")
	}
}

// TestTablesAndLIDRoute: the LFT the SM sets routes LID-routed SMPs.
func TestTablesAndLIDRoute(t *testing.T) {
	f := newFabric(t)
	set(t, f, mad.AttrPortInfo, 0, portInfoWith(1, 1, 0))       // SM host
	set(t, f, mad.AttrPortInfo, 0, portInfoWith(5, 1, 0), 0, 1) // switch port 0
	set(t, f, mad.AttrPortInfo, 0, portInfoWith(2, 1, 0), 0, 1, 2)
	lft := make([]byte, 64)
	for i := range lft {
		lft[i] = 0xFF
	}
	lft[1], lft[2], lft[5] = 1, 2, 0
	if st := set(t, f, mad.AttrLinearFT, 0, lft, 0, 1); st != 0 {
		t.Fatalf("LFT: %#x", st)
	}
	if st := set(t, f, mad.AttrLinearFT, LinearFDBCap/64, lft, 0, 1); st != mad.StatusInvalidField {
		t.Fatalf("LFT block beyond the cap: %#x", st)
	}
	for _, c := range []struct {
		dlid uint16
		want Verdict
		guid uint64
	}{{1, Reply, DefaultHostGUID}, {5, Reply, DefaultSwitchGUID}, {2, Reply, 0xa1}, {3, Timeout, 0}, {0xC001, Timeout, 0}} {
		r := lidSMP(mad.MethodGet, mad.AttrNodeInfo, 0, c.dlid)
		if v := f.Process(r); v != c.want {
			t.Errorf("DLID %d: %v, want %v", c.dlid, v, c.want)
			continue
		}
		if c.want != Reply {
			continue
		}
		m := mad.MAD(r.MAD())
		if g := mad.NodeInfo(mad.SMP(m).Data()).NodeGUID(); g != c.guid || m.Status() != 0 || r.SLID() != c.dlid || r.DLID() != 1 {
			t.Errorf("DLID %d: node %#x status %#x slid %d dlid %d", c.dlid, g, m.Status(), r.SLID(), r.DLID())
		}
	}
	// MFT: MLID 0xC021 (block 1, entry 1) to switch ports 2 and 3.
	mft := make([]byte, 64)
	binary.BigEndian.PutUint16(mft[2:], 1<<2|1<<3)
	if st := set(t, f, mad.AttrMulticastFT, 1, mft, 0, 1); st != 0 {
		t.Fatalf("MFT: %#x", st)
	}
	if ps := f.MFT(0xC021); !slices.Equal(ps, []int{2, 3}) {
		t.Fatalf("MFT(0xC021) = %v", ps)
	}
	if st := set(t, f, mad.AttrMulticastFT, 1<<28, mft, 0, 1); st != mad.StatusInvalidField {
		t.Fatalf("MFT position 1 of an 8-port switch: %#x", st)
	}
	if got := f.LFT(); len(got) != 1 { // LinearFDBTop still 0
		t.Fatalf("LFT %v", got)
	}
}

// TestStatuses: what a minimal switch and HCA say to what they lack.
func TestStatuses(t *testing.T) {
	f := newFabric(t)
	for _, c := range []struct {
		name   string
		method uint8
		attr   uint16
		mod    uint32
		path   []byte
		want   uint16
	}{
		{"SMInfo at the switch", mad.MethodGet, mad.AttrSMInfo, 0, []byte{0, 1}, mad.StatusUnsupportedMethodAttr},
		{"SMInfo at a CA", mad.MethodGet, mad.AttrSMInfo, 0, []byte{0, 1, 2}, mad.StatusUnsupportedMethodAttr},
		{"Set NodeInfo", mad.MethodSet, mad.AttrNodeInfo, 0, []byte{0, 1}, mad.StatusUnsupportedMethodAttr},
		{"SwitchInfo at a CA", mad.MethodGet, mad.AttrSwitchInfo, 0, []byte{0, 1, 2}, mad.StatusUnsupportedMethodAttr},
		{"LFT at a CA", mad.MethodGet, mad.AttrLinearFT, 0, []byte{0, 1, 2}, mad.StatusUnsupportedMethodAttr},
		{"vendor attribute", mad.MethodGet, 0xFF90, 0, []byte{0, 1}, mad.StatusUnsupportedMethodAttr},
		{"method Send", mad.MethodSend, mad.AttrNodeInfo, 0, []byte{0, 1}, mad.StatusUnsupportedMethod},
		{"PortInfo of port 9", mad.MethodGet, mad.AttrPortInfo, 9, []byte{0, 1}, mad.StatusInvalidField},
		{"PortInfo of a CA's port 2", mad.MethodGet, mad.AttrPortInfo, 2, []byte{0, 1, 2}, mad.StatusInvalidField},
		{"P_Key block 1", mad.MethodGet, mad.AttrPKeyTable, 1, []byte{0, 1, 2}, mad.StatusInvalidField},
		{"P_Key of a switch's port 0", mad.MethodGet, mad.AttrPKeyTable, 0, []byte{0, 1}, 0},
		{"GUIDInfo", mad.MethodGet, mad.AttrGUIDInfo, 0, []byte{0, 1, 2}, 0},
		{"SLtoVL in 9", mad.MethodGet, mad.AttrSLtoVLTable, 9 << 8, []byte{0, 1}, mad.StatusInvalidField},
		{"VLArb block 5", mad.MethodGet, mad.AttrVLArbitration, 5 << 16, []byte{0, 1, 2}, mad.StatusInvalidField},
		{"NodeDescription", mad.MethodGet, mad.AttrNodeDescription, 0, []byte{0, 1, 4}, 0},
	} {
		r := drSMP(c.method, c.attr, c.mod, c.path...)
		if v := f.Process(r); v != Reply {
			t.Errorf("%s: %v", c.name, v)
			continue
		}
		if st := mad.SMP(r.MAD()).DRStatus(); st != c.want {
			t.Errorf("%s: status %#x, want %#x", c.name, st, c.want)
		}
	}
	_, d := get(t, f, mad.AttrNodeDescription, 0, 0, 1, 4)
	if string(d[:3]) != "ca3" || d[3] != 0 {
		t.Errorf("NodeDescription %q", d)
	}
	_, d = get(t, f, mad.AttrGUIDInfo, 0, 0, 1, 4)
	if binary.BigEndian.Uint64(d) != 0xa3 {
		t.Errorf("GUIDInfo[0] %#x", binary.BigEndian.Uint64(d))
	}
	// SMInfo at the SM host goes to its SM.
	if v := f.Process(drSMP(mad.MethodGet, mad.AttrSMInfo, 0, 0)); v != ToHost {
		t.Errorf("SMInfo at the SM host: %v", v)
	}
}

// TestTopology: ports come and go, taking the lowest free switch port.
func TestTopology(t *testing.T) {
	l := &mutablePorts{ps: []Port{{GUID: 0xb1}, {GUID: 0xb2}}}
	f := New(Config{Ports: l, SwitchPorts: 3})
	if vs := f.Ports(); len(vs) != 2 || vs[0].SwitchPort != 2 || vs[1].SwitchPort != 3 {
		t.Fatalf("ports %+v", vs)
	}
	l.ps = []Port{{GUID: 0xb2}, {GUID: 0xb3}, {GUID: 0xb4}, {GUID: DefaultSwitchGUID}}
	f.Refresh()
	if _, ok := f.Port(0xb1); ok {
		t.Fatal("a detached port is still there")
	}
	v, ok := f.Port(0xb3)
	if !ok || v.SwitchPort != 2 {
		t.Fatalf("0xb3: %+v %v", v, ok)
	}
	if _, ok := f.Port(0xb4); ok {
		t.Fatal("a port beyond the switch's ports was added")
	}
	if sw := f.Switch(); sw.PortStates[2] != mad.PortInit || sw.NumPorts != 3 {
		t.Fatalf("switch %+v", sw)
	}
}

type mutablePorts struct{ ps []Port }

func (m *mutablePorts) CAPorts() []Port { return m.ps }

// FuzzProcess: no MAD makes the model panic, and a Reply keeps the
// datagram's size.
func FuzzProcess(f *testing.F) {
	f.Add([]byte(drSMP(mad.MethodGet, mad.AttrNodeInfo, 0, 0, 1, 2)))
	f.Add([]byte(drSMP(mad.MethodSet, mad.AttrPortInfo, 3, 0, 1)))
	f.Add([]byte(drSMP(mad.MethodSet, mad.AttrMulticastFT, 0xF00001FF, 0, 1)))
	f.Add([]byte(lidSMP(mad.MethodGet, mad.AttrPortInfo, 0, 1)))
	fab := New(Config{Ports: cas, SwitchPorts: 20})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := simproto.Request(make([]byte, simproto.RequestLen))
		copy(r, b)
		if v := fab.Process(r); v == Reply && len(r) != simproto.RequestLen {
			t.Fatal("size")
		}
	})
}
