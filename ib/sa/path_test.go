package sa

import (
	"testing"

	"github.com/softrdma/softrdma/ib/mad"
)

// pathReq builds an SA PathRecord request; set fills the record.
func pathReq(method uint8, comp uint64, set func(mad.PathRecord)) mad.MAD {
	nextTID++
	m := mad.NewSARequest(method, mad.AttrPathRecord, nextTID, comp)
	if set != nil {
		set(m.PathRecord())
	}
	return m
}

// pathSA has ports A (LID 2) and B (LID 3, MTU 1024, 2.5 Gb/s) and C
// without a LID.
func pathSA() *SA {
	s := New(Config{})
	s.AddPort(Port{GUID: guidA, LID: 2})
	s.AddPort(Port{GUID: guidB, LID: 3, MTU: mad.MTU1024, Rate: mad.Rate2_5Gbps})
	s.AddPort(Port{GUID: guidC})
	return s
}

// TestPathRecord: a unicast path between two ports by GID and by LID, the
// first port as the default source, a multicast path, the statuses of what
// has no path, and GetTable over every port (the rules as test/saoracle
// found OpenSM 3.3.23's).
func TestPathRecord(t *testing.T) {
	s := pathSA()
	fromA := From{GUID: guidA}
	byGID := pathReq(mad.MethodGet, mad.PathCompSGID|mad.PathCompDGID|mad.PathCompTClass|mad.PathCompNumbPath|mad.PathCompReversible|mad.PathCompServiceID|mad.PathCompPKey|mad.PathCompQoSClass, func(r mad.PathRecord) {
		r.SetSGID(portGID(guidA))
		r.SetDGID(portGID(guidB))
		r.SetTClass(0x20)
		r.SetNumbPath(1)
		r.SetReversible(true)
		r.SetServiceID(0x0000000001060000 | 4791)
		r.SetPKey(0xFFFF)
		r.SetQoSClass(0x5)
	})
	resp := one(t, s, byGID, fromA)
	if resp.Status() != mad.StatusOK || resp.Method() != mad.MethodGetResp || resp.AttrOffset() != mad.PathRecordWords {
		t.Fatalf("status %#x method %#x offset %d", resp.Status(), resp.Method(), resp.AttrOffset())
	}
	p := resp.PathRecord()
	// As OpenSM 3.3.23 (test/saoracle): TClass, QoSClass, ServiceID and
	// NumbPath are not filled in.
	if p.SGID() != portGID(guidA) || p.DGID() != portGID(guidB) || p.SLID() != 2 || p.DLID() != 3 ||
		p.MTU() != mad.MTU1024 || p.Rate() != mad.Rate2_5Gbps || p.MTUSelector() != mad.SelExactly ||
		p.PKey() != 0xFFFF || p.SL() != 0 || p.TClass() != 0 || p.QoSClass() != 0 || !p.Reversible() || p.NumbPath() != 0 ||
		p.PacketLifeTime() != pathPacketLifeTime || p.ServiceID() != 0 || p.HopLimit() != 0 {
		t.Errorf("path % x", []byte(p))
	}
	// By LIDs, and with no source: the first port of the table (A).
	for _, m := range []mad.MAD{
		pathReq(mad.MethodGet, mad.PathCompSLID|mad.PathCompDLID, func(r mad.PathRecord) { r.SetSLID(2); r.SetDLID(3) }),
		pathReq(mad.MethodGet, mad.PathCompDGID, func(r mad.PathRecord) { r.SetDGID(portGID(guidB)) }),
	} {
		if r := one(t, s, m, fromA); r.Status() != 0 || r.PathRecord().SLID() != 2 || r.PathRecord().DLID() != 3 {
			t.Errorf("mask %#x: status %#x path % x", m.CompMask(), r.Status(), []byte(r.PathRecord()))
		}
	}
	// A multicast path: the group's MLID and fields.
	bc := one(t, s, pathReq(mad.MethodGet, mad.PathCompDGID, func(r mad.PathRecord) { r.SetDGID(BroadcastMGID) }), fromA)
	if bp := bc.PathRecord(); bc.Status() != 0 || bp.DLID() != BroadcastMLID || bp.DGID() != BroadcastMGID || bp.Reversible() ||
		bp.NumbPath() != 1 || bp.MTU() != mad.MTU2048 || bp.PacketLifeTime() != BroadcastPacketLifeTime {
		t.Errorf("broadcast path: status %#x % x", bc.Status(), []byte(bp))
	}
	foreign := portGID(guidB)
	foreign[0] = 0x20 // another subnet prefix
	for _, c := range []struct {
		what string
		m    mad.MAD
		st   uint16
	}{
		{"unknown DGID", pathReq(mad.MethodGet, mad.PathCompDGID, func(r mad.PathRecord) { r.SetDGID(portGID(0x999)) }), mad.StatusNoRecords},
		{"foreign prefix", pathReq(mad.MethodGet, mad.PathCompDGID, func(r mad.PathRecord) { r.SetDGID(foreign) }), mad.StatusNoRecords},
		{"unknown group", pathReq(mad.MethodGet, mad.PathCompDGID, func(r mad.PathRecord) { r.SetDGID(gid("ff12:601b:ffff::1")) }), mad.StatusNoRecords},
		{"unknown DLID", pathReq(mad.MethodGet, mad.PathCompDLID, func(r mad.PathRecord) { r.SetDLID(77) }), mad.StatusNoRecords},
		{"no end (Get: more than one)", pathReq(mad.MethodGet, 0, nil), mad.StatusOK},
		{"port without LID", pathReq(mad.MethodGet, mad.PathCompDGID, func(r mad.PathRecord) { r.SetDGID(portGID(guidC)) }), mad.StatusNoRecords},
		{"half a ServiceID mask", pathReq(mad.MethodGet, mad.PathCompDGID|1, func(r mad.PathRecord) { r.SetDGID(portGID(guidB)) }), mad.StatusInsufComps},
		{"bad MTU", pathReq(mad.MethodGet, mad.PathCompDGID|mad.PathCompMTU|mad.PathCompMTUSelector, func(r mad.PathRecord) {
			r.SetDGID(portGID(guidB))
			r.SetMTUSelector(mad.SelExactly)
			r.SetMTU(7)
		}), mad.StatusReqInvalid},
		{"MTU exactly 2048", pathReq(mad.MethodGet, mad.PathCompDGID|mad.PathCompMTU|mad.PathCompMTUSelector, func(r mad.PathRecord) {
			r.SetDGID(portGID(guidB))
			r.SetMTUSelector(mad.SelExactly)
			r.SetMTU(mad.MTU2048)
		}), mad.StatusNoRecords},
		{"P_Key of another partition", pathReq(mad.MethodGet, mad.PathCompDGID|mad.PathCompPKey, func(r mad.PathRecord) { r.SetDGID(portGID(guidB)); r.SetPKey(0x8001) }), mad.StatusNoRecords},
	} {
		r := one(t, s, c.m, fromA)
		if r.Status() != c.st || r.Method() != mad.MethodGetResp {
			t.Errorf("%s: status %#x method %#x, want %#x", c.what, r.Status(), r.Method(), c.st)
		}
	}
	if r := s.Handle(pathReq(mad.MethodSet, mad.PathCompDGID, func(r mad.PathRecord) { r.SetDGID(portGID(guidB)) }), fromA); r != nil {
		t.Errorf("Set answered: %d MADs", len(r))
	}
	if r := s.Handle(byGID, From{GUID: 0x4242}); r != nil {
		t.Errorf("unknown requester answered")
	}
	// GetTable from A: a path to every port with a LID (A itself, B).
	segs := s.Handle(pathReq(mad.MethodGetTable, mad.PathCompSGID, func(r mad.PathRecord) { r.SetSGID(portGID(guidA)) }), fromA)
	var re mad.Reassembler
	var data []byte
	for _, seg := range segs {
		done, d, err := re.Add(seg)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			data = d
		}
	}
	if len(data) < 2*mad.PathRecordLen || mad.PathRecord(data[0:]).DLID() != 2 || mad.PathRecord(data[mad.PathRecordLen:]).DLID() != 3 {
		t.Errorf("table of %d bytes: % x", len(data), data)
	}
}

// TestPathRecordLayout pins the packed fields to the kernel's layout.
func TestPathRecordLayout(t *testing.T) {
	b := make([]byte, mad.PathRecordLen)
	r := mad.PathRecord(b)
	r.SetFlowLabel(0xABCDE)
	r.SetHopLimit(0x40)
	r.SetQoSClass(0x123)
	r.SetSL(5)
	r.SetReversible(true)
	r.SetNumbPath(0x7F)
	if b[44] != 0x0A || b[45] != 0xBC || b[46] != 0xDE || b[47] != 0x40 || b[52] != 0x12 || b[53] != 0x35 || b[49] != 0xFF {
		t.Errorf("% x", b)
	}
	if r.FlowLabel() != 0xABCDE || r.HopLimit() != 0x40 || r.QoSClass() != 0x123 || r.SL() != 5 || !r.Reversible() || r.NumbPath() != 0x7F {
		t.Errorf("read back % x", b)
	}
}
