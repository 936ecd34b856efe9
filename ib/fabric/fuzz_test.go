package fabric

import (
	"reflect"
	"testing"

	"github.com/softrdma/softrdma/wire"
)

// FuzzParse feeds arbitrary datagrams to the fabric parsers: they must
// never panic, and a packet Parse accepts re-encodes to the same bytes.
func FuzzParse(f *testing.F) {
	f.Add(samplePacket(true, []byte("hello")))
	f.Add(samplePacket(false, make([]byte, 256)))
	f.Add(EncodeControl(&Control{Type: TypeAttach, GUID: 1}))
	f.Add(EncodeControl(&Control{Type: TypeRefused, GUID: 1, Reason: ReasonGUIDInUse}))
	f.Add(EncodeControl(&Control{Type: TypeRetry, GUID: 1, Cookie: make([]byte, CookieLen)}))
	f.Add(EncodeControlVersion(&Control{Type: TypeAttach, GUID: 1}, 1))
	f.Fuzz(func(t *testing.T, b []byte) {
		if IsControl(b) {
			// Every version decodes alike; a decoded message re-encodes
			// to one that decodes the same (padding included).
			c, v, err := DecodeControlAnyVersion(b)
			if _, err2 := DecodeControl(b); (err2 == nil) != (err == nil && v == Version) {
				t.Fatalf("DecodeControl %v, DecodeControlAnyVersion version %d %v", err2, v, err)
			}
			if err != nil {
				return
			}
			again, v2, err := DecodeControlAnyVersion(EncodeControlVersion(c, v))
			if err != nil || v2 != v || !reflect.DeepEqual(normal(again), normal(c)) {
				t.Fatalf("%+v re-encoded in version %d → %+v, %d, %v", c, v, again, v2, err)
			}
			return
		}
		var p Packet
		if err := Parse(b, &p); err != nil {
			return
		}
		h := &UDPacket{VL: p.LRH.VL(), SL: p.LRH.SL(), DLID: p.LRH.DLID(), SLID: p.LRH.SLID(), Global: p.Global(), UD: p.UD.Header()}
		if p.Global() {
			h.GRH = wire.IBGRHFields{TClass: p.GRH.TClass(), FlowLabel: p.GRH.FlowLabel(), HopLmt: p.GRH.HopLmt(), SGID: p.GRH.SGID(), DGID: p.GRH.DGID()}
		}
		out := make([]byte, PacketLen(len(p.UD.Payload), p.UD.HasImm, p.Global()))
		EncodeUD(out, h, p.UD.Payload)
		var q Packet
		if err := Parse(out, &q); err != nil {
			t.Fatalf("re-encoded packet rejected: %v", err)
		}
		if len(out) != len(b) {
			// Reserved bits and pad contents may differ, the length may not.
			t.Fatalf("re-encoded length %d, was %d", len(out), len(b))
		}
	})
}

// normal makes empty slices nil (JSON decodes [] and absence alike after a
// round trip).
func normal(c *Control) *Control {
	n := *c
	if len(n.PKeys) == 0 {
		n.PKeys = nil
	}
	if len(n.Cookie) == 0 {
		n.Cookie = nil
	}
	return &n
}
