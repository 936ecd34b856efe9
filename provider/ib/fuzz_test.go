package ib

import (
	"net/netip"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/internal/sys/rawudp"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/rdmacm/saclient"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// fuzzDevice is a port that is not attached to anything: its handlers can
// be called directly. Its event loop runs until stop.
func fuzzDevice() (d *Device, stop func()) {
	d = &Device{
		guid: 0x0002c900000000aa, activeCh: make(chan struct{}),
		qpns: map[uint32]bool{}, nextQPN: 2,
		done: make(chan struct{}), events: make(chan PortEvent, 16), linkCh: make(chan struct{}),
	}
	d.core = softverbs.New(d)
	// A socket for what the handlers send (to an unbound loopback port).
	conn, err := rawudp.ListenUDP("udp", "127.0.0.1:0", nil)
	if err != nil {
		panic(err)
	}
	d.conn, d.smDst = conn, netip.MustParseAddrPort("127.0.0.1:9")
	// Direct forwarding on, with an all-zero session token: the fuzzer's
	// direct messages carry it unless it mutates them.
	d.initDirect(1 << 20)
	d.directConfig(true, make([]byte, fabric.SessionLen), 1, false)
	// No SM address: the port trusts it by address, without the warning
	// of an unauthenticated remote SM.
	d.auth.warned = true
	// The host's SA client takes QP1's MADs, as on a registered port.
	e := saclient.New(fuzzPort{d}, saclient.Config{})
	d.RegisterMADAgent(e.Receive)
	d.wg.Add(1)
	go d.eventLoop()
	return d, func() { close(d.done); e.Close(); d.wg.Wait(); d.core.Close(); conn.Close() }
}

// fuzzPort sends the SA client's MADs nowhere.
type fuzzPort struct{ d *Device }

func (p fuzzPort) SendSA([]byte) error { return nil }
func (p fuzzPort) PortGID() verbs.GID  { return p.d.PortGID() }
func (p fuzzPort) SMLID() uint16       { return p.d.SMLID() }

// FuzzHandlers feeds datagrams, as if from the SM, to a port's control
// and packet handlers: no panic, no hang, every datagram counted once as
// received or as a control drop, and the port's state stays sane (an
// active port has a unicast LID, a unicast SM LID and an MTU of 256..4096).
func FuzzHandlers(f *testing.F) {
	d, stop := fuzzDevice()
	f.Add(portInfoMsg(d, nil))
	f.Add(portInfoMsg(d, func(c *fabric.Control) { c.LID = 0xC000 }))
	stop()
	p := fabric.UDPacket{DLID: 2, SLID: 1, UD: wire.UDHeader{PKey: 0xffff, DestQP: 1, QKey: mad.GSIQKey, SrcQP: 1}}
	m := mad.NewSARequest(mad.MethodGetResp, mad.AttrMCMemberRecord, 1, 0)
	b := make([]byte, fabric.PacketLen(len(m), false, false))
	f.Add(b[:fabric.EncodeUD(b, &p, m)])
	p.Global, p.DLID, p.UD.DestQP = true, 0xC001, wire.MulticastQPN
	b = make([]byte, fabric.PacketLen(8, false, true))
	f.Add(b[:fabric.EncodeUD(b, &p, []byte("12345678"))])
	peer := fabric.Peer{GUID: 7, LID: 3, Addr: netip.MustParseAddrPort("127.0.0.1:9")}
	f.Add(fabric.AppendDirect(nil, &fabric.Direct{Type: fabric.DirectPeer, Peers: []fabric.Peer{peer}}))
	f.Add(fabric.AppendDirect(nil, &fabric.Direct{Type: fabric.DirectRoute, Seq: 1, DLID: 3, HOQLife: time.Second, VLStallCount: 7, Peers: []fabric.Peer{peer}}))
	f.Add(fabric.AppendDirect(nil, &fabric.Direct{Type: fabric.DirectPeerGone, PeerGUID: 7}))
	f.Fuzz(func(t *testing.T, in []byte) {
		d, stop := fuzzDevice()
		defer stop()
		var rx receiveScratch
		// A datagram may be both: first as itself, then with the magic.
		for _, b := range [][]byte{in, append([]byte(fabric.Magic), in...)} {
			if fabric.IsDirect(b) {
				// The port's query for DLID 3 is out, so a route may
				// answer it.
				d.dmu.Lock()
				d.dir.dlids[3] = &dlidState{seq: 1}
				d.dmu.Unlock()
				d.directIn(b)
				d.dmu.Lock()
				for _, pl := range d.dir.byGUID {
					if pl.win <= 0 || d.dir.used > d.dir.budget {
						t.Fatalf("peer %#x window %d, peers use %d of %d", pl.guid, pl.win, d.dir.used, d.dir.budget)
					}
				}
				d.dmu.Unlock()
			} else if fabric.IsControl(b) {
				d.control(b)
			} else {
				d.handlePacket(b, nil, &rx)
			}
		}
		c := d.Counters()
		if rcvd, ctl := c.Get(softverbs.RcvdPkts), c.Get(softverbs.ControlDrops); rcvd+ctl > 2 {
			t.Fatalf("counted %d received and %d control drops for 2 datagrams", rcvd, ctl)
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.active && (!unicastLID(d.lid) || !unicastLID(d.smLID) || verbs.MTU(d.mtu) < verbs.MTU256 || verbs.MTU(d.mtu) > verbs.MTU4096) {
			t.Fatalf("active port with LID %#x SM LID %#x MTU %d", d.lid, d.smLID, d.mtu)
		}
	})
}
