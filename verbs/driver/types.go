package driver

import (
	"fmt"

	"github.com/softrdma/softrdma/wire"
)

// This file is the plain data of the verbs: attributes, work requests,
// completions and their enums, as libibverbs' structs carry them. verbs
// gives programs the same types under its own names (type WC =
// driver.WC), so nothing is converted between a backend and a program.

// GID is a 128-bit global identifier (ibv_gid). On RoCEv2 an IPv4 address
// appears in its IPv4-mapped form ::ffff:a.b.c.d.
type GID = wire.GID

// MTU is an InfiniBand path MTU enum (enum ibv_mtu).
type MTU uint8

// IB MTU values, as in enum ibv_mtu.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes (1 << (mtu + 7)), or 0 for an invalid value.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 1 << (uint(m) + 7)
}

// LinkLayer is the link layer of a port (IBV_LINK_LAYER_*).
type LinkLayer uint8

// Link layers.
const (
	LinkLayerUnspecified LinkLayer = 0
	LinkLayerInfiniBand  LinkLayer = 1
	LinkLayerEthernet    LinkLayer = 2
)

// String returns the name ibv_devinfo prints.
func (l LinkLayer) String() string {
	switch l {
	case LinkLayerInfiniBand:
		return "InfiniBand"
	case LinkLayerEthernet:
		return "Ethernet"
	}
	return "Unknown"
}

// PortState is a port's logical state (enum ibv_port_state).
type PortState uint8

// Port states.
const (
	PortNop    PortState = 0
	PortDown   PortState = 1
	PortInit   PortState = 2
	PortArmed  PortState = 3
	PortActive PortState = 4
)

// String returns the ibv_port_state_str name.
func (s PortState) String() string {
	switch s {
	case PortNop:
		return "PORT_NOP"
	case PortDown:
		return "PORT_DOWN"
	case PortInit:
		return "PORT_INIT"
	case PortArmed:
		return "PORT_ARMED"
	case PortActive:
		return "PORT_ACTIVE"
	}
	return "unknown"
}

// GIDType is the type of a GID table entry.
type GIDType uint8

// GID types.
const (
	GIDTypeIB     GIDType = 0
	GIDTypeRoCEv1 GIDType = 1
	GIDTypeRoCEv2 GIDType = 2
)

// String names the GID type like the kernel's sysfs gid_attrs/types.
func (t GIDType) String() string {
	switch t {
	case GIDTypeIB:
		return "IB/RoCE v1"
	case GIDTypeRoCEv1:
		return "RoCE v1"
	case GIDTypeRoCEv2:
		return "RoCE v2"
	}
	return "unknown"
}

// GIDEntry is one entry of a port's GID table (ibv_gid_entry).
type GIDEntry struct {
	GID       GID
	Index     int
	PortNum   uint8
	Type      GIDType
	NetdevIdx int // interface index of the netdev the GID belongs to (0 for IB)
}

// DeviceAttr holds device capabilities (struct ibv_device_attr, the fields
// that matter for UD multicast).
type DeviceAttr struct {
	NodeGUID         uint64
	SysImageGUID     uint64
	VendorID         uint32
	VendorPartID     uint32
	HWVer            uint32
	FWVer            string
	PhysPortCnt      uint8
	MaxQP            int
	MaxQPWR          int
	MaxSGE           int
	MaxCQ            int
	MaxCQE           int
	MaxMR            int
	MaxPD            int
	MaxAH            int
	MaxMcastGrp      int // max_mcast_grp: distinct multicast groups on the device
	MaxMcastQPAttach int // max_mcast_qp_attach: QPs attached to one group
	MaxTotalMcastQP  int // max_total_mcast_qp_attach: attachments over all groups
	MaxInlineData    int
}

// PortAttr holds a port's attributes (struct ibv_port_attr).
type PortAttr struct {
	State      PortState
	MaxMTU     MTU
	ActiveMTU  MTU
	GIDTblLen  int
	PKeyTblLen int
	LID        uint16
	SMLID      uint16
	LMC        uint8
	SMSL       uint8
	LinkLayer  LinkLayer
	// NetdevMTU is the MTU of the Ethernet interface below a RoCE port (0 on IB).
	NetdevMTU int
}

// Access flags for memory registration (enum ibv_access_flags).
type Access uint32

// Access flags.
const (
	AccessLocalWrite   Access = 1 << 0
	AccessRemoteWrite  Access = 1 << 1
	AccessRemoteRead   Access = 1 << 2
	AccessRemoteAtomic Access = 1 << 3
)

// QPType is a QP transport type (enum ibv_qp_type).
type QPType uint8

// QP types. Only UD is implemented by the providers in this module.
const (
	QPTypeRC QPType = 2
	QPTypeUC QPType = 3
	QPTypeUD QPType = 4
)

// String returns the C enum name.
func (t QPType) String() string {
	switch t {
	case QPTypeRC:
		return "IBV_QPT_RC"
	case QPTypeUC:
		return "IBV_QPT_UC"
	case QPTypeUD:
		return "IBV_QPT_UD"
	}
	return "unknown"
}

// QPState is a QP state (enum ibv_qp_state).
type QPState uint8

// QP states.
const (
	QPSReset QPState = 0
	QPSInit  QPState = 1
	QPSRTR   QPState = 2
	QPSRTS   QPState = 3
	QPSSQD   QPState = 4
	QPSSQE   QPState = 5
	QPSErr   QPState = 6
)

// String returns the state name as ibv_qp_state_str would.
func (s QPState) String() string {
	switch s {
	case QPSReset:
		return "RESET"
	case QPSInit:
		return "INIT"
	case QPSRTR:
		return "RTR"
	case QPSRTS:
		return "RTS"
	case QPSSQD:
		return "SQD"
	case QPSSQE:
		return "SQE"
	case QPSErr:
		return "ERR"
	}
	return "unknown"
}

// CreateFlags are QP creation flags (enum ibv_qp_create_flags).
type CreateFlags uint32

// QP creation flags.
const (
	// CreateBlockSelfMcastLB prevents the QP from receiving the multicast
	// datagrams it sent itself (IBV_QP_CREATE_BLOCK_SELF_MCAST_LB).
	CreateBlockSelfMcastLB CreateFlags = 1 << 1
)

// QPCap are a QP's work queue sizes (struct ibv_qp_cap).
type QPCap struct {
	MaxSendWR     int
	MaxRecvWR     int
	MaxSendSGE    int
	MaxRecvSGE    int
	MaxInlineData int
}

// QPInitAttr describes a QP to create (struct ibv_qp_init_attr_ex, the UD
// subset) as a backend gets it: verbs' QPInitAttr with the CQs' backend
// sides, which the backend checks are its own.
type QPInitAttr struct {
	Context     any // opaque user context (qp_context)
	SendCQ      CQOps
	RecvCQ      CQOps
	Cap         QPCap
	QPType      QPType
	SQSigAll    bool // every send WR generates a completion
	CreateFlags CreateFlags
}

// QPAttrMask selects the QPAttr fields that Modify applies (enum ibv_qp_attr_mask).
type QPAttrMask uint32

// QP attribute mask bits.
const (
	QPAttrState   QPAttrMask = 1 << 0
	QPAttrPKeyIdx QPAttrMask = 1 << 4
	QPAttrPort    QPAttrMask = 1 << 5
	QPAttrQKey    QPAttrMask = 1 << 6
	QPAttrSQPSN   QPAttrMask = 1 << 16
)

// QPAttr holds QP attributes (struct ibv_qp_attr, the UD subset).
type QPAttr struct {
	State    QPState
	PKeyIdx  uint16
	PortNum  uint8
	QKey     uint32
	SQPSN    uint32
	Cap      QPCap
	CurState QPState
}

// GlobalRoute is the GRH part of an address handle (struct ibv_global_route).
type GlobalRoute struct {
	DGID         GID
	FlowLabel    uint32
	SGIDIndex    uint8
	HopLimit     uint8
	TrafficClass uint8
}

// AHAttr describes an address handle (struct ibv_ah_attr).
type AHAttr struct {
	GRH         GlobalRoute
	DLID        uint16
	SL          uint8
	SrcPathBits uint8
	StaticRate  uint8
	IsGlobal    bool
	PortNum     uint8
}

// SGE is a scatter/gather element (struct ibv_sge). Addr is an address
// inside a registered memory region (see MR.Addr), LKey that region's key.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// WROpcode is a send work request opcode (enum ibv_wr_opcode).
type WROpcode uint8

// Send opcodes valid on UD QPs.
const (
	WRSend        WROpcode = 2
	WRSendWithImm WROpcode = 3
)

// wrOpcodeNames are the names of enum ibv_wr_opcode.
var wrOpcodeNames = [...]string{
	"IBV_WR_RDMA_WRITE", "IBV_WR_RDMA_WRITE_WITH_IMM", "IBV_WR_SEND", "IBV_WR_SEND_WITH_IMM",
	"IBV_WR_RDMA_READ", "IBV_WR_ATOMIC_CMP_AND_SWP", "IBV_WR_ATOMIC_FETCH_AND_ADD",
}

// String returns the opcode's libibverbs name and number, e.g.
// "IBV_WR_RDMA_WRITE (0)" (the zero value: a SendWR whose Opcode was not
// set).
func (o WROpcode) String() string {
	if int(o) < len(wrOpcodeNames) {
		return fmt.Sprintf("%s (%d)", wrOpcodeNames[o], uint8(o))
	}
	return fmt.Sprintf("opcode %d", uint8(o))
}

// SendFlags modify a send work request (enum ibv_send_flags).
type SendFlags uint32

// Send flags.
const (
	SendFence     SendFlags = 1 << 0
	SendSignaled  SendFlags = 1 << 1
	SendSolicited SendFlags = 1 << 2
	SendInline    SendFlags = 1 << 3
)

// UDWR is the UD part of a send work request (wr.ud).
type UDWR struct {
	AH         AH // a *verbs.AH
	RemoteQPN  uint32
	RemoteQKey uint32
}

// SendWR is a send work request (struct ibv_send_wr). Requests may be
// chained through Next, as in C.
type SendWR struct {
	WRID    uint64
	Next    *SendWR
	SGList  []SGE
	Opcode  WROpcode
	Flags   SendFlags
	ImmData uint32 // immediate value in host order (C: be32toh(wr.imm_data))
	UD      UDWR
}

// RecvWR is a receive work request (struct ibv_recv_wr).
type RecvWR struct {
	WRID   uint64
	Next   *RecvWR
	SGList []SGE
}

// WCStatus is a work completion status (enum ibv_wc_status).
type WCStatus uint8

// Completion statuses used by this module.
const (
	WCSuccess      WCStatus = 0
	WCLocLenErr    WCStatus = 1
	WCLocQPOpErr   WCStatus = 2
	WCLocProtErr   WCStatus = 4
	WCWRFlushErr   WCStatus = 5
	WCRemInvReqErr WCStatus = 9
	WCGeneralErr   WCStatus = 21
)

// String returns ibv_wc_status_str's text.
func (s WCStatus) String() string {
	switch s {
	case WCSuccess:
		return "success"
	case WCLocLenErr:
		return "local length error"
	case WCLocQPOpErr:
		return "local QP operation error"
	case WCLocProtErr:
		return "local protection error"
	case WCWRFlushErr:
		return "Work Request Flushed Error"
	case WCRemInvReqErr:
		return "remote invalid request error"
	case WCGeneralErr:
		return "general error"
	}
	return "unknown"
}

// WCOpcode is a work completion opcode (enum ibv_wc_opcode).
type WCOpcode uint8

// Completion opcodes.
const (
	WCOpSend WCOpcode = 0
	WCOpRecv WCOpcode = 128
)

// WCFlags are work completion flags (enum ibv_wc_flags).
type WCFlags uint32

// Completion flags.
const (
	WCGRH     WCFlags = 1 << 0
	WCWithImm WCFlags = 1 << 1
)

// WC is a work completion (struct ibv_wc).
type WC struct {
	WRID         uint64
	Status       WCStatus
	Opcode       WCOpcode
	VendorErr    uint32
	ByteLen      uint32
	ImmData      uint32 // host order (C: be32toh(wc.imm_data)), valid with WCWithImm
	QPNum        uint32
	SrcQP        uint32
	Flags        WCFlags
	PKeyIndex    uint16
	SLID         uint16
	SL           uint8
	DLIDPathBits uint8
}
