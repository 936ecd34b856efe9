// Package simproto is the wire format of ibsim's server protocol, which
// libumad2sim.so (ibsim's LD_PRELOAD library that turns libibumad's calls
// into datagrams) speaks: a MAD client such as OpenSM runs unmodified
// against a simulated fabric. The layouts are those of ibsim's
// include/ibsim.h, as the C compiler lays them out on a little- or
// big-endian 64-bit host; see each type.
//
// Sockets (abstract unix datagram sockets, in the network namespace of
// the processes; Base is the name prefix, IBSIM_SOCKNAME or "sim"):
//
//	<Base>:ctl        the server's control socket (CtlName)
//	<Base>:ctl<pid>   a client's control socket, from which it sends Ctl
//	                  messages and gets each answered in kind
//	<Base>:in<pid>    a client's data socket (InName): it binds it before
//	                  it sends CONNECT, then connects it to
//	<Base>:out<id>    the server's data socket for client id (OutName),
//	                  which the server binds and connects to the
//	                  client's data socket before it answers CONNECT;
//	                  Request datagrams go both ways on this pair
//
// Every name ends in a NUL byte, which is part of the abstract name:
// umad2sim and ibsim count the terminating NUL of the formatted string
// in the address length. The name functions here include it.
//
// A client that finds a server socket missing (ECONNREFUSED) tries again
// every 2 s, forever. ibsim's UDP mode (IBSIM_SERVER_NAME) is not
// described here.
//
// A control exchange: the client sends a Ctl (CtlLen bytes, Magic, its
// ClientID, a Type, Len and Data) and reads one Ctl back: the same with
// Data filled in, or Type TypeError. Types (Data in and out):
//
//	CONNECT     ClientInfo: ID = the client's pid, QP 0, IsSM, NodeID (the
//	            node to attach to, SIM_HOST, or empty for the default);
//	            answered with ID = the client id (0..MaxClients-1) and
//	            NodeID = the node's name
//	DISCONNECT  -
//	GET_VENDOR  Vendor
//	GET_NODEINFO   the NodeInfo attribute of the client's node (64 bytes,
//	            IB byte order)
//	GET_PORTINFO   Data[0] a port number (0: the client's port) → the
//	            PortInfo attribute (64 bytes)
//	GET_PKEYS   the client's port's P_Key table (32 big-endian P_Keys)
//	SET_ISSM    a native uint32: 1 when the client opened the issm device
//	            (it is the port's SM), 0 when it closed it
//	GET_PORT, GET_GID, GET_GUID: lid/state, GID, node GUID (unused by
//	            umad2sim)
//
// A Request (RequestLen bytes) carries one MAD (up to MADLen bytes) with
// the addressing the kernel's umad interface would give it. See Request.
package simproto

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

// Protocol constants (ibsim.h).
const (
	// Magic starts every Ctl (SIM_MAGIC).
	Magic = 0xdeadbeef
	// MaxClients is how many clients a server takes (IBSIM_MAX_CLIENTS):
	// client ids are 0..MaxClients-1.
	MaxClients = 10
	// DefaultBase is the socket name prefix when IBSIM_SOCKNAME is unset.
	DefaultBase = "sim"
	// CtlDataLen is the size of Ctl's data (SIM_CTL_MAX_DATA).
	CtlDataLen = 64
	// CtlLen is the size of a Ctl.
	CtlLen = 16 + CtlDataLen
	// ClientInfoLen is the size of a ClientInfo; NodeIDLen its NodeID.
	ClientInfoLen = 12 + NodeIDLen
	NodeIDLen     = 32
	// VendorLen is the size of a Vendor.
	VendorLen = 24
	// MADLen is the size of a Request's MAD.
	MADLen = 256
	// RequestLen is the size of a Request.
	RequestLen = 32 + MADLen
	// StatusTimeout is the Request status of a MAD that went nowhere
	// (ETIMEDOUT): the sender gets its MAD back with it, as the kernel
	// reports a send that timed out.
	StatusTimeout = 110
)

// Ctl types (enum SIM_CTL_TYPES).
const (
	TypeError       = 0
	TypeConnect     = 1
	TypeDisconnect  = 2
	TypeGetPort     = 3
	TypeGetVendor   = 4
	TypeGetGID      = 5
	TypeGetGUID     = 6
	TypeGetNodeInfo = 7
	TypeGetPortInfo = 8
	TypeSetIsSM     = 9
	TypeGetPKeys    = 10
)

// CtlName is the server's control socket name (abstract: without the
// leading NUL) for socket base name base.
func CtlName(base string) string { return base + ":ctl\x00" }

// ClientCtlName is the control socket name of the client with pid.
func ClientCtlName(base string, pid uint32) string { return fmt.Sprintf("%s:ctl%d\x00", base, pid) }

// InName is the data socket name of the client with pid.
func InName(base string, pid uint32) string { return fmt.Sprintf("%s:in%d\x00", base, pid) }

// OutName is the server's data socket name for client id.
func OutName(base string, id int) string { return fmt.Sprintf("%s:out%d\x00", base, id) }

var native = binary.NativeEndian

// littleEndian is whether this host is: ibsim puts a big-endian 16-bit
// LID into a host-order 32-bit field.
var littleEndian = native.Uint16([]byte{1, 0}) == 1

// Ctl is a control message (struct sim_ctl), host byte order:
//
//	0  magic(4) 4 clientid(4) 8 type(4) 12 len(4) 16 data(64)
type Ctl []byte

// Magic returns the magic number (Magic when valid).
func (c Ctl) Magic() uint32 { return native.Uint32(c[0:]) }

// SetMagic sets the magic number.
func (c Ctl) SetMagic(v uint32) { native.PutUint32(c[0:], v) }

// ClientID returns the sender's client id (0 in a CONNECT).
func (c Ctl) ClientID() uint32 { return native.Uint32(c[4:]) }

// SetClientID sets the client id.
func (c Ctl) SetClientID(v uint32) { native.PutUint32(c[4:], v) }

// Type returns the message type (TypeConnect...).
func (c Ctl) Type() uint32 { return native.Uint32(c[8:]) }

// SetType sets the message type.
func (c Ctl) SetType(v uint32) { native.PutUint32(c[8:], v) }

// Len returns the length of the data the client sent and wants back.
func (c Ctl) Len() uint32 { return native.Uint32(c[12:]) }

// SetLen sets the data length.
func (c Ctl) SetLen(v uint32) { native.PutUint32(c[12:], v) }

// Data returns the data area (CtlDataLen bytes).
func (c Ctl) Data() []byte { return c[16:CtlLen] }

// ClientInfo is CONNECT's data (struct sim_client_info), host order:
//
//	0 id(4) 4 qp(4) 8 issm(4) 12 nodeid(32, NUL-terminated)
type ClientInfo []byte

// ID returns the client's pid (request) or client id (answer).
func (c ClientInfo) ID() uint32 { return native.Uint32(c[0:]) }

// SetID sets ID.
func (c ClientInfo) SetID(v uint32) { native.PutUint32(c[0:], v) }

// QP returns the client's QP (0 from umad2sim).
func (c ClientInfo) QP() uint32 { return native.Uint32(c[4:]) }

// SetQP sets QP.
func (c ClientInfo) SetQP(v uint32) { native.PutUint32(c[4:], v) }

// IsSM returns whether the client attaches as the port's SM.
func (c ClientInfo) IsSM() bool { return native.Uint32(c[8:]) != 0 }

// SetIsSM sets IsSM.
func (c ClientInfo) SetIsSM(v bool) {
	var n uint32
	if v {
		n = 1
	}
	native.PutUint32(c[8:], n)
}

// NodeID returns the node name, up to its first NUL.
func (c ClientInfo) NodeID() string {
	b := c[12:ClientInfoLen]
	for i, x := range b {
		if x == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// SetNodeID sets the node name, cut to NodeIDLen-1 bytes and NUL-padded.
func (c ClientInfo) SetNodeID(s string) {
	b := c[12:ClientInfoLen]
	clear(b)
	copy(b[:NodeIDLen-1], s)
}

// Vendor is GET_VENDOR's data (struct sim_vendor), host order:
//
//	0 vendor_id(4) 4 vendor_part_id(4) 8 hw_ver(4) 12 pad(4) 16 fw_ver(8)
type Vendor []byte

// SetVendorID sets the vendor id.
func (v Vendor) SetVendorID(x uint32) { native.PutUint32(v[0:], x) }

// VendorID returns the vendor id.
func (v Vendor) VendorID() uint32 { return native.Uint32(v[0:]) }

// SetPartID sets the vendor part id.
func (v Vendor) SetPartID(x uint32) { native.PutUint32(v[4:], x) }

// PartID returns the vendor part id.
func (v Vendor) PartID() uint32 { return native.Uint32(v[4:]) }

// SetHWVer sets the hardware version.
func (v Vendor) SetHWVer(x uint32) { native.PutUint32(v[8:], x) }

// HWVer returns the hardware version.
func (v Vendor) HWVer() uint32 { return native.Uint32(v[8:]) }

// SetFWVer sets the firmware version.
func (v Vendor) SetFWVer(x uint64) { native.PutUint64(v[16:], x) }

// FWVer returns the firmware version.
func (v Vendor) FWVer() uint64 { return native.Uint64(v[16:]) }

// Request is a MAD datagram (struct sim_request):
//
//	0  dlid(4)   a big-endian LID in the first 2 bytes' worth of a
//	             host-order uint32 (umad's be16 assigned to a uint32)
//	4  slid(4)   the same; 0 from a client: "the sender's port's LID"
//	8  dqp(4)    big-endian
//	12 sqp(4)    big-endian
//	16 status(4) big-endian; StatusTimeout on a MAD that went nowhere
//	20 pad(4)
//	24 length(8) big-endian: the MAD's length
//	32 mad(256)
type Request []byte

// lid16 reads ibsim's LID field: ntohs of the low 16 bits of a host
// uint32.
func lid16(b []byte) uint16 {
	v := uint16(native.Uint32(b))
	if littleEndian {
		v = bits.ReverseBytes16(v)
	}
	return v
}

func putLID16(b []byte, lid uint16) {
	if littleEndian {
		lid = bits.ReverseBytes16(lid)
	}
	native.PutUint32(b, uint32(lid))
}

// DLID returns the destination LID (0xFFFF: directed route).
func (r Request) DLID() uint16 { return lid16(r[0:]) }

// SetDLID sets the destination LID.
func (r Request) SetDLID(v uint16) { putLID16(r[0:], v) }

// SLID returns the source LID.
func (r Request) SLID() uint16 { return lid16(r[4:]) }

// SetSLID sets the source LID.
func (r Request) SetSLID(v uint16) { putLID16(r[4:], v) }

// DQP returns the destination QP.
func (r Request) DQP() uint32 { return binary.BigEndian.Uint32(r[8:]) }

// SetDQP sets the destination QP.
func (r Request) SetDQP(v uint32) { binary.BigEndian.PutUint32(r[8:], v) }

// SQP returns the source QP.
func (r Request) SQP() uint32 { return binary.BigEndian.Uint32(r[12:]) }

// SetSQP sets the source QP.
func (r Request) SetSQP(v uint32) { binary.BigEndian.PutUint32(r[12:], v) }

// Status returns the status (0, or an errno such as StatusTimeout).
func (r Request) Status() uint32 { return binary.BigEndian.Uint32(r[16:]) }

// SetStatus sets the status.
func (r Request) SetStatus(v uint32) { binary.BigEndian.PutUint32(r[16:], v) }

// Length returns the MAD's length.
func (r Request) Length() uint64 { return binary.BigEndian.Uint64(r[24:]) }

// SetLength sets the MAD's length.
func (r Request) SetLength(v uint64) { binary.BigEndian.PutUint64(r[24:], v) }

// MAD returns the MAD (MADLen bytes).
func (r Request) MAD() []byte { return r[32:RequestLen] }
