package fabric

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"time"
)

// Direct forwarding. Every packet through the switch costs a wake-up of
// the SM's process and a copy, which RoCEv2 does not pay: on a loaded
// host that is most of a round trip. A fabric's switches forward by the
// tables the SM gives them; with direct forwarding (softsm's own SM's
// default, off with sm.Config.ViaSwitch, softsm -via-switch; port_info's
// Direct) the SM gives each port the part of
// the tables it sends by, and the port sends a packet to its destination
// ports itself. DIRECT messages are binary (DirectMagic, a type byte, the
// fields big-endian), small and handled in order with the packets:
//
//	route_query  port → SM: Seq, DLID: sent after a packet the port sent
//	             to DLID through the switch
//	route        SM → port: Seq (the query's; 0 for an update), DLID, the
//	             switch's HOQLife and VLStallCount, Peers: the DLID's
//	             destination ports, each a peer of the port (none: send
//	             through the switch); an update whenever they change
//	peer         SM → port: Peers[0], a port this one may send to directly
//	             and take packets from: both ends start a link (see
//	             Link), counts at 0, and each grants the other a window of
//	             its receive buffer (DirectWindow), which the other learns
//	             from the answer to its first OpRequest. OK asks the port
//	             to probe: to send OpRequests until the peer answers,
//	             which proves that the two reach each other directly
//	peer_ok      port → SM: PeerGUID, OK: the port took the peer (after
//	             the probe's answer, when it probes), or has no room for
//	             it (DirectWindow), or its probe went unanswered
//	peer_gone    SM → port: PeerGUID is no longer a peer (it left, or the
//	             pairing failed): its packets are dropped from now on
//
// Every message of the SM carries the port's Session token (port_info's),
// so a port takes routes and peers only from the SM it authenticated.
// The SM answers a query only once both ends of every pair took each
// other, and only when the switch holds no packet of the querying port: a
// query follows the packets it was sent after into the switch's input,
// and once they all left the switch nothing the port then sends directly
// can overtake them. The port takes an answer only when it sent nothing
// to the DLID through the switch since the query (a UD path keeps its
// order), and an update only for a DLID it already sends directly to
// (or one that sends it back through the switch). A multicast route
// lists the group's forwarding members other than the sender, as the
// switch's multicast table.
//
// A port sends a direct packet to a peer only with that peer's credit,
// and takes a data or flow control packet from an address only when the
// SM made it a peer. A packet that waits for a peer without credit waits
// at most the switch's head-of-queue lifetime and is then discarded for
// that peer (counted), and after VLStallCount such packets in a row every
// packet for the peer is discarded at once for 8 × HOQLife: the switch's
// rules, kept by the sender.

// DirectMagic starts every direct forwarding message ("SRDF" and its
// version): neither a control message (Magic) nor an IB packet (whose
// first byte is never 'S') nor a flow control packet (longer).
const DirectMagic = "SRDF\x01"

// Direct forwarding message types.
const (
	DirectRouteQuery = 1
	DirectRoute      = 2
	DirectPeer       = 3
	DirectPeerOK     = 4
	DirectPeerGone   = 5
)

// Direct forwarding sizes.
const (
	// MaxDirectWindow is the largest window a port grants a peer, in
	// packets (a flow control packet every quarter of it).
	MaxDirectWindow = 64
	// MaxRoutePeers is the most destination ports a route lists; a DLID
	// with more goes through the switch.
	MaxRoutePeers = 512
	// peerLen is a Peer's encoded length: GUID, LID, IPv6 (or
	// IPv4-mapped) address, UDP port.
	peerLen = 8 + 2 + 16 + 2
	// directHead is the header every message has: magic, type, session,
	// seq, DLID, PeerGUID, OK, HOQLife in µs, VLStallCount, peer count.
	directHead = len(DirectMagic) + 1 + SessionLen + 4 + 2 + 8 + 1 + 4 + 1 + 2
)

// Peer is a port another port sends to directly.
type Peer struct {
	GUID uint64
	LID  uint16
	Addr netip.AddrPort
}

// Direct is a direct forwarding message.
type Direct struct {
	Type uint8
	// Session is the port's Session token (messages of the SM).
	Session []byte
	// Seq numbers a query; its route answer carries it (0: an update).
	Seq  uint32
	DLID uint16
	// PeerGUID (peer_ok, peer_gone) names the peer; OK says whether the
	// port took it (peer_ok), or asks the port to probe the peer (peer).
	PeerGUID uint64
	OK       bool
	// HOQLife and VLStallCount (route) are the switch's head-of-queue
	// rules, which a sender keeps for its direct packets.
	HOQLife      time.Duration
	VLStallCount int
	// Peers are a route's destination ports, or a peer message's peer.
	Peers []Peer
}

// ErrDirect reports a malformed direct forwarding message.
var ErrDirect = errors.New("fabric: bad direct forwarding message")

// IsDirect reports whether datagram b is a direct forwarding message.
func IsDirect(b []byte) bool {
	return len(b) >= len(DirectMagic) && string(b[:len(DirectMagic)]) == DirectMagic
}

// AppendDirect appends m's encoding to b.
func AppendDirect(b []byte, m *Direct) []byte {
	b = append(b, DirectMagic...)
	b = append(b, m.Type)
	var s [SessionLen]byte
	copy(s[:], m.Session)
	b = append(b, s[:]...)
	b = binary.BigEndian.AppendUint32(b, m.Seq)
	b = binary.BigEndian.AppendUint16(b, m.DLID)
	b = binary.BigEndian.AppendUint64(b, m.PeerGUID)
	ok := byte(0)
	if m.OK {
		ok = 1
	}
	b = append(b, ok)
	b = binary.BigEndian.AppendUint32(b, uint32(min(max(m.HOQLife/time.Microsecond, 0), 1<<32-1)))
	b = append(b, byte(min(max(m.VLStallCount, 0), 255)))
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.Peers)))
	for _, p := range m.Peers {
		b = binary.BigEndian.AppendUint64(b, p.GUID)
		b = binary.BigEndian.AppendUint16(b, p.LID)
		a := p.Addr.Addr().As16()
		b = append(b, a[:]...)
		b = binary.BigEndian.AppendUint16(b, p.Addr.Port())
	}
	return b
}

// DecodeDirect parses a direct forwarding message into m, reusing m's
// Peers; m.Session aliases b. Addresses come out unmapped.
func DecodeDirect(b []byte, m *Direct) error {
	if !IsDirect(b) || len(b) < directHead {
		return ErrDirect
	}
	i := len(DirectMagic)
	m.Type = b[i]
	i++
	m.Session = b[i : i+SessionLen]
	i += SessionLen
	m.Seq = binary.BigEndian.Uint32(b[i:])
	m.DLID = binary.BigEndian.Uint16(b[i+4:])
	m.PeerGUID = binary.BigEndian.Uint64(b[i+6:])
	m.OK = b[i+14] == 1
	m.HOQLife = time.Duration(binary.BigEndian.Uint32(b[i+15:])) * time.Microsecond
	m.VLStallCount = int(b[i+19])
	n := int(binary.BigEndian.Uint16(b[i+20:]))
	i += 22
	if m.Type < DirectRouteQuery || m.Type > DirectPeerGone || b[i-8] > 1 || n > MaxRoutePeers || len(b) != i+n*peerLen {
		return ErrDirect
	}
	m.Peers = m.Peers[:0]
	for range n {
		var a [16]byte
		copy(a[:], b[i+10:i+26])
		addr := netip.AddrPortFrom(netip.AddrFrom16(a).Unmap(), binary.BigEndian.Uint16(b[i+26:]))
		m.Peers = append(m.Peers, Peer{GUID: binary.BigEndian.Uint64(b[i:]), LID: binary.BigEndian.Uint16(b[i+8:]), Addr: addr})
		i += peerLen
	}
	return nil
}

// DirectBudget is how many packets of a receive buffer of rcvbuf bytes
// the windows of a port's direct peers may take together: half of it.
func DirectBudget(rcvbuf int) int { return rcvbuf / PacketBufferCost / 2 }

// DirectWindow is the window a port grants its next peer when its peers'
// windows take used packets of budget (DirectBudget): a quarter of what
// is left, at most MaxDirectWindow; 0 (below MinWindow) means no room.
func DirectWindow(budget, used int) int {
	w := min((budget-used)/4, MaxDirectWindow)
	if w < MinWindow {
		return 0
	}
	return w
}
