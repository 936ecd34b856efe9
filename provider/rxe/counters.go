package rxe

import "sync/atomic"

// Counters is a snapshot of a device's packet counters. A datagram the
// device reads (RcvdPkts) is either dropped before it reaches a QP, counted
// once in one of MalformedDrops' parts, ICRCErrors, NoGroupDrops or
// NoQPDrops, or checked once per attached QP (in attach order, like rxe)
// and counted per QP as Delivered or in one per-QP drop counter.
type Counters struct {
	// RcvdPkts and RcvdBytes count the datagrams (and their UDP payload
	// bytes) read from the device's UDP 4791 sockets, before any check.
	RcvdPkts  uint64
	RcvdBytes uint64
	// Delivered counts datagrams handed to a QP's receive queue (one per
	// receiving QP).
	Delivered uint64
	// SentPkts and SentBytes count datagrams (UDP payload bytes) sent.
	SentPkts  uint64
	SentBytes uint64
	// SendErrors counts sends the kernel refused (sendmsg errors).
	SendErrors uint64

	// MalformedDrops is the sum of TruncatedDrops, TVerDrops, OpcodeDrops,
	// DestQP0Drops and OversizedRecvDrops.
	MalformedDrops uint64
	// TruncatedDrops counts datagrams shorter than their headers + ICRC.
	TruncatedDrops uint64
	// TVerDrops counts datagrams with a BTH transport version other than 0.
	TVerDrops uint64
	// OpcodeDrops counts datagrams whose opcode is not UD SEND_ONLY[_IMM].
	OpcodeDrops uint64
	// DestQP0Drops counts datagrams addressed to QP 0.
	DestQP0Drops uint64
	// OversizedRecvDrops counts datagrams larger than the receive buffer
	// (larger than any RoCEv2 packet of a 4096-byte MTU).
	OversizedRecvDrops uint64
	// ICRCErrors counts datagrams whose ICRC does not match (for IPv4: no
	// IP identification/DF value makes it match).
	ICRCErrors uint64

	// NoGroupDrops counts multicast datagrams for a group with no attached QP.
	NoGroupDrops uint64
	// NoQPDrops counts unicast datagrams for a QPN the device does not have.
	NoQPDrops uint64
	// NotReadyDrops counts datagrams for a QP below RTR (or in ERR).
	NotReadyDrops uint64
	// PKeyViolations counts datagrams whose BTH P_Key is not the default
	// partition (low 15 bits 0x7FFF), per receiving QP.
	PKeyViolations uint64
	// QKeyViolations counts datagrams whose DETH Q_Key differs from the
	// receiving QP's Q_Key, per receiving QP.
	QKeyViolations uint64
	// SelfLoopbackDrops counts a QP's own multicast datagrams not delivered
	// to it because it was created with CreateBlockSelfMcastLB.
	SelfLoopbackDrops uint64
	// NoRecvWRDrops counts datagrams dropped because no receive WR was posted.
	NoRecvWRDrops uint64
	// TooLongDrops counts datagrams larger than the next receive WR (40 +
	// payload > WR length); the WR is not consumed.
	TooLongDrops uint64
	// CQFullDrops counts datagrams dropped because the receive CQ was full.
	CQFullDrops uint64
	// OversizedSendDrops counts sends larger than the active MTU, completed
	// without being sent (as rxe does).
	OversizedSendDrops uint64
}

// QPCounters is the per-QP subset of Counters; each field counts, for one
// QP, what the Counters field of the same name counts for the device.
type QPCounters struct {
	Delivered          uint64
	NotReadyDrops      uint64
	PKeyViolations     uint64
	QKeyViolations     uint64
	SelfLoopbackDrops  uint64
	NoRecvWRDrops      uint64
	TooLongDrops       uint64
	CQFullDrops        uint64
	SentPkts           uint64
	SentBytes          uint64
	SendErrors         uint64
	OversizedSendDrops uint64
}

// ctr names one counter of a counterSet.
type ctr int

const (
	cRcvdPkts ctr = iota
	cRcvdBytes
	cDelivered
	cSentPkts
	cSentBytes
	cSendErrors
	cTruncated
	cTVer
	cOpcode
	cDestQP0
	cOversizedRecv
	cICRC
	cNoGroup
	cNoQP
	cNotReady
	cPKey
	cQKey
	cSelfLB
	cNoRecvWR
	cTooLong
	cCQFull
	cOversizedSend
	numCtr
)

// counterSet holds atomic counters; the hot path only adds.
type counterSet [numCtr]atomic.Uint64

func (c *counterSet) add(i ctr, n uint64) { c[i].Add(n) }
func (c *counterSet) get(i ctr) uint64    { return c[i].Load() }

func (c *counterSet) snapshot() Counters {
	s := Counters{
		RcvdPkts:           c.get(cRcvdPkts),
		RcvdBytes:          c.get(cRcvdBytes),
		Delivered:          c.get(cDelivered),
		SentPkts:           c.get(cSentPkts),
		SentBytes:          c.get(cSentBytes),
		SendErrors:         c.get(cSendErrors),
		TruncatedDrops:     c.get(cTruncated),
		TVerDrops:          c.get(cTVer),
		OpcodeDrops:        c.get(cOpcode),
		DestQP0Drops:       c.get(cDestQP0),
		OversizedRecvDrops: c.get(cOversizedRecv),
		ICRCErrors:         c.get(cICRC),
		NoGroupDrops:       c.get(cNoGroup),
		NoQPDrops:          c.get(cNoQP),
		NotReadyDrops:      c.get(cNotReady),
		PKeyViolations:     c.get(cPKey),
		QKeyViolations:     c.get(cQKey),
		SelfLoopbackDrops:  c.get(cSelfLB),
		NoRecvWRDrops:      c.get(cNoRecvWR),
		TooLongDrops:       c.get(cTooLong),
		CQFullDrops:        c.get(cCQFull),
		OversizedSendDrops: c.get(cOversizedSend),
	}
	s.MalformedDrops = s.TruncatedDrops + s.TVerDrops + s.OpcodeDrops + s.DestQP0Drops + s.OversizedRecvDrops
	return s
}

func (c *counterSet) qpSnapshot() QPCounters {
	return QPCounters{
		Delivered:          c.get(cDelivered),
		NotReadyDrops:      c.get(cNotReady),
		PKeyViolations:     c.get(cPKey),
		QKeyViolations:     c.get(cQKey),
		SelfLoopbackDrops:  c.get(cSelfLB),
		NoRecvWRDrops:      c.get(cNoRecvWR),
		TooLongDrops:       c.get(cTooLong),
		CQFullDrops:        c.get(cCQFull),
		SentPkts:           c.get(cSentPkts),
		SentBytes:          c.get(cSentBytes),
		SendErrors:         c.get(cSendErrors),
		OversizedSendDrops: c.get(cOversizedSend),
	}
}

// Counters returns a snapshot of the device's counters.
func (d *Device) Counters() Counters { return d.ctr.snapshot() }

// QPCounters returns a snapshot of the counters of the device's QP qpn;
// false when the device has no such QP (never created or destroyed).
func (d *Device) QPCounters(qpn uint32) (QPCounters, bool) {
	q := (*d.qpTable.Load())[qpn]
	if q == nil {
		return QPCounters{}, false
	}
	return q.ctr.qpSnapshot(), true
}

// count adds one to a counter of the device and, when q is not nil, of q.
func (d *Device) count(q *qp, i ctr) {
	d.ctr.add(i, 1)
	if q != nil {
		q.ctr.add(i, 1)
	}
}
