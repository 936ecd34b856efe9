package sm

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
	"unicode/utf8"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/sa"
)

// ctlMsg is a control message waiting for the control goroutine.
type ctlMsg struct {
	b    []byte
	from netip.AddrPort
}

// fifo is a first-in first-out queue.
type fifo[T any] struct {
	q    []T
	head int
}

func (f *fifo[T]) len() int { return len(f.q) - f.head }

func (f *fifo[T]) push(v T) { f.q = append(f.q, v) }

func (f *fifo[T]) pop() T {
	var zero T
	v := f.q[f.head]
	f.q[f.head] = zero
	f.head++
	if f.head == len(f.q) {
		f.q, f.head = f.q[:0], 0
	} else if f.head >= 1024 && f.head*2 >= len(f.q) {
		f.q = append(f.q[:0], f.q[f.head:]...)
		f.head = 0
	}
	return v
}

// controlIn queues a control message for the control goroutine (the
// reader's part: O(1)). A message from an attached port's address is
// taken within the port's budget (ControlBurst, ControlRate) and waits
// with the port's others (at most portPending): the control goroutine
// serves the attached ports round robin, so that no flood of them delays
// a port's keepalive by more than one message of each. Any other message
// waits in one queue of at most newQueue. Beyond, it is dropped. Caller
// holds mu.
func (s *SM) controlIn(b []byte, from netip.AddrPort, now time.Time) {
	if len(b) > MaxControlLen {
		s.ctlDrops.Add(1)
		s.limitedf(&s.logDrop, now, "control message of %d bytes from %v: dropped (longer than %d)", len(b), from, MaxControlLen)
		return
	}
	m := ctlMsg{from: from}
	if p := s.byAddr[from]; p != nil {
		if !p.budget.allow(now, ControlBurst, ControlRate) || len(p.pending) == portPending {
			s.throttled.Add(1)
			s.limitedf(&s.logThrottle, now, "control message from %v (port %#x): dropped, beyond %d a second", from, p.guid, ControlRate)
			return
		}
		m.b = append([]byte(nil), b...)
		if len(p.pending) == 0 {
			s.ctlPorts.push(p)
		}
		p.pending = append(p.pending, m)
	} else {
		if max := s.cfg.MaxPortsPerSource; max > 0 && s.perSource[from.Addr().Unmap()] >= max &&
			!s.refusals.allow(now, RefusalRate, RefusalRate) {
			s.sourceLimit.Add(1)
			s.limitedf(&s.logSource, now, "control message from %v: dropped unread, %d ports attached from %v, the most one source address may attach",
				from, max, from.Addr().Unmap())
			return
		}
		if s.ctlNew.len() == newQueue {
			s.ctlDrops.Add(1)
			s.limitedf(&s.logDrop, now, "control message from %v: dropped, %d from unattached addresses wait already", from, newQueue)
			return
		}
		m.b = append([]byte(nil), b...)
		s.ctlNew.push(m)
	}
	select {
	case s.ctlWake <- struct{}{}:
	default:
	}
}

// nextControl takes the next control message to handle: attached ports
// round robin, and the rest's queue, in turns. Caller holds mu.
func (s *SM) nextControl() (ctlMsg, bool) {
	known, other := s.ctlPorts.len() > 0, s.ctlNew.len() > 0
	if other && (!known || s.ctlTurn) {
		s.ctlTurn = false
		return s.ctlNew.pop(), true
	}
	if !known {
		return ctlMsg{}, false
	}
	s.ctlTurn = true
	p := s.ctlPorts.pop()
	m := p.pending[0]
	p.pending[0] = ctlMsg{}
	p.pending = p.pending[1:]
	if len(p.pending) > 0 {
		s.ctlPorts.push(p)
	} else {
		p.pending = nil
	}
	return m, true
}

// controlLoop handles the queued control messages until Close.
func (s *SM) controlLoop() {
	for {
		select {
		case <-s.ctlWake:
		case <-s.quit:
			return
		}
		for {
			s.mu.Lock()
			m, ok := s.nextControl()
			closed := s.closed
			s.mu.Unlock()
			if !ok || closed {
				break
			}
			s.handleControl(m.b, m.from)
		}
	}
}

func (s *SM) handleControl(b []byte, from netip.AddrPort) {
	c, err := fabric.DecodeControl(b)
	if errors.Is(err, fabric.ErrVersion) {
		s.otherVersion(b, from)
		return
	}
	if err != nil {
		s.limitedf(&s.logBad, time.Now(), "bad control message from %v: %v", from, err)
		return
	}
	switch c.Type {
	case fabric.TypeAttach:
		if c.GUID == 0 {
			s.limitedf(&s.logBad, time.Now(), "attach without GUID from %v", from)
			return
		}
		if !s.proven(c, from, len(b)) {
			return
		}
		lid, rereg, win, err := s.attach(c.GUID, c.NodeDesc, from, c.Credits)
		if err != nil {
			s.refuse(c.GUID, c.Nonce, from, err)
			return
		}
		if s.ext != nil {
			s.extAttached(c.GUID, c.Nonce, from, rereg, c.Credits)
			return
		}
		reply := fabric.EncodeControl(s.sign(&fabric.Control{
			Type: fabric.TypePortInfo, GUID: c.GUID, LID: lid, SMLID: fabric.SMLID,
			SubnetPrefix: s.prefix, PKeys: []uint16{fabric.DefaultPKey}, Epoch: s.epoch,
			MTU: fabric.PortMTU, Rate: fabric.PortRate, State: fabric.StateActive,
			ClientReregister: rereg, Credits: win,
			Session: s.session(from, c.GUID), SMGUID: s.cfg.SMGUID, Direct: s.direct(),
		}, c.Nonce))
		if _, err := s.fabric.WriteToUDPAddrPort(reply, from); err != nil {
			s.logf("port_info to %v: %v", from, err)
		}
	case fabric.TypeDetach:
		s.mu.Lock()
		if p := s.byAddr[from]; p != nil && (c.GUID == 0 || c.GUID == p.guid) {
			s.logf("port %#x (LID %d) detached", p.guid, p.lid)
			s.detachLocked(p)
			if s.ext != nil {
				// The model's link goes down now, and the switch tells
				// OpenSM (trap 128), which sweeps at once.
				defer s.ext.linkChanged()
			}
		} else {
			s.foreignDetach.Add(1)
			s.limitedf(&s.logForeign, time.Now(), "detach of %#x from %v ignored: not the port's address", c.GUID, from)
		}
		s.mu.Unlock()
	default:
		s.limitedf(&s.logBad, time.Now(), "unknown control message %q from %v", c.Type, from)
	}
}

// proven reports whether the attach c (len bytes) comes from an address
// proven for its GUID: the GUID's port is registered at from, or c carries
// a valid cookie for from and the GUID. Otherwise it answers with a retry
// (when that is no longer than the attach) and nothing else happens.
func (s *SM) proven(c *fabric.Control, from netip.AddrPort, n int) bool {
	s.mu.Lock()
	p := s.byGUID[c.GUID]
	registered := p != nil && p.attached() && p.addr == from
	s.mu.Unlock()
	if registered {
		return true
	}
	now := time.Now()
	w := cookieWindow(now)
	if len(c.Cookie) > 0 {
		if hmac.Equal(c.Cookie, s.cookie(from, c.GUID, w)) || hmac.Equal(c.Cookie, s.cookie(from, c.GUID, w-1)) {
			return true
		}
		s.badCookies.Add(1)
		s.limitedf(&s.logCookie, now, "attach of %#x from %v: wrong or expired cookie, answered with a retry", c.GUID, from)
	}
	retry := fabric.EncodeControl(&fabric.Control{Type: fabric.TypeRetry, GUID: c.GUID, Cookie: s.cookie(from, c.GUID, w)})
	if len(retry) > n {
		s.unpadded.Add(1)
		s.limitedf(&s.logUnpadded, now, "attach of %#x from %v: %d bytes from an unproven address, shorter than a retry (%d): dropped", c.GUID, from, n, len(retry))
		return false
	}
	// Counted before it leaves, so that whoever reads the answer finds
	// it counted.
	s.retries.Add(1)
	if _, err := s.fabric.WriteToUDPAddrPort(retry, from); err != nil {
		s.sendErrors.Add(1)
		s.limitedf(&s.logRetry, now, "retry to %v: %v", from, err)
		return false
	}
	s.limitedf(&s.logRetry, now, "attach of %#x from %v: address not proven yet, answered with a retry", c.GUID, from)
	return false
}

// cookieWindow is the cookie time unit of t (fabric.CookieWindow).
func cookieWindow(t time.Time) int64 { return t.UnixNano() / int64(fabric.CookieWindow) }

// cookie is the cookie of a retry to from for guid in time unit w: an
// HMAC-SHA256 of them under the SM's secret, cut to fabric.CookieLen.
func (s *SM) cookie(from netip.AddrPort, guid uint64, w int64) []byte {
	var b [16 + 2 + 8 + 8]byte
	a := from.Addr().Unmap().As16()
	copy(b[:16], a[:])
	binary.BigEndian.PutUint16(b[16:], from.Port())
	binary.BigEndian.PutUint64(b[18:], guid)
	binary.BigEndian.PutUint64(b[26:], uint64(w))
	m := hmac.New(sha256.New, s.secret[:])
	m.Write(b[:])
	return m.Sum(nil)[:fabric.CookieLen]
}

// sign sets c's MAC for the attach of nonce when the SM has a key (an
// attach without a nonce gets no MAC: its port cannot check one).
func (s *SM) sign(c *fabric.Control, nonce []byte) *fabric.Control {
	if len(s.cfg.Key) > 0 && len(nonce) > 0 && len(nonce) <= 2*fabric.NonceLen {
		c.MAC = fabric.ControlMAC(s.cfg.Key, nonce, c)
	}
	return c
}

// session is the Session token of the port of guid at from: an HMAC of
// them under the SM's secret (random per SM start), so that it is the
// same in every port_info of this SM to that port and nobody but the SM
// and the port knows it.
func (s *SM) session(from netip.AddrPort, guid uint64) []byte {
	var b [7 + 16 + 2 + 8]byte
	copy(b[:7], "session")
	a := from.Addr().Unmap().As16()
	copy(b[7:23], a[:])
	binary.BigEndian.PutUint16(b[23:], from.Port())
	binary.BigEndian.PutUint64(b[25:], guid)
	m := hmac.New(sha256.New, s.secret[:])
	m.Write(b[:])
	return m.Sum(nil)[:fabric.SessionLen]
}

// otherVersion answers an attach of another protocol version with a
// refused (fabric.ReasonVersion) in that version, when the refusal is no
// longer than the attach; anything else of another version is dropped.
func (s *SM) otherVersion(b []byte, from netip.AddrPort) {
	now := time.Now()
	c, v, err := fabric.DecodeControlAnyVersion(b)
	if err != nil || c.Type != fabric.TypeAttach || c.GUID == 0 {
		s.limitedf(&s.logBad, now, "control message of protocol version %d from %v: dropped", fabric.ControlVersion(b), from)
		return
	}
	s.oldVersion.Add(1)
	r := fabric.EncodeControlVersion(&fabric.Control{Type: fabric.TypeRefused, GUID: c.GUID, Reason: fabric.ReasonVersion}, v)
	if len(r) > len(b) {
		s.limitedf(&s.logVersion, now, "attach of %#x from %v: protocol version %d, this SM speaks %d: dropped (a refusal would be longer)", c.GUID, from, v, fabric.Version)
		return
	}
	if _, err := s.fabric.WriteToUDPAddrPort(r, from); err != nil {
		s.sendErrors.Add(1)
		s.limitedf(&s.logVersion, now, "refused to %v: %v", from, err)
		return
	}
	s.limitedf(&s.logVersion, now, "attach of %#x from %v: protocol version %d, this SM speaks %d: refused", c.GUID, from, v, fabric.Version)
}

// errLive refuses an attach for a GUID registered at another address.
var errLive = errors.New("the GUID is registered at another address")

// ErrSourceLimit reports that the attach's source IP address has
// Config.MaxPortsPerSource ports attached: the attach is refused.
var ErrSourceLimit = errors.New("sm: the source address has the most ports it may attach")

// refuse answers a refused attach with a "refused" control message, so
// that the port fails at once instead of waiting for a port_info.
func (s *SM) refuse(guid uint64, nonce []byte, to netip.AddrPort, err error) {
	reason := fabric.ReasonGUIDInUse
	switch {
	case errors.Is(err, ErrNoLID):
		reason = fabric.ReasonNoLID
	case errors.Is(err, ErrSourceLimit):
		reason = fabric.ReasonSourceLimit
	}
	b := fabric.EncodeControl(s.sign(&fabric.Control{Type: fabric.TypeRefused, GUID: guid, Reason: reason}, nonce))
	if _, err := s.fabric.WriteToUDPAddrPort(b, to); err != nil {
		s.logf("refused to %v: %v", to, err)
	}
}

// attach registers or refreshes a port and returns its LID, whether the
// port registers anew (its memberships, if it had any, are gone) and the
// switch's receive window for it (0 when the port offers no credits: its
// links are not flow controlled).
func (s *SM) attach(guid uint64, desc string, from netip.AddrPort, credits int) (lid uint16, rereg bool, win int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	p := s.byGUID[guid]
	if p != nil && p.attached() && p.addr != from {
		if now.Sub(p.lastSeen) <= s.timeout {
			s.refusedAttach.Add(1)
			s.limitedf(&s.logRefused, now, "attach of %#x from %v refused: %v (%v)", guid, from, errLive, p.addr)
			return 0, false, 0, fmt.Errorf("%w (%v)", errLive, p.addr)
		}
		s.logf("port %#x (LID %d) silent for %v: forgotten", p.guid, p.lid, s.timeout)
		s.detachLocked(p)
		p = s.byGUID[guid]
	}
	other := s.byAddr[from]
	if (p == nil || !p.attached()) && other == nil && s.cfg.MaxPortsPerSource > 0 &&
		s.perSource[from.Addr().Unmap()] >= s.cfg.MaxPortsPerSource {
		s.sourceLimit.Add(1)
		s.limitedf(&s.logSource, now, "attach of %#x from %v refused: %d ports attached from %v, the most one source address may attach",
			guid, from, s.cfg.MaxPortsPerSource, from.Addr().Unmap())
		return 0, false, 0, ErrSourceLimit
	}
	if other != nil && other != p {
		// The socket's own owner attaches another GUID: its old port goes.
		s.logf("port %#x replaced by %#x at %v", other.guid, guid, from)
		s.detachLocked(other)
	}
	if p == nil {
		lid, err := s.lids.lidFor(guid)
		if err != nil {
			s.noLIDAttach.Add(1)
			s.limitedf(&s.logNoLID, now, "attach of %#x from %v refused: %v", guid, from, err)
			return 0, false, 0, err
		}
		p = &port{guid: guid, lid: lid}
		s.byGUID[guid] = p
		s.byLID[p.lid] = p
		s.stateDirty = s.cfg.StateFile != ""
	}
	rereg = !p.attached()
	if len(desc) > MaxNodeDesc {
		desc = cutUTF8(desc, MaxNodeDesc)
	}
	if rereg {
		if s.ext != nil {
			s.logf("port %#x attached at %v: %q, its LID OpenSM's", guid, from, desc)
		} else {
			s.logf("port %#x attached at %v: LID %d %q", guid, from, p.lid, desc)
		}
		p.addr = from
		s.byAddr[from] = p
		s.perSource[from.Addr().Unmap()]++
		s.resizeWindows()
		credits = min(max(credits, 0), fabric.MaxWindow)
		p.ls.link.Reset(credits, s.win)
		p.ls.stallCount, p.ls.dropUntil = 0, time.Time{}
		if s.direct() {
			// Routes to the LID (a port that went, or none) change.
			s.dchanged = append(s.dchanged, p.lid)
			s.directChanged(now)
		}
	}
	if !s.sa.HasPort(guid) {
		s.sa.AddPort(sa.Port{GUID: guid, LID: p.lid, MTU: fabric.PortMTU, Rate: fabric.PortRate})
	}
	if p.desc != desc {
		p.desc = desc
	}
	p.lastSeen = now
	s.lruTouch(p)
	if p.ls.link.On {
		win = s.win
	}
	return p.lid, rereg, win, nil
}

// cutUTF8 cuts s to at most n bytes, not inside a UTF-8 sequence.
func cutUTF8(s string, n int) string {
	for n > 0 && n < len(s) && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// resizeWindows shares the fabric socket's buffer among the attached
// ports: a port's window (the most packets it may have in flight to the
// switch) shrinks as ports attach; credit already granted stays, and a
// window that grew is advertised when the port next asks for credit or
// its queue drains. O(1). Caller holds mu.
func (s *SM) resizeWindows() {
	s.win = fabric.Window(s.rcvbuf, len(s.byAddr))
}

// detachLocked removes a port's attachment and memberships; ports that
// were not pre-registered are forgotten (their LID stays reserved).
func (s *SM) detachLocked(p *port) {
	if p.attached() {
		if s.direct() {
			s.directGone(p, time.Now())
		}
		delete(s.byAddr, p.addr)
		src := p.addr.Addr().Unmap()
		if s.perSource[src]--; s.perSource[src] <= 0 {
			delete(s.perSource, src)
			delete(s.saSources, src) // transfers and queries keep their pointer
		}
		p.addr = netip.AddrPort{}
		p.c.drops.Add(uint64(p.ls.dropQueue())) // a port that went down loses what it sent
		p.ls.link = fabric.Link{}
		p.ls.wantFlow = false
		p.budget, p.saBudget, p.tableBudget = bucket{}, bucket{}, bucket{}
		s.lruRemove(p)
		s.resizeWindows()
	}
	// The SA marks the MLIDs of the port's memberships changed: the
	// forwarding table follows entry by entry (rebuildMFT).
	if p.pre {
		s.sa.LeaveAll(p.guid)
	} else {
		s.sa.RemovePort(p.guid)
		delete(s.byGUID, p.guid)
		delete(s.byLID, p.lid)
		s.lids.forget(p.guid)
	}
	if s.direct() {
		s.rebuildMFT() // the groups it left: their routes change
		s.directChanged(time.Now())
	}
}

// rebuildMFT brings the multicast forwarding table up to date: the
// entries of the MLIDs the SA changed (all of it the first time). A port
// that attaches has no memberships yet, and a port that goes loses its
// memberships at the SA, so attachments need no full rebuild. Caller
// holds mu (or is New).
func (s *SM) rebuildMFT() {
	if s.mft != nil && s.mftVer == s.sa.Version() {
		return
	}
	if s.mft != nil {
		for _, mlid := range s.sa.TakeChanged() {
			if len(s.dsubs[mlid]) > 0 {
				s.dchanged = append(s.dchanged, mlid) // direct.go
			}
			if guids, ok := s.sa.MulticastEntry(mlid); ok {
				s.mft[mlid] = s.portsOf(guids)
			} else {
				delete(s.mft, mlid)
			}
		}
		s.mftVer = s.sa.Version()
		return
	}
	s.sa.TakeChanged()
	mft := make(map[uint16][]*port)
	for mlid, guids := range s.sa.MulticastTable() {
		mft[mlid] = s.portsOf(guids)
	}
	s.mft, s.mftVer = mft, s.sa.Version()
}

// portsOf returns the known ports among guids. Caller holds mu.
func (s *SM) portsOf(guids []uint64) []*port {
	var ps []*port
	for _, g := range guids {
		if p := s.byGUID[g]; p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}
