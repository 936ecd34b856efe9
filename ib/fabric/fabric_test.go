package fabric

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
	"pgregory.net/rapid"
)

func TestControlGolden(t *testing.T) {
	b := EncodeControl(&Control{Type: TypeAttach, GUID: 0x100001, NodeDesc: "host rxe0"})
	want := "SRSM\x02" + `{"type":"attach","guid":1048577,"node_desc":"host rxe0"}`
	want += strings.Repeat(" ", AttachLen-len(want)) // padded
	if string(b) != want {
		t.Fatalf("got %q\nwant %q", b, want)
	}
	pi := &Control{Type: TypePortInfo, GUID: 0x100001, LID: 2, SMLID: 1, SubnetPrefix: DefaultSubnetPrefix,
		PKeys: []uint16{0xffff}, Epoch: 42, MTU: 4, Rate: 3, State: StateActive}
	want = "SRSM\x02" + `{"type":"port_info","guid":1048577,"lid":2,"sm_lid":1,"subnet_prefix":18338657682652659712,` +
		`"pkeys":[65535],"epoch":42,"mtu":4,"rate":3,"state":"active"}`
	if got := string(EncodeControl(pi)); got != want {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	c, err := DecodeControl([]byte(want))
	if err != nil || !reflect.DeepEqual(c, pi) {
		t.Fatalf("decode %+v, %v", c, err)
	}
	ref := &Control{Type: TypeRefused, GUID: 0x100001, Reason: ReasonGUIDInUse}
	want = "SRSM\x02" + `{"type":"refused","guid":1048577,"reason":"guid_in_use"}`
	if got := string(EncodeControl(ref)); got != want {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	if c, err := DecodeControl([]byte(want)); err != nil || !reflect.DeepEqual(c, ref) {
		t.Fatalf("decode %+v, %v", c, err)
	}
	retry := &Control{Type: TypeRetry, GUID: 0x100001, Cookie: []byte("0123456789abcdef")}
	want = "SRSM\x02" + `{"type":"retry","guid":1048577,"cookie":"MDEyMzQ1Njc4OWFiY2RlZg=="}`
	if got := string(EncodeControl(retry)); got != want {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	if c, err := DecodeControl([]byte(want)); err != nil || !reflect.DeepEqual(c, retry) {
		t.Fatalf("decode %+v, %v", c, err)
	}
	if _, err := DecodeControl([]byte("SRS\x02{}")); !errors.Is(err, ErrNotControl) {
		t.Fatalf("no magic: %v", err)
	}
	if _, err := DecodeControl([]byte("SRSM\x02{")); err == nil {
		t.Fatal("bad JSON accepted")
	}
	if IsControl([]byte("SRSM")) || !IsControl([]byte(Magic)) || Magic[4] != Version {
		t.Fatal("IsControl")
	}
}

// TestControlVersions: a message of version 1 (before address validation)
// is a control message that DecodeControl refuses with ErrVersion and
// DecodeControlAnyVersion reads; the SM's refusal in version 1 is what a
// version 1 port decodes (the same JSON, Magic "SRSM\x01"), and no
// longer than that port's attach.
func TestControlVersions(t *testing.T) {
	v1 := []byte("SRSM\x01" + `{"type":"attach","guid":1048577,"node_desc":"softrdma 127.0.0.1","credits":64}`)
	if !IsControl(v1) || ControlVersion(v1) != 1 || ControlVersion([]byte("xx")) != 0 {
		t.Fatal("IsControl/ControlVersion of version 1")
	}
	if _, err := DecodeControl(v1); !errors.Is(err, ErrVersion) {
		t.Fatalf("version 1: %v, want ErrVersion", err)
	}
	c, v, err := DecodeControlAnyVersion(v1)
	if err != nil || v != 1 || c.Type != TypeAttach || c.GUID != 0x100001 {
		t.Fatalf("DecodeControlAnyVersion: %+v %d %v", c, v, err)
	}
	r := EncodeControlVersion(&Control{Type: TypeRefused, GUID: c.GUID, Reason: ReasonVersion}, 1)
	if want := "SRSM\x01" + `{"type":"refused","guid":1048577,"reason":"version"}`; string(r) != want {
		t.Fatalf("got %q\nwant %q", r, want)
	}
	if len(r) > len(v1) {
		t.Fatalf("refusal of %d bytes to an attach of %d", len(r), len(v1))
	}
	// Attaches of version 1 were never padded; EncodeControlVersion pads
	// only this version's.
	if a := EncodeControlVersion(&Control{Type: TypeAttach, GUID: 1}, 1); len(a) >= AttachLen {
		t.Fatalf("version 1 attach padded: %d bytes", len(a))
	}
}

// TestAnswersFitAttach: the SM's answers, with every field at its
// longest, are no longer than the shortest attach EncodeControl makes
// (AttachLen), so that a padded attach is never amplified; a long attach
// is not cut.
func TestAnswersFitAttach(t *testing.T) {
	const maxU64 = ^uint64(0)
	answers := []*Control{
		{Type: TypeRetry, GUID: maxU64, Cookie: make([]byte, CookieLen)},
		{Type: TypePortInfo, GUID: maxU64, LID: 0xBFFF, SMLID: 0xBFFF, SubnetPrefix: maxU64, PKeys: []uint16{0xffff},
			Epoch: maxU64, MTU: 5, Rate: 255, State: StateActive, ClientReregister: true, Credits: MaxWindow,
			Session: make([]byte, SessionLen), SMGUID: maxU64, MAC: make([]byte, MACLen)},
		{Type: TypeRefused, GUID: maxU64, Reason: ReasonSourceLimit, MAC: make([]byte, MACLen)},
		{Type: TypeRefused, GUID: maxU64, Reason: ReasonGUIDInUse},
	}
	for _, a := range answers {
		if n := len(EncodeControl(a)); n > AttachLen {
			t.Errorf("%s of %d bytes: longer than an attach (%d)", a.Type, n, AttachLen)
		}
	}
	if n := len(EncodeControl(&Control{Type: TypeAttach, GUID: 1})); n != AttachLen {
		t.Errorf("short attach: %d bytes, want %d", n, AttachLen)
	}
	long := &Control{Type: TypeAttach, GUID: 1, NodeDesc: strings.Repeat("x", AttachLen)}
	if b := EncodeControl(long); len(b) <= AttachLen || b[len(b)-1] != '}' {
		t.Errorf("long attach: %d bytes, ends %q", len(b), b[len(b)-1])
	}
}

func TestPropControlRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := &Control{
			Type:         rapid.SampledFrom([]string{TypeAttach, TypePortInfo, TypeRefused, TypeDetach, TypeRetry}).Draw(t, "type"),
			GUID:         rapid.Uint64().Draw(t, "guid"),
			NodeDesc:     rapid.String().Draw(t, "desc"),
			LID:          rapid.Uint16().Draw(t, "lid"),
			SMLID:        rapid.Uint16().Draw(t, "smlid"),
			SubnetPrefix: rapid.Uint64().Draw(t, "prefix"),
			Epoch:        rapid.Uint64().Draw(t, "epoch"),
			MTU:          rapid.Uint8().Draw(t, "mtu"),
			Rate:         rapid.Uint8().Draw(t, "rate"),
			State:        rapid.SampledFrom([]string{"", StateActive}).Draw(t, "state"),
			Reason:       rapid.SampledFrom([]string{"", ReasonGUIDInUse, ReasonNoLID, ReasonSourceLimit, ReasonVersion}).Draw(t, "reason"),
		}
		if rapid.Bool().Draw(t, "cookie") {
			c.Cookie = rapid.SliceOfN(rapid.Byte(), 1, MaxCookieLen).Draw(t, "cookie bytes")
		}
		if n := rapid.IntRange(0, 3).Draw(t, "npk"); n > 0 {
			for range n {
				c.PKeys = append(c.PKeys, rapid.Uint16().Draw(t, "pk"))
			}
		}
		got, err := DecodeControl(EncodeControl(c))
		if err != nil || !reflect.DeepEqual(got, c) {
			t.Fatalf("%+v -> %+v (%v)", c, got, err)
		}
	})
}

func TestPortGID(t *testing.T) {
	g := PortGID(DefaultSubnetPrefix, 0x100001)
	if g.String() != "fe80::10:1" || GUIDOf(g) != 0x100001 {
		t.Fatalf("%v", g)
	}
}

var (
	sgid = PortGID(DefaultSubnetPrefix, 0x100001)
	dgid = wire.GID{0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 12: 6, 13: 1, 14: 2, 15: 3}
)

func samplePacket(global bool, payload []byte) []byte {
	p := &UDPacket{SL: 2, DLID: 0xC001, SLID: 2, Global: global,
		GRH: wire.IBGRHFields{HopLmt: 0xFF, SGID: sgid, DGID: dgid},
		UD:  wire.UDHeader{PKey: 0xFFFF, DestQP: wire.MulticastQPN, PSN: 7, QKey: 0x01234567, SrcQP: 0x42}}
	b := make([]byte, PacketLen(len(payload), false, global))
	if n := EncodeUD(b, p, payload); n != len(b) {
		panic("length")
	}
	return b
}

func TestEncodeParse(t *testing.T) {
	for _, global := range []bool{false, true} {
		for _, n := range []int{0, 1, 5, 256, 1000} {
			payload := bytes.Repeat([]byte{'c'}, n)
			b := samplePacket(global, payload)
			if b[0] == 'S' || IsControl(b) {
				t.Fatal("IB packet looks like a control message")
			}
			var p Packet
			if err := Parse(b, &p); err != nil {
				t.Fatalf("global=%v n=%d: %v", global, n, err)
			}
			if p.Global() != global || p.LRH.DLID() != 0xC001 || p.LRH.SLID() != 2 || p.LRH.SL() != 2 ||
				!bytes.Equal(p.UD.Payload, payload) || p.UD.DETH.SrcQP() != 0x42 || p.UD.BTH.DestQP() != wire.MulticastQPN {
				t.Fatalf("global=%v n=%d: fields", global, n)
			}
			if global && (p.GRH.SGID() != sgid || p.GRH.DGID() != dgid || p.GRH.HopLmt() != 0xFF) {
				t.Fatal("GRH")
			}
			wantLNH := uint8(wire.LNHLocal)
			if global {
				wantLNH = wire.LNHGlobal
			}
			if p.LRH.LNH() != wantLNH || int(p.LRH.PktLen())*4+2 != len(b) {
				t.Fatal("LRH")
			}
		}
	}
}

func TestParseErrors(t *testing.T) {
	good := samplePacket(true, []byte("hello"))
	fixVCRC := func(b []byte) { wire.PutVCRC(b[len(b)-2:], wire.VCRC(b[:len(b)-2])) }
	cases := []struct {
		name string
		mod  func(b []byte) []byte
		want error
	}{
		{"short", func(b []byte) []byte { return b[:20] }, ErrShort},
		{"LVer", func(b []byte) []byte { b[0] |= 1; fixVCRC(b); return b }, ErrLVer},
		{"LNH raw", func(b []byte) []byte { wire.LRH(b).SetLNH(0); fixVCRC(b); return b }, ErrLNH},
		{"PktLen", func(b []byte) []byte { wire.LRH(b).SetPktLen(3); fixVCRC(b); return b }, ErrPktLen},
		{"VCRC", func(b []byte) []byte { b[len(b)-1] ^= 1; return b }, ErrVCRC},
		{"VL change keeps ICRC, breaks VCRC", func(b []byte) []byte { wire.LRH(b).SetVL(3); return b }, ErrVCRC},
		{"NxtHdr", func(b []byte) []byte { b[8+6] = 17; fixVCRC(b); return b }, ErrGRH},
		{"IPVer", func(b []byte) []byte { b[8] = 0x4F; fixVCRC(b); return b }, ErrGRH},
		{"PayLen", func(b []byte) []byte { wire.IBGRH(b[8:]).SetPayLen(4); fixVCRC(b); return b }, ErrGRH},
		{"ICRC (payload bit, VCRC redone)", func(b []byte) []byte { b[len(b)-9] ^= 1; fixVCRC(b); return b }, ErrICRC},
		{"TVer", func(b []byte) []byte { b[48+1] |= 1; fixVCRC(b); return b }, wire.ErrTVer},
	}
	for _, c := range cases {
		b := c.mod(append([]byte(nil), good...))
		var p Packet
		if err := Parse(b, &p); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// A switch rewriting VL and the VCRC keeps the packet valid end to end.
	b := append([]byte(nil), good...)
	wire.LRH(b).SetVL(5)
	fixVCRC(b)
	var p Packet
	if err := Parse(b, &p); err != nil {
		t.Fatalf("VL rewrite: %v", err)
	}
}

// An SA request as the provider sends it: local packet to LID 1, QP1.
func TestSAMADPacket(t *testing.T) {
	m := mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 9, 0)
	h := &UDPacket{DLID: SMLID, SLID: 2, UD: wire.UDHeader{PKey: 0xFFFF, DestQP: SAQPN, QKey: SAQKey, SrcQP: 1}}
	b := make([]byte, PacketLen(mad.Len, false, false))
	EncodeUD(b, h, m)
	if len(b) != 8+12+8+256+4+2 {
		t.Fatalf("length %d", len(b))
	}
	var p Packet
	if err := Parse(b, &p); err != nil {
		t.Fatal(err)
	}
	if p.Global() || p.UD.DETH.QKey() != SAQKey || mad.MAD(p.UD.Payload).TID() != 9 {
		t.Fatal("fields")
	}
}

func TestParseZeroAlloc(t *testing.T) {
	b := samplePacket(true, make([]byte, 1024))
	var p Packet
	if n := testing.AllocsPerRun(100, func() {
		if err := Parse(b, &p); err != nil {
			panic(err)
		}
	}); n != 0 {
		t.Fatalf("%v allocs", n)
	}
}
