package sm

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/test/testenv"
)

// Forged source addresses: an attach whose UDP source
// address is forged must not make the SM send the owner of that address
// anything larger than the attach, nor allocate anything for it.

// rawForger sends UDP datagrams with any source address on lo (a raw
// IPv4 socket: IP_HDRINCL), as an attacker who can forge addresses.
type rawForger struct{ fd int }

func newRawForger(t *testing.T) *rawForger {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
	if err != nil {
		testenv.Require(t, "no raw socket (forging a source address needs CAP_NET_RAW): %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return &rawForger{fd: fd}
}

// send sends payload from src to dst, both loopback addresses: the
// datagram never leaves the host.
func (f *rawForger) send(t *testing.T, src, dst netip.AddrPort, payload []byte) {
	t.Helper()
	if !src.Addr().Is4() || !dst.Addr().Is4() || !dst.Addr().IsLoopback() {
		t.Fatalf("forging %v → %v: only IPv4 loopback", src, dst)
	}
	b := make([]byte, 28+len(payload))
	b[0] = 0x45 // IPv4, 20-byte header
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	b[8], b[9] = 64, unix.IPPROTO_UDP // TTL, protocol (the kernel fills in the checksum)
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	copy(b[12:16], s4[:])
	copy(b[16:20], d4[:])
	binary.BigEndian.PutUint16(b[20:], src.Port())
	binary.BigEndian.PutUint16(b[22:], dst.Port())
	binary.BigEndian.PutUint16(b[24:], uint16(8+len(payload))) // UDP checksum 0: none
	copy(b[28:], payload)
	if err := unix.Sendto(f.fd, b, 0, &unix.SockaddrInet4{Addr: d4}); err != nil {
		t.Fatal(err)
	}
}

// udpSocket is a plain UDP socket on 127.0.0.1 (a victim, or a client
// that reads the SM's answers itself), closed when the test ends.
func udpSocket(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func addrOf(c *net.UDPConn) netip.AddrPort { return c.LocalAddr().(*net.UDPAddr).AddrPort() }

// readAnswer reads the next datagram on c (failing after waitTimeout).
func readAnswer(t *testing.T, c *net.UDPConn) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(waitTimeout))
	buf := make([]byte, 65536)
	n, _, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("no answer at %v: %v", addrOf(c), err)
	}
	return buf[:n]
}

// noMore checks that nothing more is waiting on c. Call it once the SM
// counted its last answer: the kernel queued every datagram the SM sent
// to a loopback socket before the SM's send returned.
func noMore(t *testing.T, c *net.UDPConn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	buf := make([]byte, 65536)
	if n, _, err := c.ReadFromUDPAddrPort(buf); err == nil {
		t.Fatalf("unexpected datagram at %v: %q", addrOf(c), buf[:n])
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatal(err)
	}
}

// mustRetry decodes a retry for guid no longer than the request it
// answers (reqLen bytes).
func mustRetry(t *testing.T, b []byte, guid uint64, reqLen int) *fabric.Control {
	t.Helper()
	c, err := fabric.DecodeControl(b)
	if err != nil || c.Type != fabric.TypeRetry || c.GUID != guid || len(c.Cookie) != fabric.CookieLen {
		t.Fatalf("answer %q (%v): want a retry for %#x", b, err, guid)
	}
	if len(b) > reqLen {
		t.Fatalf("retry of %d bytes to an unproven address, the attach had %d", len(b), reqLen)
	}
	return c
}

// noPorts checks that the SM holds no port, LID or per-source count.
func noPorts(t *testing.T, s *SM) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.byGUID) != 0 || len(s.byAddr) != 0 || len(s.lids.byGUID) != 0 || len(s.perSource) != 0 || s.lruOld != nil {
		t.Fatalf("state allocated: %d ports, %d addresses, %d LIDs, %d sources", len(s.byGUID), len(s.byAddr), len(s.lids.byGUID), len(s.perSource))
	}
}

// TestForgedAttachReflection: attaches whose source address is forged to a
// victim's (a plain UDP socket, then a registered port) make the SM send
// the victim only retries, each no larger than its attach, and register
// nothing; unpadded forged attaches get no answer at all; a forged attach
// for another GUID does not replace the port registered at the victim's
// address.
func TestForgedAttachReflection(t *testing.T) {
	forger := newRawForger(t)
	var logs logRecorder
	s := startSM(t, Config{Logf: logs.logf(t)})
	victim := udpSocket(t)
	const n = 50
	sent, got := 0, 0
	var reqs []int
	for i := range n {
		b := fabric.EncodeControl(&fabric.Control{Type: fabric.TypeAttach, GUID: 0x700000 + uint64(i),
			NodeDesc: strings.Repeat("x", i), Credits: 64})
		forger.send(t, addrOf(victim), s.FabricAddr(), b)
		sent += len(b)
		reqs = append(reqs, len(b))
	}
	waitUntil(t, "the SM to answer the forged attaches", func() bool { return s.Stats().Retries == n })
	for i := range n {
		b := readAnswer(t, victim)
		mustRetry(t, b, 0x700000+uint64(i), reqs[i])
		got += len(b)
	}
	noMore(t, victim)
	t.Logf("%d forged attaches, %d bytes; the victim received %d retries, %d bytes", n, sent, n, got)
	noPorts(t, s)
	if !logs.has("answered with a retry") {
		t.Error("the retries were not logged")
	}

	// Unpadded forged attaches (shorter than a retry): no answer.
	for i := range n {
		forger.send(t, addrOf(victim), s.FabricAddr(), []byte(fabric.Magic+`{"type":"attach","guid":`+string(rune('1'+i%9))+`}`))
	}
	waitUntil(t, "the unpadded attaches to be dropped", func() bool { return s.Stats().UnpaddedAttaches == n })
	noMore(t, victim)
	noPorts(t, s)

	// A forged attach with a made-up cookie: a bad cookie, a retry.
	forged := fabric.EncodeControl(&fabric.Control{Type: fabric.TypeAttach, GUID: 0x700100, Cookie: make([]byte, fabric.CookieLen)})
	forger.send(t, addrOf(victim), s.FabricAddr(), forged)
	mustRetry(t, readAnswer(t, victim), 0x700100, len(forged))
	if st := s.Stats(); st.BadCookies != 1 || st.Retries != n+1 {
		t.Fatalf("BadCookies %d Retries %d, want 1 and %d", st.BadCookies, st.Retries, n+1)
	}
	noPorts(t, s)

	// The victim is a registered port: a forged attach from its address
	// for another GUID gets it a retry, and its port stays.
	port := newFakePortNoAttach(t, s.FabricAddr(), 0x700200)
	port.rawRetries = true
	port.sendControl(&fabric.Control{Type: fabric.TypeAttach, GUID: port.guid})
	r := port.control()
	port.sendControl(&fabric.Control{Type: fabric.TypeAttach, GUID: port.guid, Cookie: r.Cookie})
	if pi := port.control(); pi.Type != fabric.TypePortInfo {
		t.Fatalf("%+v", pi)
	}
	before := portStats(t, s, port.guid)
	forged = fabric.EncodeControl(&fabric.Control{Type: fabric.TypeAttach, GUID: 0x700201})
	forger.send(t, addrOf(port.conn), s.FabricAddr(), forged)
	if c := port.control(); c.Type != fabric.TypeRetry || c.GUID != 0x700201 {
		t.Fatalf("answer to the forged attach: %+v", c)
	}
	if after := portStats(t, s, port.guid); !after.Attached || after.Addr != before.Addr || after.LID != before.LID {
		t.Fatalf("the victim's port before %+v, after %+v", before, after)
	}
	if st := s.Stats(); len(st.Ports) != 1 {
		t.Fatalf("%d ports, want the victim's only", len(st.Ports))
	}
}

// TestAttachAnswersSenderOnly: without forging, an attach from an address
// that has not proven itself is answered with a retry to the sender only,
// no larger than the attach; the cookie works only from the address it
// was sent to and for its GUID; with it the port registers, in one more
// round trip.
func TestAttachAnswersSenderOnly(t *testing.T) {
	s := startSM(t, Config{})
	a, b := udpSocket(t), udpSocket(t)
	const guid = 0x710001
	req := fabric.EncodeControl(&fabric.Control{Type: fabric.TypeAttach, GUID: guid})
	a.WriteToUDPAddrPort(req, s.FabricAddr())
	r := mustRetry(t, readAnswer(t, a), guid, len(req))
	noMore(t, b)
	noPorts(t, s)
	// a's cookie from b, or for another GUID: bad cookies, retries.
	withCookie := func(g uint64, cookie []byte) []byte {
		return fabric.EncodeControl(&fabric.Control{Type: fabric.TypeAttach, GUID: g, Cookie: cookie})
	}
	b.WriteToUDPAddrPort(withCookie(guid, r.Cookie), s.FabricAddr())
	mustRetry(t, readAnswer(t, b), guid, len(req))
	a.WriteToUDPAddrPort(withCookie(guid+1, r.Cookie), s.FabricAddr())
	mustRetry(t, readAnswer(t, a), guid+1, len(req))
	if st := s.Stats(); st.BadCookies != 2 || st.Retries != 3 {
		t.Fatalf("BadCookies %d Retries %d, want 2 and 3", st.BadCookies, st.Retries)
	}
	noPorts(t, s)
	noMore(t, a)
	noMore(t, b)
	// The right cookie from the right address.
	a.WriteToUDPAddrPort(withCookie(guid, r.Cookie), s.FabricAddr())
	pi, err := fabric.DecodeControl(readAnswer(t, a))
	if err != nil || pi.Type != fabric.TypePortInfo || pi.GUID != guid || pi.LID == 0 || !pi.ClientReregister {
		t.Fatalf("port_info %+v %v", pi, err)
	}
	// Its keepalives need no cookie: the address is the port's.
	a.WriteToUDPAddrPort(req, s.FabricAddr())
	if pi, err := fabric.DecodeControl(readAnswer(t, a)); err != nil || pi.Type != fabric.TypePortInfo || pi.ClientReregister {
		t.Fatalf("keepalive answer %+v %v", pi, err)
	}
	if st := portStats(t, s, guid); !st.Attached || st.Addr != addrOf(a) {
		t.Fatalf("%+v", st)
	}
}

// TestBadCookies: an attach whose cookie is expired, cut, or from another
// SM instance registers nothing and is answered with a new retry (counted
// and logged); the cookie of the previous window is still taken.
func TestBadCookies(t *testing.T) {
	var logs logRecorder
	s := startSM(t, Config{Logf: logs.logf(t)})
	other := startSM(t, Config{})
	c := udpSocket(t)
	from := addrOf(c)
	const guid = 0x720001
	w := cookieWindow(time.Now())
	bad := [][]byte{
		s.cookie(from, guid, w-2),      // expired
		s.cookie(from, guid, w+2),      // from the future
		s.cookie(from, guid, w)[:8],    // cut
		other.cookie(from, guid, w),    // another SM's secret
		s.cookie(from, guid+1, w),      // another GUID's
		make([]byte, fabric.CookieLen), // made up
	}
	for i, cookie := range bad {
		req := fabric.EncodeControl(&fabric.Control{Type: fabric.TypeAttach, GUID: guid, Cookie: cookie})
		c.WriteToUDPAddrPort(req, s.FabricAddr())
		mustRetry(t, readAnswer(t, c), guid, len(req))
		if st := s.Stats(); st.BadCookies != uint64(i+1) || len(st.Ports) != 0 {
			t.Fatalf("bad cookie %d: BadCookies %d, %d ports", i, st.BadCookies, len(st.Ports))
		}
	}
	noPorts(t, s)
	if !logs.has("wrong or expired cookie") {
		t.Error("the bad cookies were not logged")
	}
	req := fabric.EncodeControl(&fabric.Control{Type: fabric.TypeAttach, GUID: guid, Cookie: s.cookie(from, guid, cookieWindow(time.Now())-1)})
	c.WriteToUDPAddrPort(req, s.FabricAddr())
	if pi, err := fabric.DecodeControl(readAnswer(t, c)); err != nil || pi.Type != fabric.TypePortInfo {
		t.Fatalf("the previous window's cookie: %+v %v", pi, err)
	}
}

// TestOldVersionAttach: a port of protocol version 1 (before address
// validation) gets a refused with reason "version" in version 1, no
// larger than its attach, so it fails at once instead of waiting; nothing
// is registered. A version 1 attach shorter than that refusal gets no
// answer; other version 1 messages are dropped.
func TestOldVersionAttach(t *testing.T) {
	var logs logRecorder
	s := startSM(t, Config{Logf: logs.logf(t)})
	c := udpSocket(t)
	short := []byte("SRSM\x01" + `{"type":"attach","guid":5}`)
	detach := []byte("SRSM\x01" + `{"type":"detach","guid":1048577}`)
	v1 := []byte("SRSM\x01" + `{"type":"attach","guid":1048577,"node_desc":"softrdma 127.0.0.1","credits":64}`)
	for _, b := range [][]byte{short, detach, v1} {
		c.WriteToUDPAddrPort(b, s.FabricAddr())
	}
	// The SM handles one address's messages in order: the first answer
	// is the third message's.
	b := readAnswer(t, c)
	if want := "SRSM\x01" + `{"type":"refused","guid":1048577,"reason":"version"}`; string(b) != want {
		t.Fatalf("answer %q, want %q", b, want)
	}
	if len(b) > len(v1) {
		t.Fatalf("refusal of %d bytes to an attach of %d", len(b), len(v1))
	}
	noMore(t, c)
	noPorts(t, s)
	if st := s.Stats(); st.VersionRefusals != 2 || st.Retries != 0 {
		t.Fatalf("VersionRefusals %d Retries %d, want 2 and 0", st.VersionRefusals, st.Retries)
	}
	if !logs.has("protocol version 1, this SM speaks 2") {
		t.Error("the refusal was not logged")
	}
}

// BenchmarkAttach measures a new port's attach: attach, retry, attach
// with the cookie, port_info (before address validation: attach,
// port_info). Each iteration attaches a new GUID from one socket (the
// socket's previous port goes). It speaks the fabric's JSON directly so
// that it also runs against an SM without retries.
func BenchmarkAttach(b *testing.B) {
	s, err := New(Config{Listen: "127.0.0.1:0", MaxPortsPerSource: -1})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 65536)
	send := func(guid uint64, cookie []byte) {
		m := map[string]any{"type": "attach", "guid": guid, "node_desc": "bench", "credits": 64}
		if cookie != nil {
			m["cookie"] = cookie
		}
		j, _ := json.Marshal(m)
		msg := append([]byte(fabric.Magic), j...)
		for len(msg) < 256 {
			msg = append(msg, ' ')
		}
		c.WriteToUDPAddrPort(msg, s.FabricAddr())
	}
	rtts := 0
	b.ResetTimer()
	for i := range b.N {
		guid := 0x7300000 + uint64(i)
		send(guid, nil)
		for {
			rtts++
			c.SetReadDeadline(time.Now().Add(waitTimeout))
			n, _, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				b.Fatal(err)
			}
			var a struct {
				Type   string `json:"type"`
				Cookie []byte `json:"cookie"`
			}
			if err := json.Unmarshal(buf[len(fabric.Magic):n], &a); err != nil {
				b.Fatal(err)
			}
			if a.Type == "retry" {
				send(guid, a.Cookie)
				continue
			}
			if a.Type != "port_info" {
				b.Fatalf("answer %q", buf[:n])
			}
			break
		}
	}
	b.ReportMetric(float64(rtts)/float64(b.N), "round-trips/op")
}
