package mad

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// The communication management class (IBA 12.6, 16.7; the kernel's
// cm_msgs.h): only Service ID Resolution (SIDR), the CM's UD exchange, is
// spoken. A CM MAD is a 256-byte MAD (common header, then the message):
//
//	SIDR_REQ (0x0017):
//	24  RequestID(4)  28 P_Key(2) Reserved(2)  32 ServiceID(8)
//	40  PrivateData(216)
//
//	SIDR_REP (0x0018):
//	24  RequestID(4)  28 Status(1) AddInfoLen(1) Reserved(2)
//	32  QPN(24b)|Reserved(8)  36 ServiceID(8)  44 Q_Key(4)
//	48  AdditionalInfo(72)  120 PrivateData(136)
//
// The RDMA CM (cma.c) starts a SIDR_REQ's private data with its header
// (CMAHeader) and builds the service ID from the port space and port
// (ServiceID).
const (
	// ClassCM is the communication management class (0x07).
	ClassCM = 0x07
	// CMClassVersion is the CM class version the kernel speaks (2).
	CMClassVersion = 2

	// AttrSIDRReq is the SIDR_REQ attribute (0x0017).
	AttrSIDRReq = 0x0017
	// AttrSIDRRep is the SIDR_REP attribute (0x0018).
	AttrSIDRRep = 0x0018

	// SIDRReqPrivateDataLen is IB_CM_SIDR_REQ_PRIVATE_DATA_SIZE (216).
	SIDRReqPrivateDataLen = 216
	// SIDRRepPrivateDataLen is IB_CM_SIDR_REP_PRIVATE_DATA_SIZE (136).
	SIDRRepPrivateDataLen = 136
	// SIDRRepAddInfoLen is the size of a SIDR_REP's additional
	// information (IB_CM_SIDR_REP_INFO_LENGTH, 72).
	SIDRRepAddInfoLen = 72
)

// SIDR_REP status values (enum ib_cm_sidr_status).
const (
	SIDRSuccess            = 0
	SIDRUnsupported        = 1
	SIDRReject             = 2
	SIDRNoQP               = 3
	SIDRRedirect           = 4
	SIDRUnsupportedVersion = 5
)

// CM message offsets.
const (
	offCMRequestID  = 24
	offSIDRReqPKey  = 28
	offSIDRReqSID   = 32
	offSIDRReqPData = 40

	offSIDRRepStatus   = 28
	offSIDRRepInfoLen  = 29
	offSIDRRepQPN      = 32
	offSIDRRepSID      = 36
	offSIDRRepQKey     = 44
	offSIDRRepAddInfo  = 48
	offSIDRRepPData    = 120
	sidrRepQPNShift    = 8
	sidrRepQPNMaskWord = 0xFFFFFF00
)

// ErrNotCM is the error of CheckCM for a MAD that is not a CM SIDR
// message softrdma takes.
var ErrNotCM = errors.New("not a CM SIDR_REQ or SIDR_REP")

// CheckCM reports whether b is a SIDR_REQ or SIDR_REP of the CM class
// that the views below may read: Len bytes or more, base version 1,
// class ClassCM version CMClassVersion, method Send, a SIDR attribute.
// It never panics.
func CheckCM(b []byte) error {
	if len(b) < Len {
		return ErrNotCM
	}
	m := MAD(b)
	if m.BaseVersion() != BaseVersion || m.MgmtClass() != ClassCM || m.ClassVersion() != CMClassVersion ||
		m.Method() != MethodSend {
		return ErrNotCM
	}
	switch m.AttrID() {
	case AttrSIDRReq, AttrSIDRRep:
		return nil
	}
	return ErrNotCM
}

// NewCM returns a zeroed 256-byte CM MAD whose header is that of a
// SIDR message attr (AttrSIDRReq or AttrSIDRRep), method Send, with
// transaction ID tid.
func NewCM(attr uint16, tid uint64) MAD {
	m := MAD(make([]byte, Len))
	m.EncodeHeader(Header{MgmtClass: ClassCM, ClassVersion: CMClassVersion, Method: MethodSend, TID: tid, AttrID: attr})
	return m
}

// SIDRReplyTo returns a SIDR_REP with status answering req: its
// transaction ID, request ID and service ID, the rest zero (what the
// kernel's CM sends for a status other than success, cm_reject_sidr_req).
func SIDRReplyTo(req SIDRReq, status uint8) SIDRRep {
	rep := SIDRRep(NewCM(AttrSIDRRep, req.MAD().TID()))
	rep.SetRequestID(req.RequestID())
	rep.SetStatus(status)
	rep.SetServiceID(req.ServiceID())
	return rep
}

// SIDRReq is a view of a SIDR_REQ MAD (Len bytes, header included).
type SIDRReq []byte

// MAD returns the message's MAD header view.
func (s SIDRReq) MAD() MAD { return MAD(s) }

// RequestID returns the sender's request ID.
func (s SIDRReq) RequestID() uint32 { return binary.BigEndian.Uint32(s[offCMRequestID:]) }

// SetRequestID sets the request ID.
func (s SIDRReq) SetRequestID(v uint32) { binary.BigEndian.PutUint32(s[offCMRequestID:], v) }

// PKey returns the P_Key.
func (s SIDRReq) PKey() uint16 { return binary.BigEndian.Uint16(s[offSIDRReqPKey:]) }

// SetPKey sets the P_Key.
func (s SIDRReq) SetPKey(v uint16) { binary.BigEndian.PutUint16(s[offSIDRReqPKey:], v) }

// ServiceID returns the service ID.
func (s SIDRReq) ServiceID() uint64 { return binary.BigEndian.Uint64(s[offSIDRReqSID:]) }

// SetServiceID sets the service ID.
func (s SIDRReq) SetServiceID(v uint64) { binary.BigEndian.PutUint64(s[offSIDRReqSID:], v) }

// PrivateData returns the 216 bytes of private data (a view).
func (s SIDRReq) PrivateData() []byte {
	return s[offSIDRReqPData : offSIDRReqPData+SIDRReqPrivateDataLen]
}

// SIDRRep is a view of a SIDR_REP MAD (Len bytes, header included).
type SIDRRep []byte

// MAD returns the message's MAD header view.
func (s SIDRRep) MAD() MAD { return MAD(s) }

// RequestID returns the request ID of the SIDR_REQ answered.
func (s SIDRRep) RequestID() uint32 { return binary.BigEndian.Uint32(s[offCMRequestID:]) }

// SetRequestID sets the request ID.
func (s SIDRRep) SetRequestID(v uint32) { binary.BigEndian.PutUint32(s[offCMRequestID:], v) }

// Status returns the SIDR status (SIDRSuccess…).
func (s SIDRRep) Status() uint8 { return s[offSIDRRepStatus] }

// SetStatus sets the SIDR status.
func (s SIDRRep) SetStatus(v uint8) { s[offSIDRRepStatus] = v }

// AddInfoLen returns the length of the additional information.
func (s SIDRRep) AddInfoLen() uint8 { return s[offSIDRRepInfoLen] }

// SetAddInfoLen sets the length of the additional information.
func (s SIDRRep) SetAddInfoLen(v uint8) { s[offSIDRRepInfoLen] = v }

// QPN returns the 24-bit QP number of the service.
func (s SIDRRep) QPN() uint32 { return binary.BigEndian.Uint32(s[offSIDRRepQPN:]) >> sidrRepQPNShift }

// SetQPN sets the QP number (24 bits; the reserved byte is kept).
func (s SIDRRep) SetQPN(v uint32) {
	w := binary.BigEndian.Uint32(s[offSIDRRepQPN:])
	binary.BigEndian.PutUint32(s[offSIDRRepQPN:], w&^sidrRepQPNMaskWord|(v<<sidrRepQPNShift)&sidrRepQPNMaskWord)
}

// ServiceID returns the service ID.
func (s SIDRRep) ServiceID() uint64 { return binary.BigEndian.Uint64(s[offSIDRRepSID:]) }

// SetServiceID sets the service ID.
func (s SIDRRep) SetServiceID(v uint64) { binary.BigEndian.PutUint64(s[offSIDRRepSID:], v) }

// QKey returns the Q_Key of the service's QP.
func (s SIDRRep) QKey() uint32 { return binary.BigEndian.Uint32(s[offSIDRRepQKey:]) }

// SetQKey sets the Q_Key.
func (s SIDRRep) SetQKey(v uint32) { binary.BigEndian.PutUint32(s[offSIDRRepQKey:], v) }

// AddInfo returns the 72 bytes of additional information (a view).
func (s SIDRRep) AddInfo() []byte { return s[offSIDRRepAddInfo : offSIDRRepAddInfo+SIDRRepAddInfoLen] }

// PrivateData returns the 136 bytes of private data (a view).
func (s SIDRRep) PrivateData() []byte {
	return s[offSIDRRepPData : offSIDRRepPData+SIDRRepPrivateDataLen]
}

// The RDMA CM's private-data header (the kernel's struct cma_hdr):
//
//	0 CMAVersion(1)  1 IPVersion(1: version in bits 7:4)  2 SrcPort(2)
//	4 SrcAddr(16)  20 DstAddr(16)
//
// An IPv4 address sits in the last 4 bytes of its 16 (the first 12 are
// zero); an IPv6 one fills them.
const (
	// CMAHeaderLen is sizeof(struct cma_hdr).
	CMAHeaderLen = 36
	// CMAVersion is the header version the kernel writes (0x00).
	CMAVersion = 0x00

	offCMAVersion = 0
	offCMAIPVer   = 1
	offCMAPort    = 2
	offCMASrc     = 4
	offCMADst     = 20
)

// CMAHeader is a view of the RDMA CM's header at the start of a SIDR_REQ's
// private data; it must be at least CMAHeaderLen bytes long.
type CMAHeader []byte

// Version returns the CMA version byte.
func (h CMAHeader) Version() uint8 { return h[offCMAVersion] }

// SetVersion sets the CMA version byte.
func (h CMAHeader) SetVersion(v uint8) { h[offCMAVersion] = v }

// IPVersion returns the IP version (4 or 6; bits 7:4 of its byte).
func (h CMAHeader) IPVersion() uint8 { return h[offCMAIPVer] >> 4 }

// SetIPVersion sets the IP version (bits 7:4; the low bits are cleared).
func (h CMAHeader) SetIPVersion(v uint8) { h[offCMAIPVer] = v << 4 }

// SrcPort returns the active side's port.
func (h CMAHeader) SrcPort() uint16 { return binary.BigEndian.Uint16(h[offCMAPort:]) }

// SetSrcPort sets the active side's port.
func (h CMAHeader) SetSrcPort(p uint16) { binary.BigEndian.PutUint16(h[offCMAPort:], p) }

// SrcAddr returns the active side's address, read as the IP version says
// (invalid for a version neither 4 nor 6).
func (h CMAHeader) SrcAddr() netip.Addr { return h.addr(offCMASrc) }

// SetSrcAddr sets the active side's address.
func (h CMAHeader) SetSrcAddr(a netip.Addr) { h.setAddr(offCMASrc, a) }

// DstAddr returns the passive side's address (what the active side
// resolved), read as the IP version says.
func (h CMAHeader) DstAddr() netip.Addr { return h.addr(offCMADst) }

// SetDstAddr sets the passive side's address.
func (h CMAHeader) SetDstAddr(a netip.Addr) { h.setAddr(offCMADst, a) }

func (h CMAHeader) addr(off int) netip.Addr {
	switch h.IPVersion() {
	case 4:
		return netip.AddrFrom4([4]byte(h[off+12 : off+16]))
	case 6:
		return netip.AddrFrom16([16]byte(h[off : off+16]))
	}
	return netip.Addr{}
}

func (h CMAHeader) setAddr(off int, a netip.Addr) {
	clear(h[off : off+16])
	if a.Is4() {
		copy(h[off+12:off+16], a.AsSlice())
		return
	}
	b := a.As16()
	copy(h[off:off+16], b[:])
}

// ServiceID returns the RDMA CM's service ID of a port of a port space
// (cma_get_service_id): RDMA_IP_PS << 16 | port, with ps the enum
// rdma_ucm_port_space value (0x0111 for RDMA_PS_UDP).
func ServiceID(ps uint16, port uint16) uint64 { return uint64(ps)<<16 | uint64(port) }

// ServicePort splits an RDMA CM service ID into its port space and port;
// ok is false for an ID outside the RDMA IP service range (bits 63:32 set).
func ServicePort(sid uint64) (ps, port uint16, ok bool) {
	if sid>>32 != 0 {
		return 0, 0, false
	}
	return uint16(sid >> 16), uint16(sid), true
}
