package ib

import "sync/atomic"

// counters are the port's packet counters.
type counters struct {
	sent, sendErrors, oversized                   atomic.Uint64
	rcvd, delivered, malformed, crcErrors         atomic.Uint64
	noGroup, noQP, notReady, noRecvWR, otherDrops atomic.Uint64
	qkeyViolations, pkeyViolations                atomic.Uint64
}

// Counters is a snapshot of a port's counters.
type Counters struct {
	SentPkts, SendErrors, OversizedSendDrops              uint64
	RcvdPkts, Delivered, MalformedDrops, CRCErrors        uint64
	NoGroupDrops, NoQPDrops, NotReadyDrops, NoRecvWRDrops uint64
	OtherDrops, QKeyViolations, PKeyViolations            uint64
}

// Counters returns a snapshot of the port's counters.
func (d *Device) Counters() Counters {
	c := &d.ctr
	return Counters{
		SentPkts: c.sent.Load(), SendErrors: c.sendErrors.Load(), OversizedSendDrops: c.oversized.Load(),
		RcvdPkts: c.rcvd.Load(), Delivered: c.delivered.Load(), MalformedDrops: c.malformed.Load(),
		CRCErrors: c.crcErrors.Load(), NoGroupDrops: c.noGroup.Load(), NoQPDrops: c.noQP.Load(),
		NotReadyDrops: c.notReady.Load(), NoRecvWRDrops: c.noRecvWR.Load(), OtherDrops: c.otherDrops.Load(),
		QKeyViolations: c.qkeyViolations.Load(), PKeyViolations: c.pkeyViolations.Load(),
	}
}
