package mad

import (
	"bytes"
	"testing"

	"github.com/softrdma/softrdma/wire"
	"pgregory.net/rapid"
)

var (
	testMGID    = wire.GID{0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 12: 0x06, 13: 0x01, 14: 0x02, 15: 0x03}
	testPortGID = wire.GID{0xfe, 0x80, 13: 0x10, 15: 0x01}
)

// goldenSetMAD is a Set(MCMemberRecord) written byte by byte from the
// layouts of IBA 1.3 §15.2 (SA MAD header, MCMemberRecord, component mask).
func goldenSetMAD() []byte {
	b := make([]byte, Len)
	copy(b, []byte{
		0x01, 0x03, 0x02, 0x02, // base version, class SubnAdm, class version 2, Set
		0x00, 0x00, 0x00, 0x00, // status, class specific
		0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // TID
		0x00, 0x38, 0x00, 0x00, // attribute MCMemberRecord, reserved
		0x00, 0x00, 0x00, 0x00, // attribute modifier
	})
	// RMPP header 24..35 zero, SM_Key 36..43 zero.
	copy(b[44:], []byte{0x00, 0x07, 0x00, 0x00})                         // AttributeOffset 7
	copy(b[48:], []byte{0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x30, 0xC7}) // comp mask 0x130C7
	r := b[56:]
	copy(r[0:], testMGID[:])
	copy(r[16:], testPortGID[:])
	copy(r[32:], []byte{0x01, 0x23, 0x45, 0x67}) // Q_Key
	copy(r[36:], []byte{0xC0, 0x01})             // MLID
	r[38] = 0x84                                 // MTU selector 2, MTU 4
	r[39] = 0x00                                 // TClass
	copy(r[40:], []byte{0xFF, 0xFF})             // P_Key
	r[42] = 0x83                                 // rate selector 2, rate 3
	r[43] = 0x92                                 // packet lifetime selector 2, 18
	copy(r[44:], []byte{0x51, 0x23, 0x45, 0x40}) // SL 5, FlowLabel 0x12345, HopLimit 0x40
	r[48] = 0x28                                 // scope 2, JoinState 8
	r[49] = 0x80                                 // ProxyJoin
	return b
}

func goldenFields() MCMemberFields {
	return MCMemberFields{
		MGID: testMGID, PortGID: testPortGID, QKey: 0x01234567, MLID: 0xC001,
		MTUSelector: SelExactly, MTU: MTU2048, PKey: 0xFFFF,
		RateSelector: SelExactly, Rate: Rate10Gbps,
		PacketLifeTimeSelector: SelExactly, PacketLifeTime: 18,
		SL: 5, FlowLabel: 0x12345, HopLimit: 0x40,
		Scope: ScopeLinkLocal, JoinState: JoinSendOnlyFullMember, ProxyJoin: true,
	}
}

func TestGoldenSetMCMemberRecord(t *testing.T) {
	m := NewSARequest(MethodSet, AttrMCMemberRecord, 0x0102030405060708, CompCreateRequired)
	f := goldenFields()
	m.MCMemberRecord().Encode(&f)
	if want := goldenSetMAD(); !bytes.Equal(m, want) {
		t.Fatalf("encoded MAD differs from golden\n got % x\nwant % x", m[:112], want[:112])
	}
	g := MAD(goldenSetMAD())
	if g.BaseVersion() != 1 || g.MgmtClass() != ClassSubnAdm || g.ClassVersion() != 2 || g.Method() != MethodSet ||
		g.Status() != 0 || g.TID() != 0x0102030405060708 || g.AttrID() != AttrMCMemberRecord || g.AttrMod() != 0 ||
		g.AttrOffset() != 7 || g.CompMask() != 0x130C7 || g.SMKey() != 0 || g.IsResponse() {
		t.Fatal("header accessors")
	}
	if got := g.MCMemberRecord().Fields(); got != f {
		t.Fatalf("decoded %+v\nwant %+v", got, f)
	}
	r := g.MCMemberRecord()
	if r.MTUSelector() != 2 || r.MTU() != 4 || r.RateSelector() != 2 || r.Rate() != 3 ||
		r.PacketLifeTimeSelector() != 2 || r.PacketLifeTime() != 18 || r.SL() != 5 ||
		r.FlowLabel() != 0x12345 || r.HopLimit() != 0x40 || r.Scope() != 2 || r.JoinState() != 8 || !r.ProxyJoin() {
		t.Fatal("record accessors")
	}
}

func TestCompMaskConstants(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uint64
	}{
		{"join", CompJoinRequired, 0x10003},
		{"create", CompCreateRequired, 0x130C7},
		{"ipoib", CompIPoIBJoin, 0x173F7},
		{"proxy", CompProxyJoin, 1 << 17},
	} {
		if c.got != c.want {
			t.Errorf("%s mask %#x, want %#x", c.name, c.got, c.want)
		}
	}
	if CapMask2WordSendOnlyFullMember != 0x00020000 {
		t.Fatalf("send-only word mask %#x", CapMask2WordSendOnlyFullMember)
	}
}

// Each setter changes only its own field.
func TestPropMCMemberRecordRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var f MCMemberFields
		copy(f.MGID[:], rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, "mgid"))
		copy(f.PortGID[:], rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, "pgid"))
		f.QKey = rapid.Uint32().Draw(t, "qkey")
		f.MLID = rapid.Uint16().Draw(t, "mlid")
		f.MTUSelector = rapid.Uint8Range(0, 3).Draw(t, "mtusel")
		f.MTU = rapid.Uint8Range(0, 63).Draw(t, "mtu")
		f.TClass = rapid.Uint8().Draw(t, "tc")
		f.PKey = rapid.Uint16().Draw(t, "pkey")
		f.RateSelector = rapid.Uint8Range(0, 3).Draw(t, "ratesel")
		f.Rate = rapid.Uint8Range(0, 63).Draw(t, "rate")
		f.PacketLifeTimeSelector = rapid.Uint8Range(0, 3).Draw(t, "plsel")
		f.PacketLifeTime = rapid.Uint8Range(0, 63).Draw(t, "pl")
		f.SL = rapid.Uint8Range(0, 15).Draw(t, "sl")
		f.FlowLabel = rapid.Uint32Range(0, 0xFFFFF).Draw(t, "fl")
		f.HopLimit = rapid.Uint8().Draw(t, "hop")
		f.Scope = rapid.Uint8Range(0, 15).Draw(t, "scope")
		f.JoinState = rapid.Uint8Range(0, 15).Draw(t, "js")
		f.ProxyJoin = rapid.Bool().Draw(t, "proxy")
		b := make([]byte, MCMemberRecordStride)
		r := MCMemberRecord(b)
		r.Encode(&f)
		if got := r.Fields(); got != f {
			t.Fatalf("round trip %+v != %+v", got, f)
		}
		// Setters applied field by field give the same bytes.
		c := make([]byte, MCMemberRecordStride)
		v := MCMemberRecord(c)
		v.SetJoinState(f.JoinState)
		v.SetScope(f.Scope)
		v.SetProxyJoin(f.ProxyJoin)
		v.SetHopLimit(f.HopLimit)
		v.SetFlowLabel(f.FlowLabel)
		v.SetSL(f.SL)
		v.SetPacketLifeTime(f.PacketLifeTime)
		v.SetPacketLifeTimeSelector(f.PacketLifeTimeSelector)
		v.SetRate(f.Rate)
		v.SetRateSelector(f.RateSelector)
		v.SetPKey(f.PKey)
		v.SetTClass(f.TClass)
		v.SetMTU(f.MTU)
		v.SetMTUSelector(f.MTUSelector)
		v.SetMLID(f.MLID)
		v.SetQKey(f.QKey)
		v.SetPortGID(f.PortGID)
		v.SetMGID(f.MGID)
		if !bytes.Equal(b, c) {
			t.Fatalf("setters\n% x\nEncode\n% x", c, b)
		}
		if !bytes.Equal(b[MCMemberRecordLen:], make([]byte, 4)) {
			t.Fatal("padding written")
		}
	})
}

func TestPropMADHeaderRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := Header{
			MgmtClass:    rapid.Uint8().Draw(t, "class"),
			ClassVersion: rapid.Uint8().Draw(t, "cv"),
			Method:       rapid.Uint8().Draw(t, "method"),
			Status:       rapid.Uint16().Draw(t, "status"),
			TID:          rapid.Uint64().Draw(t, "tid"),
			AttrID:       rapid.Uint16().Draw(t, "attr"),
			AttrMod:      rapid.Uint32().Draw(t, "mod"),
		}
		m := MAD(make([]byte, Len))
		m.EncodeHeader(h)
		got := Header{m.MgmtClass(), m.ClassVersion(), m.Method(), m.Status(), m.TID(), m.AttrID(), m.AttrMod()}
		if got != h || m.BaseVersion() != 1 {
			t.Fatalf("%+v != %+v", got, h)
		}
		sk := rapid.Uint64().Draw(t, "smkey")
		cm := rapid.Uint64().Draw(t, "comp")
		ao := rapid.Uint16().Draw(t, "aoff")
		m.SetSMKey(sk)
		m.SetCompMask(cm)
		m.SetAttrOffset(ao)
		if m.SMKey() != sk || m.CompMask() != cm || m.AttrOffset() != ao || m.TID() != h.TID {
			t.Fatal("SA header")
		}
		m.SetRMPPVersion(1)
		m.SetRMPPType(RMPPTypeData)
		m.SetRMPPRespTime(0x1F)
		m.SetRMPPFlags(RMPPFlagActive | RMPPFlagLast)
		m.SetRMPPStatus(3)
		m.SetSegmentNumber(7)
		m.SetPayloadLength(220)
		if m.RMPPVersion() != 1 || m.RMPPType() != 1 || m.RMPPRespTime() != 0x1F || m.RMPPFlags() != 5 ||
			m.RMPPStatus() != 3 || m.SegmentNumber() != 7 || m.PayloadLength() != 220 || m[26] != 0xFD {
			t.Fatal("RMPP header")
		}
		m.SetStatus(0x0200)
		m.SetMethod(MethodGetResp)
		m.SetClassSpecific(0xABCD)
		m.SetTID(1)
		m.SetAttrID(2)
		m.SetAttrMod(3)
		m.SetBaseVersion(1)
		m.SetMgmtClass(3)
		m.SetClassVersion(2)
		if m.Status() != 0x0200 || !m.IsResponse() || m.ClassSpecific() != 0xABCD || m.TID() != 1 ||
			m.AttrID() != 2 || m.AttrMod() != 3 || m.MgmtClass() != 3 || m.ClassVersion() != 2 {
			t.Fatal("setters")
		}
	})
}

// goldenCPI is a ClassPortInfo as OpenSM 3.3.23 answered:
// CapabilityMask 0x2602, CapabilityMask2 0xB5E8, RespTimeValue 0x10.
func TestGoldenClassPortInfo(t *testing.T) {
	b := make([]byte, ClassPortInfoLen)
	copy(b, []byte{0x01, 0x02, 0x26, 0x02, 0x00, 0x16, 0xBD, 0x10})
	copy(b[32:], []byte{0x00, 0x00, 0x00, 0x01, 0x80, 0x01, 0x00, 0x00}) // redirect QP 1, Q_Key
	copy(b[68:], []byte{0x80, 0x01, 0x00, 0x00})                         // trap Q_Key
	c := ClassPortInfo(b)
	if c.BaseVersion() != 1 || c.ClassVersion() != 2 || c.CapabilityMask() != 0x2602 ||
		c.CapabilityMask2() != 0xB5E8 || c.RespTimeValue() != 0x10 || !c.SendOnlyFullMemberSupported() ||
		c.RedirectQP() != 1 || c.RedirectQKey() != GSIQKey || c.TrapQKey() != GSIQKey {
		t.Fatalf("decode: cm %#x cm2 %#x rtv %#x", c.CapabilityMask(), c.CapabilityMask2(), c.RespTimeValue())
	}
	n := ClassPortInfo(make([]byte, ClassPortInfoLen))
	n.SetBaseVersion(1)
	n.SetClassVersion(2)
	n.SetCapabilityMask(0x2602)
	n.SetRespTimeValue(0x10)
	n.SetCapabilityMask2(0xB5E8)
	n.SetRedirectQP(1)
	n.SetRedirectQKey(GSIQKey)
	n.SetTrapQKey(GSIQKey)
	if !bytes.Equal(n, b) {
		t.Fatalf("encode\n% x\nwant\n% x", []byte(n), b)
	}
	n.SetCapabilityMask2(n.CapabilityMask2() &^ CapMask2SendOnlyFullMember)
	if n.SendOnlyFullMemberSupported() || n.RespTimeValue() != 0x10 || n[5] != 0x14 {
		t.Fatalf("clearing bit 12: % x", []byte(n[4:8]))
	}
	// Remaining fields round-trip.
	gid := wire.GID{0xfe, 0x80, 15: 1}
	n.SetRedirectGID(gid)
	n.SetRedirectTCSLFL(0x12345678)
	n.SetRedirectLID(0x11)
	n.SetRedirectPKey(0xFFFF)
	n.SetTrapGID(gid)
	n.SetTrapTCSLFL(0x9)
	n.SetTrapLID(0x22)
	n.SetTrapPKey(0x7FFF)
	n.SetTrapHopLimit(0x40)
	n.SetTrapQP(0xABCDEF)
	if n.RedirectGID() != gid || n.RedirectTCSLFL() != 0x12345678 || n.RedirectLID() != 0x11 ||
		n.RedirectPKey() != 0xFFFF || n.TrapGID() != gid || n.TrapTCSLFL() != 9 || n.TrapLID() != 0x22 ||
		n.TrapPKey() != 0x7FFF || n.TrapHopLimit() != 0x40 || n.TrapQP() != 0xABCDEF {
		t.Fatal("ClassPortInfo accessors")
	}
}

func TestEnums(t *testing.T) {
	if !ValidMTU(1) || !ValidMTU(5) || ValidMTU(0) || ValidMTU(6) || MTUBytes(MTU2048) != 2048 || MTUBytes(9) != 0 {
		t.Fatal("MTU enums")
	}
	if !ValidRate(2) || !ValidRate(24) || ValidRate(1) || ValidRate(25) || ValidRate(0) {
		t.Fatal("rate enums")
	}
	if RateMbps(Rate10Gbps) != 10000 || RateMbps(Rate5Gbps) >= RateMbps(Rate30Gbps) || RateMbps(200) != 0 {
		t.Fatal("rate values")
	}
}

func TestRMPPSegments(t *testing.T) {
	hdr := NewSARequest(MethodGetTableResp, AttrMCMemberRecord, 77, 0x3)
	for _, n := range []int{0, 1, 3, 4, 7, 50} {
		data := make([]byte, n*MCMemberRecordStride)
		for i := range data {
			data[i] = byte(i*13 + n)
		}
		segs := RMPPSegments(hdr, data)
		wantSegs := max(1, (len(data)+SADataLen-1)/SADataLen)
		if len(segs) != wantSegs {
			t.Fatalf("%d records: %d segments, want %d", n, len(segs), wantSegs)
		}
		pad := wantSegs*SADataLen - len(data)
		for i, s := range segs {
			if len(s) != Len || s.TID() != 77 || s.Method() != MethodGetTableResp || s.AttrOffset() != 7 ||
				s.RMPPVersion() != 1 || s.RMPPType() != RMPPTypeData || s.RMPPFlags()&RMPPFlagActive == 0 ||
				s.SegmentNumber() != uint32(i+1) || s.RMPPRespTime() != RMPPNoRespTime {
				t.Fatalf("segment %d header", i)
			}
			first, last := s.RMPPFlags()&RMPPFlagFirst != 0, s.RMPPFlags()&RMPPFlagLast != 0
			if first != (i == 0) || last != (i == len(segs)-1) {
				t.Fatalf("segment %d flags %#x", i, s.RMPPFlags())
			}
			switch {
			case last:
				if s.PayloadLength() != uint32(RMPPDataLen-pad) {
					t.Fatalf("last paylen %d", s.PayloadLength())
				}
			case first:
				if s.PayloadLength() != uint32(wantSegs*RMPPDataLen-pad) {
					t.Fatalf("first paylen %d", s.PayloadLength())
				}
			default:
				if s.PayloadLength() != 0 {
					t.Fatal("middle paylen")
				}
			}
		}
		// Reassemble in reverse order.
		var r Reassembler
		var got []byte
		done := false
		for i := len(segs) - 1; i >= 0; i-- {
			d, data, err := r.Add(segs[i])
			if err != nil {
				t.Fatal(err)
			}
			if d {
				done, got = true, data
			}
		}
		if !done || !bytes.Equal(got, data) {
			t.Fatalf("%d records: reassembled %d bytes, want %d", n, len(got), len(data))
		}
		if r.Header().TID() != 77 {
			t.Fatal("header")
		}
	}
	var r Reassembler
	if _, _, err := r.Add(NewSARequest(MethodGetResp, AttrMCMemberRecord, 1, 0)); err != ErrNotRMPP {
		t.Fatalf("plain MAD: %v", err)
	}
	segs := RMPPSegments(hdr, make([]byte, 500))
	if _, _, err := r.Add(segs[0]); err != nil {
		t.Fatal(err)
	}
	other := append(MAD(nil), segs[1]...)
	other.SetTID(78)
	if _, _, err := r.Add(other); err != ErrRMPPSegment {
		t.Fatalf("TID mismatch: %v", err)
	}
}
