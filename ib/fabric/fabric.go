// Package fabric is the wire protocol between the ports of emulated
// InfiniBand devices and the subnet manager (cmd/softsm, package ib/sm).
//
// Every IB port is a UDP socket of a client process; the SM listens on a
// fabric UDP address (DefaultListen). A datagram on the fabric is a
// CONTROL message, an IB PACKET, a 6-byte FLOW CONTROL packet (the links
// are lossless: credit-based flow control, see flow.go), or a DIRECT
// forwarding message (direct.go).
//
// A CONTROL message is the 5-byte prefix Magic ("SRSM" + the protocol
// version, Version), then a JSON object (Control). An IB packet never
// starts with 'S' (0x53): LRH byte 0 is VL<<4 | LVer and LVer is 0.
// Types:
//
//	attach     port → SM: GUID, NodeDesc, Nonce (new in each); at start
//	           and every KeepaliveInterval as keepalive; Cookie, the one
//	           of the SM's last retry, until a port_info comes. EncodeControl pads
//	           an attach with trailing spaces (which JSON ignores) to
//	           AttachLen bytes, so that no answer of the SM is larger
//	           than the attach it answers
//	retry      SM → port, the answer to an attach from an address that has
//	           not proven that it receives there: GUID (the attach's) and
//	           Cookie, which the port sends back in an attach at once
//	port_info  SM → port, the answer to every attach it accepts: LID, SMLID,
//	           SubnetPrefix, PKeys [0xffff], Epoch (random per SM start),
//	           MTU 4 (2048), Rate 3 (10 Gb/s), State "active",
//	           ClientReregister when the SM registered the port anew
//	           (first attach, or after it forgot the port), Session and
//	           SMGUID, MAC when the SM has a key (auth.go), and Direct
//	           when the SM forwards directly (direct.go)
//	refused    SM → port, the answer to an attach the SM refuses: GUID
//	           (the attach's) and Reason: ReasonGUIDInUse when the GUID
//	           is registered at another live address, ReasonNoLID when
//	           no LID is free, ReasonSourceLimit when the source IP
//	           address has as many ports attached as the SM allows one,
//	           ReasonVersion (in the attach's own version) when the attach
//	           speaks another protocol version; MAC when the SM has a
//	           key
//	detach     port → SM when the port closes
//
// Address validation. A UDP source address can be
// forged, so the SM never answers an attach from an unproven address with
// anything but a retry no larger than the attach, and allocates nothing
// (no LID, no port record) for it. An address is proven for a GUID when
// the port of that GUID is registered at that address, or when the attach
// carries a Cookie of a retry the SM sent to that address for that GUID:
// an HMAC of the address, the GUID and the time in CookieWindow units
// under a secret of the SM's (random per SM start); a cookie is taken in
// its window and the next (CookieWindow to 2×CookieWindow). The port sends
// its attach again with the cookie as soon as a retry comes, so attaching
// costs one more round trip. Only then does the SM register the port and
// answer port_info or refused. A port of version 1 gets a refused with
// ReasonVersion in version 1's format, when that is no larger than its
// attach.
//
// Attach and port_info carry Credits, the receive window of their sender:
// the links are flow controlled (see Flow) so that the subnet is lossless
// like an IB fabric.
//
// A port takes datagrams only from the SM's fabric address (the SM is also
// the switch) and, with direct forwarding, IB and flow control packets
// from the peers the SM gave it (direct.go); a refused only when it names the port's GUID (a port that
// is still waiting for its first port_info gives up at once; an active
// port ignores it and notices a silent SM by its keepalives), a retry
// only when it names the port's GUID and carries a cookie of at most
// MaxCookieLen bytes (it answers each new cookie with one attach at once),
// and a port_info only when it names the port's GUID, a unicast
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
// SA MADs travel as UD packets to the SM LID of the port's last port_info
// (SMLID with softsm's own SM; OpenSM's port's LID when OpenSM manages
// the subnet, ib/sm's ManagerOpenSM), BTH DestQP 1, DETH Q_Key
// 0x80010000, payload one 256-byte MAD; the answer comes from that SM LID /
// source QP 1 to the requester's LID and QP, with a GRH (GIDs swapped) when
// the request had one.
package fabric

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/softrdma/softrdma/wire"
)

// Version is the protocol version of the control messages: 2 since the
// SM validates addresses (retry and Cookie); 1 before.
const Version = 2

// Magic starts every control message: "SRSM" and the protocol version.
const Magic = magicPrefix + "\x02"

// magicPrefix starts a control message of any protocol version.
const magicPrefix = "SRSM"

// Address validation (see the package comment).
const (
	// AttachLen is the length EncodeControl pads an attach to: no answer
	// of the SM (retry, port_info, refused) is longer.
	AttachLen = 384
	// CookieLen is the length of the SM's cookies; MaxCookieLen the
	// longest cookie a port takes.
	CookieLen    = 16
	MaxCookieLen = 64
	// CookieWindow is the SM's time unit for cookies: a cookie is taken
	// for CookieWindow to 2×CookieWindow after its retry.
	CookieWindow = 10 * time.Second
)

// Control message types and the port state.
const (
	TypeAttach   = "attach"
	TypePortInfo = "port_info"
	TypeRefused  = "refused"
	TypeRetry    = "retry"
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
	// ReasonVersion: the attach speaks another protocol version than the
	// SM (the refusal is in the attach's version).
	ReasonVersion = "version"
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
	// ReasonNoLID, ReasonSourceLimit or ReasonVersion.
	Reason string `json:"reason,omitempty"`
	// Cookie (retry, and attach after a retry) proves that the port
	// receives at its address (see the package comment).
	Cookie []byte `json:"cookie,omitempty"`
	// Nonce (attach) is the port's challenge, NonceLen random bytes new
	// in every attach: a keyed SM's answer carries a MAC over it (see
	// auth.go).
	Nonce []byte `json:"nonce,omitempty"`
	// Session (port_info) is the SM's token for the port: SessionLen
	// bytes that one SM instance gives one port registration and that
	// nobody else sees. A port that authenticated its SM once takes the
	// SM's later port_infos by it; another token means another SM (see
	// auth.go).
	Session []byte `json:"session,omitempty"`
	// SMGUID (port_info) is the SM port's GUID.
	SMGUID uint64 `json:"sm_guid,omitempty"`
	// MAC (port_info and refused of a keyed SM) authenticates the
	// message: ControlMAC over the nonce of the attach it answers.
	MAC []byte `json:"mac,omitempty"`
	// Direct (port_info) says that the SM forwards directly: the port
	// asks it for routes (see direct.go).
	Direct bool `json:"direct,omitempty"`
}

// ErrNotControl reports a datagram without the Magic prefix.
var ErrNotControl = errors.New("fabric: not a control message")

// ErrVersion reports a control message of another protocol version.
var ErrVersion = errors.New("fabric: control message of another protocol version")

// IsControl reports whether b is a control message of any protocol
// version ("SRSM" and a version byte): see ControlVersion.
func IsControl(b []byte) bool {
	return len(b) >= len(Magic) && string(b[:len(magicPrefix)]) == magicPrefix
}

// ControlVersion returns the protocol version of a control message (0
// when b is not one).
func ControlVersion(b []byte) byte {
	if !IsControl(b) {
		return 0
	}
	return b[len(magicPrefix)]
}

// EncodeControl returns Magic followed by the JSON of c; an attach is
// padded with spaces to AttachLen bytes.
func EncodeControl(c *Control) []byte { return EncodeControlVersion(c, Version) }

// EncodeControlVersion is EncodeControl in protocol version v (the SM
// refuses a port of another version in that port's version: versions 1
// and 2 share the JSON). Only Version pads attaches.
func EncodeControlVersion(c *Control, v byte) []byte {
	j, err := json.Marshal(c)
	if err != nil { // cannot happen: every field has a JSON form
		panic(err)
	}
	b := append(append([]byte(magicPrefix), v), j...)
	if c.Type == TypeAttach && v == Version && len(b) < AttachLen {
		b = append(b, bytes.Repeat([]byte{' '}, AttachLen-len(b))...)
	}
	return b
}

// DecodeControl parses a control message of protocol version Version (a
// message of another version fails with ErrVersion).
func DecodeControl(b []byte) (*Control, error) {
	c, v, err := DecodeControlAnyVersion(b)
	if err != nil {
		return nil, err
	}
	if v != Version {
		return nil, fmt.Errorf("%w: version %d, this is %d", ErrVersion, v, Version)
	}
	return c, nil
}

// DecodeControlAnyVersion parses a control message of any protocol
// version as one of this version (whose JSON versions 1 and 2 share) and
// returns its version.
func DecodeControlAnyVersion(b []byte) (*Control, byte, error) {
	if !IsControl(b) {
		return nil, 0, ErrNotControl
	}
	c := new(Control)
	if err := json.Unmarshal(b[len(Magic):], c); err != nil {
		return nil, 0, err
	}
	return c, b[len(magicPrefix)], nil
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
