package sm

import (
	"context"
	"runtime"
	"time"
)

func (s *SM) expiryLoop(ctx context.Context) {
	t := time.NewTicker(max(min(s.timeout/5, 500*time.Millisecond), time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if !s.expire(now) {
				return
			}
			s.saveIfDirty(now)
			s.logSocketDrops()
			s.flushDiscards(now)
		}
	}
}

// expire forgets the ports silent since before now - PortTimeout, the
// longest silent first (O(forgotten), at most expireBatch under one hold
// of mu); false once the SM is closed.
func (s *SM) expire(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n := 0; ; n++ {
		if s.closed {
			return false
		}
		p := s.lruOld
		if p == nil || now.Sub(p.lastSeen) <= s.timeout {
			return true
		}
		s.logf("port %#x (LID %d) silent for %v: forgotten", p.guid, p.lid, s.timeout)
		s.detachLocked(p)
		if n == expireBatch {
			n = 0
			s.mu.Unlock()
			runtime.Gosched() // let the reader and the control goroutine in
			s.mu.Lock()
		}
	}
}

// lruTouch makes p the most recently seen attached port. Caller holds mu.
func (s *SM) lruTouch(p *port) {
	s.lruRemove(p)
	p.older, p.newer, p.inLRU = s.lruNew, nil, true
	if s.lruNew != nil {
		s.lruNew.newer = p
	} else {
		s.lruOld = p
	}
	s.lruNew = p
}

// lruRemove takes p out of the list of attached ports. Caller holds mu.
func (s *SM) lruRemove(p *port) {
	if !p.inLRU {
		return
	}
	if p.older != nil {
		p.older.newer = p.newer
	} else {
		s.lruOld = p.newer
	}
	if p.newer != nil {
		p.newer.older = p.older
	} else {
		s.lruNew = p.older
	}
	p.older, p.newer, p.inLRU = nil, nil, false
}
