package introspect

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"github.com/softrdma/softrdma/capture"
	"github.com/softrdma/softrdma/provider/rxe"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

func TestMain(m *testing.M) {
	testenv.OwnNetns() // lo to this package alone
	testenv.ClearSoftRDMA()
	unscope, err := testenv.ScopeEndpoints() // discovery sees this run's processes only
	if err != nil {
		fmt.Fprintln(os.Stderr, "introspect test:", err)
		os.Exit(1)
	}
	code := m.Run()
	unscope()
	rxe.CloseAll()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func randGroup() netip.Addr {
	return netip.AddrFrom4([4]byte{239, byte(1 + rand.IntN(250)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))})
}

var lo = rdmacm.UDPAddr(netip.MustParseAddr("127.0.0.1"))

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// member is an id of the in-process scenario.
type member struct {
	id  *rdmacm.ID
	mr  *verbs.MR
	ah  *verbs.AH
	buf []byte
}

// newMember creates an id on ch bound to 127.0.0.1 with a QP (unless
// noQP) and n posted receives.
func newMember(t *testing.T, ch *rdmacm.EventChannel, noQP bool, n int) *member {
	t.Helper()
	m := &member{}
	var err error
	if m.id, err = rdmacm.CreateID(ch, m, rdmacm.PS_UDP); err != nil {
		t.Fatal(err)
	}
	if err := m.id.BindAddr(lo); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if m.ah != nil {
			m.ah.Destroy()
		}
		if m.id.QP() != nil {
			m.id.DestroyQP()
		}
		if m.mr != nil {
			m.mr.Dereg()
		}
		m.id.Destroy()
	})
	if noQP {
		return m
	}
	attr := verbs.QPInitAttr{Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: max(n, 1), MaxSendSGE: 1, MaxRecvSGE: 1}, QPType: verbs.QPTypeUD}
	if err := m.id.CreateQP(nil, &attr); err != nil {
		t.Fatal(err)
	}
	const slot = verbs.GRHLen + 64
	m.buf = make([]byte, max(n, 1)*slot)
	if m.mr, err = m.id.RegMsgs(m.buf); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := m.id.PostRecv(uint64(i), m.mr, i*slot, slot); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func (m *member) join(t *testing.T, g netip.Addr, flags uint32) {
	t.Helper()
	err := m.id.JoinMulticastEx(&rdmacm.JoinMCAttrEx{CompMask: rdmacm.JoinMCAttrAddress | rdmacm.JoinMCAttrJoinFlags, JoinFlags: flags, Addr: rdmacm.UDPAddr(g)}, nil)
	if err != nil {
		t.Fatal(err)
	}
}

// joined retrieves the JOIN event of m and makes its AH.
func (m *member) joined(t *testing.T) {
	t.Helper()
	ev, err := m.id.Channel().GetEvent(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if ev.Event != rdmacm.EventMulticastJoin || ev.ID != m.id {
		ev.Ack()
		t.Fatalf("event %v for another id or not a join", ev.Event)
	}
	if m.id.QP() != nil {
		if m.ah, err = m.id.PD().CreateAH(&ev.Param.AHAttr); err != nil {
			t.Fatal(err)
		}
	}
	ev.Ack()
}

func (m *member) send(t *testing.T, n int, qkey uint32) {
	t.Helper()
	msg := make([]byte, 16)
	smr, err := m.id.RegMsgs(msg)
	if err != nil {
		t.Fatal(err)
	}
	defer smr.Dereg()
	for i := range n {
		if err := m.id.PostUDSend(uint64(i), smr, 0, len(msg), verbs.SendSignaled, m.ah, rdmacm.MulticastQPN); err != nil {
			t.Fatal(err)
		}
		if _, err := m.id.GetSendComp(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	_ = qkey
}

// scenario builds, in this process, on a random group g: a full member
// with a QP and 10 receives (joined), a send-only member (joined), and a
// full member without a QP whose JOIN event is still queued.
type scenario struct {
	g                     netip.Addr
	ch                    *rdmacm.EventChannel
	full, sendOnly, queue *member
}

func newScenario(t *testing.T) *scenario {
	t.Helper()
	s := &scenario{g: randGroup()}
	var err error
	if s.ch, err = rdmacm.CreateEventChannel(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.ch.Close() })
	s.full = newMember(t, s.ch, false, 10)
	s.sendOnly = newMember(t, s.ch, false, 0)
	s.queue = newMember(t, s.ch, true, 0)
	s.full.join(t, s.g, rdmacm.MCJoinFlagFullMember)
	s.full.joined(t)
	s.sendOnly.join(t, s.g, rdmacm.MCJoinFlagSendOnlyFullMember)
	s.sendOnly.joined(t)
	s.queue.join(t, s.g, rdmacm.MCJoinFlagFullMember)
	return s
}

// startServer starts an endpoint on a Unix socket in a temporary directory.
func startServer(t *testing.T) (*Server, *Client) {
	t.Helper()
	srv, err := Start("unix:" + filepath.Join(t.TempDir(), "ep.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	c, err := Dial(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return srv, c
}

// TestEndpointState checks every view of the endpoint against the state
// the scenario built.
func TestEndpointState(t *testing.T) {
	s := newScenario(t)
	s.sendOnly.send(t, 3, rdmacm.UDPQKey)
	qpFull, qpSO := s.full.id.QP().Num(), s.sendOnly.id.QP().Num()
	_, c := startServer(t)
	var snap *Snapshot
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		if snap, err = c.Snapshot(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if qpCounter(snap, qpFull, "delivered") == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if snap.PID != os.Getpid() {
		t.Errorf("pid %d", snap.PID)
	}
	var dev *Device
	for i := range snap.Devices {
		if snap.Devices[i].Name == "rxe_lo" {
			dev = &snap.Devices[i]
		}
	}
	if dev == nil {
		t.Fatalf("no rxe_lo in %+v", snap.Devices)
	}
	p := dev.Ports[0]
	if p.State != "PORT_ACTIVE" || p.ActiveMTU != 4096 || p.LinkLayer != "Ethernet" || len(p.GIDs) == 0 || p.GIDs[0].GID != "::ffff:127.0.0.1" || p.GIDs[0].Type != "RoCE v2" {
		t.Errorf("port %+v", p)
	}
	if dev.Limits.MaxMcastQPAttach != rxe.DefaultMaxMcastQPAttach || dev.Limits.MaxMcastGrp != rxe.DefaultMaxMcastGrp {
		t.Errorf("limits %+v", dev.Limits)
	}
	mg := wire.RoCEv2MGID(s.g).String()
	seen := map[uint32]bool{}
	for _, q := range dev.QPs {
		seen[q.QPN] = true
		switch q.QPN {
		case qpFull:
			if q.State != "RTS" || q.QKey != rdmacm.UDPQKey || len(q.Groups) != 1 || q.Groups[0] != mg || q.CMID == 0 {
				t.Errorf("full member's QP %+v", q)
			}
			if q.Counters["delivered"] != 3 {
				t.Errorf("full member's QP delivered %d, want 3", q.Counters["delivered"])
			}
		case qpSO:
			if len(q.Groups) != 0 || q.Counters["sent_pkts"] != 3 {
				t.Errorf("send-only member's QP %+v", q)
			}
		}
	}
	if !seen[qpFull] || !seen[qpSO] {
		t.Errorf("snapshot lacks a QP: full member's %#x %v, send-only member's %#x %v (QPs %+v)", qpFull, seen[qpFull], qpSO, seen[qpSO], dev.QPs)
	}
	if dev.Counters["sent_pkts"] < 3 || dev.Counters["rcvd_pkts"] < 3 {
		t.Errorf("device counters %v", dev.Counters)
	}

	var grp *Group
	for i := range snap.Groups {
		if snap.Groups[i].MGID == mg {
			grp = &snap.Groups[i]
		}
	}
	if grp == nil {
		t.Fatalf("group %s missing: %+v", mg, snap.Groups)
	}
	if grp.Addr != s.g.String() || !grp.IPMembership || grp.CMRefs != 2 || len(grp.AttachedQPs) != 1 || grp.AttachedQPs[0] != qpFull {
		t.Errorf("group %+v: want membership with 2 CM refs (two full members), QP %#x attached", grp, qpFull)
	}
	if len(grp.Joins) != 3 {
		t.Fatalf("joins %+v", grp.Joins)
	}
	byQPN := map[uint32]Join{}
	for _, j := range grp.Joins {
		byQPN[j.QPN] = j
	}
	if j := byQPN[qpFull]; j.JoinType != "full" || j.State != "joined" || !j.Attached || !j.MembershipRef {
		t.Errorf("full member's join %+v", j)
	}
	if j := byQPN[qpSO]; j.JoinType != "send-only" || j.JoinFlags != 1 || j.State != "joined" || j.Attached || j.MembershipRef {
		t.Errorf("send-only join %+v", j)
	}
	if j := byQPN[0]; j.State != "pending" || j.EventsQueued != 1 || !j.MembershipRef {
		t.Errorf("queued join %+v", j)
	}
	if len(snap.IDs) < 3 || snap.CM.EventQueueDepth < 1 || snap.CM.Joins < 3 {
		t.Errorf("ids %d, cm %+v", len(snap.IDs), snap.CM)
	}
	for _, id := range snap.IDs {
		if id.Device == "rxe_lo" && (id.State != "ADDR_BOUND" || id.PortSpace != "RDMA_PS_UDP" || !strings.HasPrefix(id.Src, "127.0.0.1:")) {
			t.Errorf("id %+v", id)
		}
	}

	// The partial views.
	for _, path := range []string{"/v1/devices", "/v1/groups", "/v1/ids", "/"} {
		resp, err := c.get(ctxT(t), path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if path != "/" && !json.Valid(b) {
			t.Errorf("%s: invalid JSON", path)
		}
	}
}

func qpCounter(s *Snapshot, qpn uint32, name string) uint64 {
	for _, d := range s.Devices {
		for _, q := range d.QPs {
			if q.QPN == qpn {
				return q.Counters[name]
			}
		}
	}
	return 0
}

// parseMetrics parses the Prometheus text format.
func parseMetrics(t *testing.T, b []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, b)
	}
	return fams
}

// metricValue returns the value of the sample of family name whose labels
// include want.
func metricValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		ok := true
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == k && l.GetValue() == v)
			}
			ok = ok && found
		}
		if !ok {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		}
	}
	return 0, false
}

// TestMetrics scrapes /metrics, parses it with the Prometheus text parser
// and checks the values against the scenario.
func TestMetrics(t *testing.T) {
	s := newScenario(t)
	_, c := startServer(t)
	// The counters before the two datagrams: the process-wide ones carry
	// what earlier tests of the package did, so the checks below compare
	// increases.
	b0, err := c.Metrics(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	before := parseMetrics(t, b0)
	s.sendOnly.send(t, 2, rdmacm.UDPQKey)
	qpFull := s.full.id.QP().Num()
	deadline := time.Now().Add(5 * time.Second)
	var fams map[string]*dto.MetricFamily
	qpn := fmt.Sprintf("%#06x", qpFull)
	for {
		b, err := c.Metrics(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		fams = parseMetrics(t, b)
		v, _ := metricValue(fams, "softrdma_qp_delivered_packets_total", map[string]string{"device": "rxe_lo", "qpn": qpn})
		if v == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	dev := map[string]string{"device": "rxe_lo"}
	checks := []struct {
		name   string
		labels map[string]string
		min    float64
	}{
		{"softrdma_sent_packets_total", dev, 2},
		{"softrdma_sent_bytes_total", dev, 2 * 16},
		{"softrdma_received_packets_total", dev, 2},
		{"softrdma_received_bytes_total", dev, 2 * 16},
		{"softrdma_delivered_packets_total", dev, 2},
		{"softrdma_qp_delivered_packets_total", map[string]string{"device": "rxe_lo", "qpn": qpn}, 2},
		{"softrdma_qps", dev, 2},
		{"softrdma_mcast_groups", dev, 1},
		{"softrdma_mcast_memberships", dev, 1},
		{"softrdma_cm_ids", nil, 3},
		{"softrdma_cm_joins_total", nil, 3},
		{"softrdma_cm_joins", map[string]string{"device": "rxe_lo", "join_type": "send-only", "state": "joined"}, 1},
		{"softrdma_cm_joins", map[string]string{"device": "rxe_lo", "join_type": "full", "state": "pending"}, 1},
		{"softrdma_cm_event_queue_depth", nil, 1},
		{"softrdma_port_state", dev, 4},
		{"softrdma_device_info", map[string]string{"device": "rxe_lo", "ifname": "lo", "gid0": "::ffff:127.0.0.1"}, 1},
		{"go_goroutines", nil, 1},
	}
	for _, ck := range checks {
		v, ok := metricValue(fams, ck.name, ck.labels)
		if !ok || v < ck.min {
			t.Errorf("%s%v = %v (found %v), want ≥ %v", ck.name, ck.labels, v, ok, ck.min)
		}
	}
	// What the two datagrams changed, exactly: two sent and two delivered
	// to the full member's QP; no drop, no leave.
	for _, ck := range []struct {
		name   string
		labels map[string]string
		delta  float64
	}{
		{"softrdma_sent_packets_total", dev, 2},
		{"softrdma_qp_delivered_packets_total", map[string]string{"device": "rxe_lo", "qpn": qpn}, 2},
		{"softrdma_dropped_packets_total", map[string]string{"device": "rxe_lo", "reason": "icrc"}, 0},
		{"softrdma_dropped_packets_total", map[string]string{"device": "rxe_lo", "reason": "no_recv_wr"}, 0},
		{"softrdma_dropped_packets_total", map[string]string{"device": "rxe_lo", "reason": "qkey"}, 0},
		{"softrdma_cm_leaves_total", nil, 0},
		{"softrdma_cm_joins_total", nil, 0},
	} {
		v0, _ := metricValue(before, ck.name, ck.labels) // absent before: 0
		v, ok := metricValue(fams, ck.name, ck.labels)
		if !ok || v-v0 != ck.delta {
			t.Errorf("%s%v went from %v to %v (found %v), want +%v", ck.name, ck.labels, v0, v, ok, ck.delta)
		}
	}
	reasons := map[string]bool{}
	for _, m := range fams["softrdma_dropped_packets_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "reason" {
				reasons[l.GetValue()] = true
			}
		}
	}
	// Every drop reason of the software devices' counter schema is
	// exported, and nothing else.
	want := map[string]bool{}
	for _, c := range softverbs.Schema() {
		if c.Reason != "" {
			want[c.Reason] = true
		}
	}
	if !maps.Equal(reasons, want) {
		t.Errorf("drop reasons %v, want %v", reasons, want)
	}
	if f := fams["softrdma_sent_packets_total"]; f.GetType() != dto.MetricType_COUNTER {
		t.Errorf("sent packets type %v", f.GetType())
	}
}

// TestCaptureStream captures through the endpoint while the scenario
// sends, and decodes the stream.
func TestCaptureStream(t *testing.T) {
	s := newScenario(t)
	_, c := startServer(t)
	pr, pw := io.Pipe()
	started := make(chan struct{})
	var n int64
	var cerr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer pw.Close()
		n, cerr = c.Capture(ctxT(t), CaptureRequest{Device: "rxe_lo", Direction: capture.Sent, Count: 3}, pw, func() { close(started) })
	}()
	var buf bytes.Buffer
	copied := make(chan struct{})
	go func() { io.Copy(&buf, pr); close(copied) }()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("capture did not start")
	}
	s.sendOnly.send(t, 3, rdmacm.UDPQKey)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("capture did not end after 3 frames")
	}
	<-copied
	if cerr != nil {
		t.Fatal(cerr)
	}
	r, err := pcapgo.NewReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatalf("%v (%d bytes)", err, n)
	}
	for i := range 3 {
		data, _, err := r.ReadPacketData()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		var p wire.Packet
		if err := wire.ParseUD(data[14+20+8:], &p); err != nil {
			t.Fatal(err)
		}
		ip, udp := wire.IPv4(data[14:34]), wire.UDP(data[34:42])
		if wire.ICRCv4(ip, udp, p.Body) != p.ICRC || p.DETH.SrcQP() != s.sendOnly.id.QP().Num() || ip.Dst() != s.g {
			t.Errorf("frame %d: ICRC or fields wrong", i)
		}
	}
	if _, _, err := r.ReadPacketData(); err != io.EOF {
		t.Errorf("more than 3 frames: %v", err)
	}
	if capture.Active(nil) != 0 {
		t.Error("capture still running")
	}
}

// TestCaptureClientGone: a client that leaves ends the capture in the
// process, and Close ends a capture in progress.
func TestCaptureClientGone(t *testing.T) {
	newScenario(t)
	srv, c := startServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := c.Capture(ctx, CaptureRequest{}, io.Discard, func() { close(started) })
		done <- err
	}()
	<-started
	if capture.Active(nil) != 1 {
		t.Errorf("%d captures", capture.Active(nil))
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("cancelled capture: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for capture.Active(nil) != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if capture.Active(nil) != 0 {
		t.Error("capture survived its client")
	}
	// Close during a capture.
	started2 := make(chan struct{})
	go func() {
		_, err := c.Capture(context.Background(), CaptureRequest{}, io.Discard, func() { close(started2) })
		done <- err
	}()
	<-started2
	srv.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the capture")
	}
	if capture.Active(nil) != 0 {
		t.Error("capture survived Close")
	}
}

// rawRequest sends raw bytes on a new connection to the server and returns
// what came back before the server closed or 2s passed.
func rawRequest(t *testing.T, srv *Server, req string) string {
	t.Helper()
	conn, err := net.Dial("unix", strings.TrimPrefix(srv.Addr(), "unix:"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	conn.Write([]byte(req))
	b, _ := io.ReadAll(conn)
	return string(b)
}

// TestMalformedRequests: garbage, bad methods, unknown paths and bad query
// parameters get an error status; the endpoint keeps serving.
func TestMalformedRequests(t *testing.T) {
	srv, c := startServer(t)
	for _, raw := range []string{
		"GARBAGE\r\n\r\n",
		"GET /v1/snapshot HTTP/9.9\r\n\r\n",
		"GET /v1/snapshot HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
		"GET /v1/snapshot HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 64<<10) + "\r\n\r\n",
		"\x00\x01\x02\xff\xfe\r\n\r\n",
		"GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		resp := rawRequest(t, srv, raw)
		code := 0
		if f := strings.Fields(resp); len(f) > 1 && strings.HasPrefix(f[0], "HTTP/1.") {
			code, _ = strconv.Atoi(f[1])
		}
		if code < 400 || code > 599 {
			t.Errorf("request %.40q: response %.60q, want an error status", raw, resp)
		}
	}
	hc := &http.Client{Transport: c.tr}
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{"POST", "/v1/snapshot", 405},
		{"DELETE", "/metrics", 405},
		{"PUT", "/v1/capture", 405},
		{"GET", "/v2/everything", 404},
		{"GET", "/v1/snapshot/extra", 404},
		{"GET", "/v1/snapshot?x=1", 400},
		{"GET", "/v1/snapshot?%zz", 400},
		{"GET", "/v1/capture?count=abc", 400},
		{"GET", "/v1/capture?count=-1", 400},
		{"GET", "/v1/capture?duration=forever", 400},
		{"GET", "/v1/capture?dir=sideways", 400},
		{"GET", "/v1/capture?snaplen=99999999", 400},
		{"GET", "/v1/capture?count=1&count=2", 400},
		{"GET", "/v1/capture?device=rxe_nosuch", 404},
		{"GET", "/v1/groups?device=rxe_lo", 400},
	} {
		req, _ := http.NewRequest(tc.method, "http://softrdma"+tc.path, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Errorf("%s %s: %v", tc.method, tc.path, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e errorBody
		if resp.StatusCode != tc.code || json.Unmarshal(b, &e) != nil || e.Error == "" {
			t.Errorf("%s %s: %d %q, want %d with a JSON error", tc.method, tc.path, resp.StatusCode, b, tc.code)
		}
	}
	// Random bytes, many connections.
	rnd := rand.New(rand.NewPCG(1, 2))
	var wg sync.WaitGroup
	for range 20 {
		b := make([]byte, 1+rnd.IntN(512))
		for i := range b {
			b[i] = byte(rnd.UintN(256))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("unix", strings.TrimPrefix(srv.Addr(), "unix:"))
			if err != nil {
				return
			}
			conn.SetDeadline(time.Now().Add(time.Second))
			conn.Write(b)
			conn.Write([]byte("\r\n\r\n"))
			io.Copy(io.Discard, conn)
			conn.Close()
		}()
	}
	wg.Wait()
	if _, err := c.Snapshot(ctxT(t)); err != nil {
		t.Fatalf("endpoint dead after malformed requests: %v", err)
	}
}

// listeningInodes returns the socket inodes this process has open that
// are listening (TCP LISTEN or a Unix socket in the listening state).
func listeningInodes(t *testing.T) []string {
	t.Helper()
	ours := map[string]bool{}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		testenv.Require(t, "no /proc/self/fd: %v", err)
	}
	for _, fd := range fds {
		l, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if err == nil && strings.HasPrefix(l, "socket:[") {
			ours[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var out []string
	scan := func(path string, inodeCol int, listening func([]string) bool) {
		f, err := os.Open(path)
		if err != nil {
			return
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) > inodeCol && ours[fs[inodeCol]] && listening(fs) {
				out = append(out, path+":"+fs[inodeCol])
			}
		}
	}
	tcpListen := func(fs []string) bool { return fs[3] == "0A" }
	scan("/proc/self/net/tcp", 9, tcpListen)
	scan("/proc/self/net/tcp6", 9, tcpListen)
	// /proc/net/unix: Num RefCount Protocol Flags Type St Inode Path;
	// Flags 00010000 is __SO_ACCEPTCON (listening). Not the RoCEv2
	// devices' hand-over sockets and peer-socket lock (provider/rxe:
	// abstract unix sockets @softrdma/<uid>/...): they serve other devices
	// of the user, not requests.
	handover := fmt.Sprintf("@softrdma/%d/", os.Geteuid())
	scan("/proc/self/net/unix", 6, func(fs []string) bool {
		return fs[3] == "00010000" && !(len(fs) > 7 && strings.HasPrefix(fs[7], handover))
	})
	return out
}

// TestOffByDefault: without SOFTRDMA_DEBUG_ADDR, FromEnv starts nothing —
// even with devices, ids and joins alive, the process listens nowhere and
// no socket file appears.
func TestOffByDefault(t *testing.T) {
	t.Setenv(EnvAddr, "")
	t.Setenv(EnvLog, "")
	newScenario(t)
	before := listeningInodes(t)
	stop, err := FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if after := listeningInodes(t); len(after) != len(before) {
		t.Errorf("listening sockets: before %v, after FromEnv %v", before, after)
	}
	if len(before) != 0 {
		t.Errorf("the process listens without being asked: %v", before)
	}
	if _, err := os.Stat(SocketPath(os.Getpid())); err == nil {
		t.Errorf("%s exists", SocketPath(os.Getpid()))
	}

	// Asked: it listens, on a Unix socket of mode 0600, and stops again.
	dir := t.TempDir()
	t.Setenv(EnvDir, "") // this part tests the default places
	t.Setenv("XDG_RUNTIME_DIR", dir)
	t.Setenv(EnvAddr, "unix")
	stop2, err := FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, fmt.Sprintf("softrdma-%d.sock", os.Getpid()))
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("socket %s: %v %v", path, fi, err)
	}
	if n := len(listeningInodes(t)); n != 1 {
		t.Errorf("%d listening sockets, want 1", n)
	}
	c, err := ForPID(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Snapshot(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	found := false
	for _, e := range Endpoints() {
		found = found || (e.PID == os.Getpid() && e.Path == path)
	}
	if !found {
		t.Errorf("Endpoints() = %v lacks %s", Endpoints(), path)
	}
	stop2()
	if _, err := os.Stat(path); err == nil {
		t.Error("socket file left after stop")
	}
	if n := len(listeningInodes(t)); n != 0 {
		t.Errorf("%d listening sockets after stop", n)
	}
}

// TestAddresses: only Unix sockets and loopback addresses are accepted.
func TestAddresses(t *testing.T) {
	for _, bad := range []string{"0.0.0.0:0", ":0", "192.0.2.1:80", "[::]:0", "example.com:80", "10.0.0.1:1", "127.0.0.1", "127.0.0.1:99999", "unix:", "[fe80::1%lo]:0", "tcp://127.0.0.1:1"} {
		if _, err := Start(bad); err == nil {
			t.Errorf("Start(%q) accepted", bad)
		}
		if _, err := Dial(bad); err == nil {
			t.Errorf("Dial(%q) accepted", bad)
		}
	}
	for _, good := range []string{"127.0.0.1:0", "localhost:0", "[::1]:0", "127.0.0.2:0"} {
		srv, err := Start(good)
		if err != nil {
			if strings.Contains(good, "::1") {
				t.Logf("%s: %v (no IPv6 loopback?)", good, err)
				continue
			}
			t.Errorf("Start(%q): %v", good, err)
			continue
		}
		c, err := Dial(srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		c.SetToken(srv.Token())
		if _, err := c.Snapshot(ctxT(t)); err != nil {
			t.Errorf("%s: %v", srv.Addr(), err)
		}
		c.Close()
		srv.Close()
	}
	// A live socket is not taken over; a stale one is.
	path := filepath.Join(t.TempDir(), "x.sock")
	srv, err := Start(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(path); err == nil {
		t.Error("second endpoint on a live socket")
	}
	srv.Close()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close() // stale socket file
	srv, err = Start("unix:" + path)
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	srv.Close()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Start(path); err == nil {
		t.Error("endpoint replaced a regular file")
	}
	if _, err := ForPID(1 << 30); !errors.Is(err, ErrNoEndpoint) {
		t.Errorf("ForPID(no such process): %v", err)
	}
}

// record is a decoded JSON log record.
type record map[string]any

// TestLogging: joins, leaves, join failures and drops reach the logger.
func TestLogging(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	l := slog.New(slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	newScenario(t) // creates rxe_lo before logging starts
	stop := EnableLogging(l, LogOptions{DropInterval: 20 * time.Millisecond})
	defer stop()
	ch, err := rdmacm.CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })

	g := randGroup()
	m := newMember(t, ch, false, 0) // no receive posted: its deliveries drop
	m.join(t, g, rdmacm.MCJoinFlagFullMember)
	m.joined(t)
	m.send(t, 2, rdmacm.UDPQKey) // loops back to m: no_recv_wr drops
	bad := m.id.JoinMulticastEx(&rdmacm.JoinMCAttrEx{CompMask: rdmacm.JoinMCAttrAddress | rdmacm.JoinMCAttrJoinFlags, Addr: rdmacm.UDPAddr(netip.MustParseAddr("127.0.0.1"))}, nil)
	if bad == nil {
		t.Fatal("loopback group join accepted")
	}
	if err := m.id.LeaveMulticast(rdmacm.UDPAddr(g)); err != nil {
		t.Fatal(err)
	}
	records := func() []record {
		mu.Lock()
		defer mu.Unlock()
		var out []record
		for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			var r record
			if json.Unmarshal([]byte(line), &r) == nil {
				out = append(out, r)
			}
		}
		return out
	}
	find := func(msg string, match func(record) bool) record {
		for _, r := range records() {
			if r["msg"] == msg && (match == nil || match(r)) {
				return r
			}
		}
		return nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for find("drops", nil) == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	grp := g.String()
	if r := find("multicast join", func(r record) bool { return r["group"] == grp }); r == nil || r["level"] != "INFO" || r["device"] != "rxe_lo" || r["join"] != "full" {
		t.Errorf("join record %v", r)
	}
	if r := find("multicast join failed", nil); r == nil || r["level"] != "WARN" || r["err"] == nil {
		t.Errorf("join failure record %v", r)
	}
	if r := find("multicast leave", func(r record) bool { return r["group"] == grp }); r == nil || r["level"] != "INFO" {
		t.Errorf("leave record %v", r)
	}
	r := find("drops", nil)
	if r == nil || r["level"] != "WARN" || r["device"] != "rxe_lo" {
		t.Fatalf("drop record %v\nall: %v", r, records())
	}
	// The looped-back datagrams drop as no_recv_wr (no receive posted) or
	// no_group (arrived after the leave).
	by, _ := r["by_reason"].(map[string]any)
	if len(by) == 0 || r["dropped"] == nil || by["no_recv_wr_drops"] == nil && by["no_group_drops"] == nil {
		t.Errorf("drop record %v: want no_recv_wr or no_group drops", r)
	}
	// Rate limit: at most one drop record per device per interval.
	n := 0
	for _, r := range records() {
		if r["msg"] == "drops" {
			n++
		}
	}
	if n > 2 {
		t.Errorf("%d drop records for one burst", n)
	}
	stop()
	before := len(records())
	m2 := newMember(t, ch, true, 0)
	m2.join(t, randGroup(), rdmacm.MCJoinFlagSendOnlyFullMember)
	m2.joined(t)
	if len(records()) != before {
		t.Error("records after stop")
	}
	if _, err := ParseLogSpec("loud"); err == nil {
		t.Error("bad level accepted")
	}
	if _, err := ParseLogSpec("info,xml"); err == nil {
		t.Error("bad format accepted")
	}
	for _, spec := range []string{"info", "debug,json", "warn,text", "ERROR"} {
		if _, err := ParseLogSpec(spec); err != nil {
			t.Errorf("%s: %v", spec, err)
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestEndpointDir: with SOFTRDMA_DEBUG_DIR set, the socket goes there and
// discovery looks nowhere else: a process whose socket is in the default
// places is not listed.
func TestEndpointDir(t *testing.T) {
	t.Setenv(EnvLog, "")
	scoped, other := t.TempDir(), t.TempDir()
	t.Setenv(EnvDir, scoped)
	t.Setenv(EnvAddr, "unix")
	stop, err := FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	path := filepath.Join(scoped, fmt.Sprintf("softrdma-%d.sock", os.Getpid()))
	if got := SocketPath(os.Getpid()); got != path {
		t.Errorf("SocketPath = %s, want %s", got, path)
	}
	if eps := Endpoints(); len(eps) != 1 || eps[0].Path != path {
		t.Errorf("Endpoints() = %v, want only %s", eps, path)
	}
	t.Setenv(EnvDir, other)
	if eps := Endpoints(); len(eps) != 0 {
		t.Errorf("Endpoints() in another directory = %v, want none", eps)
	}
	if _, err := ForPID(os.Getpid()); !errors.Is(err, ErrNoEndpoint) {
		t.Errorf("ForPID from another directory: %v, want ErrNoEndpoint", err)
	}
}
