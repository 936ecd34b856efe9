package ib

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// eventLog records a port's events.
type eventLog struct {
	mu  sync.Mutex
	evs []PortEventKind
	ch  chan struct{}
}

func logEvents(d *Device) *eventLog {
	l := &eventLog{ch: make(chan struct{}, 64)}
	d.Watch(func(ev PortEvent) {
		l.mu.Lock()
		l.evs = append(l.evs, ev.Kind)
		l.mu.Unlock()
		l.ch <- struct{}{}
	})
	return l
}

// waitEvent waits for the next event.
func (l *eventLog) waitEvent(t *testing.T) {
	t.Helper()
	select {
	case <-l.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no port event")
	}
}

func (l *eventLog) kinds() []PortEventKind {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]PortEventKind(nil), l.evs...)
}

func portInfoMsg(d *Device, fn func(*fabric.Control)) []byte {
	c := fabric.Control{Type: fabric.TypePortInfo, GUID: d.GUID(), LID: 2, SMLID: fabric.SMLID,
		SubnetPrefix: fabric.DefaultSubnetPrefix, PKeys: []uint16{fabric.DefaultPKey}, Epoch: 1,
		MTU: fabric.PortMTU, Rate: fabric.PortRate, State: fabric.StateActive}
	if fn != nil {
		fn(&c)
	}
	return fabric.EncodeControl(&c)
}

func attacker(t *testing.T) *net.UDPConn {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestForeignControlDropped: a port_info from another address than the
// SM's (a new epoch, a tiny MTU, another SM LID) changes nothing and is
// counted; the SM's own next port_info is taken.
func TestForeignControlDropped(t *testing.T) {
	f := startFakeSM(t)
	d := openOn(t, f, "127.0.3.2")
	defer d.Close()
	evs := logEvents(d)
	bad := attacker(t)
	f.sendFrom(bad, portInfoMsg(d, func(c *fabric.Control) { c.Epoch, c.MTU, c.SMLID = 99, 1, 7 }))
	// Then the SM moves the port to LID 3: one LIDChange event, nothing else.
	f.send(portInfoMsg(d, func(c *fabric.Control) { c.LID = 3 }))
	evs.waitEvent(t)
	if k := evs.kinds(); len(k) != 1 || k[0] != LIDChange {
		t.Errorf("events %v, want only LIDChange", k)
	}
	pa, _ := d.QueryPort(1)
	if pa.LID != 3 || pa.SMLID != fabric.SMLID || pa.ActiveMTU != verbs.MTU2048 {
		t.Errorf("port %+v", pa)
	}
	if n := d.Counters().Get(softverbs.UntrustedDrops); n != 1 {
		t.Errorf("untrusted_drops %d, want 1", n)
	}
}

// TestBadPortInfoDropped: the SM's own port_info is taken only with sane
// fields: a unicast LID other than the SM's, a unicast SM LID, an MTU of
// 256..4096, state active, this port's GUID, an epoch.
func TestBadPortInfoDropped(t *testing.T) {
	f := startFakeSM(t)
	d := openOn(t, f, "127.0.3.3")
	defer d.Close()
	evs := logEvents(d)
	bad := []func(*fabric.Control){
		func(c *fabric.Control) { c.LID = 0 },
		func(c *fabric.Control) { c.LID = 0xC000 },
		func(c *fabric.Control) { c.LID = 0xFFFF },
		func(c *fabric.Control) { c.LID = fabric.SMLID },
		func(c *fabric.Control) { c.SMLID = 0 },
		func(c *fabric.Control) { c.SMLID = 0xC001 },
		func(c *fabric.Control) { c.MTU = 0 },
		func(c *fabric.Control) { c.MTU = 6 },
		func(c *fabric.Control) { c.State = "down" },
		func(c *fabric.Control) { c.State = "" },
		func(c *fabric.Control) { c.GUID++ },
		func(c *fabric.Control) { c.Epoch = 0 },
		func(c *fabric.Control) { c.Type = fabric.TypeDetach },
	}
	for _, fn := range bad {
		f.send(portInfoMsg(d, fn))
	}
	f.send([]byte(fabric.Magic + "{not json"))
	f.send(portInfoMsg(d, func(c *fabric.Control) { c.LID = 4 }))
	evs.waitEvent(t)
	if k := evs.kinds(); len(k) != 1 || k[0] != LIDChange {
		t.Errorf("events %v, want only LIDChange", k)
	}
	pa, _ := d.QueryPort(1)
	if pa.LID != 4 || pa.SMLID != fabric.SMLID || pa.ActiveMTU != verbs.MTU2048 || pa.State != verbs.PortActive {
		t.Errorf("port %+v", pa)
	}
	if n := d.Counters().Get(softverbs.ControlDrops); n != uint64(len(bad)+1) {
		t.Errorf("control_drops %d, want %d", n, len(bad)+1)
	}
}

// TestForeignPacketDropped: an IB packet to a QP of the port from another
// address than the SM's (the switch) is not delivered; the same packet
// from the switch is.
func TestForeignPacketDropped(t *testing.T) {
	f := startFakeSM(t)
	d := openOn(t, f, "127.0.3.4")
	defer d.Close()
	ctx, _ := d.Verbs().Open()
	defer ctx.Close()
	pd, _ := ctx.AllocPD()
	defer pd.Dealloc()
	cq, _ := ctx.CreateCQ(8)
	defer cq.Destroy()
	qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTypeUD, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Destroy()
	for _, s := range []struct {
		a verbs.QPAttr
		m verbs.QPAttrMask
	}{
		{verbs.QPAttr{State: verbs.QPSInit, PortNum: 1, QKey: 0x1234}, verbs.QPAttrState | verbs.QPAttrPKeyIdx | verbs.QPAttrPort | verbs.QPAttrQKey},
		{verbs.QPAttr{State: verbs.QPSRTR}, verbs.QPAttrState},
	} {
		if err := qp.Modify(&s.a, s.m); err != nil {
			t.Fatal(err)
		}
	}
	mr, _ := pd.RegMR(make([]byte, 4*128), verbs.AccessLocalWrite)
	defer mr.Dereg()
	for i := range 4 {
		if err := qp.PostRecv(&verbs.RecvWR{WRID: uint64(i), SGList: []verbs.SGE{mr.SGE(i*128, 128)}}); err != nil {
			t.Fatal(err)
		}
	}
	pkt := func(slid uint16) []byte {
		p := fabric.UDPacket{DLID: 2, SLID: slid, UD: wire.UDHeader{PKey: 0xffff, DestQP: qp.Num(), QKey: 0x1234, SrcQP: 5}}
		b := make([]byte, fabric.PacketLen(8, false, false))
		return b[:fabric.EncodeUD(b, &p, []byte("payload!"))]
	}
	f.sendFrom(attacker(t), pkt(66))
	f.send(pkt(77))
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cq.Wait(wctx); err != nil {
		t.Fatal(err)
	}
	var wc [4]verbs.WC
	n, _ := cq.Poll(wc[:])
	if n != 1 || wc[0].SLID != 77 {
		t.Fatalf("%d completions %+v, want one from SLID 77", n, wc[:n])
	}
	if c := d.Counters(); c.Get(softverbs.UntrustedDrops) != 1 || c.Get(softverbs.RcvdPkts) != 1 {
		t.Errorf("untrusted_drops %d rcvd_pkts %d, want 1 and 1", c.Get(softverbs.UntrustedDrops), c.Get(softverbs.RcvdPkts))
	}
}

// TestClientReregisterBit: a port_info from the SM with ClientReregister
// (the SM forgot the port and registered it anew) is a client reregister
// even with the same epoch: the port's joins get -ENETRESET.
func TestClientReregisterBit(t *testing.T) {
	f := startFakeSM(t)
	d := openOn(t, f, "127.0.3.5")
	defer d.Close()
	evs := logEvents(d)
	f.send(portInfoMsg(d, func(c *fabric.Control) { c.ClientReregister = true }))
	evs.waitEvent(t)
	if k := evs.kinds(); len(k) != 1 || k[0] != ClientReregister {
		t.Errorf("events %v, want ClientReregister", k)
	}
}

// TestRefusalTrust: a refused is taken only from the SM, only for the
// port's GUID and only while Open waits for the first port_info: a
// refusal from another address or for another GUID does not end Open
// (dropped, counted), and one after the port is active changes nothing.
func TestRefusalTrust(t *testing.T) {
	f := startFakeSM(t)
	f.setQuiet(true)
	const guid = 0x2c90000abcdef
	type result struct {
		d   *Device
		err error
	}
	res := make(chan result, 1)
	go func() {
		d, err := Open(Config{SM: f.addr(), Local: netip.MustParseAddr("127.0.3.6"), GUID: guid,
			SATimeout: 20 * time.Millisecond, SARetries: 1, ActivateTimeout: time.Minute})
		res <- result{d, err}
	}()
	f.waitFor(fabric.TypeAttach, 1)
	refused := func(g uint64) []byte {
		return fabric.EncodeControl(&fabric.Control{Type: fabric.TypeRefused, GUID: g, Reason: fabric.ReasonGUIDInUse})
	}
	f.sendFrom(attacker(t), refused(guid))
	f.send(refused(guid + 1))
	// The SM's port_info comes after both: Open succeeds. (The fake SM
	// stays quiet: keepalives go unanswered.)
	f.send(portInfoMsg(&Device{guid: guid}, nil))
	r := <-res
	if r.err != nil {
		t.Fatalf("open: %v", r.err)
	}
	d := r.d
	defer d.Close()
	// A refusal of the active port, from the SM: dropped.
	f.send(refused(guid))
	evs := logEvents(d)
	f.send(portInfoMsg(d, func(c *fabric.Control) { c.LID = 5 }))
	evs.waitEvent(t)
	if k := evs.kinds(); len(k) != 1 || k[0] != LIDChange {
		t.Errorf("events %v, want only LIDChange", k)
	}
	if pa, _ := d.QueryPort(1); pa.State != verbs.PortActive || pa.LID != 5 {
		t.Errorf("port %+v", pa)
	}
	if c := d.Counters(); c.Get(softverbs.UntrustedDrops) != 1 || c.Get(softverbs.ControlDrops) != 2 {
		t.Errorf("untrusted_drops %d control_drops %d, want 1 and 2", c.Get(softverbs.UntrustedDrops), c.Get(softverbs.ControlDrops))
	}
}
