package conformance

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
	"github.com/softrdma/softrdma/wire"
)

// This file is a kind of device that neither rdmacm nor any provider
// package knows: a RoCE port over process memory, registered from this
// test package the way a provider registers itself (an address owner for
// the CM, a NetdevPort capability on its driver, softverbs' core for the
// verbs). TestConformanceFakeKind runs the suite's cases on it: a new kind
// of device is one package and no change to rdmacm.

// fakeAddr is the one local address the fake kind owns; it is a loopback
// address, so the RoCEv2 device of lo would claim it if the fake kind did
// not come first (AddrOrder).
var fakeAddr = netip.MustParseAddr("127.0.0.3")

// fakeKind is the kind's address owner: one device per host, made on
// first use and closed with the host.
type fakeKind struct{}

type fakeKey struct{}

func (fakeKind) DeviceForAddr(h driver.Host, a netip.Addr) (driver.DeviceOps, error) {
	if a.Unmap().WithZone("") != fakeAddr {
		return nil, nil
	}
	d := h.Value(fakeKey{}, func() any {
		d := newFakeDev(h.(*verbs.Host))
		h.OnClose(d.close)
		return d
	}).(*fakeDev)
	return d.core, nil
}

// AddrOrder comes before the RoCEv2 devices of interfaces (100).
func (fakeKind) AddrOrder() int { return 50 }

var registerFakeKind sync.Once

// fakeDev is a device of the fake kind (softverbs.Driver and
// driver.NetdevPort). Its wire is a channel: a send to a multicast GID
// reaches the device's groups, a send to its own GID the QP named, from a
// goroutine of the device, as a datagram from a socket would.
type fakeDev struct {
	h    *verbs.Host
	core *softverbs.Device
	vdev *verbs.Device
	wire chan fakeFrame
	done chan struct{}

	nextQPN atomic.Uint32

	mu     sync.Mutex
	groups map[netip.Addr]int // IP memberships the CM holds (IncGroup)
}

// fakeFrame is one datagram on the fake wire.
type fakeFrame struct {
	dgid  verbs.GID
	tc    uint8 // the AH's traffic class, the IPv4 TOS
	dqpn  uint32
	qkey  uint32
	srcQP uint32
	imm   uint32
	hasIm bool
	sol   bool
	data  []byte
}

func newFakeDev(h *verbs.Host) *fakeDev {
	d := &fakeDev{h: h, wire: make(chan fakeFrame, 256), done: make(chan struct{}), groups: map[netip.Addr]int{}}
	d.nextQPN.Store(0x100)
	d.core = softverbs.New(d)
	d.vdev = h.RegisterDevice(d.core)
	go d.receive()
	return d
}

// receive delivers what was sent, until the wire closes.
func (d *fakeDev) receive() {
	defer close(d.done)
	var b softverbs.Burst
	var grh [verbs.GRHLen]byte
	for f := range d.wire {
		ip := make(wire.IPv4, wire.IPv4HeaderLen)
		ip.Encode(wire.IPv4Fields{TOS: f.tc, TTL: 64, Protocol: 17, Src: fakeAddr, Dst: f.dgid.Addr().Unmap(), TotalLength: uint16(wire.IPv4HeaderLen + len(f.data))})
		wire.PutGRHv4(grh[:], ip)
		dg := &softverbs.Datagram{GRH: &grh, PKey: 0xFFFF, QKey: f.qkey, SrcQP: f.srcQP, Imm: f.imm, HasImm: f.hasIm, Solicited: f.sol, Payload: f.data, Self: true}
		if f.dgid.IsMulticast() {
			d.core.DeliverGroup(d.core.Group(f.dgid), 0, dg, &b)
		} else {
			d.core.DeliverUnicast(f.dqpn, dg, &b)
		}
		b.Flush()
	}
}

func (d *fakeDev) close() {
	d.core.Close()
	d.h.UnregisterDevice(d.vdev)
	close(d.wire)
	<-d.done
}

func (d *fakeDev) Name() string { return "fakeroce0" }

func (d *fakeDev) Attr() verbs.DeviceAttr {
	return verbs.DeviceAttr{
		NodeGUID: 0x0200_00ff_fe00_0003, PhysPortCnt: 1, MaxQP: 1024, MaxQPWR: 1024, MaxSGE: 4,
		MaxCQ: 1024, MaxCQE: 4096, MaxMR: 1024, MaxPD: 64, MaxAH: 1024,
		MaxMcastGrp: 64, MaxMcastQPAttach: 16, MaxTotalMcastQP: 256, MaxInlineData: 64,
	}
}

func (d *fakeDev) QueryPort(port uint8) (verbs.PortAttr, error) {
	if port != 1 {
		return verbs.PortAttr{}, fmt.Errorf("fakeroce0: port %d: %w", port, syscall.EINVAL)
	}
	return verbs.PortAttr{State: verbs.PortActive, MaxMTU: verbs.MTU4096, ActiveMTU: verbs.MTU4096,
		GIDTblLen: 1, PKeyTblLen: 1, LinkLayer: verbs.LinkLayerEthernet, NetdevMTU: 65536}, nil
}

func (d *fakeDev) GIDTable(port uint8) ([]verbs.GIDEntry, error) {
	if port != 1 {
		return nil, fmt.Errorf("fakeroce0: port %d: %w", port, syscall.EINVAL)
	}
	return []verbs.GIDEntry{{GID: wire.GIDFromAddr(fakeAddr), Index: 0, Type: verbs.GIDTypeRoCEv2}}, nil
}

func (d *fakeDev) CreateQP(softverbs.DriverQPInit) (softverbs.DriverQP, error) {
	return &fakeQP{d: d, qpn: d.nextQPN.Add(1)}, nil
}

// The fake wire carries every group: nothing to start or stop.
func (d *fakeDev) GroupCreated(*softverbs.Group) error { return nil }
func (d *fakeDev) GroupDestroyed(*softverbs.Group)     {}

// IncGroup and DecGroup count the CM's IP memberships (driver.NetdevPort).
func (d *fakeDev) IncGroup(g netip.Addr) error {
	if !g.IsMulticast() {
		return fmt.Errorf("fakeroce0: %v is not a multicast address: %w", g, syscall.EINVAL)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.groups[g.Unmap()]++
	return nil
}

func (d *fakeDev) DecGroup(g netip.Addr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.groups[g.Unmap()] == 0 {
		return fmt.Errorf("fakeroce0: %v not joined: %w", g, syscall.EADDRNOTAVAIL)
	}
	d.groups[g.Unmap()]--
	if d.groups[g.Unmap()] == 0 {
		delete(d.groups, g.Unmap())
	}
	return nil
}

// memberships returns the number of IP memberships held.
func (d *fakeDev) memberships() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.groups)
}

// WatchNetdev: the fake interface never changes.
func (d *fakeDev) WatchNetdev(func(driver.NetdevEvent)) func() { return func() {} }

var _ driver.NetdevPort = (*fakeDev)(nil)

type fakeQP struct {
	d   *fakeDev
	qpn uint32
}

func (q *fakeQP) QPN() uint32 { return q.qpn }

func (q *fakeQP) Send(s *softverbs.UDSend) error {
	if len(s.Payload) > verbs.MTU4096.Bytes() {
		s.Wire = 0 // dropped, as rxe drops a datagram above the MTU
		return nil
	}
	q.d.wire <- fakeFrame{dgid: s.AH.GRH.DGID, tc: s.AH.GRH.TrafficClass, dqpn: s.RemoteQPN, qkey: s.RemoteQKey, srcQP: q.qpn,
		imm: s.Imm, hasIm: s.HasImm, sol: s.Solicited, data: append([]byte(nil), s.Payload...)}
	s.Wire = len(s.Payload)
	return nil
}

func (q *fakeQP) Destroy() {}

// TestConformanceFakeKind runs every case on the fake kind of device,
// registered from this package; rdmacm finds it by its address and its
// port by capability.
func TestConformanceFakeKind(t *testing.T) {
	c := loadConfig(t)
	if c.backend != rdmacm.BackendSoft {
		t.Skip("the fake kind of device lives in this test process: the kernel run has no such target")
	}
	registerFakeKind.Do(func() { driver.RegisterAddrOwner("fakekind", fakeKind{}) })
	c.target, c.addr = targetFake, fakeAddr
	c.unreach, c.unreachSrc, c.inNet, c.noUnreach = netip.Addr{}, fakeAddr, nil, "unreachable destinations are the host's routes, tested on the soft target"
	s := &suite{config: c}
	s.runAll(t)
	vd, err := verbs.DefaultHost().DeviceForAddr(fakeAddr)
	if err != nil || vd == nil || vd.Name() != "fakeroce0" {
		t.Fatalf("the fake kind does not own %v: %v %v", fakeAddr, vd, err)
	}
	d := verbs.DefaultHost().Value(fakeKey{}, func() any { return nil }).(*fakeDev)
	if n := d.memberships(); n != 0 {
		t.Errorf("%d IP memberships left after the cases", n)
	}
	if d.core.Counters()[softverbs.Delivered] == 0 {
		t.Errorf("nothing was delivered through the fake kind's wire")
	}
}
