// Package fabric is the wire protocol between the ports of emulated
// InfiniBand devices and the subnet manager (cmd/softsm, package ib/sm).
//
// Every IB port is a UDP socket of a client process; the SM listens on a
// fabric UDP address (DefaultListen). A datagram on the fabric is a
// CONTROL message, an IB PACKET, or a 6-byte FLOW CONTROL packet (the
// links are lossless: credit-based flow control, see flow.go).
//
// A CONTROL message is the 5-byte prefix Magic ("SRSM" + version 0x01), then
// a JSON object (Control). An IB packet never starts with 'S' (0x53): LRH
// byte 0 is VL<<4 | LVer and LVer is 0. Types:
//
//	attach     port → SM: GUID, NodeDesc; at start and every
//	           KeepaliveInterval as keepalive
//	port_info  SM → port, the answer to every attach it accepts: LID, SMLID,
//	           SubnetPrefix, PKeys [0xffff], Epoch (random per SM start),
//	           MTU 4 (2048), Rate 3 (10 Gb/s), State "active", and
//	           ClientReregister when the SM registered the port anew
//	           (first attach, or after it forgot the port)
//	refused    SM → port, the answer to an attach the SM refuses: GUID
//	           (the attach's) and Reason: ReasonGUIDInUse when the GUID
//	           is registered at another live address, ReasonNoLID when
//	           no LID is free, ReasonSourceLimit when the source IP
//	           address has as many ports attached as the SM allows one
//	detach     port → SM when the port closes
//
// Attach and port_info carry Credits, the receive window of their sender:
// the links are flow controlled (see Flow) so that the subnet is lossless
// like an IB fabric.
//
// A port takes datagrams only from the SM's fabric address (the SM is also
// the switch), a refused only when it names the port's GUID (a port that
// is still waiting for its first port_info gives up at once; an active
// port ignores it and notices a silent SM by its keepalives), and a
// port_info only when it names the port's GUID, a unicast
// LID other than SMLID, a unicast SMLID, an MTU enum 1..5, State "active"
// and a non-zero Epoch. A port that sees a new Epoch knows the SM
// restarted (client reregister).
// The SM forgets a port silent for PortTimeout; its memberships are removed
// as by a leave of all bits, and the port's next port_info carries
// ClientReregister. LIDs start at FirstLID and stay with a GUID while the
// SM runs (and across restarts with a state file) until every unicast LID
// was handed out; then LIDs of forgotten ports are reused. The SM and the
// SA are at SMLID.
//
// An IB PACKET is LRH | [GRH when LNH = 3] | BTH | DETH | [ImmDt] | payload
// | pad | ICRC | VCRC, exactly as on an IB link (see wire.ICRCIB and
// wire.VCRC). EncodeUD builds one, Parse checks and splits one.
//
// SA MADs travel as UD packets to DLID SMLID, BTH DestQP 1, DETH Q_Key
// 0x80010000, payload one 256-byte MAD; the answer comes from SLID SMLID /
// source QP 1 to the requester's LID and QP, with a GRH (GIDs swapped) when
// the request had one.
package fabric

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"time"

	"github.com/softrdma/softrdma/wire"
)

// Magic starts every control message: "SRSM" and protocol version 1.
const Magic = "SRSM\x01"

// Control message types and the port state.
const (
	TypeAttach   = "attach"
	TypePortInfo = "port_info"
	TypeRefused  = "refused"
	TypeDetach   = "detach"
	StateActive  = "active"
)

// Reasons of a refused message.
const (
	// ReasonGUIDInUse: the GUID is registered at another address that is
	// still live (no port takeover).
	ReasonGUIDInUse = "guid_in_use"
	// ReasonNoLID: every unicast LID is held by a registered port.
	ReasonNoLID = "no_lid"
	// ReasonSourceLimit: the attach's source IP address has as many ports
	// attached as the SM lets one address attach.
	ReasonSourceLimit = "source_limit"
)

// Fabric defaults.
const (
	// DefaultListen is the SM's default fabric address.
	DefaultListen = "127.0.0.1:4792"
	// DefaultSAListen is the default raw SA port: one datagram = one
	// 256-byte SA MAD.
	DefaultSAListen = "127.0.0.1:4793"
	// SMLID is the LID of the SM and the SA.
	SMLID = 1
	// FirstLID is the first LID given to a port.
	FirstLID = 2
	// DefaultSubnetPrefix is the subnet prefix fe80::/64.
	DefaultSubnetPrefix = 0xFE80000000000000
	// DefaultPKey is the only P_Key of a port.
	DefaultPKey = 0xFFFF
	// PortMTU is the active MTU enum the SM reports (4 = 2048).
	PortMTU = 4
	// PortRate is the rate enum the SM reports (3 = 10 Gb/s).
	PortRate = 3
	// KeepaliveInterval is how often a port sends "attach".
	KeepaliveInterval = time.Second
	// PortTimeout is how long the SM keeps a silent port.
	PortTimeout = 5 * time.Second
	// SAQPN is the SA's QP (QP1) and SAQKey the GSI Q_Key.
	SAQPN  = 1
	SAQKey = 0x80010000
)

// Control is a control message (after Magic, as JSON).
type Control struct {
	Type         string   `json:"type"`
	GUID         uint64   `json:"guid,omitempty"`
	NodeDesc     string   `json:"node_desc,omitempty"`
	LID          uint16   `json:"lid,omitempty"`
	SMLID        uint16   `json:"sm_lid,omitempty"`
	SubnetPrefix uint64   `json:"subnet_prefix,omitempty"`
	PKeys        []uint16 `json:"pkeys,omitempty"`
	Epoch        uint64   `json:"epoch,omitempty"`
	MTU          uint8    `json:"mtu,omitempty"` // IB MTU enum
	Rate         uint8    `json:"rate,omitempty"`
	State        string   `json:"state,omitempty"` // "active"
	// ClientReregister (port_info) tells a port that the SM registered it
	// anew: memberships it held are gone (PortInfo's ClientReregister bit).
	ClientReregister bool `json:"client_reregister,omitempty"`
	// Credits is the receive window of the sender of the message, in
	// packets: in an attach the port's (for the link switch → port), in a
	// port_info the switch's for the port (port → switch). 0 or absent:
	// no link flow control (see flow.go).
	Credits int `json:"credits,omitempty"`
	// Reason (refused) says why the SM refused an attach: ReasonGUIDInUse,
	// ReasonNoLID or ReasonSourceLimit.
	Reason string `json:"reason,omitempty"`
}

// ErrNotControl reports a datagram without the Magic prefix.
var ErrNotControl = errors.New("fabric: not a control message")

// IsControl reports whether b is a control message (starts with Magic).
func IsControl(b []byte) bool { return len(b) >= len(Magic) && string(b[:len(Magic)]) == Magic }

// EncodeControl returns Magic followed by the JSON of c.
func EncodeControl(c *Control) []byte {
	j, err := json.Marshal(c)
	if err != nil { // cannot happen: every field has a JSON form
		panic(err)
	}
	return append([]byte(Magic), j...)
}

// DecodeControl parses a control message.
func DecodeControl(b []byte) (*Control, error) {
	if !IsControl(b) {
		return nil, ErrNotControl
	}
	c := new(Control)
	if err := json.Unmarshal(b[len(Magic):], c); err != nil {
		return nil, err
	}
	return c, nil
}

// PortGID returns the GID of a port: the subnet prefix, then the GUID
// (e.g. GUID 0x100001 → fe80::10:1).
func PortGID(prefix, guid uint64) wire.GID {
	var g wire.GID
	binary.BigEndian.PutUint64(g[:8], prefix)
	binary.BigEndian.PutUint64(g[8:], guid)
	return g
}

// GUIDOf returns the interface ID (GUID) of a GID.
func GUIDOf(g wire.GID) uint64 { return binary.BigEndian.Uint64(g[8:]) }
