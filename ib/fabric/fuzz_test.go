package fabric

import (
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
	f.Fuzz(func(t *testing.T, b []byte) {
		if IsControl(b) {
			DecodeControl(b)
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
