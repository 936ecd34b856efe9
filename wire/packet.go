package wire

import "errors"

// Errors returned by ParseUD. Compare with errors.Is.
var (
	// ErrTruncated reports a datagram shorter than a BTH, or than the
	// opcode's headers plus pad plus ICRC.
	ErrTruncated = errors.New("wire: truncated RoCEv2 packet")
	// ErrTVer reports a BTH transport version other than 0.
	ErrTVer = errors.New("wire: BTH TVer is not 0")
	// ErrOpcode reports an opcode other than UD SEND_ONLY[_WITH_IMMEDIATE].
	ErrOpcode = errors.New("wire: not a UD SEND_ONLY opcode")
	// ErrDestQP0 reports a BTH DestQP of 0.
	ErrDestQP0 = errors.New("wire: BTH DestQP is 0")
)

// UDHeader is what a sender puts in BTH/DETH/ImmDt of a UD
// SEND_ONLY[_WITH_IMMEDIATE].
type UDHeader struct {
	Solicited bool
	PKey      uint16
	DestQP    uint32 // 24 bits
	PSN       uint32 // 24 bits
	QKey      uint32
	SrcQP     uint32 // 24 bits
	HasImm    bool
	Imm       uint32 // host value; written big-endian
}

// udHeaderLen returns the transport header length of a UD SEND_ONLY packet.
func udHeaderLen(hasImm bool) int {
	if hasImm {
		return BTHLen + DETHLen + ImmDtLen
	}
	return BTHLen + DETHLen
}

// padLen returns the number of pad bytes after a payload of n bytes.
func padLen(n int) int { return -n & 3 }

// UDLen is the length of the RoCEv2 part (UDP payload) of a UD SEND_ONLY
// packet: BTH+DETH[+ImmDt]+payload+pad+ICRC.
func UDLen(payloadLen int, hasImm bool) int {
	return udHeaderLen(hasImm) + payloadLen + padLen(payloadLen) + ICRCLen
}

// EncodeUD writes BTH, DETH, [ImmDt], payload and zero pad into b
// (len(b) >= UDLen(len(payload), h.HasImm)) and returns the number of bytes
// written without the 4 ICRC bytes: the caller computes the ICRC over b[:n]
// and stores it with PutICRC(b[n:], crc).
//
// Opcode is OpUDSendOnlyImm when h.HasImm, else OpUDSendOnly; PadCount is
// (-len(payload))&3; MigReq, TVer, FECN/BECN (byte 4), AckReq and the DETH
// reserved byte are 0.
func EncodeUD(b []byte, h *UDHeader, payload []byte) int {
	hl := udHeaderLen(h.HasImm)
	pad := padLen(len(payload))
	n := hl + len(payload) + pad
	if len(b) < n+ICRCLen {
		panic("wire: EncodeUD buffer too short")
	}
	bth := BTH(b[:BTHLen])
	op := OpUDSendOnly
	if h.HasImm {
		op = OpUDSendOnlyImm
	}
	bth[bthOpcode] = op
	bth[bthFlags] = uint8(pad << bthPadShift)
	bth.SetSolicited(h.Solicited)
	bth.SetPKey(h.PKey)
	bth[bthResv8a] = 0
	bth.SetDestQP(h.DestQP)
	bth[bthAckPSN] = 0
	bth.SetPSN(h.PSN)

	deth := DETH(b[BTHLen : BTHLen+DETHLen])
	deth.SetQKey(h.QKey)
	deth[dethSrcQP] = 0
	deth.SetSrcQP(h.SrcQP)

	if h.HasImm {
		ImmDt(b[BTHLen+DETHLen : hl]).SetImm(h.Imm)
	}
	copy(b[hl:], payload)
	clear(b[hl+len(payload) : n])
	return n
}

// Packet is a parsed RoCEv2 UD datagram (a UDP payload). Slices alias the
// input.
type Packet struct {
	BTH     BTH    // the 12-byte BTH
	DETH    DETH   // the 8-byte DETH
	HasImm  bool   // opcode is OpUDSendOnlyImm
	Imm     uint32 // host value of ImmDt when HasImm, else 0
	Payload []byte // the payload, without the pad (its capacity ends there too)
	// Body is everything covered by the ICRC after the UDP header: BTH
	// through the pad, i.e. b[:len(b)-ICRCLen].
	Body []byte
	// ICRC is the received ICRC (GetICRC of the last 4 bytes).
	ICRC uint32
}

// Header returns the UD header fields of p, as EncodeUD takes them.
func (p *Packet) Header() UDHeader {
	return UDHeader{
		Solicited: p.BTH.Solicited(),
		PKey:      p.BTH.PKey(),
		DestQP:    p.BTH.DestQP(),
		PSN:       p.BTH.PSN(),
		QKey:      p.DETH.QKey(),
		SrcQP:     p.DETH.SrcQP(),
		HasImm:    p.HasImm,
		Imm:       p.Imm,
	}
}

// ParseUD parses the UDP payload b of a RoCEv2 UD SEND_ONLY[_WITH_IMMEDIATE]
// packet into p without allocating. The checks run in this order, like
// rxe's receive path: length >= BTHLen (ErrTruncated), TVer == 0 (ErrTVer),
// opcode 0x64/0x65 (ErrOpcode), length >= headers + pad + ICRC
// (ErrTruncated), DestQP != 0 (ErrDestQP0). It does not check the ICRC, nor
// reserved bits, pad contents or that the length is a multiple of 4 (rxe
// does not either). On error p is left unchanged.
func ParseUD(b []byte, p *Packet) error {
	if len(b) < BTHLen {
		return ErrTruncated
	}
	bth := BTH(b[:BTHLen])
	if bth.TVer() != 0 {
		return ErrTVer
	}
	var hasImm bool
	switch bth.Opcode() {
	case OpUDSendOnly:
	case OpUDSendOnlyImm:
		hasImm = true
	default:
		return ErrOpcode
	}
	hl := udHeaderLen(hasImm)
	end := len(b) - ICRCLen - bth.PadCount()
	if end < hl {
		return ErrTruncated
	}
	if bth.DestQP() == 0 {
		return ErrDestQP0
	}
	p.BTH = bth
	p.DETH = DETH(b[BTHLen : BTHLen+DETHLen])
	p.HasImm = hasImm
	p.Imm = 0
	if hasImm {
		p.Imm = ImmDt(b[BTHLen+DETHLen : hl]).Imm()
	}
	p.Payload = b[hl:end:end]
	p.Body = b[: len(b)-ICRCLen : len(b)-ICRCLen]
	p.ICRC = GetICRC(b[len(b)-ICRCLen:])
	return nil
}
