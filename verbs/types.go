package verbs

import (
	"github.com/softrdma/softrdma/verbs/driver"
	"github.com/softrdma/softrdma/wire"
)

// The plain data of the verbs (attributes, work requests, completions,
// enums, reports) is defined in package driver, which the backends
// implement and verbs sits on; the names here are aliases of those
// (type WC = driver.WC), so a program uses verbs' names only, and a
// completion goes from a backend to the program without a conversion.
// QPInitAttr is verbs' own: it names verbs' CQs.

// GID is a 128-bit global identifier (ibv_gid). On RoCEv2 an IPv4 address
// appears in its IPv4-mapped form ::ffff:a.b.c.d.
type GID = wire.GID

// MTU is an InfiniBand path MTU enum (enum ibv_mtu).
type MTU = driver.MTU

// IB MTU values, as in enum ibv_mtu.
const (
	MTU256  MTU = driver.MTU256
	MTU512  MTU = driver.MTU512
	MTU1024 MTU = driver.MTU1024
	MTU2048 MTU = driver.MTU2048
	MTU4096 MTU = driver.MTU4096
)

// MTUFromBytes returns the largest IB MTU that is not larger than n bytes,
// or 0 when n is smaller than 256.
func MTUFromBytes(n int) MTU {
	for m := MTU4096; m >= MTU256; m-- {
		if m.Bytes() <= n {
			return m
		}
	}
	return 0
}

// LinkLayer is the link layer of a port (IBV_LINK_LAYER_*).
type LinkLayer = driver.LinkLayer

// Link layers.
const (
	LinkLayerUnspecified LinkLayer = driver.LinkLayerUnspecified
	LinkLayerInfiniBand  LinkLayer = driver.LinkLayerInfiniBand
	LinkLayerEthernet    LinkLayer = driver.LinkLayerEthernet
)

// PortState is a port's logical state (enum ibv_port_state).
type PortState = driver.PortState

// Port states.
const (
	PortNop    PortState = driver.PortNop
	PortDown   PortState = driver.PortDown
	PortInit   PortState = driver.PortInit
	PortArmed  PortState = driver.PortArmed
	PortActive PortState = driver.PortActive
)

// GIDType is the type of a GID table entry.
type GIDType = driver.GIDType

// GID types.
const (
	GIDTypeIB     GIDType = driver.GIDTypeIB
	GIDTypeRoCEv1 GIDType = driver.GIDTypeRoCEv1
	GIDTypeRoCEv2 GIDType = driver.GIDTypeRoCEv2
)

// GIDEntry is one entry of a port's GID table (ibv_gid_entry).
type GIDEntry = driver.GIDEntry

// DeviceAttr holds device capabilities (struct ibv_device_attr, the fields
// that matter for UD multicast).
type DeviceAttr = driver.DeviceAttr

// PortAttr holds a port's attributes (struct ibv_port_attr).
type PortAttr = driver.PortAttr

// Access flags for memory registration (enum ibv_access_flags).
type Access = driver.Access

// Access flags.
const (
	AccessLocalWrite   Access = driver.AccessLocalWrite
	AccessRemoteWrite  Access = driver.AccessRemoteWrite
	AccessRemoteRead   Access = driver.AccessRemoteRead
	AccessRemoteAtomic Access = driver.AccessRemoteAtomic
)

// QPType is a QP transport type (enum ibv_qp_type).
type QPType = driver.QPType

// QP types. Only UD is implemented by the providers in this module.
const (
	QPTypeRC QPType = driver.QPTypeRC
	QPTypeUC QPType = driver.QPTypeUC
	QPTypeUD QPType = driver.QPTypeUD
)

// QPState is a QP state (enum ibv_qp_state).
type QPState = driver.QPState

// QP states.
const (
	QPSReset QPState = driver.QPSReset
	QPSInit  QPState = driver.QPSInit
	QPSRTR   QPState = driver.QPSRTR
	QPSRTS   QPState = driver.QPSRTS
	QPSSQD   QPState = driver.QPSSQD
	QPSSQE   QPState = driver.QPSSQE
	QPSErr   QPState = driver.QPSErr
)

// CreateFlags are QP creation flags (enum ibv_qp_create_flags).
type CreateFlags = driver.CreateFlags

// QP creation flags.
const (
	// CreateBlockSelfMcastLB prevents the QP from receiving the multicast
	// datagrams it sent itself (IBV_QP_CREATE_BLOCK_SELF_MCAST_LB).
	CreateBlockSelfMcastLB CreateFlags = driver.CreateBlockSelfMcastLB
)

// QPCap are a QP's work queue sizes (struct ibv_qp_cap).
type QPCap = driver.QPCap

// QPInitAttr describes a QP to create (struct ibv_qp_init_attr_ex, the UD subset).
type QPInitAttr struct {
	Context     any // opaque user context (qp_context)
	SendCQ      *CQ
	RecvCQ      *CQ
	Cap         QPCap
	QPType      QPType
	SQSigAll    bool // every send WR generates a completion
	CreateFlags CreateFlags
}

// QPAttrMask selects the QPAttr fields that Modify applies (enum ibv_qp_attr_mask).
type QPAttrMask = driver.QPAttrMask

// QP attribute mask bits.
const (
	QPAttrState   QPAttrMask = driver.QPAttrState
	QPAttrPKeyIdx QPAttrMask = driver.QPAttrPKeyIdx
	QPAttrPort    QPAttrMask = driver.QPAttrPort
	QPAttrQKey    QPAttrMask = driver.QPAttrQKey
	QPAttrSQPSN   QPAttrMask = driver.QPAttrSQPSN
)

// QPAttr holds QP attributes (struct ibv_qp_attr, the UD subset).
type QPAttr = driver.QPAttr

// GlobalRoute is the GRH part of an address handle (struct ibv_global_route).
type GlobalRoute = driver.GlobalRoute

// AHAttr describes an address handle (struct ibv_ah_attr).
type AHAttr = driver.AHAttr

// SGE is a scatter/gather element (struct ibv_sge). Addr is an address
// inside a registered memory region (see MR.Addr), LKey that region's key.
type SGE = driver.SGE

// WROpcode is a send work request opcode (enum ibv_wr_opcode).
type WROpcode = driver.WROpcode

// Send opcodes valid on UD QPs.
const (
	WRSend        WROpcode = driver.WRSend
	WRSendWithImm WROpcode = driver.WRSendWithImm
)

// SendFlags modify a send work request (enum ibv_send_flags).
type SendFlags = driver.SendFlags

// Send flags.
const (
	SendFence     SendFlags = driver.SendFence
	SendSignaled  SendFlags = driver.SendSignaled
	SendSolicited SendFlags = driver.SendSolicited
	SendInline    SendFlags = driver.SendInline
)

// UDWR is the UD part of a send work request (wr.ud).
type UDWR = driver.UDWR

// SendWR is a send work request (struct ibv_send_wr). Requests may be
// chained through Next, as in C.
type SendWR = driver.SendWR

// RecvWR is a receive work request (struct ibv_recv_wr).
type RecvWR = driver.RecvWR

// WCStatus is a work completion status (enum ibv_wc_status).
type WCStatus = driver.WCStatus

// Completion statuses used by this module.
const (
	WCSuccess      WCStatus = driver.WCSuccess
	WCLocLenErr    WCStatus = driver.WCLocLenErr
	WCLocQPOpErr   WCStatus = driver.WCLocQPOpErr
	WCLocProtErr   WCStatus = driver.WCLocProtErr
	WCWRFlushErr   WCStatus = driver.WCWRFlushErr
	WCRemInvReqErr WCStatus = driver.WCRemInvReqErr
	WCGeneralErr   WCStatus = driver.WCGeneralErr
)

// WCOpcode is a work completion opcode (enum ibv_wc_opcode).
type WCOpcode = driver.WCOpcode

// Completion opcodes.
const (
	WCOpSend WCOpcode = driver.WCOpSend
	WCOpRecv WCOpcode = driver.WCOpRecv
)

// WCFlags are work completion flags (enum ibv_wc_flags).
type WCFlags = driver.WCFlags

// Completion flags.
const (
	WCGRH     WCFlags = driver.WCGRH
	WCWithImm WCFlags = driver.WCWithImm
)

// WC is a work completion (struct ibv_wc).
type WC = driver.WC

// DeviceReport is a read-only view of a device.
type DeviceReport = driver.DeviceReport

// NetdevReport names the network interface of a RoCE device.
type NetdevReport = driver.NetdevReport

// UsageCount is one usage figure of a device.
type UsageCount = driver.UsageCount

// QPReport is the view of one QP.
type QPReport = driver.QPReport

// McastAttachment is one multicast attachment of a QP: an MGID and the
// MLID it was attached with (0 on RoCE).
type McastAttachment = driver.McastAttachment

// GroupReport is one multicast group of a device.
type GroupReport = driver.GroupReport

// DeviceEvent is a change of a device's network side that tools log.
type DeviceEvent = driver.DeviceEvent

// CounterScope says where a counter is kept.
type CounterScope = driver.CounterScope

// Counter scopes.
const (
	// ScopeDevice counters are kept per device only.
	ScopeDevice CounterScope = driver.ScopeDevice
	// ScopeQP counters are kept per device and per QP.
	ScopeQP CounterScope = driver.ScopeQP
)

// CounterDesc is one counter of a device's schema.
type CounterDesc = driver.CounterDesc

// Link types of frames, as pcap names them (LINKTYPE_*).
const (
	// LinkTypeEthernet is Ethernet frames (RoCE).
	LinkTypeEthernet uint32 = driver.LinkTypeEthernet
	// LinkTypeInfiniBand is InfiniBand packets from the LRH on (Wireshark
	// decodes them).
	LinkTypeInfiniBand uint32 = driver.LinkTypeInfiniBand
)

// Frame is one packet a device sent or received, as its link carries it.
type Frame = driver.Frame

// AsyncEventType is the kind of an asynchronous event (enum
// ibv_event_type, with libibverbs' values).
type AsyncEventType = driver.AsyncEventType

// Asynchronous event types.
const (
	EventCQErr            AsyncEventType = driver.EventCQErr
	EventQPFatal          AsyncEventType = driver.EventQPFatal
	EventQPReqErr         AsyncEventType = driver.EventQPReqErr
	EventQPAccessErr      AsyncEventType = driver.EventQPAccessErr
	EventCommEst          AsyncEventType = driver.EventCommEst
	EventSQDrained        AsyncEventType = driver.EventSQDrained
	EventPathMig          AsyncEventType = driver.EventPathMig
	EventPathMigErr       AsyncEventType = driver.EventPathMigErr
	EventDeviceFatal      AsyncEventType = driver.EventDeviceFatal
	EventPortActive       AsyncEventType = driver.EventPortActive
	EventPortErr          AsyncEventType = driver.EventPortErr
	EventLIDChange        AsyncEventType = driver.EventLIDChange
	EventPKeyChange       AsyncEventType = driver.EventPKeyChange
	EventSMChange         AsyncEventType = driver.EventSMChange
	EventSRQErr           AsyncEventType = driver.EventSRQErr
	EventSRQLimitReached  AsyncEventType = driver.EventSRQLimitReached
	EventQPLastWQEReached AsyncEventType = driver.EventQPLastWQEReached
	EventClientReregister AsyncEventType = driver.EventClientReregister
	EventGIDChange        AsyncEventType = driver.EventGIDChange
	EventWQFatal          AsyncEventType = driver.EventWQFatal
)

// AsyncEvent is an asynchronous event of a device (struct
// ibv_async_event). softrdma's devices raise port events: PortNum names
// the port.
type AsyncEvent = driver.AsyncEvent

// Multicast constants shared by verbs users.
const (
	// MulticastQPN is the destination QPN of every multicast send (0xFFFFFF).
	MulticastQPN = 0xFFFFFF
	// MulticastLIDBase is the first multicast LID on InfiniBand.
	MulticastLIDBase = 0xC000
	// GRHLen is the size of the GRH area at the start of every UD receive buffer.
	GRHLen = 40
)

// ParseGID parses a GID written as an IPv6 address (inet_pton AF_INET6).
func ParseGID(s string) (GID, error) { return wire.ParseGID(s) }
