package ib

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
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
