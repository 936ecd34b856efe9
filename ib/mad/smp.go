package mad

import "encoding/binary"

// Subnet management packets (IBA 14.2.1): the SMP, LID-routed (class
// 0x01) or directed-route (class 0x81), and its attributes.
//
// SMP layout:
//
//	0   BaseVersion(1) MgmtClass(1) ClassVersion(1) Method(1)
//	4   Status(2): directed route: D(1 bit) Status(15 bits)
//	6   LID-routed: ClassSpecific(2); directed route: HopPointer(1) HopCount(1)
//	8   TransactionID(8)
//	16  AttributeID(2) Reserved(2) AttributeModifier(4)
//	24  M_Key(8)
//	32  DrSLID(2) DrDLID(2) Reserved(28)
//	64  SMP data (64 bytes)
//	128 InitialPath(64)  (directed route; byte i is hop i's port)
//	192 ReturnPath(64)
const (
	// ClassSubnLID is the LID-routed subnet management class.
	ClassSubnLID = 0x01
	// ClassSubnDR is the directed-route subnet management class.
	ClassSubnDR = 0x81
	// SMPClassVersion is the class version of both.
	SMPClassVersion = 1
	// SMPDataOff and SMPDataLen place the SMP data.
	SMPDataOff = 64
	SMPDataLen = 64
	// MaxHops is the largest directed-route HopCount.
	MaxHops = 63
	// PermissiveLID is the DrSLID/DrDLID of a purely directed route.
	PermissiveLID = 0xFFFF
)

// SMP methods beyond the common ones.
const (
	MethodSubnGet     = MethodGet
	MethodSubnSet     = MethodSet
	MethodSubnGetResp = MethodGetResp
	MethodSubnTrap    = MethodTrap
)

// SMP attribute IDs (IBA 14.2.5).
const (
	AttrNotice          = 0x0002
	AttrNodeDescription = 0x0010
	AttrNodeInfo        = 0x0011
	AttrSwitchInfo      = 0x0012
	AttrGUIDInfo        = 0x0014
	AttrPortInfo        = 0x0015
	AttrPKeyTable       = 0x0016
	AttrSLtoVLTable     = 0x0017
	AttrVLArbitration   = 0x0018
	AttrLinearFT        = 0x0019
	AttrRandomFT        = 0x001A
	AttrMulticastFT     = 0x001B
	AttrSMInfo          = 0x0020
	AttrVendorDiag      = 0x0030
	AttrLedInfo         = 0x0031
)

// StatusDirection is the D bit of a directed-route SMP's Status word
// (the other status codes are the MAD's: StatusUnsupportedMethod...).
const StatusDirection = 0x8000

// Node types (NodeInfo.NodeType).
const (
	NodeCA     = 1
	NodeSwitch = 2
)

// Port states (PortInfo.PortState) and physical states.
const (
	PortNoChange = 0
	PortDown     = 1
	PortInit     = 2
	PortArmed    = 3
	PortActive   = 4

	PhysPolling  = 2
	PhysDisabled = 3
	PhysLinkUp   = 5
)

// SMP is a subnet management packet (Len bytes).
type SMP []byte

// MAD returns the SMP as a MAD for the common header's accessors.
func (s SMP) MAD() MAD { return MAD(s) }

// IsDR reports whether the SMP is directed route.
func (s SMP) IsDR() bool { return s[offMgmtClass] == ClassSubnDR }

// Direction returns a directed-route SMP's D bit (set on the way back).
func (s SMP) Direction() bool { return s[offStatus]&0x80 != 0 }

// SetDirection sets the D bit.
func (s SMP) SetDirection(d bool) {
	if d {
		s[offStatus] |= 0x80
	} else {
		s[offStatus] &^= 0x80
	}
}

// DRStatus returns a directed-route SMP's 15-bit status.
func (s SMP) DRStatus() uint16 { return binary.BigEndian.Uint16(s[offStatus:]) &^ StatusDirection }

// SetDRStatus sets the 15-bit status, keeping the D bit.
func (s SMP) SetDRStatus(v uint16) {
	d := binary.BigEndian.Uint16(s[offStatus:]) & StatusDirection
	binary.BigEndian.PutUint16(s[offStatus:], d|v&^StatusDirection)
}

// HopPointer returns a directed-route SMP's hop pointer.
func (s SMP) HopPointer() uint8 { return s[6] }

// SetHopPointer sets the hop pointer.
func (s SMP) SetHopPointer(v uint8) { s[6] = v }

// HopCount returns a directed-route SMP's hop count.
func (s SMP) HopCount() uint8 { return s[7] }

// SetHopCount sets the hop count.
func (s SMP) SetHopCount(v uint8) { s[7] = v }

// MKey returns the M_Key.
func (s SMP) MKey() uint64 { return binary.BigEndian.Uint64(s[24:]) }

// SetMKey sets the M_Key.
func (s SMP) SetMKey(v uint64) { binary.BigEndian.PutUint64(s[24:], v) }

// DrSLID returns a directed-route SMP's DrSLID.
func (s SMP) DrSLID() uint16 { return binary.BigEndian.Uint16(s[32:]) }

// SetDrSLID sets DrSLID.
func (s SMP) SetDrSLID(v uint16) { binary.BigEndian.PutUint16(s[32:], v) }

// DrDLID returns a directed-route SMP's DrDLID.
func (s SMP) DrDLID() uint16 { return binary.BigEndian.Uint16(s[34:]) }

// SetDrDLID sets DrDLID.
func (s SMP) SetDrDLID(v uint16) { binary.BigEndian.PutUint16(s[34:], v) }

// Data returns the SMP data (SMPDataLen bytes).
func (s SMP) Data() []byte { return s[SMPDataOff : SMPDataOff+SMPDataLen] }

// InitialPath returns the directed route's initial path (64 bytes; byte
// i is the port of hop i, byte 0 unused).
func (s SMP) InitialPath() []byte { return s[128:192] }

// ReturnPath returns the return path (64 bytes).
func (s SMP) ReturnPath() []byte { return s[192:256] }

// NodeInfo is the NodeInfo attribute (IBA 14.2.5.3, 40 bytes):
//
//	0 BaseVersion(1) ClassVersion(1) NodeType(1) NumPorts(1)
//	4 SystemImageGUID(8) 12 NodeGUID(8) 20 PortGUID(8)
//	28 PartitionCap(2) DeviceID(2) 32 Revision(4)
//	36 LocalPortNum(1) VendorID(3)
type NodeInfo []byte

// NodeInfoLen is the size of NodeInfo.
const NodeInfoLen = 40

// BaseVersion returns BaseVersion.
func (n NodeInfo) BaseVersion() uint8 { return n[0] }

// SetBaseVersion sets BaseVersion.
func (n NodeInfo) SetBaseVersion(v uint8) { n[0] = v }

// ClassVersion returns ClassVersion.
func (n NodeInfo) ClassVersion() uint8 { return n[1] }

// SetClassVersion sets ClassVersion.
func (n NodeInfo) SetClassVersion(v uint8) { n[1] = v }

// NodeType returns NodeType (NodeCA, NodeSwitch).
func (n NodeInfo) NodeType() uint8 { return n[2] }

// SetNodeType sets NodeType.
func (n NodeInfo) SetNodeType(v uint8) { n[2] = v }

// NumPorts returns NumPorts.
func (n NodeInfo) NumPorts() uint8 { return n[3] }

// SetNumPorts sets NumPorts.
func (n NodeInfo) SetNumPorts(v uint8) { n[3] = v }

// SystemImageGUID returns SystemImageGUID.
func (n NodeInfo) SystemImageGUID() uint64 { return binary.BigEndian.Uint64(n[4:]) }

// SetSystemImageGUID sets SystemImageGUID.
func (n NodeInfo) SetSystemImageGUID(v uint64) { binary.BigEndian.PutUint64(n[4:], v) }

// NodeGUID returns NodeGUID.
func (n NodeInfo) NodeGUID() uint64 { return binary.BigEndian.Uint64(n[12:]) }

// SetNodeGUID sets NodeGUID.
func (n NodeInfo) SetNodeGUID(v uint64) { binary.BigEndian.PutUint64(n[12:], v) }

// PortGUID returns PortGUID.
func (n NodeInfo) PortGUID() uint64 { return binary.BigEndian.Uint64(n[20:]) }

// SetPortGUID sets PortGUID.
func (n NodeInfo) SetPortGUID(v uint64) { binary.BigEndian.PutUint64(n[20:], v) }

// PartitionCap returns PartitionCap.
func (n NodeInfo) PartitionCap() uint16 { return binary.BigEndian.Uint16(n[28:]) }

// SetPartitionCap sets PartitionCap.
func (n NodeInfo) SetPartitionCap(v uint16) { binary.BigEndian.PutUint16(n[28:], v) }

// DeviceID returns DeviceID.
func (n NodeInfo) DeviceID() uint16 { return binary.BigEndian.Uint16(n[30:]) }

// SetDeviceID sets DeviceID.
func (n NodeInfo) SetDeviceID(v uint16) { binary.BigEndian.PutUint16(n[30:], v) }

// Revision returns Revision.
func (n NodeInfo) Revision() uint32 { return binary.BigEndian.Uint32(n[32:]) }

// SetRevision sets Revision.
func (n NodeInfo) SetRevision(v uint32) { binary.BigEndian.PutUint32(n[32:], v) }

// LocalPortNum returns LocalPortNum: the port the SMP came in by.
func (n NodeInfo) LocalPortNum() uint8 { return n[36] }

// SetLocalPortNum sets LocalPortNum.
func (n NodeInfo) SetLocalPortNum(v uint8) { n[36] = v }

// VendorID returns VendorID (24 bits).
func (n NodeInfo) VendorID() uint32 { return uint32(n[37])<<16 | uint32(n[38])<<8 | uint32(n[39]) }

// SetVendorID sets VendorID.
func (n NodeInfo) SetVendorID(v uint32) { n[37], n[38], n[39] = byte(v>>16), byte(v>>8), byte(v) }

// PortInfo is the PortInfo attribute (IBA 14.2.5.6, 64 bytes):
//
//	0  M_Key(8) 8 GIDPrefix(8) 16 LID(2) 18 MasterSMLID(2)
//	20 CapabilityMask(4) 24 DiagCode(2) 26 M_KeyLeasePeriod(2)
//	28 LocalPortNum(1) LinkWidthEnabled(1) LinkWidthSupported(1) LinkWidthActive(1)
//	32 LinkSpeedSupported(4b) PortState(4b)
//	33 PortPhysicalState(4b) LinkDownDefaultState(4b)
//	34 M_KeyProtectBits(2b) Reserved(3b) LMC(3b)
//	35 LinkSpeedActive(4b) LinkSpeedEnabled(4b)
//	36 NeighborMTU(4b) MasterSMSL(4b)
//	37 VLCap(4b) InitType(4b)
//	38 VLHighLimit(1) VLArbitrationHighCap(1) VLArbitrationLowCap(1)
//	41 InitTypeReply(4b) MTUCap(4b)
//	42 VLStallCount(3b) HOQLife(5b)
//	43 OperationalVLs(4b) PartitionEnforcement bits(4b)
//	44 M_KeyViolations(2) P_KeyViolations(2) Q_KeyViolations(2)
//	50 GUIDCap(1)
//	51 ClientReregister(1b) MulticastPKeyTrapSuppression(2b) SubnetTimeOut(5b)
//	52 Reserved(3b) RespTimeValue(5b)
//	53 LocalPhyErrors(4b) OverrunErrors(4b)
//	54 MaxCreditHint(2) 56 Reserved(1) LinkRoundTripLatency(3)
//	60 CapabilityMask2(2) 62 LinkSpeedExt...(2)
type PortInfo []byte

// PortInfoLen is the size of PortInfo.
const PortInfoLen = 64

// CapabilityMask bits the emulation uses.
const (
	CapIsSM                   = 1 << 1
	CapIsTrapSupported        = 1 << 3
	CapIsSystemImageGUID      = 1 << 11
	CapIsCMSupported          = 1 << 16
	CapIsClientReregistration = 1 << 25
)

// MKey returns M_Key.
func (p PortInfo) MKey() uint64 { return binary.BigEndian.Uint64(p[0:]) }

// SetMKey sets M_Key.
func (p PortInfo) SetMKey(v uint64) { binary.BigEndian.PutUint64(p[0:], v) }

// GIDPrefix returns GIDPrefix.
func (p PortInfo) GIDPrefix() uint64 { return binary.BigEndian.Uint64(p[8:]) }

// SetGIDPrefix sets GIDPrefix.
func (p PortInfo) SetGIDPrefix(v uint64) { binary.BigEndian.PutUint64(p[8:], v) }

// LID returns the port's base LID.
func (p PortInfo) LID() uint16 { return binary.BigEndian.Uint16(p[16:]) }

// SetLID sets LID.
func (p PortInfo) SetLID(v uint16) { binary.BigEndian.PutUint16(p[16:], v) }

// MasterSMLID returns MasterSMLID.
func (p PortInfo) MasterSMLID() uint16 { return binary.BigEndian.Uint16(p[18:]) }

// SetMasterSMLID sets MasterSMLID.
func (p PortInfo) SetMasterSMLID(v uint16) { binary.BigEndian.PutUint16(p[18:], v) }

// CapabilityMask returns CapabilityMask.
func (p PortInfo) CapabilityMask() uint32 { return binary.BigEndian.Uint32(p[20:]) }

// SetCapabilityMask sets CapabilityMask.
func (p PortInfo) SetCapabilityMask(v uint32) { binary.BigEndian.PutUint32(p[20:], v) }

// LocalPortNum returns LocalPortNum.
func (p PortInfo) LocalPortNum() uint8 { return p[28] }

// SetLocalPortNum sets LocalPortNum.
func (p PortInfo) SetLocalPortNum(v uint8) { p[28] = v }

// LinkWidthEnabled returns LinkWidthEnabled.
func (p PortInfo) LinkWidthEnabled() uint8 { return p[29] }

// SetLinkWidthEnabled sets LinkWidthEnabled.
func (p PortInfo) SetLinkWidthEnabled(v uint8) { p[29] = v }

// LinkWidthSupported returns LinkWidthSupported.
func (p PortInfo) LinkWidthSupported() uint8 { return p[30] }

// SetLinkWidthSupported sets LinkWidthSupported.
func (p PortInfo) SetLinkWidthSupported(v uint8) { p[30] = v }

// LinkWidthActive returns LinkWidthActive.
func (p PortInfo) LinkWidthActive() uint8 { return p[31] }

// SetLinkWidthActive sets LinkWidthActive.
func (p PortInfo) SetLinkWidthActive(v uint8) { p[31] = v }

func hi(b byte) uint8        { return b >> 4 }
func lo(b byte) uint8        { return b & 0xF }
func setHi(b *byte, v uint8) { *b = *b&0x0F | v<<4 }
func setLo(b *byte, v uint8) { *b = *b&0xF0 | v&0xF }

// LinkSpeedSupported returns LinkSpeedSupported.
func (p PortInfo) LinkSpeedSupported() uint8 { return hi(p[32]) }

// SetLinkSpeedSupported sets LinkSpeedSupported.
func (p PortInfo) SetLinkSpeedSupported(v uint8) { setHi(&p[32], v) }

// PortState returns PortState (PortDown...).
func (p PortInfo) PortState() uint8 { return lo(p[32]) }

// SetPortState sets PortState.
func (p PortInfo) SetPortState(v uint8) { setLo(&p[32], v) }

// PhysState returns PortPhysicalState.
func (p PortInfo) PhysState() uint8 { return hi(p[33]) }

// SetPhysState sets PortPhysicalState.
func (p PortInfo) SetPhysState(v uint8) { setHi(&p[33], v) }

// LinkDownDefaultState returns LinkDownDefaultState.
func (p PortInfo) LinkDownDefaultState() uint8 { return lo(p[33]) }

// SetLinkDownDefaultState sets LinkDownDefaultState.
func (p PortInfo) SetLinkDownDefaultState(v uint8) { setLo(&p[33], v) }

// LMC returns LMC.
func (p PortInfo) LMC() uint8 { return p[34] & 7 }

// SetLMC sets LMC.
func (p PortInfo) SetLMC(v uint8) { p[34] = p[34]&^7 | v&7 }

// LinkSpeedActive returns LinkSpeedActive.
func (p PortInfo) LinkSpeedActive() uint8 { return hi(p[35]) }

// SetLinkSpeedActive sets LinkSpeedActive.
func (p PortInfo) SetLinkSpeedActive(v uint8) { setHi(&p[35], v) }

// LinkSpeedEnabled returns LinkSpeedEnabled.
func (p PortInfo) LinkSpeedEnabled() uint8 { return lo(p[35]) }

// SetLinkSpeedEnabled sets LinkSpeedEnabled.
func (p PortInfo) SetLinkSpeedEnabled(v uint8) { setLo(&p[35], v) }

// NeighborMTU returns NeighborMTU.
func (p PortInfo) NeighborMTU() uint8 { return hi(p[36]) }

// SetNeighborMTU sets NeighborMTU.
func (p PortInfo) SetNeighborMTU(v uint8) { setHi(&p[36], v) }

// MasterSMSL returns MasterSMSL.
func (p PortInfo) MasterSMSL() uint8 { return lo(p[36]) }

// VLCap returns VLCap.
func (p PortInfo) VLCap() uint8 { return hi(p[37]) }

// SetVLCap sets VLCap.
func (p PortInfo) SetVLCap(v uint8) { setHi(&p[37], v) }

// SetVLArbitrationCaps sets VLArbitrationHighCap and LowCap.
func (p PortInfo) SetVLArbitrationCaps(high, low uint8) { p[39], p[40] = high, low }

// MTUCap returns MTUCap.
func (p PortInfo) MTUCap() uint8 { return lo(p[41]) }

// SetMTUCap sets MTUCap.
func (p PortInfo) SetMTUCap(v uint8) { setLo(&p[41], v) }

// OperationalVLs returns OperationalVLs.
func (p PortInfo) OperationalVLs() uint8 { return hi(p[43]) }

// SetOperationalVLs sets OperationalVLs.
func (p PortInfo) SetOperationalVLs(v uint8) { setHi(&p[43], v) }

// GUIDCap returns GUIDCap.
func (p PortInfo) GUIDCap() uint8 { return p[50] }

// SetGUIDCap sets GUIDCap.
func (p PortInfo) SetGUIDCap(v uint8) { p[50] = v }

// ClientReregister returns the ClientReregister bit.
func (p PortInfo) ClientReregister() bool { return p[51]&0x80 != 0 }

// SetClientReregister sets the ClientReregister bit.
func (p PortInfo) SetClientReregister(v bool) {
	if v {
		p[51] |= 0x80
	} else {
		p[51] &^= 0x80
	}
}

// SubnetTimeOut returns SubnetTimeOut.
func (p PortInfo) SubnetTimeOut() uint8 { return p[51] & 0x1F }

// RespTimeValue returns RespTimeValue.
func (p PortInfo) RespTimeValue() uint8 { return p[52] & 0x1F }

// SetRespTimeValue sets RespTimeValue.
func (p PortInfo) SetRespTimeValue(v uint8) { p[52] = p[52]&^0x1F | v&0x1F }

// SwitchInfo is the SwitchInfo attribute (IBA 14.2.5.4):
//
//	0 LinearFDBCap(2) 2 RandomFDBCap(2) 4 MulticastFDBCap(2) 6 LinearFDBTop(2)
//	8 DefaultPort(1) DefaultMulticastPrimaryPort(1) DefaultMulticastNotPrimaryPort(1)
//	11 LifeTimeValue(5b) PortStateChange(1b) OptimizedSLtoVL(2b)
//	12 LIDsPerPort(2) 14 PartitionEnforcementCap(2)
//	16 Inbound/OutboundEnforcementCap, FilterRaw..Cap, EnhancedPort0 (bits 7..3)
//	18 MulticastFDBTop(2)
type SwitchInfo []byte

// LinearFDBCap returns LinearFDBCap.
func (s SwitchInfo) LinearFDBCap() uint16 { return binary.BigEndian.Uint16(s[0:]) }

// SetLinearFDBCap sets LinearFDBCap.
func (s SwitchInfo) SetLinearFDBCap(v uint16) { binary.BigEndian.PutUint16(s[0:], v) }

// MulticastFDBCap returns MulticastFDBCap.
func (s SwitchInfo) MulticastFDBCap() uint16 { return binary.BigEndian.Uint16(s[4:]) }

// SetMulticastFDBCap sets MulticastFDBCap.
func (s SwitchInfo) SetMulticastFDBCap(v uint16) { binary.BigEndian.PutUint16(s[4:], v) }

// LinearFDBTop returns LinearFDBTop.
func (s SwitchInfo) LinearFDBTop() uint16 { return binary.BigEndian.Uint16(s[6:]) }

// SetLinearFDBTop sets LinearFDBTop.
func (s SwitchInfo) SetLinearFDBTop(v uint16) { binary.BigEndian.PutUint16(s[6:], v) }

// LifeTimeValue returns LifeTimeValue.
func (s SwitchInfo) LifeTimeValue() uint8 { return s[11] >> 3 }

// SetLifeTimeValue sets LifeTimeValue.
func (s SwitchInfo) SetLifeTimeValue(v uint8) { s[11] = s[11]&7 | v<<3 }

// PortStateChange returns PortStateChange.
func (s SwitchInfo) PortStateChange() bool { return s[11]&4 != 0 }

// SetPortStateChange sets PortStateChange.
func (s SwitchInfo) SetPortStateChange(v bool) {
	if v {
		s[11] |= 4
	} else {
		s[11] &^= 4
	}
}

// LIDsPerPort returns LIDsPerPort.
func (s SwitchInfo) LIDsPerPort() uint16 { return binary.BigEndian.Uint16(s[12:]) }

// PartitionEnforcementCap returns PartitionEnforcementCap.
func (s SwitchInfo) PartitionEnforcementCap() uint16 { return binary.BigEndian.Uint16(s[14:]) }

// EnhancedPort0 returns EnhancedPort0.
func (s SwitchInfo) EnhancedPort0() bool { return s[16]&0x08 != 0 }

// MulticastFDBTop returns MulticastFDBTop.
func (s SwitchInfo) MulticastFDBTop() uint16 { return binary.BigEndian.Uint16(s[18:]) }

// SetMulticastFDBTop sets MulticastFDBTop.
func (s SwitchInfo) SetMulticastFDBTop(v uint16) { binary.BigEndian.PutUint16(s[18:], v) }

// SMInfo is the SMInfo attribute (IBA 14.2.5.13):
//
//	0 GUID(8) 8 SM_Key(8) 16 ActCount(4) 20 Priority(4b) SMState(4b)
type SMInfo []byte

// GUID returns the SM's port GUID.
func (s SMInfo) GUID() uint64 { return binary.BigEndian.Uint64(s[0:]) }

// ActCount returns ActCount.
func (s SMInfo) ActCount() uint32 { return binary.BigEndian.Uint32(s[16:]) }

// SMState returns SMState.
func (s SMInfo) SMState() uint8 { return s[20] & 0xF }

// Notice is the Notice attribute of a Trap (IBA 14.2.5.1), generic form:
//
//	0 IsGeneric(1b) Type(7b)  1 ProducerType(3)  4 TrapNumber(2)
//	6 IssuerLID(2)  8 NoticeToggle(1b) NoticeCount(15b)
//	10 DataDetails(54)  64 IssuerGID(16)
type Notice []byte

// Notice types and producer types (IBA 14.2.5.1), and the trap numbers
// softrdma's switch sends.
const (
	NoticeUrgent        = 1
	ProducerSwitch      = 2
	TrapLinkStateChange = 128
)

// IsGeneric reports whether the notice is generic.
func (n Notice) IsGeneric() bool { return n[0]&0x80 != 0 }

// Type returns the notice type.
func (n Notice) Type() uint8 { return n[0] & 0x7F }

// SetGeneric makes the notice generic of type typ from a producer of
// producerType.
func (n Notice) SetGeneric(typ uint8, producerType uint32) {
	n[0] = 0x80 | typ&0x7F
	n[1], n[2], n[3] = byte(producerType>>16), byte(producerType>>8), byte(producerType)
}

// ProducerType returns a generic notice's producer type.
func (n Notice) ProducerType() uint32 { return uint32(n[1])<<16 | uint32(n[2])<<8 | uint32(n[3]) }

// TrapNumber returns a generic notice's trap number.
func (n Notice) TrapNumber() uint16 { return binary.BigEndian.Uint16(n[4:]) }

// SetTrapNumber sets the trap number.
func (n Notice) SetTrapNumber(v uint16) { binary.BigEndian.PutUint16(n[4:], v) }

// IssuerLID returns the issuer's LID.
func (n Notice) IssuerLID() uint16 { return binary.BigEndian.Uint16(n[6:]) }

// SetIssuerLID sets the issuer's LID.
func (n Notice) SetIssuerLID(v uint16) { binary.BigEndian.PutUint16(n[6:], v) }

// DataDetails returns the trap's details (trap 128: the switch's LID in
// its first two bytes).
func (n Notice) DataDetails() []byte { return n[10:64] }
