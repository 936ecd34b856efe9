package sm

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sa"
	"github.com/softrdma/softrdma/wire"
)

// saSource is the SA budget of a source address: its requests and
// queries (SASourceRate, TableSourceRate) and the bytes of its RMPP
// transfers in progress (RMPPSourceBytes). Guarded by SM.mu.
type saSource struct {
	reqs, tables bucket
	rmppBytes    int
}

// tableJob is an SA query waiting for the table goroutine.
type tableJob struct {
	req  mad.MAD
	from sa.From
	key  rmppKey
	send func(mad.MAD) // called under mu
	src  *saSource
	who  string // the requester, for the log
}

// bucket is a token bucket; the zero bucket is full.
type bucket struct {
	tokens float64
	at     time.Time
}

// allow takes a token from a bucket of burst tokens refilled at rate a
// second (a nil bucket always allows).
func (b *bucket) allow(now time.Time, burst, rate float64) bool {
	if b == nil {
		return true
	}
	if b.at.IsZero() {
		b.tokens = burst
	} else {
		b.tokens = min(b.tokens+now.Sub(b.at).Seconds()*rate, burst)
	}
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// saFromFabric is the SA agent at QP1: checks the UD packet, answers
// from SLID 1 / QP1 to the requester's SLID and source QP, with the GIDs
// swapped when the request had a GRH. Caller holds mu.
func (s *SM) saFromFabric(b []byte, p *port) {
	if s.ext != nil {
		s.relayFromFabric(b, p)
		return
	}
	var pkt fabric.Packet
	if err := fabric.Parse(b, &pkt); err != nil {
		p.c.drops.Add(1)
		s.logf("SA packet from %#x: %v", p.guid, err)
		return
	}
	if pkt.UD.BTH.DestQP() != fabric.SAQPN || pkt.UD.DETH.QKey() != fabric.SAQKey || len(pkt.UD.Payload) < mad.Len {
		p.c.drops.Add(1)
		s.logf("SA packet from %#x: DestQP %d Q_Key %#x payload %d", p.guid,
			pkt.UD.BTH.DestQP(), pkt.UD.DETH.QKey(), len(pkt.UD.Payload))
		return
	}
	p.c.sa.Add(1)
	if s.saDrop.Load() {
		return
	}
	req := append(mad.MAD(nil), pkt.UD.Payload[:mad.Len]...)
	guid := p.guid
	hdr := fabric.UDPacket{
		SL: pkt.LRH.SL(), DLID: pkt.LRH.SLID(), SLID: fabric.SMLID,
		UD: wire.UDHeader{PKey: pkt.UD.BTH.PKey(), DestQP: pkt.UD.DETH.SrcQP(), QKey: fabric.SAQKey, SrcQP: fabric.SAQPN},
	}
	if pkt.Global() {
		hdr.Global = true
		hdr.GRH = wire.IBGRHFields{TClass: pkt.GRH.TClass(), FlowLabel: pkt.GRH.FlowLabel(),
			HopLmt: pkt.GRH.HopLmt(), SGID: pkt.GRH.DGID(), DGID: pkt.GRH.SGID()}
	}
	send := func(r mad.MAD) {
		d := s.byGUID[guid]
		if d == nil || !d.attached() {
			return
		}
		h := hdr
		h.UD.PSN = s.psn & 0xFFFFFF
		s.psn++
		out := make([]byte, fabric.PacketLen(len(r), false, h.Global))
		fabric.EncodeUD(out, &h, r)
		// A management packet: counted on the link, sent without credit.
		d.ls.link.Sent(1)
		if _, err := s.fabric.WriteToUDPAddrPort(out, d.addr); err != nil {
			s.logf("SA answer to %#x: %v", guid, err)
			return
		}
		d.c.tx.Add(1)
	}
	key := rmppKey{guid: guid, tid: req.TID()}
	if isRMPPControl(req) {
		s.rmppReceive(key, req, send)
		return
	}
	src := s.saSourceOf(p)
	query := s.sa.Broad(req)
	if !s.saAllow(&p.saBudget, &p.tableBudget, src, query, func() string { return fmt.Sprintf("port %#x (%v)", guid, p.addr) }) {
		return
	}
	if query {
		s.saLater(func() {
			s.queueTable(tableJob{req: req, from: sa.From{GUID: guid, Source: p.addr.Addr().Unmap()}, key: key, send: send, src: src, who: fmt.Sprintf("%#x", guid)})
		})
		return
	}
	s.saLater(func() {
		resps := s.sa.Handle(req, sa.From{GUID: guid, Source: p.addr.Addr().Unmap()})
		if s.cfg.Logf != nil {
			s.logf("SA %s from %#x → %s", describe(req), guid, describeResp(resps))
		}
		s.answer(key, req, resps, send, src)
	})
}

// saSourceOf returns the SA budgets of p's source address, made on
// first use. Caller holds mu.
func (s *SM) saSourceOf(p *port) *saSource {
	a := p.addr.Addr().Unmap()
	src := s.saSources[a]
	if src == nil {
		src = &saSource{}
		s.saSources[a] = src
	}
	return src
}

// saAllow takes an SA request's tokens: the port's and the source's
// (nil port buckets: a raw SA peer), and for a query their table tokens
// too. Beyond, the request is dropped, counted and logged. Caller holds
// mu.
func (s *SM) saAllow(reqs, tables *bucket, src *saSource, query bool, who func() string) bool {
	now := time.Now()
	why := ""
	switch {
	case !reqs.allow(now, SARequestBurst, SARequestRate):
		why = fmt.Sprintf("beyond %d SA requests a second from the port", SARequestRate)
	case !src.reqs.allow(now, SASourceBurst, SASourceRate):
		why = fmt.Sprintf("beyond %d SA requests a second from its source address", SASourceRate)
	case query && !tables.allow(now, TableBurst, TableRate):
		why = fmt.Sprintf("beyond %d broad queries (Get, GetTable) a second from the port", TableRate)
	case query && !src.tables.allow(now, TableSourceBurst, TableSourceRate):
		why = fmt.Sprintf("beyond %d broad queries (Get, GetTable) a second from its source address", TableSourceRate)
	default:
		return true
	}
	s.saThrottled.Add(1)
	if s.cfg.Logf != nil {
		s.limitedf(&s.logSAThrottle, now, "SA request from %s: dropped, %s", who(), why)
	}
	return false
}

// queueTable queues a query for the table goroutine; when tableQueue
// wait already it is answered 0x0100 at once. Caller holds mu.
func (s *SM) queueTable(j tableJob) {
	if s.tables.len() >= tableQueue {
		s.tableBusy.Add(1)
		s.limitedf(&s.logTableBusy, time.Now(), "SA %s from %s: answered 0x0100, %d queries wait already", describe(j.req), j.who, tableQueue)
		j.send(sa.ErrorReply(j.req, mad.StatusNoResources)[0])
		return
	}
	s.tables.push(j)
	select {
	case s.tableWake <- struct{}{}:
	default:
	}
}

// tableLoop answers the queued queries until Close, one at a time: under
// mu the SA copies what a query needs (sa.Prepare: at most every port or
// group), without mu the answer is built (sa.Query.Build: bounded by
// Config.MaxTableRecords), under mu again it is sent. So a query holds up
// neither the reader nor the joins of other ports for longer than the
// copy.
func (s *SM) tableLoop() {
	for {
		select {
		case <-s.tableWake:
		case <-s.quit:
			return
		}
		for {
			s.mu.Lock()
			if s.closed || s.tables.len() == 0 {
				s.mu.Unlock()
				break
			}
			j := s.tables.pop()
			resps, q := s.sa.Prepare(j.req, j.from)
			s.mu.Unlock()
			tooLarge := false
			if q != nil {
				resps, tooLarge = q.Build()
			}
			s.mu.Lock()
			if s.closed {
				s.mu.Unlock()
				return
			}
			now := time.Now()
			if tooLarge {
				s.tableTooLarge.Add(1)
				s.limitedf(&s.logTooLarge, now, "SA %s from %s: answered 0x0100, more than %d records (or %d candidates)",
					describe(j.req), j.who, s.cfg.MaxTableRecords, sa.WorkFactor*s.cfg.MaxTableRecords)
			}
			if s.cfg.Logf != nil {
				s.logf("SA %s from %s → %s", describe(j.req), j.who, describeResp(resps))
			}
			s.answer(j.key, j.req, resps, j.send, j.src)
			s.mu.Unlock()
		}
	}
}

// saLater runs f (under mu) now, or after SADelay on a timer. Caller holds mu.
func (s *SM) saLater(f func()) {
	if s.cfg.SADelay <= 0 {
		f()
		s.rebuildMFT()
		s.directChanged(time.Now())
		return
	}
	s.after(s.cfg.SADelay, func() {
		f()
		s.rebuildMFT()
		s.directChanged(time.Now())
	})
}

// after runs f under mu after d unless the timer is stopped (stopTimer)
// or the SM closes first. Caller holds mu.
func (s *SM) after(d time.Duration, f func()) *time.Timer {
	s.wg.Add(1)
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		defer s.wg.Done()
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.timers[t]; !ok || s.closed {
			return // stopped, or the SM closed
		}
		delete(s.timers, t)
		f()
	})
	s.timers[t] = struct{}{}
	return t
}

// stopTimer cancels a timer of after (nil: none). Caller holds mu.
func (s *SM) stopTimer(t *time.Timer) {
	if t == nil {
		return
	}
	if _, ok := s.timers[t]; !ok {
		return
	}
	delete(s.timers, t)
	if t.Stop() {
		s.wg.Done()
	}
}

func (s *SM) rawSALoop() error {
	buf := make([]byte, 65536)
	for {
		n, from, err := s.rawSA.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		s.rawReqs.Add(1)
		if n != mad.Len || s.saDrop.Load() || (!s.cfg.SAAllowRemote && !from.Addr().Unmap().IsLoopback()) {
			s.rawDrops.Add(1)
			continue
		}
		req := append(mad.MAD(nil), buf[:n]...)
		send := func(r mad.MAD) {
			if _, err := s.rawSA.WriteToUDPAddrPort(r, from); err != nil {
				s.logf("raw SA answer to %v: %v", from, err)
			}
		}
		key := rmppKey{raw: from, tid: req.TID()}
		s.mu.Lock()
		if isRMPPControl(req) {
			s.rmppReceive(key, req, send)
			s.mu.Unlock()
			continue
		}
		src := &s.rawSource
		query := s.sa.Broad(req)
		if !s.saAllow(nil, nil, src, query, func() string { return fmt.Sprintf("raw %v", from) }) {
			s.mu.Unlock()
			continue
		}
		if query {
			s.saLater(func() {
				s.queueTable(tableJob{req: req, from: sa.From{Raw: true, Source: from.Addr().Unmap()}, key: key, send: send, src: src, who: fmt.Sprintf("raw %v", from)})
			})
			s.mu.Unlock()
			continue
		}
		s.saLater(func() {
			resps := s.sa.Handle(req, sa.From{Raw: true, Source: from.Addr().Unmap()})
			if s.cfg.Logf != nil {
				s.logf("SA %s from raw %v → %s", describe(req), from, describeResp(resps))
			}
			s.answer(key, req, resps, send, src)
		})
		s.mu.Unlock()
	}
}

func describe(m mad.MAD) string {
	s := fmt.Sprintf("method %#02x attr %#04x tid %#x", m.Method(), m.AttrID(), m.TID())
	if m.AttrID() == mad.AttrMCMemberRecord {
		r := m.MCMemberRecord()
		s += fmt.Sprintf(" mgid %v port %v js %#x mask %#x", r.MGID(), r.PortGID(), r.JoinState(), m.CompMask())
	}
	return s
}

func describeResp(rs []mad.MAD) string {
	switch len(rs) {
	case 0:
		return "no answer"
	case 1:
		return fmt.Sprintf("status %#04x", rs[0].Status())
	}
	return fmt.Sprintf("%d RMPP segments", len(rs))
}
