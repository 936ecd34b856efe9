package fabric

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/softrdma/softrdma/wire"
)

// Link-level flow control. An InfiniBand link does not drop a burst: the
// receiving end of a link grants credits for the buffer it has, and the
// transmitting end sends a data packet only while it holds a credit
// (IBA 7.9.4). This fabric does the same on each of its two links per
// port, port → switch and switch → port, with flow control packets
// modelled on the IBA's:
//
//	byte 0      Op << 4 | FCTBS[11:8]
//	byte 1      FCTBS[7:0]
//	byte 2      VL << 4 | FCCL[11:8]   (VL is always 0)
//	byte 3      FCCL[7:0]
//	bytes 4–5   LPCRC: the VCRC's CRC-16 over bytes 0–3, low byte first
//
// A flow control packet is a 6-byte datagram (an IB data packet has at
// least 26 bytes; a control message starts with Magic). FCTBS is the
// number of data packets the sender of the flow control packet has sent on
// the link so far, FCCL the limit up to which its peer may send, both
// modulo 4096. Credits count packets, not the IBA's 64-byte blocks: here
// the buffer at the end of a link is a socket buffer, which the kernel
// charges per datagram (a 100-byte packet takes a fifth of a 2 KB one,
// not a twentieth).
//
// The rules, per direction of a link:
//   - the transmitter sends a data packet only when CanSend(FCTBS, FCCL),
//     then counts it in FCTBS;
//   - the receiver counts every data packet it takes in ABR, and
//     advertises FCCL = ABR + its free buffer (never less than it already
//     advertised); it sends a flow control packet when the limit moved by
//     a quarter of its window, and answers an OpRequest at once;
//   - a flow control packet's FCTBS resets the receiver's ABR (IBA
//     7.9.4.2), so a packet lost on the way (or a count that was reset at
//     one end) does not leak credits: datagrams between two sockets on
//     one host arrive in order, so every packet counted in FCTBS has
//     arrived or was lost;
//   - a transmitter without credit sends OpRequest flow control packets
//     every FlowRefresh until credit comes (in case a grant was lost).
//
// A port offers flow control with the window of its receive buffer in
// every attach (Control.Credits); the SM answers with the window of its
// own buffer for the port in port_info (Control.Credits). Both ends start
// their counts at 0 when the SM registers the port anew. A peer that gives
// no window (0) does not take part: its link is not flow controlled.
// Control messages (attach, port_info, detach) are not flow controlled,
// like management packets on VL15.

// Flow control constants.
const (
	// FlowLen is the length of a flow control packet.
	FlowLen = 6
	// FlowMod is the modulus of FCTBS and FCCL.
	FlowMod = 4096
	// MaxWindow is the most credit a receiver may grant beyond ABR.
	MaxWindow = 2048
	// DefaultWindow is the receive window a port or the switch grants when
	// its socket buffer is large enough.
	DefaultWindow = 256
	// MinWindow is the least receive window granted.
	MinWindow = 4
	// PacketBufferCost is what one packet of up to the port MTU (2048)
	// takes of a Linux UDP socket receive buffer on loopback (the skb's
	// truesize, measured: 4,392 bytes for a 2,122-byte packet), rounded
	// up. A receive window of W packets needs W × PacketBufferCost bytes
	// of buffer.
	PacketBufferCost = 4608
	// SocketBuffer is the receive buffer the ports and the switch ask for
	// (the kernel caps it at net.core.rmem_max and doubles it).
	SocketBuffer = 4 << 20
	// FlowRefresh is how often a transmitter without credit asks for it.
	FlowRefresh = 10 * time.Millisecond
	// DefaultLinkStall is how long a port waits for credit before it drops
	// the packet and, until credit comes, every packet it sends
	// (provider/ib Config.LinkStallTimeout): twice what the switch's
	// defaults may hold a port back behind a port that gives no credit
	// (VLStallCount × HOQLife, 1.9 s).
	DefaultLinkStall = 4 * time.Second
)

// Flow control packet ops.
const (
	// FlowOpNormal is a flow control packet that wants no answer.
	FlowOpNormal = 0
	// FlowOpRequest asks the peer for its flow control packet at once (a
	// transmitter without credit; an extension of this fabric).
	FlowOpRequest = 1
)

// ErrFlow reports a malformed flow control packet (length, VL or LPCRC).
var ErrFlow = errors.New("fabric: bad flow control packet")

// Flow is a flow control packet.
type Flow struct {
	Op    uint8
	FCTBS uint16 // packets sent on the link by the sender of the packet, mod 4096
	FCCL  uint16 // the limit granted to the peer, mod 4096
}

// IsFlow reports whether datagram b is a flow control packet (by length).
func IsFlow(b []byte) bool { return len(b) == FlowLen }

// EncodeFlow writes f into b (len(b) >= FlowLen) and returns b[:FlowLen].
func EncodeFlow(b []byte, f Flow) []byte {
	b = b[:FlowLen]
	binary.BigEndian.PutUint16(b[0:], uint16(f.Op&0xF)<<12|f.FCTBS&0xFFF)
	binary.BigEndian.PutUint16(b[2:], f.FCCL&0xFFF)
	wire.PutVCRC(b[4:], wire.VCRC(b[:4]))
	return b
}

// DecodeFlow parses a flow control packet.
func DecodeFlow(b []byte) (Flow, error) {
	if len(b) != FlowLen || b[2]>>4 != 0 || wire.VCRC(b[:4]) != wire.GetVCRC(b[4:]) {
		return Flow{}, ErrFlow
	}
	w0, w1 := binary.BigEndian.Uint16(b[0:]), binary.BigEndian.Uint16(b[2:])
	return Flow{Op: uint8(w0 >> 12), FCTBS: w0 & 0xFFF, FCCL: w1 & 0xFFF}, nil
}

// Credits returns how many data packets a transmitter that has sent fctbs
// may still send under limit fccl (IBA: a packet may go when
// (FCCL − (FCTBS + 1)) mod 4096 ≤ 2048).
func Credits(fctbs, fccl uint16) int {
	d := int((fccl - fctbs) & (FlowMod - 1))
	if d > MaxWindow {
		return 0
	}
	return d
}

// Link is the flow control state of one end of a link: its transmit side
// (what it sent, what its peer lets it send) and its receive side (what it
// took in, what it granted). The zero Link is a link just initialized. It
// is not safe for concurrent use.
type Link struct {
	// On is set when the peer takes part in flow control: the transmit
	// side then waits for credit.
	On bool
	// FCTBS counts the data packets sent, FCCL is the peer's last grant.
	FCTBS, FCCL uint16
	// ABR counts the data packets taken in; Granted is the last FCCL
	// advertised to the peer.
	ABR, Granted uint16
}

// Reset starts both directions anew: nothing sent or taken in, peerWindow
// credits from the peer (0: the peer takes no part) and window granted to
// it.
func (l *Link) Reset(peerWindow, window int) {
	*l = Link{On: peerWindow > 0, FCCL: uint16(peerWindow) & (FlowMod - 1), Granted: uint16(window) & (FlowMod - 1)}
}

// Credits returns how many data packets may be sent now (always at least
// one when flow control is off).
func (l *Link) Credits() int {
	if !l.On {
		return MaxWindow
	}
	return Credits(l.FCTBS, l.FCCL)
}

// Sent counts n data packets sent.
func (l *Link) Sent(n int) { l.FCTBS = (l.FCTBS + uint16(n)) & (FlowMod - 1) }

// Took counts n data packets taken in.
func (l *Link) Took(n int) { l.ABR = (l.ABR + uint16(n)) & (FlowMod - 1) }

// Receive applies a flow control packet from the peer: its FCCL is the new
// limit, its FCTBS the new ABR. It reports whether credit grew.
func (l *Link) Receive(f Flow) (more bool) {
	before := l.Credits()
	l.FCCL, l.ABR = f.FCCL&(FlowMod-1), f.FCTBS&(FlowMod-1)
	return l.Credits() > before
}

// Grant computes the limit to advertise for free packets of buffer beyond
// ABR (at most MaxWindow), never below what was granted already, and
// reports whether it moved by at least step since the last advertised
// limit. When send is true the caller sends Flow() and the limit counts as
// advertised.
func (l *Link) Grant(free, step int) (send bool) {
	if !l.Due(free, step) {
		return false
	}
	l.Granted = (l.ABR + uint16(min(max(free, 0), MaxWindow))) & (FlowMod - 1)
	return true
}

// Due reports whether Grant(free, step) would send. It reads only the
// receive side (ABR, Granted).
func (l *Link) Due(free, step int) bool {
	free = min(max(free, 0), MaxWindow)
	moved := int(((l.ABR + uint16(free)) - l.Granted) & (FlowMod - 1))
	return moved <= MaxWindow && moved >= max(step, 1)
}

// Answer sets the advertised limit to ABR + free (at most MaxWindow), even
// below the last one: a peer that asks for credit has counted in its
// FCTBS, now ABR, everything it sent. It returns the flow control packet
// to answer with.
func (l *Link) Answer(free int) Flow {
	l.Granted = (l.ABR + uint16(min(max(free, 0), MaxWindow))) & (FlowMod - 1)
	return l.Flow(FlowOpNormal)
}

// Flow returns the flow control packet of this end: its FCTBS and the limit
// it granted.
func (l *Link) Flow(op uint8) Flow { return Flow{Op: op, FCTBS: l.FCTBS, FCCL: l.Granted} }

// Window returns the receive window for a socket receive buffer of rcvbuf
// bytes (as getsockopt SO_RCVBUF reports it) shared by ways links: what
// the buffer holds of packets of the port MTU, between MinWindow and
// DefaultWindow.
func Window(rcvbuf, ways int) int {
	return min(max(rcvbuf/PacketBufferCost/max(ways, 1), MinWindow), DefaultWindow)
}
