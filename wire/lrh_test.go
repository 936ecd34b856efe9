package wire

import (
	"bytes"
	"testing"
)

func TestLRHGolden(t *testing.T) {
	b := make([]byte, LRHLen)
	l := LRH(b)
	l.Encode(LRHFields{VL: 0xA, SL: 0x5, LNH: LNHGlobal, DLID: 0xC001, SLID: 0x0002, PktLen: 0x123})
	want := []byte{0xA0, 0x53, 0xC0, 0x01, 0x01, 0x23, 0x00, 0x02}
	if !bytes.Equal(b, want) {
		t.Fatalf("LRH bytes % x, want % x", b, want)
	}
	if l.VL() != 0xA || l.LVer() != 0 || l.SL() != 5 || l.LNH() != LNHGlobal ||
		l.DLID() != 0xC001 || l.PktLen() != 0x123 || l.SLID() != 2 {
		t.Fatalf("accessors: vl %x lver %x sl %x lnh %x dlid %x pktlen %x slid %x",
			l.VL(), l.LVer(), l.SL(), l.LNH(), l.DLID(), l.PktLen(), l.SLID())
	}
	// Setters touch only their field.
	b[4] = 0xF8 // reserved bits of the PktLen word set
	l.SetPktLen(0x7FF)
	if b[4] != 0xFF || b[5] != 0xFF {
		t.Fatalf("SetPktLen kept reserved bits wrong: % x", b[4:6])
	}
	l.SetPktLen(0)
	if b[4] != 0xF8 || b[5] != 0 {
		t.Fatalf("SetPktLen(0): % x", b[4:6])
	}
	l.SetVL(0xF)
	l.SetLVer(0)
	l.SetSL(0)
	l.SetLNH(LNHLocal)
	if b[0] != 0xF0 || b[1] != 0x02 {
		t.Fatalf("byte 0/1 % x", b[:2])
	}
	l.SetDLID(1)
	l.SetSLID(0xBEEF)
	if l.DLID() != 1 || l.SLID() != 0xBEEF {
		t.Fatal("DLID/SLID")
	}
}

// An LRH with LVer 0 never starts with 'S', the first byte of a fabric
// control message.
func TestLRHNeverLooksLikeControl(t *testing.T) {
	for vl := range 16 {
		b := make([]byte, LRHLen)
		LRH(b).SetVL(uint8(vl))
		if b[0] == 'S' {
			t.Fatalf("VL %d gives 'S'", vl)
		}
	}
}

func TestMulticastLID(t *testing.T) {
	for _, c := range []struct {
		lid  uint16
		want bool
	}{{1, false}, {0xBFFF, false}, {0xC000, true}, {0xFFFE, true}, {0xFFFF, false}} {
		if IsMulticastLID(c.lid) != c.want {
			t.Errorf("IsMulticastLID(%#x) != %v", c.lid, c.want)
		}
	}
}

func TestIBGRHGolden(t *testing.T) {
	b := make([]byte, IBGRHLen)
	g := IBGRH(b)
	sgid := GID{0xfe, 0x80, 14: 0x10, 15: 0x01}
	dgid := GID{0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 12: 0x06, 13: 0x01, 14: 0x02, 15: 0x03}
	g.Encode(IBGRHFields{TClass: 0xAB, FlowLabel: 0x12345, PayLen: 0x40, NxtHdr: IBGRHNextHdrBTH, HopLmt: 0x7F, SGID: sgid, DGID: dgid})
	want := append([]byte{0x6A, 0xB1, 0x23, 0x45, 0x00, 0x40, 0x1B, 0x7F}, append(sgid[:], dgid[:]...)...)
	if !bytes.Equal(b, want) {
		t.Fatalf("GRH\n% x\nwant\n% x", b, want)
	}
	if g.IPVer() != 6 || g.TClass() != 0xAB || g.FlowLabel() != 0x12345 || g.PayLen() != 0x40 ||
		g.NxtHdr() != 0x1B || g.HopLmt() != 0x7F || g.SGID() != sgid || g.DGID() != dgid {
		t.Fatal("accessors")
	}
	g.SetTClass(0)
	g.SetFlowLabel(0)
	g.SetHopLmt(1)
	g.SetPayLen(2)
	g.SetNxtHdr(3)
	g.SetSGID(dgid)
	g.SetDGID(sgid)
	if g.TClass() != 0 || g.FlowLabel() != 0 || g.IPVer() != 6 || g.HopLmt() != 1 || g.PayLen() != 2 ||
		g.NxtHdr() != 3 || g.SGID() != dgid || g.DGID() != sgid {
		t.Fatal("setters")
	}
}
