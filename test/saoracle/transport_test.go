package saoracle

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// transport carries raw SA MADs to one SA and back.
type transport interface {
	send(m mad.MAD) error
	// recv returns the next SA MAD, or nil when none came within d.
	recv(d time.Duration) (mad.MAD, error)
}

// Waits of an exchange.
const (
	// answerWait bounds the wait for the answer to one request.
	answerWait = 5 * time.Second
	// lateWait is how long an answer is still awaited once the probe
	// sent after the request was answered (OpenSM serves Set and Delete
	// on a dispatcher thread of their own, so a probe's answer may pass
	// an answer to the request).
	lateWait = 300 * time.Millisecond
	// probeTID marks the ClassPortInfo probes (low 32 bits; a TID's
	// high 32 bits are the umad agent's on OpenSM's side).
	probeTID = 0x7e570000
)

// tidLow is the part of a TID both SAs echo: the kernel's (and
// umad2sim's) MAD layer replaces the high 32 bits with the agent's.
func tidLow(m mad.MAD) uint32 { return uint32(m.TID()) }

// exchange sends req and returns its answers: one MAD, or every RMPP
// segment of a GetTableResp (acknowledged as the kernel's RMPP receiver
// does), or nil when the SA does not answer. A ClassPortInfo probe follows
// the request: once it is answered the SA has seen the request, and the
// wait for an answer is cut to lateWait.
func exchange(t *testing.T, tr transport, req mad.MAD, probeSeq uint32) []mad.MAD {
	t.Helper()
	if err := tr.send(req); err != nil {
		t.Fatalf("send: %v", err)
	}
	probe := mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, uint64(probeTID|probeSeq), 0)
	if err := tr.send(probe); err != nil {
		t.Fatalf("send probe: %v", err)
	}
	var (
		out      []mad.MAD
		re       mad.Reassembler
		deadline = time.Now().Add(answerWait)
		probed   bool
	)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			if !probed {
				t.Fatalf("no answer to the probe (tid %#x) within %v: the SA is not answering", probe.TID(), answerWait)
			}
			return out
		}
		m, err := tr.recv(left)
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		if m == nil {
			continue
		}
		switch {
		case tidLow(m) == tidLow(probe):
			if !probed {
				probed = true
				if out == nil && time.Until(deadline) > lateWait {
					deadline = time.Now().Add(lateWait)
				}
			}
		case tidLow(m) != tidLow(req):
			t.Logf("stray answer tid %#x method %#x", m.TID(), m.Method())
		case m.RMPPFlags()&mad.RMPPFlagActive == 0 || unsegmented(m):
			out = append(out, m)
			if probed {
				return out
			}
			deadline = time.Now().Add(answerWait) // the probe's answer still comes
			for !probed && time.Now().Before(deadline) {
				p, err := tr.recv(time.Until(deadline))
				if err != nil {
					t.Fatalf("recv: %v", err)
				}
				if p != nil && tidLow(p) == tidLow(probe) {
					probed = true
				} else if p != nil {
					t.Logf("further answer tid %#x method %#x status %#x", p.TID(), p.Method(), p.Status())
					out = append(out, p)
				}
			}
			return out
		default:
			done, _, err := re.Add(m)
			if err != nil {
				t.Fatalf("RMPP segment %d: %v", m.SegmentNumber(), err)
			}
			if a := re.Ack(); a != nil {
				if err := tr.send(a); err != nil {
					t.Fatalf("send ACK: %v", err)
				}
			}
			if uint32(len(out)) < m.SegmentNumber() {
				out = append(out, m)
			}
			if done {
				if !probed {
					deadline = time.Now().Add(answerWait)
					for !probed && time.Now().Before(deadline) {
						p, err := tr.recv(time.Until(deadline))
						if err != nil {
							t.Fatalf("recv: %v", err)
						}
						probed = p != nil && tidLow(p) == tidLow(probe)
					}
				}
				return out
			}
			deadline = time.Now().Add(answerWait)
		}
	}
}

// unsegmented reports an RMPP-active answer whose RMPP header the
// kernel's MAD layer would fill in (RMPP type 0): OpenSM hands the whole
// answer to its MAD layer with only the Active flag set, and umad2sim has
// no RMPP: ibsim carries the first 256 bytes of it, unsegmented.
func unsegmented(m mad.MAD) bool {
	return m.RMPPFlags()&mad.RMPPFlagActive != 0 && m.RMPPType() == 0
}

// umadClient is testdata/saclient.c running on a simulated HCA of ibsim.
type umadClient struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	smLID uint16
	lid   uint16
	guid  uint64
}

// startUMADClient starts the client on HCA host and waits for its port to
// be active.
func startUMADClient(t *testing.T, bin, dir, host string, env []string) *umadClient {
	t.Helper()
	cmd := exec.Command(bin, "30000")
	cmd.Dir = dir
	cmd.Env = append(env, "SIM_HOST="+host)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &prefixWriter{t: t, prefix: "saclient " + host + ": "}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &umadClient{cmd: cmd, in: in, lines: make(chan string, 16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(c.lines)
		sc := bufio.NewScanner(outp)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		in.Close()
		cmd.Process.Kill()
		for range c.lines {
		}
		<-done
		cmd.Wait()
	})
	l, ok := c.line(40 * time.Second)
	if !ok {
		t.Fatalf("saclient on %s: no ready line", host)
	}
	var sm, lid uint16
	var guid uint64
	if _, err := fmt.Sscanf(l, "ready %d %d %x", &sm, &lid, &guid); err != nil {
		t.Fatalf("saclient on %s: %q", host, l)
	}
	c.smLID, c.lid, c.guid = sm, lid, guid
	return c
}

func (c *umadClient) line(d time.Duration) (string, bool) {
	select {
	case l, ok := <-c.lines:
		return l, ok
	case <-time.After(d):
		return "", false
	}
}

func (c *umadClient) send(m mad.MAD) error {
	if _, err := fmt.Fprintf(c.in, "send %x\n", []byte(m[:mad.Len])); err != nil {
		return err
	}
	l, ok := c.line(10 * time.Second)
	if !ok || l != "sent" {
		return fmt.Errorf("saclient: %q", l)
	}
	return nil
}

func (c *umadClient) recv(d time.Duration) (mad.MAD, error) {
	ms := max(d.Milliseconds(), 1)
	if _, err := fmt.Fprintf(c.in, "recv %d\n", ms); err != nil {
		return nil, err
	}
	l, ok := c.line(d + 10*time.Second)
	if !ok {
		return nil, errors.New("saclient: no answer to recv")
	}
	if l == "timeout" {
		return nil, nil
	}
	f := strings.Fields(l)
	if len(f) != 3 || f[0] != "mad" {
		return nil, fmt.Errorf("saclient: %q", l)
	}
	if st, _ := strconv.Atoi(f[1]); st != 0 {
		return nil, fmt.Errorf("saclient: receive status %d", st)
	}
	b, err := hex.DecodeString(f[2])
	if err != nil {
		return nil, err
	}
	switch {
	case len(b) < mad.SAHeaderEnd:
		return nil, fmt.Errorf("saclient: MAD of %d bytes", len(b))
	case len(b) > mad.Len:
		return nil, fmt.Errorf("saclient: %d bytes in one receive (not segmented by RMPP)", len(b))
	}
	// OpenSM sends a MAD as long as its header and records (umad2sim
	// carries the length); the rest of the 256 bytes is zero on a wire.
	m := make(mad.MAD, mad.Len)
	copy(m, b)
	return m, nil
}

// rawPort is softsm's raw SA port.
type rawPort struct {
	conn *net.UDPConn
	sa   netip.AddrPort
	buf  []byte
}

func newRawPort(t *testing.T, sa netip.AddrPort) *rawPort {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rawPort{conn: conn, sa: sa, buf: make([]byte, 4096)}
}

func (r *rawPort) send(m mad.MAD) error {
	_, err := r.conn.WriteToUDPAddrPort(m[:mad.Len], r.sa)
	return err
}

func (r *rawPort) recv(d time.Duration) (mad.MAD, error) {
	r.conn.SetReadDeadline(time.Now().Add(d))
	n, from, err := r.conn.ReadFromUDPAddrPort(r.buf)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if from != r.sa || n != mad.Len {
		return nil, fmt.Errorf("raw SA: %d bytes from %v", n, from)
	}
	return append(mad.MAD(nil), r.buf[:n]...), nil
}

// fabricPort is a port of softsm's subnet: it attaches with a GUID of its
// own and sends SA MADs over the fabric as UD packets to the SA (LID 1,
// QP1), as a host port does.
type fabricPort struct {
	conn *net.UDPConn
	sm   netip.AddrPort
	guid uint64
	lid  uint16
	qpn  uint32
	psn  uint32
	buf  []byte
}

func newFabricPort(t *testing.T, sm netip.AddrPort, guid uint64) *fabricPort {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.WriteToUDPAddrPort(fabric.EncodeControl(&fabric.Control{Type: fabric.TypeDetach, GUID: guid}), sm)
		conn.Close()
	})
	p := &fabricPort{conn: conn, sm: sm, guid: guid, qpn: 0x40 + uint32(guid&0xFF), buf: make([]byte, 65536)}
	a := &fabric.Control{Type: fabric.TypeAttach, GUID: guid, NodeDesc: "saoracle"}
	if _, err := conn.WriteToUDPAddrPort(fabric.EncodeControl(a), sm); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		conn.SetReadDeadline(deadline)
		n, _, err := conn.ReadFromUDPAddrPort(p.buf)
		if err != nil {
			t.Fatalf("port %#x: attach: %v", guid, err)
		}
		if !fabric.IsControl(p.buf[:n]) {
			continue
		}
		c, err := fabric.DecodeControl(p.buf[:n])
		if err != nil {
			t.Fatalf("port %#x: %v", guid, err)
		}
		switch c.Type {
		case fabric.TypeRetry:
			a.Cookie = c.Cookie
			if _, err := conn.WriteToUDPAddrPort(fabric.EncodeControl(a), sm); err != nil {
				t.Fatal(err)
			}
		case fabric.TypePortInfo:
			p.lid = c.LID
			return p
		default:
			t.Fatalf("port %#x: attach answered %q (%s)", guid, c.Type, c.Reason)
		}
	}
	t.Fatalf("port %#x: no port_info", guid)
	return nil
}

func (p *fabricPort) send(m mad.MAD) error {
	h := &fabric.UDPacket{DLID: fabric.SMLID, SLID: p.lid,
		UD: wire.UDHeader{PKey: fabric.DefaultPKey, DestQP: fabric.SAQPN, PSN: p.psn, QKey: fabric.SAQKey, SrcQP: p.qpn}}
	p.psn++
	b := make([]byte, fabric.PacketLen(mad.Len, false, false))
	fabric.EncodeUD(b, h, m[:mad.Len])
	_, err := p.conn.WriteToUDPAddrPort(b, p.sm)
	return err
}

func (p *fabricPort) recv(d time.Duration) (mad.MAD, error) {
	deadline := time.Now().Add(d)
	for {
		p.conn.SetReadDeadline(deadline)
		n, _, err := p.conn.ReadFromUDPAddrPort(p.buf)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		b := p.buf[:n]
		if fabric.IsControl(b) || fabric.IsFlow(b) {
			continue
		}
		var pkt fabric.Packet
		if err := fabric.Parse(b, &pkt); err != nil {
			return nil, fmt.Errorf("port %#x: %v", p.guid, err)
		}
		if pkt.UD.DETH.SrcQP() != fabric.SAQPN || len(pkt.UD.Payload) < mad.Len {
			continue
		}
		return append(mad.MAD(nil), pkt.UD.Payload[:mad.Len]...), nil
	}
}

// prefixWriter logs a child's stderr through t.
type prefixWriter struct {
	t      *testing.T
	prefix string
}

func (w *prefixWriter) Write(b []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		w.t.Log(w.prefix + l)
	}
	return len(b), nil
}
