package sm

import (
	"bytes"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
)

// nextDirect returns the next direct forwarding message the fake port
// got, skipping IB packets; it fails the test after waitTimeout.
func (p *fakePort) nextDirect() *fabric.Direct {
	p.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for time.Now().Before(deadline) {
		b := p.recv(time.Until(deadline))
		if b == nil {
			break
		}
		if fabric.IsDirect(b) {
			m := new(fabric.Direct)
			if err := fabric.DecodeDirect(b, m); err != nil {
				p.t.Fatalf("port %#x: %v", p.guid, err)
			}
			return m
		}
	}
	p.t.Fatalf("port %#x: no direct forwarding message", p.guid)
	return nil
}

func (p *fakePort) sendDirect(m *fabric.Direct) {
	if _, err := p.conn.WriteToUDPAddrPort(fabric.AppendDirect(nil, m), p.sm); err != nil {
		p.t.Fatal(err)
	}
}

// TestDirectPairing: a port's query for a LID makes the SM ask both
// ports to take each other (each message with its port's session token);
// the route answers the query with the destination when both took the
// other, and with none (through the switch) when one had no room, the
// other port then told its peer is gone; Stats counts both.
func TestDirectPairing(t *testing.T) {
	s := startSM(t, Config{})
	for _, refuse := range []bool{false, true} {
		a, b := newFakePort(t, s.FabricAddr(), 0xd100+uint64(btoi(refuse))), newFakePort(t, s.FabricAddr(), 0xd200+uint64(btoi(refuse)))
		sessA, sessB := s.session(addrOf(a.conn), a.guid), s.session(addrOf(b.conn), b.guid)
		a.send(b.LID(), false, [16]byte{}, 2, 1, []byte("first"))
		a.sendDirect(&fabric.Direct{Type: fabric.DirectRouteQuery, Seq: 7, DLID: b.LID()})
		pa, pb := a.nextDirect(), b.nextDirect()
		if pa.Type != fabric.DirectPeer || len(pa.Peers) != 1 || pa.Peers[0].GUID != b.guid || pa.Peers[0].LID != b.LID() || !bytes.Equal(pa.Session, sessA) {
			t.Fatalf("a got %+v, want a peer message about b with a's session", pa)
		}
		if pb.Type != fabric.DirectPeer || len(pb.Peers) != 1 || pb.Peers[0].GUID != a.guid || !bytes.Equal(pb.Session, sessB) {
			t.Fatalf("b got %+v, want a peer message about a with b's session", pb)
		}
		a.sendDirect(&fabric.Direct{Type: fabric.DirectPeerOK, PeerGUID: b.guid, OK: true})
		b.sendDirect(&fabric.Direct{Type: fabric.DirectPeerOK, PeerGUID: a.guid, OK: !refuse})
		m := a.nextDirect()
		if refuse && m.Type == fabric.DirectPeerGone {
			if m.PeerGUID != b.guid {
				t.Fatalf("a: peer_gone of %#x, want b", m.PeerGUID)
			}
			m = a.nextDirect()
		}
		if m.Type != fabric.DirectRoute || m.Seq != 7 || m.DLID != b.LID() {
			t.Fatalf("a got %+v, want the route answering query 7", m)
		}
		switch {
		case refuse && len(m.Peers) != 0:
			t.Errorf("b refused, yet the route is %+v", m.Peers)
		case !refuse && (len(m.Peers) != 1 || m.Peers[0].GUID != b.guid || m.HOQLife != DefaultHOQLife || m.VLStallCount != DefaultVLStallCount):
			t.Errorf("route %+v (HOQLife %v, VLStallCount %d), want b with the switch's rules", m.Peers, m.HOQLife, m.VLStallCount)
		}
	}
	st := s.Stats()
	if st.DirectPairs != 1 || st.DirectRefusedPairs != 1 || st.DirectRoutes != 2 || st.DirectDrops != 0 {
		t.Errorf("Stats: pairs %d refused %d routes %d drops %d, want 1 1 2 0", st.DirectPairs, st.DirectRefusedPairs, st.DirectRoutes, st.DirectDrops)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
