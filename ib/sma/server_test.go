package sma

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/simproto"
	"github.com/softrdma/softrdma/test/testenv"
)

// fakeClient speaks umad2sim's side of the protocol.
type fakeClient struct {
	t        *testing.T
	ctl, dat *net.UnixConn // dat is bound, not connected: send writes to out
	out      *net.UnixAddr
	id       uint32
}

func (c *fakeClient) send(b []byte) error {
	_, err := c.dat.WriteToUnix(b, c.out)
	return err
}

func abstract(name string) *net.UnixAddr { return &net.UnixAddr{Net: "unixgram", Name: "@" + name} }

func newFakeClient(t *testing.T, base string, pid uint32, issm bool) *fakeClient {
	t.Helper()
	ctl, err := net.DialUnix("unixgram", abstract(simproto.ClientCtlName(base, pid)), abstract(simproto.CtlName(base)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctl.Close() })
	c := &fakeClient{t: t, ctl: ctl}
	dat, err := net.ListenUnixgram("unixgram", abstract(simproto.InName(base, pid)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dat.Close() })
	c.dat = dat
	info := make([]byte, simproto.ClientInfoLen)
	ci := simproto.ClientInfo(info)
	ci.SetID(pid)
	ci.SetIsSM(issm)
	ans, ok := c.exchange(simproto.TypeConnect, info)
	if !ok {
		t.Fatal("CONNECT refused")
	}
	c.id = simproto.ClientInfo(ans).ID()
	if n := simproto.ClientInfo(ans).NodeID(); n != HostName {
		t.Fatalf("attached at %q", n)
	}
	c.out = abstract(simproto.OutName(base, int(c.id)))
	return c
}

// exchange sends a control message and returns the answer's data.
func (c *fakeClient) exchange(typ uint32, data []byte) ([]byte, bool) {
	c.t.Helper()
	m := simproto.Ctl(make([]byte, simproto.CtlLen))
	m.SetMagic(simproto.Magic)
	m.SetClientID(c.id)
	m.SetType(typ)
	m.SetLen(uint32(len(data)))
	copy(m.Data(), data)
	if _, err := c.ctl.Write(m); err != nil {
		c.t.Fatal(err)
	}
	c.ctl.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.ctl.Read(m)
	if err != nil || n != simproto.CtlLen {
		c.t.Fatalf("control answer: %d bytes, %v", n, err)
	}
	return m.Data(), m.Type() != simproto.TypeError
}

func (c *fakeClient) recv() simproto.Request {
	c.t.Helper()
	b := make([]byte, simproto.RequestLen+1)
	c.dat.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.dat.Read(b)
	if err != nil || n != simproto.RequestLen {
		c.t.Fatalf("MAD: %d bytes, %v", n, err)
	}
	return simproto.Request(b[:n])
}

func TestServer(t *testing.T) {
	f := New(Config{Ports: cas, SwitchPorts: 8})
	_, base := runServer(t, f, ServerConfig{Logf: t.Logf})
	// Garbage first: dropped, and the server goes on.
	g, err := net.DialUnix("unixgram", nil, abstract(simproto.CtlName(base)))
	if err != nil {
		t.Fatal(err)
	}
	g.Write([]byte("garbage"))
	g.Write(make([]byte, simproto.CtlLen)) // bad magic
	g.Close()

	sm := newFakeClient(t, base, 4242, true)
	d, ok := sm.exchange(simproto.TypeGetNodeInfo, make([]byte, 64))
	if ni := mad.NodeInfo(d); !ok || ni.NodeGUID() != DefaultHostGUID || ni.PortGUID() != DefaultHostGUID+1 || ni.NodeType() != mad.NodeCA {
		t.Fatalf("GET_NODEINFO: %v %x", ok, d[:40])
	}
	d, _ = sm.exchange(simproto.TypeGetPortInfo, make([]byte, 64))
	if pi := mad.PortInfo(d); pi.LocalPortNum() != 1 || pi.PortState() != mad.PortInit || pi.PhysState() != mad.PhysLinkUp {
		t.Fatalf("GET_PORTINFO: port %d state %d", pi.LocalPortNum(), pi.PortState())
	}
	d, _ = sm.exchange(simproto.TypeGetPKeys, make([]byte, 64))
	if d[0] != 0xFF || d[1] != 0xFF {
		t.Fatalf("GET_PKEYS %x", d[:4])
	}
	if _, ok := sm.exchange(simproto.TypeSetIsSM, []byte{1, 0, 0, 0}); !ok {
		t.Fatal("SET_ISSM refused")
	}
	if pi := mad.PortInfo(f.HostPortInfo()); pi.CapabilityMask()&mad.CapIsSM == 0 {
		t.Fatal("IsSM not set")
	}
	// A second SM on the node is refused; another client is not.
	info := make([]byte, simproto.ClientInfoLen)
	simproto.ClientInfo(info).SetID(4343)
	simproto.ClientInfo(info).SetIsSM(true)
	if _, ok := sm.exchange(simproto.TypeConnect, info); ok {
		t.Fatal("a second SM was taken")
	}
	other := newFakeClient(t, base, 4444, false)

	// A DR NodeInfo of the switch, answered; the TID keeps its low 48
	// bits and carries the client id above.
	req := drSMP(mad.MethodGet, mad.AttrNodeInfo, 0, 0, 1)
	mad.MAD(req.MAD()).SetTID(0x0000_0001_0000_1234)
	if err := other.send(req); err != nil {
		t.Fatal(err)
	}
	r := other.recv()
	m := mad.MAD(r.MAD())
	if m.Method() != mad.MethodGetResp || m.TID() != uint64(other.id)<<48|0x0000_0001_0000_1234 || r.Status() != 0 ||
		mad.NodeInfo(mad.SMP(m).Data()).NodeGUID() != DefaultSwitchGUID {
		t.Fatalf("answer: method %#x tid %#x status %d", m.Method(), m.TID(), r.Status())
	}
	// A path to nowhere comes back with ETIMEDOUT.
	if err := other.send(drSMP(mad.MethodGet, mad.AttrNodeInfo, 0, 0, 1, 7)); err != nil {
		t.Fatal(err)
	}
	if r := other.recv(); r.Status() != simproto.StatusTimeout || mad.MAD(r.MAD()).Method() != mad.MethodGet {
		t.Fatalf("no timeout: status %d", r.Status())
	}
	// SMInfo at the SM host goes to its SM, whose answer goes back by
	// the TID.
	if err := other.send(drSMP(mad.MethodGet, mad.AttrSMInfo, 0, 0)); err != nil {
		t.Fatal(err)
	}
	fwd := sm.recv()
	fm := mad.MAD(fwd.MAD())
	if fm.AttrID() != mad.AttrSMInfo || fm.TID()>>48 != uint64(other.id) {
		t.Fatalf("forwarded attr %#x tid %#x", fm.AttrID(), fm.TID())
	}
	fm.SetMethod(mad.MethodGetResp)
	if err := sm.send(fwd); err != nil {
		t.Fatal(err)
	}
	if r := other.recv(); mad.MAD(r.MAD()).Method() != mad.MethodGetResp || mad.MAD(r.MAD()).AttrID() != mad.AttrSMInfo {
		t.Fatal("the SM's answer did not come back")
	}
	// A short datagram is dropped; the next request is answered.
	other.send(make([]byte, 10))
	other.send(drSMP(mad.MethodGet, mad.AttrNodeInfo, 0, 0))
	if r := other.recv(); mad.MAD(r.MAD()).Method() != mad.MethodGetResp {
		t.Fatal("no answer after a short datagram")
	}
	if _, ok := other.exchange(simproto.TypeDisconnect, nil); !ok {
		t.Fatal("DISCONNECT refused")
	}
	if _, ok := other.exchange(simproto.TypeGetNodeInfo, make([]byte, 64)); ok {
		t.Fatal("a disconnected client is served")
	}
}

// runServer listens with cfg on a fresh random base name (returned) and
// runs the server until the test ends, failing it if Run fails.
func runServer(t *testing.T, f *Fabric, cfg ServerConfig) (*Server, string) {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	cfg.Base = "softrdma-sma-test-" + hex.EncodeToString(b[:])
	srv, err := Listen(f, cfg)
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunUntilEnd(t, "sma server", srv.Run)
	return srv, cfg.Base
}
