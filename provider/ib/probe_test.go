package ib

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/provider/softverbs"
)

// TestDirectProbe: a port asked to probe a peer (the SM's peer message
// with OK) takes it only once the peer answered its request for credit,
// proving that the two reach each other directly; a peer that never
// answers (a firewall between them) gets probeTries requests, and the
// port then tells the SM no.
func TestDirectProbe(t *testing.T) {
	f := startFakeSM(t)
	sess := bytes.Repeat([]byte{7}, fabric.SessionLen)
	f.setPortInfo(func(c *fabric.Control) { c.Direct, c.Session = true, sess })
	d := openOn(t, f, "127.0.3.41")
	defer d.Close()
	for _, answers := range []bool{true, false} {
		peer, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 3, 42)})
		if err != nil {
			t.Fatal(err)
		}
		defer peer.Close()
		guid := uint64(0x70)
		if !answers {
			guid = 0x71
		}
		f.send(fabric.AppendDirect(nil, &fabric.Direct{Type: fabric.DirectPeer, Session: sess, OK: true,
			Peers: []fabric.Peer{{GUID: guid, LID: 9, Addr: peer.LocalAddr().(*net.UDPAddr).AddrPort()}}}))
		requests := 0
		buf := make([]byte, 64)
		for want := 1; !answers && want <= probeTries || answers && want <= 1; want++ {
			peer.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, from, err := peer.ReadFromUDPAddrPort(buf)
			if err != nil {
				t.Fatalf("peer %#x: request %d: %v", guid, want, err)
			}
			if fl, err := fabric.DecodeFlow(buf[:n]); err != nil || fl.Op != fabric.FlowOpRequest {
				t.Fatalf("peer %#x got %x, want a request for credit", guid, buf[:n])
			} else if answers {
				var fb [fabric.FlowLen]byte
				peer.WriteToUDPAddrPort(fabric.EncodeFlow(fb[:], fabric.Flow{FCCL: 16}), netip.AddrPortFrom(from.Addr().Unmap(), from.Port()))
			}
			requests++
		}
		var got fabric.Direct
		f.waitUntil(func() bool {
			for _, m := range f.directs {
				if m.Type == fabric.DirectPeerOK && m.PeerGUID == guid {
					got = m
					return true
				}
			}
			return false
		}, func() string { return "no peer_ok" })
		if got.OK != answers {
			t.Errorf("peer %#x (answers %v): peer_ok %v after %d requests", guid, answers, got.OK, requests)
		}
		d.dmu.Lock()
		pl := d.dir.byGUID[guid]
		d.dmu.Unlock()
		credits := 0
		if pl != nil {
			d.lmu.Lock()
			credits = pl.link.Credits()
			d.lmu.Unlock()
		}
		if answers && (pl == nil || credits != 16) {
			t.Errorf("the answered peer: %v, %d credits, want a link with the 16 credits it granted", pl != nil, credits)
		}
		if !answers && pl != nil {
			t.Errorf("the silent peer is still a peer")
		}
	}
}

// TestDirectDiscards: a port sending to a peer directly keeps the
// switch's head-of-queue rules: with 2 credits from the peer, 2 packets
// go; each later one waits the route's lifetime and is discarded
// (direct_discards), and after VLStallCount in a row the rest is
// discarded at once (8 × the lifetime), so that the sender is not held
// back by a peer that takes nothing; every packet is accounted for.
func TestDirectDiscards(t *testing.T) {
	f := startFakeSM(t)
	sess := bytes.Repeat([]byte{7}, fabric.SessionLen)
	f.setPortInfo(func(c *fabric.Control) { c.Direct, c.Session = true, sess })
	d, q := openLinked(t, f, "127.0.3.51", 0, time.Second)
	peer, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 3, 52)})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	const guid, lid = 0x72, 7 // udSend sends to DLID 7
	// The peer, taken without a probe; its grant of 2 credits.
	f.send(fabric.AppendDirect(nil, &fabric.Direct{Type: fabric.DirectPeer, Session: sess,
		Peers: []fabric.Peer{{GUID: guid, LID: lid, Addr: peer.LocalAddr().(*net.UDPAddr).AddrPort()}}}))
	f.waitUntil(func() bool { return len(f.directs) > 0 }, func() string { return "no peer_ok" })
	var fb [fabric.FlowLen]byte
	if _, err := peer.WriteToUDPAddrPort(fabric.EncodeFlow(fb[:], fabric.Flow{FCCL: 2}), d.self); err != nil {
		t.Fatal(err)
	}
	// The first send goes through the switch and asks for DLID 7's route;
	// the answer, with a lifetime of 20 ms and a stall count of 3.
	if err := udSend(q); err != nil {
		t.Fatal(err)
	}
	var query fabric.Direct
	f.waitUntil(func() bool {
		for _, m := range f.directs {
			if m.Type == fabric.DirectRouteQuery && m.DLID == lid {
				query = m
				return true
			}
		}
		return false
	}, func() string { return "no route_query" })
	const hoq, stall = 20 * time.Millisecond, 3
	f.send(fabric.AppendDirect(nil, &fabric.Direct{Type: fabric.DirectRoute, Session: sess, Seq: query.Seq, DLID: lid,
		HOQLife: hoq, VLStallCount: stall, Peers: []fabric.Peer{{GUID: guid, LID: lid, Addr: peer.LocalAddr().(*net.UDPAddr).AddrPort()}}}))
	deadline := time.Now().Add(5 * time.Second)
	for {
		d.dmu.Lock()
		st := d.dir.dlids[lid]
		ok := st != nil && st.route != nil
		d.dmu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the route was not taken")
		}
		time.Sleep(time.Millisecond)
	}
	const n = 10
	start := time.Now()
	for range n {
		if err := udSend(q); err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	c := d.Counters()
	if s, dd := c.Get(softverbs.DirectSends), c.Get(softverbs.DirectDiscards); s != 2 || dd != n-2 {
		t.Errorf("direct_sends %d direct_discards %d, want 2 and %d", s, dd, n-2)
	}
	// 3 packets waited a lifetime each, then the peer was stalled: the
	// 5 after were discarded at once.
	d.dmu.Lock()
	pl := d.dir.byGUID[guid]
	d.dmu.Unlock()
	d.lmu.Lock()
	until := pl.dropUntil
	d.lmu.Unlock()
	if took < stall*hoq || !until.After(start) {
		t.Errorf("the %d sends took %v (want at least %d lifetimes of %v); the peer stalled until %v (want after %v)", n, took, stall, hoq, until, start)
	}
	got := 0
	buf := make([]byte, 512)
	for {
		peer.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		m, _, err := peer.ReadFromUDPAddrPort(buf)
		if err != nil {
			break
		}
		if !fabric.IsFlow(buf[:m]) {
			got++
		}
	}
	if got != 2 {
		t.Errorf("the peer received %d packets, want 2", got)
	}
}
