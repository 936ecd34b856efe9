package sm

import (
	"net/netip"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sa"
)

// rmppKey names an RMPP transfer: its TID and the requester (a port over
// the fabric, or a raw SA peer).
type rmppKey struct {
	guid uint64
	raw  netip.AddrPort
	tid  uint64
}

// rmppXfer is an RMPP transfer in progress.
type rmppXfer struct {
	snd   *mad.RMPPSender
	send  func(mad.MAD)
	timer *time.Timer
	bytes int       // its segments' (RMPPBytes, RMPPSourceBytes)
	src   *saSource // charged for bytes
}

// requester is the requester of a transfer: its key without the TID.
func (k rmppKey) requester() rmppKey {
	k.tid = 0
	return k
}

// isRMPPControl reports an RMPP ACK, STOP or ABORT (for the RMPP sender,
// not the SA).
func isRMPPControl(m mad.MAD) bool {
	return m.RMPPFlags()&mad.RMPPFlagActive != 0 && m.RMPPType() != mad.RMPPTypeData
}

// answer sends the SA's response MADs to req: a plain MAD at once, the
// segments of an RMPP-active answer through a windowed RMPP sender — unless
// the requester has MaxRMPPPerRequester transfers in progress or the
// segments would exceed src's RMPPSourceBytes or RMPPBytes: then the
// answer is 0x0100 (TableBusy). A transfer with the same key (requester
// and TID) is replaced. Caller holds mu.
func (s *SM) answer(key rmppKey, req mad.MAD, resps []mad.MAD, send func(mad.MAD), src *saSource) {
	if len(resps) == 0 {
		return
	}
	if resps[0].RMPPFlags()&mad.RMPPFlagActive == 0 {
		for _, r := range resps {
			send(r)
		}
		return
	}
	if old := s.rmpp[key]; old != nil {
		s.rmppEnd(key, old)
	}
	n := len(resps) * mad.Len
	if s.rmppPer[key.requester()] >= MaxRMPPPerRequester || s.rmppBytes+n > RMPPBytes || src.rmppBytes+n > RMPPSourceBytes {
		s.tableBusy.Add(1)
		s.limitedf(&s.logTableBusy, time.Now(), "SA %s: answered 0x0100, the requester has %d RMPP transfers in progress (at most %d), its source address %d bytes of them (%d), all %d (%d); this one %d",
			describe(req), s.rmppPer[key.requester()], MaxRMPPPerRequester, src.rmppBytes, RMPPSourceBytes, s.rmppBytes, RMPPBytes, n)
		send(sa.ErrorReply(req, mad.StatusNoResources)[0])
		return
	}
	x := &rmppXfer{snd: mad.NewRMPPSender(resps, s.cfg.RMPPRetries), send: send, bytes: n, src: src}
	s.rmpp[key] = x
	s.rmppPer[key.requester()]++
	s.rmppBytes += n
	src.rmppBytes += n
	s.rmppXfers.Add(1)
	s.rmppSend(key, x, x.snd.Start())
}

// rmppEnd forgets a transfer: its timer, its count and bytes. Caller
// holds mu.
func (s *SM) rmppEnd(key rmppKey, x *rmppXfer) {
	s.stopTimer(x.timer)
	delete(s.rmpp, key)
	who := key.requester()
	if s.rmppPer[who]--; s.rmppPer[who] <= 0 {
		delete(s.rmppPer, who)
	}
	s.rmppBytes -= x.bytes
	x.src.rmppBytes -= x.bytes
}

// rmppSend sends segments of a transfer and (re)arms its ACK timer.
// Caller holds mu.
func (s *SM) rmppSend(key rmppKey, x *rmppXfer, segs []mad.MAD) {
	for _, m := range segs {
		x.send(m)
	}
	s.stopTimer(x.timer)
	x.timer = s.after(s.cfg.RMPPTimeout, func() { s.rmppTimeout(key, x) })
}

// rmppTimeout resends the window's unacknowledged segments or drops the
// transfer once its retries are used. Caller holds mu.
func (s *SM) rmppTimeout(key rmppKey, x *rmppXfer) {
	if s.rmpp[key] != x {
		return
	}
	x.timer = nil
	segs := x.snd.Timeout()
	if done, _ := x.snd.Done(); done {
		s.rmppTimeouts.Add(1)
		s.rmppEnd(key, x)
		s.logf("RMPP transfer tid %#x: no ACK after %d retries (%d segments acknowledged): dropped", key.tid, s.cfg.RMPPRetries, x.snd.Acked())
		return
	}
	s.rmppRetrans.Add(uint64(len(segs)))
	s.rmppSend(key, x, segs)
}

// rmppReceive hands an RMPP ACK, STOP or ABORT to its transfer; one for
// no transfer in progress is ignored. Caller holds mu.
func (s *SM) rmppReceive(key rmppKey, m mad.MAD, reply func(mad.MAD)) {
	x := s.rmpp[key]
	if x == nil {
		return
	}
	segs, progress, abort := x.snd.Receive(m)
	if abort != nil {
		reply(abort)
	}
	if done, err := x.snd.Done(); done {
		s.rmppEnd(key, x)
		if err != nil {
			s.rmppAborts.Add(1)
			s.logf("RMPP transfer tid %#x: %v (RMPP type %d status %d)", key.tid, err, m.RMPPType(), m.RMPPStatus())
		}
		return
	}
	if progress || len(segs) > 0 {
		s.rmppSend(key, x, segs)
	}
}
