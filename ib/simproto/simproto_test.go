package simproto

import (
	"bytes"
	"testing"
)

// The layouts against bytes built as ibsim's C structs lay them out on
// x86-64 (little-endian): host-order fields little-endian, htonl'd ones
// big-endian, a be16 LID assigned to a uint32.
func TestRequestLayout(t *testing.T) {
	if !littleEndian {
		t.Skip("the byte images are a little-endian host's")
	}
	b := make([]byte, RequestLen)
	copy(b[0:], []byte{0x01, 0x02, 0, 0})        // dlid = be16 0x0102
	copy(b[4:], []byte{0xff, 0xff, 0, 0})        // slid = 0xffff
	copy(b[8:], []byte{0, 0, 0, 0})              // dqp 0
	copy(b[12:], []byte{0, 0, 0, 1})             // sqp htonl(1)
	copy(b[16:], []byte{0, 0, 0, 110})           // status htonl(110)
	copy(b[24:], []byte{0, 0, 0, 0, 0, 0, 1, 0}) // length htobe64(256)
	b[32] = 1                                    // MAD base version
	r := Request(b)
	if r.DLID() != 0x0102 || r.SLID() != 0xFFFF || r.DQP() != 0 || r.SQP() != 1 ||
		r.Status() != StatusTimeout || r.Length() != 256 || r.MAD()[0] != 1 || len(r.MAD()) != MADLen {
		t.Fatalf("decoded dlid %#x slid %#x dqp %d sqp %d status %d length %d", r.DLID(), r.SLID(), r.DQP(), r.SQP(), r.Status(), r.Length())
	}
	w := Request(make([]byte, RequestLen))
	w.SetDLID(0x0102)
	w.SetSLID(0xFFFF)
	w.SetSQP(1)
	w.SetStatus(StatusTimeout)
	w.SetLength(256)
	w.MAD()[0] = 1
	if !bytes.Equal(w, b) {
		t.Fatalf("encoded\n%x\nwant\n%x", []byte(w), b)
	}
}

func TestCtlLayout(t *testing.T) {
	if !littleEndian {
		t.Skip("the byte images are a little-endian host's")
	}
	b := make([]byte, CtlLen)
	copy(b, []byte{0xef, 0xbe, 0xad, 0xde, 3, 0, 0, 0, TypeConnect, 0, 0, 0, ClientInfoLen, 0, 0, 0})
	ci := b[16:]
	copy(ci, []byte{0x39, 0x30, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}) // pid 12345, qp 0, issm 1
	copy(ci[12:], "Hca1")
	c := Ctl(b)
	if c.Magic() != Magic || c.ClientID() != 3 || c.Type() != TypeConnect || c.Len() != ClientInfoLen {
		t.Fatalf("ctl magic %#x id %d type %d len %d", c.Magic(), c.ClientID(), c.Type(), c.Len())
	}
	info := ClientInfo(c.Data())
	if info.ID() != 12345 || info.QP() != 0 || !info.IsSM() || info.NodeID() != "Hca1" {
		t.Fatalf("client info id %d qp %d issm %v node %q", info.ID(), info.QP(), info.IsSM(), info.NodeID())
	}
	w := Ctl(make([]byte, CtlLen))
	w.SetMagic(Magic)
	w.SetClientID(3)
	w.SetType(TypeConnect)
	w.SetLen(ClientInfoLen)
	wi := ClientInfo(w.Data())
	wi.SetID(12345)
	wi.SetIsSM(true)
	wi.SetNodeID("Hca1")
	if !bytes.Equal(w, b) {
		t.Fatalf("encoded\n%x\nwant\n%x", []byte(w), b)
	}
	wi.SetNodeID(string(bytes.Repeat([]byte{'x'}, 40)))
	if n := wi.NodeID(); len(n) != NodeIDLen-1 {
		t.Fatalf("a long node id kept %d bytes, want %d (NUL-terminated)", len(n), NodeIDLen-1)
	}
	v := Vendor(make([]byte, VendorLen))
	v.SetVendorID(0x2c9)
	v.SetPartID(7)
	v.SetHWVer(2)
	v.SetFWVer(0x0102030405060708)
	want := []byte{0xc9, 2, 0, 0, 7, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1}
	if !bytes.Equal(v, want) || v.VendorID() != 0x2c9 || v.PartID() != 7 || v.HWVer() != 2 || v.FWVer() != 0x0102030405060708 {
		t.Fatalf("vendor %x, want %x", []byte(v), want)
	}
}

func TestNames(t *testing.T) {
	for got, want := range map[string]string{
		CtlName("sim"):          "sim:ctl\x00",
		ClientCtlName("sim", 7): "sim:ctl7\x00",
		InName("sim", 7):        "sim:in7\x00",
		OutName("sim", 3):       "sim:out3\x00",
	} {
		if got != want {
			t.Errorf("%q, want %q", got, want)
		}
	}
}

// FuzzRequest: any datagram of the right size decodes without panicking.
func FuzzRequest(f *testing.F) {
	f.Add(make([]byte, RequestLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < RequestLen {
			b = append(b, make([]byte, RequestLen-len(b))...)
		}
		r := Request(b[:RequestLen])
		_ = r.DLID() + r.SLID()
		_ = r.DQP() + r.SQP() + r.Status()
		_ = r.Length()
		r.SetDLID(r.SLID())
		if len(r.MAD()) != MADLen {
			t.Fatal("MAD size")
		}
	})
}
