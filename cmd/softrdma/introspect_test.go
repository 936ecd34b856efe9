package main

// Multi-process tests of the operator subcommands: mckey processes run
// with their introspection endpoint on, and devices/groups/stat/capture
// read them; their pcap captures are decoded with gopacket (ICRC
// recomputed with package wire) and, where installed, with tshark.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"github.com/softrdma/softrdma/introspect"
	"github.com/softrdma/softrdma/provider/rxe"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/wire"
)

// mckeyBin is the mckey binary TestMain builds.
var mckeyBin string

// mckeyBinVar carries the Go mckey TestMain built into the re-runs of
// tests in network namespaces.
const mckeyBinVar = "SOFTRDMA_TEST_MCKEY_BIN"

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	testenv.OwnNetns() // lo to this package alone
	testenv.ClearSoftRDMA()
	unscope, err := testenv.ScopeEndpoints() // the tools see this run's processes only
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrdma test:", err)
		return 1
	}
	defer unscope()
	defer func() {
		if execBuild.dir != "" {
			os.RemoveAll(execBuild.dir)
		}
	}()
	// The Go mckey is built once: a test's re-run in a network namespace
	// (testenv.InNetns) finds it in mckeyBinVar.
	if mckeyBin = os.Getenv(mckeyBinVar); mckeyBin == "" {
		dir, err := os.MkdirTemp("", "softrdma-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		args := []string{"build", "-o", dir}
		if raceEnabled {
			args = append(args, "-race")
		}
		args = append(args, "../mckey")
		if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go %s: %v\n%s", strings.Join(args, " "), err, out)
			return 1
		}
		mckeyBin = filepath.Join(dir, "mckey")
		os.Setenv(mckeyBinVar, mckeyBin)
	}
	code := m.Run()
	rxe.CloseAll()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

func randomGroup() string {
	return fmt.Sprintf("239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254))
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// child is a running mckey process.
type child struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stdout lockedBuffer
	stderr lockedBuffer
	done   chan struct{}
	err    error
}

// startMckey runs mckey in its own process group, with the test's
// environment less SOFTRDMA_* and XDG_RUNTIME_DIR, plus env; it is killed
// at the end of the test.
func startMckey(t *testing.T, name string, env []string, args ...string) *child {
	t.Helper()
	c := &child{t: t, name: name, done: make(chan struct{})}
	c.cmd = exec.Command(mckeyBin, args...)
	for _, kv := range testenv.CleanEnv() {
		if !strings.HasPrefix(kv, "XDG_RUNTIME_DIR=") {
			c.cmd.Env = append(c.cmd.Env, kv)
		}
	}
	c.cmd.Env = append(c.cmd.Env, env...)
	if raceEnabled {
		c.cmd.Env = append(c.cmd.Env, "GORACE=atexit_sleep_ms=100")
	}
	c.cmd.Stdout, c.cmd.Stderr = &c.stdout, &c.stderr
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	go func() { c.err = c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
			<-c.done
		}
		if t.Failed() {
			t.Logf("%s stdout:\n%s\n%s stderr:\n%s", name, c.stdout.String(), name, c.stderr.String())
		}
	})
	return c
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// waitFor waits until cond holds, or fails the test.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timeout waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *child) waitLine(sub string) {
	c.t.Helper()
	waitFor(c.t, fmt.Sprintf("%s to print %q", c.name, sub), 30*time.Second, func() bool {
		select {
		case <-c.done:
			if !strings.Contains(c.stdout.String(), sub) {
				c.t.Fatalf("%s exited (%v) without printing %q", c.name, c.err, sub)
			}
		default:
		}
		return strings.Contains(c.stdout.String(), sub)
	})
}

func (c *child) wait() {
	c.t.Helper()
	select {
	case <-c.done:
	case <-time.After(60 * time.Second):
		c.t.Fatalf("%s did not exit", c.name)
	}
	if c.err != nil {
		c.t.Fatalf("%s: %v\n%s\n%s", c.name, c.err, c.stdout.String(), c.stderr.String())
	}
}

// softrdma runs a subcommand in this process and returns its status and
// output.
func softrdma(args ...string) (int, string, string) {
	var out, errOut lockedBuffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// mustJSON runs a subcommand with --json and decodes its output into v.
func mustJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	code, out, errOut := softrdma(append(args, "--json")...)
	if code != 0 {
		t.Fatalf("softrdma %v: exit %d: %s", args, code, errOut)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("softrdma %v: %v\n%s", args, err, out)
	}
}

// TestOperatorTools runs mckey processes with the endpoint on and checks
// what devices, groups, stat and capture report against what they did.
func TestOperatorTools(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(introspect.EnvDir, dir)
	env := []string{"XDG_RUNTIME_DIR=" + dir, introspect.EnvAddr + "=unix", introspect.EnvLog + "=info"}
	g := randomGroup()
	mgid := "::ffff:" + g
	rxPcap, txPcap, capPcap := filepath.Join(dir, "rx.pcap"), filepath.Join(dir, "tx.pcap"), filepath.Join(dir, "cap.pcap")

	recv := startMckey(t, "receiver", env, "-m", g, "-b", "127.0.0.1", "-C", "10", "--timeout", "60s", "--join-pause", "0", "--verify", "--pcap", rxPcap)
	recv.waitLine("receiving data transfers")
	hold := startMckey(t, "send-only", env, "-m", g, "-b", "127.0.0.1", "-s", "-o", "-C", "1", "--join-pause", "120s")
	hold.waitLine("mckey: joined")
	rpid, hpid := strconv.Itoa(recv.pid()), strconv.Itoa(hold.pid())
	for _, p := range []int{recv.pid(), hold.pid()} {
		path := filepath.Join(dir, fmt.Sprintf("softrdma-%d.sock", p))
		waitFor(t, path, 10*time.Second, func() bool { _, err := os.Stat(path); return err == nil })
	}

	// Two processes have an endpoint: without -p the tool refuses to guess.
	if code, _, errOut := softrdma("devices"); code != 1 || !strings.Contains(errOut, "several processes") {
		t.Errorf("devices without -p: exit %d, %q", code, errOut)
	}

	// devices
	var devs struct {
		PID     int                 `json:"pid"`
		Devices []introspect.Device `json:"devices"`
	}
	mustJSON(t, &devs, "devices", "-p", rpid)
	if devs.PID != recv.pid() || len(devs.Devices) != 1 || devs.Devices[0].Name != "rxe_lo" {
		t.Fatalf("devices: %+v", devs)
	}
	d := devs.Devices[0]
	p := d.Ports[0]
	if p.State != "PORT_ACTIVE" || p.ActiveMTU != 4096 || p.GIDs[0].GID != "::ffff:127.0.0.1" || d.Limits.MaxMcastQPAttach != 56 {
		t.Errorf("device %+v", d)
	}
	if len(d.QPs) != 1 {
		t.Fatalf("receiver QPs %+v", d.QPs)
	}
	rqp := d.QPs[0]
	if rqp.State != "RTS" || rqp.QKey != 0x01234567 || len(rqp.Groups) != 1 || rqp.Groups[0] != mgid || rqp.CMID == 0 {
		t.Errorf("receiver QP %+v", rqp)
	}
	code, out, errOut := softrdma("devices", "-p", rpid, "-v")
	for _, want := range []string{"hca_id:\trxe_lo", "PORT_ACTIVE (4)", "4096 (5)", "::ffff:127.0.0.1, RoCE v2", "max_mcast_qp_attach:", "qkey 0x01234567", "groups " + mgid, fmt.Sprintf("qpn %#06x  UD RTS", rqp.QPN)} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("devices output lacks %q (exit %d, %s):\n%s", want, code, errOut, out)
		}
	}

	// groups: the receiver holds the membership with its full-member join
	// and its QP attached; the send-only process holds no membership.
	var groups struct {
		Groups []introspect.Group `json:"groups"`
	}
	mustJSON(t, &groups, "groups", "-p", rpid)
	if len(groups.Groups) != 1 {
		t.Fatalf("receiver groups %+v", groups.Groups)
	}
	rg := groups.Groups[0]
	if rg.Addr != g || rg.MGID != mgid || !rg.IPMembership || rg.CMRefs != 1 || len(rg.AttachedQPs) != 1 || rg.AttachedQPs[0] != rqp.QPN {
		t.Errorf("receiver group %+v", rg)
	}
	if len(rg.Joins) != 1 || rg.Joins[0].JoinType != "full" || rg.Joins[0].State != "joined" || !rg.Joins[0].Attached || rg.Joins[0].QPN != rqp.QPN {
		t.Errorf("receiver joins %+v", rg.Joins)
	}
	mustJSON(t, &groups, "groups", "-p", hpid)
	if len(groups.Groups) != 1 {
		t.Fatalf("send-only groups %+v", groups.Groups)
	}
	hg := groups.Groups[0]
	if hg.IPMembership || hg.CMRefs != 0 || len(hg.AttachedQPs) != 0 || len(hg.Joins) != 1 ||
		hg.Joins[0].JoinType != "send-only" || hg.Joins[0].JoinFlags != 1 || hg.Joins[0].Attached || hg.Joins[0].State != "joined" {
		t.Errorf("send-only group %+v", hg)
	}
	code, out, _ = softrdma("groups", "-p", rpid)
	for _, want := range []string{"rxe_lo " + g + "  mgid " + mgid, "joined on the interface (IGMP/MLD), 1 CM reference(s)", "full      (flags 0)  joined", "attached"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("groups output lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = softrdma("groups", "-p", hpid)
	if code != 0 || !strings.Contains(out, "send-only (flags 1)") || !strings.Contains(out, "not joined, 0 CM reference(s)") {
		t.Errorf("send-only groups output:\n%s", out)
	}

	// capture through the endpoint while a sender sends 5 messages.
	var capOut, capErr lockedBuffer
	capDone := make(chan int, 1)
	go func() {
		capDone <- run([]string{"capture", "-p", rpid, "-w", capPcap, "-c", "5", "-dir", "received", "-d", "60s"}, &capOut, &capErr)
	}()
	waitFor(t, "the capture to start", 10*time.Second, func() bool { return strings.Contains(capErr.String(), "capturing") })
	send := startMckey(t, "sender", env, "-m", g, "-b", "127.0.0.1", "-s", "-C", "5", "--join-pause", "200ms", "--pcap", txPcap)
	send.wait()
	select {
	case code := <-capDone:
		if code != 0 || !strings.Contains(capErr.String(), "5 frames") {
			t.Errorf("capture: exit %d: %s", code, capErr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("capture did not end after 5 frames")
	}

	// stat: exactly the 5 datagrams arrived and were delivered.
	var st struct {
		Totals map[string]introspect.Counters `json:"totals"`
		CM     introspect.CMStats             `json:"cm"`
	}
	qpKey := fmt.Sprintf("rxe_lo/%#06x", rqp.QPN)
	waitFor(t, "5 deliveries", 10*time.Second, func() bool {
		mustJSON(t, &st, "stat", "-p", rpid)
		return st.Totals[qpKey]["delivered"] >= 5
	})
	if c := st.Totals["rxe_lo"]; c["rcvd_pkts"] != 5 || c["delivered"] != 5 || c["icrc_errors"] != 0 || c["malformed_drops"] != 0 {
		t.Errorf("receiver device counters %v", c)
	}
	if c := st.Totals[qpKey]; c["delivered"] != 5 || c["no_recv_wr_drops"] != 0 {
		t.Errorf("receiver QP counters %v", c)
	}
	if st.CM.IDs != 1 || st.CM.Joins != 1 || st.CM.Leaves != 0 {
		t.Errorf("receiver CM stats %+v", st.CM)
	}
	code, out, _ = softrdma("stat", "-p", rpid)
	if code != 0 || !strings.Contains(out, "device rxe_lo") || !strings.Contains(out, "rcvd_pkts              5") {
		t.Errorf("stat output:\n%s", out)
	}
	// stat -w: nothing changes while nobody sends.
	code, out, _ = softrdma("stat", "-p", rpid, "-w", "100ms", "-n", "2")
	if code != 0 || strings.Count(out, "no change") != 2 {
		t.Errorf("stat -w output:\n%s", out)
	}

	// metrics over the same socket, parsed as Prometheus text.
	c, err := introspect.ForPID(recv.pid())
	if err != nil {
		t.Fatal(err)
	}
	mb, err := c.Metrics(context.Background())
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	fams, err := func() (map[string]*dto.MetricFamily, error) {
		p := expfmt.NewTextParser(model.UTF8Validation)
		return p.TextToMetricFamilies(bytes.NewReader(mb))
	}()
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	if v := sample(fams, "softrdma_received_packets_total", "device", "rxe_lo"); v != 5 {
		t.Errorf("softrdma_received_packets_total = %v", v)
	}
	if v := sample(fams, "softrdma_qp_delivered_packets_total", "qpn", fmt.Sprintf("%#06x", rqp.QPN)); v != 5 {
		t.Errorf("softrdma_qp_delivered_packets_total = %v", v)
	}
	if v := sample(fams, "softrdma_cm_joins_total", "", ""); v != 1 {
		t.Errorf("softrdma_cm_joins_total = %v", v)
	}

	// Five more complete the receiver: it leaves, exits 0 and removes
	// its socket.
	send2 := startMckey(t, "sender2", env, "-m", g, "-b", "127.0.0.1", "-s", "-C", "5", "--join-pause", "200ms")
	send2.wait()
	recv.wait()
	if !strings.Contains(recv.stdout.String(), "mckey: verified 10 messages") {
		t.Errorf("receiver output:\n%s", recv.stdout.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "softrdma-"+rpid+".sock")); err == nil {
		t.Error("receiver left its socket file")
	}
	for _, want := range []string{`msg="multicast join"`, `group=` + g, `msg="multicast leave"`} {
		if !strings.Contains(recv.stderr.String(), want) {
			t.Errorf("receiver log lacks %s:\n%s", want, recv.stderr.String())
		}
	}

	// The captures: the receiver's own (--pcap) has the 10 datagrams it
	// received, the endpoint capture the first 5, the first sender's its
	// 5 sends (and maybe its own looped-back copies).
	checkCapture(t, rxPcap, g, 10, 10)
	checkCapture(t, capPcap, g, 5, 5)
	checkCapture(t, txPcap, g, 5, 10)
}

// sample returns the value of the first sample of family name that has
// label k=v (any sample when k is "").
func sample(fams map[string]*dto.MetricFamily, name, k, v string) float64 {
	for _, m := range fams[name].GetMetric() {
		ok := k == ""
		for _, l := range m.GetLabel() {
			ok = ok || (l.GetName() == k && l.GetValue() == v)
		}
		if !ok {
			continue
		}
		if m.Counter != nil {
			return m.Counter.GetValue()
		}
		return m.Gauge.GetValue()
	}
	return -1
}

// checkCapture decodes a pcap with gopacket: between min and max frames,
// every one Ethernet/IPv4/UDP 4791/RoCEv2 to group g with a valid ICRC
// recomputed over the captured headers; then, if tshark is installed, it
// must decode every frame as InfiniBand (its RRoCE dissector) with the
// same ICRC.
func checkCapture(t *testing.T, path, g string, lo, hi int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var icrcs []uint32
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		pkt := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default)
		ip, ok1 := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		udp, ok2 := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if !ok1 || !ok2 || udp.DstPort != wire.UDPPort || ip.DstIP.String() != g {
			t.Fatalf("%s frame %d: not IPv4/UDP 4791 to %s: %v", path, len(icrcs), g, pkt)
		}
		var p wire.Packet
		if err := wire.ParseUD(udp.Payload, &p); err != nil {
			t.Fatalf("%s frame %d: %v", path, len(icrcs), err)
		}
		if got := wire.ICRCv4(wire.IPv4(data[14:34]), wire.UDP(data[34:42]), p.Body); got != p.ICRC {
			t.Errorf("%s frame %d: ICRC %#x, recomputed %#x", path, len(icrcs), p.ICRC, got)
		}
		if p.DETH.QKey() != 0x01234567 || p.BTH.DestQP() != wire.MulticastQPN || !p.HasImm || len(p.Payload) != 100 {
			t.Errorf("%s frame %d: header %+v", path, len(icrcs), p.Header())
		}
		icrcs = append(icrcs, p.ICRC)
	}
	if len(icrcs) < lo || len(icrcs) > hi {
		t.Errorf("%s: %d frames, want %d..%d", path, len(icrcs), lo, hi)
	}
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Logf("tshark not installed: %s not decoded by Wireshark's dissector", path)
		return
	}
	// tshark decodes UDP 4791 as RRoCE by default (its "infiniband"
	// dissector); should a version not, name the dissector explicitly.
	var out []byte
	for _, decodeAs := range [][]string{nil, {"-d", "udp.port==4791,infiniband"}, {"-d", "udp.port==4791,rroce"}} {
		args := append([]string{"-r", path}, decodeAs...)
		args = append(args, "-T", "fields", "-e", "frame.protocols", "-e", "infiniband.invariant.crc",
			"-e", "infiniband.bth.opcode", "-e", "infiniband.deth.q_key")
		cmd := exec.Command(tshark, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		o, err := cmd.Output()
		if err != nil {
			t.Logf("tshark %v: %v\n%s", decodeAs, err, stderr.String())
			continue
		}
		out = o
		if strings.Count(string(o), ":udp:infiniband") == len(icrcs) {
			break
		}
	}
	if out == nil {
		t.Fatalf("tshark could not read %s", path)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	i := 0
	for sc.Scan() {
		fs := strings.Split(sc.Text(), "\t")
		if len(fs) < 4 || !strings.Contains(fs[0], ":udp:infiniband") {
			t.Errorf("tshark frame %d not decoded as RoCE: %q", i, sc.Text())
			i++
			continue
		}
		// tshark shows the ICRC's four bytes as a big-endian number; the
		// ICRC is stored little-endian.
		crc, err := strconv.ParseUint(strings.TrimPrefix(fs[1], "0x"), 16, 32)
		if err != nil || i >= len(icrcs) || bits.ReverseBytes32(uint32(crc)) != icrcs[i] {
			t.Errorf("tshark frame %d: ICRC %s, recomputed %#x", i, fs[1], bits.ReverseBytes32(icrcs[min(i, len(icrcs)-1)]))
		}
		if fs[2] != "101" || !strings.HasSuffix(fs[3], "01234567") {
			t.Errorf("tshark frame %d: opcode %s q_key %s", i, fs[2], fs[3])
		}
		i++
	}
	if i != len(icrcs) {
		t.Errorf("tshark decoded %d frames, gopacket %d", i, len(icrcs))
	}
}

// listening reports the listening sockets of process pid (TCP LISTEN or
// listening Unix sockets), from /proc.
func listening(t *testing.T, pid int) []string {
	t.Helper()
	ours := map[string]bool{}
	base := fmt.Sprintf("/proc/%d", pid)
	fds, err := os.ReadDir(base + "/fd")
	if err != nil {
		testenv.Require(t, "cannot read %s/fd: %v", base, err)
	}
	for _, fd := range fds {
		if l, err := os.Readlink(base + "/fd/" + fd.Name()); err == nil && strings.HasPrefix(l, "socket:[") {
			ours[strings.Trim(strings.TrimPrefix(l, "socket:"), "[]")] = true
		}
	}
	var out []string
	for _, tab := range []struct {
		file string
		col  int
		ok   func([]string) bool
	}{
		{"/net/tcp", 9, func(f []string) bool { return f[3] == "0A" }},
		{"/net/tcp6", 9, func(f []string) bool { return f[3] == "0A" }},
		// Not the RoCEv2 devices' hand-over sockets (provider/rxe:
		// abstract @softrdma/<uid>/…, which take only this user's
		// connections): they serve other devices of the user, not requests.
		{"/net/unix", 6, func(f []string) bool { return f[3] == "00010000" && !handoverSocket(f) }},
	} {
		b, err := os.ReadFile(base + tab.file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) > tab.col && ours[f[tab.col]] && tab.ok(f) {
				out = append(out, tab.file+" "+line)
			}
		}
	}
	return out
}

// handoverSocket reports whether a line of /proc/net/unix (its fields) is
// a RoCEv2 device's hand-over socket (or its peer-socket lock): abstract
// sockets named @softrdma/<uid>/.
func handoverSocket(f []string) bool {
	return len(f) > 7 && strings.HasPrefix(f[7], fmt.Sprintf("@softrdma/%d/", os.Geteuid()))
}

// TestEndpointOffByDefault: an mckey started without SOFTRDMA_DEBUG_ADDR
// listens nowhere and creates no socket file, even while joined.
func TestEndpointOffByDefault(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(introspect.EnvDir, dir)
	g := randomGroup()
	c := startMckey(t, "receiver", []string{"XDG_RUNTIME_DIR=" + dir}, "-m", g, "-b", "127.0.0.1", "-C", "1", "--timeout", "60s", "--join-pause", "0")
	c.waitLine("receiving data transfers")
	if l := listening(t, c.pid()); len(l) != 0 {
		t.Errorf("mckey listens without being asked:\n%s", strings.Join(l, "\n"))
	}
	if ms, _ := filepath.Glob(filepath.Join(dir, "*")); len(ms) != 0 {
		t.Errorf("files in XDG_RUNTIME_DIR: %v", ms)
	}
	if code, _, errOut := softrdma("devices", "-p", strconv.Itoa(c.pid())); code != 1 || !strings.Contains(errOut, "no introspection endpoint") {
		t.Errorf("devices -p of a process without endpoint: exit %d: %s", code, errOut)
	}
	if code, _, errOut := softrdma("groups"); code != 1 || !strings.Contains(errOut, "no process with an endpoint") {
		t.Errorf("groups with no endpoint anywhere: exit %d: %s", code, errOut)
	}
}

// TestSubcommandErrors: bad flags and unreachable endpoints are errors,
// never a crash.
func TestSubcommandErrors(t *testing.T) {
	t.Setenv(introspect.EnvDir, t.TempDir())
	for _, args := range [][]string{
		{"devices", "extra"},
		{"devices", "-nosuchflag"},
		{"stat", "-w", "-1s"},
		{"stat", "-w", "1ms"},
		{"capture", "-p", "1"},
		{"capture", "-w", "x.pcap", "-dir", "sideways"},
	} {
		if code, _, _ := softrdma(args...); code != 2 {
			t.Errorf("softrdma %v: exit %d, want 2", args, code)
		}
	}
	for _, args := range [][]string{
		{"devices", "-addr", "192.0.2.1:80"},
		{"groups", "-addr", "unix:/nonexistent/x.sock"},
		{"stat", "-addr", "127.0.0.1:1"},
		{"devices", "-p", "1", "-addr", "127.0.0.1:1"},
		{"capture", "-addr", "unix:/nonexistent/x.sock", "-w", filepath.Join(t.TempDir(), "x.pcap")},
	} {
		if code, _, errOut := softrdma(args...); code != 1 || errOut == "" {
			t.Errorf("softrdma %v: exit %d (%q), want 1 with a message", args, code, errOut)
		}
	}
	if code, out, _ := softrdma("help"); code != 0 || !strings.Contains(out, "devices") || !strings.Contains(out, "capture") {
		t.Errorf("help:\n%s", out)
	}
}

// TestPcapCounter: the frame counter of capture follows a pcap stream cut
// at arbitrary points.
func TestPcapCounter(t *testing.T) {
	var buf bytes.Buffer
	w := pcapgo.NewWriter(&buf)
	w.WriteFileHeader(65535, layers.LinkTypeEthernet)
	for i := range 7 {
		data := bytes.Repeat([]byte{byte(i)}, 10+i*13)
		w.WritePacket(gopacket.CaptureInfo{Timestamp: time.Now(), CaptureLength: len(data), Length: len(data)}, data)
	}
	b := buf.Bytes()
	for step := 1; step < 40; step += 3 {
		pc := &pcapCounter{w: io.Discard}
		for i := 0; i < len(b); i += step {
			pc.Write(b[i:min(i+step, len(b))])
		}
		if pc.frames != 7 || pc.bytes != int64(len(b)) {
			t.Errorf("step %d: %d frames, %d bytes", step, pc.frames, pc.bytes)
		}
	}
}
