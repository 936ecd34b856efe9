package sm

import (
	"fmt"
	"maps"
	"net/netip"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// FuzzSMDatagrams drives an SM (no goroutines: its handlers are called
// directly) with a sequence of datagrams decoded from the input: attach
// (without a cookie, with a valid, an expired or a wrong one), detach, SA
// joins and leaves over the fabric, raw bytes (of this protocol version
// or version 1), from one of four addresses, for one of six GUIDs, with
// expiry steps. An attach from an address not proven for its GUID (not
// the GUID's registered address, no valid cookie) changes nothing: no
// port, LID or address registered or dropped. After every step:
// no two registered ports share a LID, every LID is unicast (2..0xBFFF),
// byLID/byAddr agree with the ports, and the SA holds memberships only of
// attached ports, or of pre-registered ports (they exist without a client
// process, as ports an SM knows from its configuration: another port of
// their partition may join them by proxy, as in OpenSM).
//
// Each input gets a fresh SM state (newState: what New builds, minus the
// sockets); all share one fabric socket, bound once, for their answers.
func FuzzSMDatagrams(f *testing.F) {
	f.Add([]byte{0, 0, 0, 2, 0, 1, 0, 0, 1, 1, 1, 0, 3, 1, 0, 0})
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 2, 0, 1, 4, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 3})
	f.Add([]byte{0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 2, 0, 0, 3, 5, 0, 0, 0, 0, 1, 0, 0})
	cfg := Config{Listen: "127.0.0.1:0", SendOnlySupport: true, MaxLID: 5, PortTimeout: time.Second, Ports: []uint64{0x10}}
	shared, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { shared.Close() })
	guids := []uint64{0x10, 0x11, 0x12, 0x13, 0x14, 0x15}
	addrs := make([]netip.AddrPort, 4)
	for i := range addrs {
		// Unbound loopback ports: the SM's answers go nowhere.
		addrs[i] = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(1+i))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		s, err := newState(cfg)
		if err != nil {
			t.Fatal(err)
		}
		s.fabric = shared.fabric // not closed here: Close would close it
		smSteps(t, s, addrs, guids, in)
	})
}

// smSteps runs the steps FuzzSMDatagrams decodes from in on s, checking
// the SM after each.
func smSteps(t testing.TB, s *SM, addrs []netip.AddrPort, guids []uint64, in []byte) {
	now := time.Now()
	for len(in) >= 4 && len(in) < 4096 {
		op, a, g, x := in[0]%6, addrs[in[1]%4], guids[in[2]%6], in[3]
		in = in[4:]
		switch op {
		case 0:
			c := &fabric.Control{Type: fabric.TypeAttach, GUID: g}
			w := cookieWindow(time.Now())
			switch x % 4 {
			case 1:
				c.Cookie = s.cookie(a, g, w)
			case 2: // expired
				c.Cookie = s.cookie(a, g, w-2)
			case 3: // wrong
				c.Cookie = s.cookie(a, g, w)
				c.Cookie[x%fabric.CookieLen] ^= x | 1
			}
			s.mu.Lock()
			p := s.byGUID[g]
			proven := x%4 == 1 || (p != nil && p.attached() && p.addr == a)
			s.mu.Unlock()
			before := registry(s)
			s.handleControl(fabric.EncodeControl(c), a)
			if after := registry(s); !proven && after != before {
				t.Fatalf("attach of %#x from %v (cookie case %d), not proven, changed the ports:\n%s\n→\n%s", g, a, x%4, before, after)
			}
		case 1:
			s.handleControl(fabric.EncodeControl(&fabric.Control{Type: fabric.TypeDetach, GUID: g}), a)
		case 2, 3: // an SA join (2) or leave (3) for g with join state x
			method := uint8(mad.MethodSet)
			comp := uint64(mad.CompCreateRequired)
			if op == 3 {
				method, comp = mad.MethodDelete, mad.CompJoinRequired
			}
			mgid := wire.GID{0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 15: x >> 4}
			s.handlePacket(saPacket(s, a, mcReq(method, comp, mgid, g, x&0x0f)), a)
		case 4: // raw bytes as a packet or a control message
			n := min(int(x), len(in))
			b := in[:n]
			in = in[n:]
			switch x & 3 {
			case 0:
				b = append([]byte(fabric.Magic), b...)
			case 2:
				b = append([]byte("SRSM\x01"), b...)
			case 3: // a direct forwarding message (a query or a peer answer)
				m := fabric.Direct{Type: fabric.DirectRouteQuery, Seq: uint32(x), DLID: uint16(n)%8 + 1}
				if n%3 == 0 {
					m.DLID = 0xC000 + uint16(x%4)
				}
				if n%2 == 1 {
					m = fabric.Direct{Type: fabric.DirectPeerOK, PeerGUID: guids[int(x)%len(guids)], OK: x&4 != 0}
				}
				b = fabric.AppendDirect(nil, &m)
			}
			s.handlePacket(b, a)
			if fabric.IsControl(b) {
				s.handleControl(b, a)
			}
		case 5: // time passes
			now = now.Add(time.Duration(x) * 50 * time.Millisecond)
			s.expire(now)
		}
		checkSM(t, s)
	}
}

// saPacket wraps an SA MAD in a UD packet from the port at a (SLID: its
// LID, or 2 when none is attached there) to the SA.
func saPacket(s *SM, a netip.AddrPort, m mad.MAD) []byte {
	s.mu.Lock()
	slid := uint16(2)
	if p := s.byAddr[a]; p != nil {
		slid = p.lid
	}
	s.mu.Unlock()
	p := fabric.UDPacket{DLID: fabric.SMLID, SLID: slid,
		UD: wire.UDHeader{PKey: 0xffff, DestQP: fabric.SAQPN, QKey: fabric.SAQKey, SrcQP: 1}}
	b := make([]byte, fabric.PacketLen(len(m), false, false))
	return b[:fabric.EncodeUD(b, &p, m)]
}

// registry describes the SM's ports: GUID, LID and address of each.
func registry(s *SM) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := ""
	for _, p := range s.sortedPorts() {
		out += fmt.Sprintf("%#x LID %d at %v; ", p.guid, p.lid, p.addr)
	}
	return out
}

func checkSM(t testing.TB, s *SM) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[uint16]uint64{}
	for guid, p := range s.byGUID {
		if p.guid != guid || !validUnicast(p.lid) || p.lid > s.lids.max {
			t.Fatalf("port %#x has LID %#x", guid, p.lid)
		}
		if o, ok := seen[p.lid]; ok {
			t.Fatalf("ports %#x and %#x share LID %d", o, guid, p.lid)
		}
		seen[p.lid] = guid
		if s.byLID[p.lid] != p {
			t.Fatalf("byLID[%d] is not port %#x", p.lid, guid)
		}
		if p.attached() && s.byAddr[p.addr] != p {
			t.Fatalf("byAddr[%v] is not port %#x", p.addr, guid)
		}
	}
	for a, p := range s.byAddr {
		if s.byGUID[p.guid] != p || p.addr != a {
			t.Fatalf("byAddr[%v] holds a stale port %#x", a, p.guid)
		}
	}
	// The bookkeeping that spares the SM walking every port: ports per
	// source, the expiry list, the forwarder's list, the window.
	perSource := map[netip.Addr]int{}
	for a := range s.byAddr {
		perSource[a.Addr().Unmap()]++
	}
	if !maps.Equal(perSource, s.perSource) {
		t.Fatalf("perSource %v, want %v", s.perSource, perSource)
	}
	n := 0
	for p, older := s.lruOld, (*port)(nil); p != nil; older, p = p, p.newer {
		if !p.attached() || !p.inLRU || p.older != older || (older != nil && p.lastSeen.Before(older.lastSeen)) {
			t.Fatalf("expiry list broken at port %#x", p.guid)
		}
		n++
	}
	if n != len(s.byAddr) {
		t.Fatalf("expiry list holds %d ports, %d are attached", n, len(s.byAddr))
	}
	onList := map[*port]int{}
	for _, p := range s.visit {
		onList[p]++
		if !p.ls.active || onList[p] > 1 {
			t.Fatalf("forwarder's list: port %#x active %v, listed %d times", p.guid, p.ls.active, onList[p])
		}
	}
	for _, p := range s.byAddr {
		if p.ls.in.n > 0 && onList[p] == 0 {
			t.Fatalf("port %#x has %d packets queued and is not on the forwarder's list", p.guid, p.ls.in.n)
		}
	}
	if w := fabric.Window(s.rcvbuf, len(s.byAddr)); s.win != w && len(s.byAddr) > 0 {
		t.Fatalf("window %d, want %d", s.win, w)
	}
	// Direct forwarding: the route holders of each DLID are the ports
	// holding its route, all attached; a pairing's ends are peers of each
	// other (or it was refused).
	for dlid, subs := range s.dsubs {
		for p := range subs {
			if !p.attached() || p.dir.routes[dlid] == nil {
				t.Fatalf("DLID %#x: route holder %#x attached %v, holds it %v", dlid, p.guid, p.attached(), p.dir.routes[dlid] != nil)
			}
		}
	}
	for _, p := range s.byGUID {
		if !p.attached() && (len(p.dir.routes) > 0 || len(p.dir.peers) > 0 || len(p.dir.refused) > 0) {
			t.Fatalf("detached port %#x keeps %d routes, %d peers, %d refusals", p.guid, len(p.dir.routes), len(p.dir.peers), len(p.dir.refused))
		}
		for g := range p.dir.refused {
			if q := s.byGUID[g]; q == nil || !q.attached() {
				t.Fatalf("port %#x keeps a refusal of %#x, which is gone", p.guid, g)
			}
		}
		for dlid := range p.dir.routes {
			if _, ok := s.dsubs[dlid][p]; !ok {
				t.Fatalf("port %#x holds DLID %#x's route but is not listed", p.guid, dlid)
			}
		}
	}
	for k := range s.dpairs {
		a, b := s.byGUID[k.a], s.byGUID[k.b]
		if a == nil || b == nil || !a.dir.peers[k.b] || !b.dir.peers[k.a] {
			t.Fatalf("pairing %#x–%#x: not peers of each other", k.a, k.b)
		}
	}
	for _, g := range s.sa.Groups() {
		if !wire.IsMulticastLID(g.Rec.MLID) {
			t.Fatalf("group %v has MLID %#x", g.Rec.MGID, g.Rec.MLID)
		}
		for _, m := range g.Members {
			p := s.byGUID[m.GUID]
			if p == nil || !(p.attached() || p.pre) {
				t.Fatalf("group %v holds port %#x, which is not attached", g.Rec.MGID, m.GUID)
			}
		}
	}
}
