package mad

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
)

// TestSIDRReqLayout writes every field of a SIDR_REQ and its CMA header
// and checks the bytes at the offsets of the kernel's cm_msgs.h and
// cma.c, then reads them back.
func TestSIDRReqLayout(t *testing.T) {
	m := NewCM(AttrSIDRReq, 0x0102030405060708)
	r := SIDRReq(m)
	r.SetRequestID(0xA1B2C3D4)
	r.SetPKey(0xFFFF)
	r.SetServiceID(ServiceID(0x0111, 7174))
	h := CMAHeader(r.PrivateData())
	h.SetVersion(CMAVersion)
	h.SetIPVersion(4)
	h.SetSrcPort(40000)
	h.SetSrcAddr(netip.MustParseAddr("10.0.0.1"))
	h.SetDstAddr(netip.MustParseAddr("10.0.0.2"))
	copy(r.PrivateData()[CMAHeaderLen:], "hello")

	want := map[int][]byte{
		0:  {1, ClassCM, CMClassVersion, MethodSend},
		8:  {1, 2, 3, 4, 5, 6, 7, 8},
		16: {0x00, 0x17},
		24: {0xA1, 0xB2, 0xC3, 0xD4, 0xFF, 0xFF, 0, 0},
		32: {0, 0, 0, 0, 0x01, 0x11, 0x1C, 0x06},
		40: {0x00, 0x40, 0x9C, 0x40},
		44: append(make([]byte, 12), 10, 0, 0, 1),
		60: append(make([]byte, 12), 10, 0, 0, 2),
		76: []byte("hello"),
	}
	for off, b := range want {
		if got := m[off : off+len(b)]; !bytes.Equal(got, b) {
			t.Errorf("offset %d: % x, want % x", off, got, b)
		}
	}
	if err := CheckCM(m); err != nil {
		t.Fatal(err)
	}
	if r.RequestID() != 0xA1B2C3D4 || r.PKey() != 0xFFFF || h.SrcPort() != 40000 || h.Version() != 0 {
		t.Errorf("read back: %#x %#x %d %d", r.RequestID(), r.PKey(), h.SrcPort(), h.Version())
	}
	if ps, port, ok := ServicePort(r.ServiceID()); !ok || ps != 0x0111 || port != 7174 {
		t.Errorf("ServicePort = %#x %d %v", ps, port, ok)
	}
	if h.SrcAddr() != netip.MustParseAddr("10.0.0.1") || h.DstAddr() != netip.MustParseAddr("10.0.0.2") {
		t.Errorf("addresses %v %v", h.SrcAddr(), h.DstAddr())
	}
	h.SetIPVersion(6)
	h.SetDstAddr(netip.MustParseAddr("fe80::1"))
	if h.DstAddr() != netip.MustParseAddr("fe80::1") || m[41] != 0x60 {
		t.Errorf("IPv6: %v, byte %#x", h.DstAddr(), m[41])
	}
}

// TestSIDRRepLayout checks a SIDR_REP's fields at the kernel's offsets.
func TestSIDRRepLayout(t *testing.T) {
	m := NewCM(AttrSIDRRep, 9)
	r := SIDRRep(m)
	r.SetRequestID(0x11223344)
	r.SetStatus(SIDRReject)
	r.SetAddInfoLen(3)
	r.SetQPN(0xABCDEF)
	r.SetServiceID(ServiceID(0x0111, 1))
	r.SetQKey(0x01234567)
	copy(r.AddInfo(), "inf")
	copy(r.PrivateData(), "bye")
	if got := binary.BigEndian.Uint32(m[32:]); got != 0xABCDEF00 {
		t.Errorf("QPN word %#x", got)
	}
	if m[28] != SIDRReject || m[29] != 3 || string(m[48:51]) != "inf" || string(m[120:123]) != "bye" ||
		binary.BigEndian.Uint32(m[44:]) != 0x01234567 || binary.BigEndian.Uint64(m[36:]) != 0x01110001 {
		t.Errorf("layout: % x", m[24:124])
	}
	if r.QPN() != 0xABCDEF || r.QKey() != 0x01234567 || r.Status() != SIDRReject || r.RequestID() != 0x11223344 || r.AddInfoLen() != 3 {
		t.Errorf("read back %#x %#x %d", r.QPN(), r.QKey(), r.Status())
	}
	if len(r.PrivateData())+offSIDRRepPData != Len || len(SIDRReq(m).PrivateData())+offSIDRReqPData != Len {
		t.Error("private data does not end the MAD")
	}
	if _, _, ok := ServicePort(1 << 40); ok {
		t.Error("ServicePort took an ID outside the RDMA IP range")
	}
}

// FuzzCM reads every field of whatever CheckCM accepts: nothing may
// panic, and a rewritten field reads back.
func FuzzCM(f *testing.F) {
	f.Add([]byte(NewCM(AttrSIDRReq, 1)))
	f.Add([]byte(NewCM(AttrSIDRRep, 2)))
	f.Add([]byte{1, 7, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		if CheckCM(b) != nil {
			return
		}
		switch MAD(b).AttrID() {
		case AttrSIDRReq:
			r := SIDRReq(b)
			_, _, _ = r.RequestID(), r.PKey(), r.ServiceID()
			h := CMAHeader(r.PrivateData())
			_, _, _, _ = h.IPVersion(), h.SrcPort(), h.SrcAddr(), h.DstAddr()
			_, _, _ = ServicePort(r.ServiceID())
		case AttrSIDRRep:
			r := SIDRRep(b)
			_, _, _, _ = r.RequestID(), r.Status(), r.ServiceID(), r.QKey()
			q := r.QPN()
			r.SetQPN(q)
			if r.QPN() != q || q > 0xFFFFFF {
				t.Fatalf("QPN %#x", q)
			}
		default:
			t.Fatalf("CheckCM took attribute %#x", MAD(b).AttrID())
		}
	})
}
