// Package opensm runs Debian's unmodified OpenSM as the subnet manager of
// softsm's emulated subnet: an in-process ib/sm.SM with fabric ports
// attached, package ib/sma's model of its switch and CAs behind ibsim's
// server protocol, and opensm under libumad2sim.so connected to it. The
// test waits for OpenSM's "SUBNET UP" and checks what OpenSM set: every
// CA port Active with a LID of its own, the switch's linear forwarding
// table leading to each; then ibnetdiscover (under libumad2sim.so too)
// must find the switch and every port.
//
// It runs with SOFTRDMA_TEST_OPENSM=1 (a step of .ci/run); it needs
// opensm and libumad2sim.so (ibnetdiscover for its last part), and skips
// (fails under CI=true) when one is missing. Every process it starts talks
// over abstract unix sockets of the package's own network namespace, and
// loopback UDP only. SOFTRDMA_TEST_OPENSM_DIR=DIR keeps OpenSM's log and
// files in DIR instead of a temporary directory.
package opensm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/ib/sma"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
)

// Env is the variable that, set to 1, runs the test.
const Env = "SOFTRDMA_TEST_OPENSM"

// umad2sim is where Debian's libumad2sim0 puts the preload library.
const umad2sim = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so"

func TestMain(m *testing.M) {
	testenv.OwnNetns() // lo and the abstract unix sockets to this package alone
	testenv.ClearSoftRDMA()
	code := m.Run()
	verbs.DefaultHost().Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "opensm: leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func prereqs(t *testing.T) {
	t.Helper()
	if os.Getenv(Env) != "1" {
		t.Skipf("OpenSM as softsm's subnet manager runs with %s=1 (a step of .ci/run); it needs opensm and libumad2sim0", Env)
	}
	if _, err := exec.LookPath("opensm"); err != nil {
		testenv.Require(t, "opensm not found (apt-get install opensm): %v", err)
	}
	if _, err := os.Stat(umad2sim); err != nil {
		testenv.Require(t, "libumad2sim.so not found (apt-get install libumad2sim0): %v", err)
	}
}

// startProc starts a long-running child and ends it when the test ends.
func startProc(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", cmd.Path, err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %s", what, d, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startSM runs an SM on loopback with n fabric ports attached; it returns
// the SM and the ports' GUIDs.
func startSM(t *testing.T, n int) (*sm.SM, []uint64) {
	t.Helper()
	s, err := sm.New(sm.Config{Listen: "127.0.0.1:0", PortTimeout: 10 * time.Minute, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunUntilEnd(t, "softsm", s.Run)
	var guids []uint64
	for i := range n {
		guid := uint64(0x0002_c903_00a0_0000) + uint64(i+1)
		attach(t, s.FabricAddr(), guid, fmt.Sprintf("opensm-test host%d mlx5_0", i+1))
		guids = append(guids, guid)
	}
	return s, guids
}

// attach attaches a fabric port (a UDP socket that answers the SM's retry
// once and then stays silent: PortTimeout is long).
func attach(t *testing.T, smAddr netip.AddrPort, guid uint64, desc string) {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.WriteToUDPAddrPort(fabric.EncodeControl(&fabric.Control{Type: fabric.TypeDetach, GUID: guid}), smAddr)
		conn.Close()
	})
	a := &fabric.Control{Type: fabric.TypeAttach, GUID: guid, NodeDesc: desc}
	if _, err := conn.WriteToUDPAddrPort(fabric.EncodeControl(a), smAddr); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65536)
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn.SetReadDeadline(deadline)
		n, _, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("port %#x: attach: %v", guid, err)
		}
		if !fabric.IsControl(buf[:n]) {
			continue
		}
		c, err := fabric.DecodeControl(buf[:n])
		if err != nil {
			t.Fatalf("port %#x: %v", guid, err)
		}
		switch c.Type {
		case fabric.TypeRetry:
			a.Cookie = c.Cookie
			if _, err := conn.WriteToUDPAddrPort(fabric.EncodeControl(a), smAddr); err != nil {
				t.Fatal(err)
			}
		case fabric.TypePortInfo:
			return
		default:
			t.Fatalf("port %#x: attach answered %q (%s)", guid, c.Type, c.Reason)
		}
	}
}

// serve runs the SMA model of s's subnet behind ibsim's protocol on a
// socket base name of its own.
func serve(t *testing.T, s *sm.SM) (*sma.Fabric, string) {
	t.Helper()
	f := sma.New(sma.Config{Ports: s, Logf: t.Logf})
	var b [6]byte
	rand.Read(b[:])
	srv, err := sma.Listen(f, sma.ServerConfig{Base: "softrdma-opensm-" + hex.EncodeToString(b[:]), Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunUntilEnd(t, "sma server", srv.Run)
	return f, srv.Base()
}

// startOpenSM runs opensm under libumad2sim.so against base and waits
// for SUBNET UP; it returns the environment its clients need.
func startOpenSM(t *testing.T, dir, base string) []string {
	t.Helper()
	env := append(os.Environ(), "IBSIM_SOCKNAME="+base, "OSM_TMP_DIR="+dir, "OSM_CACHE_DIR="+dir, "LD_PRELOAD="+umad2sim)
	conf := filepath.Join(dir, "opensm.conf")
	if out, err := exec.Command("opensm", "-c", conf).CombinedOutput(); err != nil {
		t.Fatalf("opensm -c: %v\n%s", err, out)
	}
	osmLog := filepath.Join(dir, "osm.log")
	out, err := os.Create(filepath.Join(dir, "opensm.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	t.Logf("OpenSM log: %s", osmLog)
	// -V as in test/saoracle: every log line flushed (and umad2sim's
	// threads paced: without it OpenSM's first sweep loses answers now
	// and then under Debian's umad2sim).
	osm := exec.Command("opensm", "-F", conf, "-V", "-f", osmLog)
	osm.Dir, osm.Env, osm.Stdout, osm.Stderr = dir, env, out, out
	startProc(t, osm)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(osmLog)
			if len(b) > 30000 {
				b = b[len(b)-30000:]
			}
			o, _ := os.ReadFile(filepath.Join(dir, "opensm.out"))
			t.Logf("opensm output:\n%s\nOpenSM log (end):\n%s", o, b)
		}
	})
	waitFor(t, 8*time.Second, "OpenSM's SUBNET UP", func() (bool, string) {
		b, _ := os.ReadFile(osmLog)
		return strings.Contains(string(b), "SUBNET UP"), fmt.Sprintf("%d bytes of log", len(b))
	})
	return env
}

// TestOpenSMManagesSoftsm: OpenSM brings every port of softsm's subnet up
// and routes to each.
func TestOpenSMManagesSoftsm(t *testing.T) {
	prereqs(t)
	dir := t.TempDir()
	if d := os.Getenv("SOFTRDMA_TEST_OPENSM_DIR"); d != "" {
		dir = d // keep OpenSM's files to read
	}
	start := time.Now()
	s, guids := startSM(t, 3)
	f, base := serve(t, s)
	env := startOpenSM(t, dir, base)
	t.Logf("SUBNET UP after %v", time.Since(start).Round(time.Millisecond))

	// SUBNET UP comes after OpenSM set the ports Active; wait for the
	// last Sets all the same (the log line and the last answer race).
	waitFor(t, 10*time.Second, "every CA port Active", func() (bool, string) {
		var st []string
		ok := true
		for _, g := range guids {
			v, found := f.Port(g)
			ok = ok && found && v.State == mad.PortActive
			st = append(st, fmt.Sprintf("%#x: %+v", g, v))
		}
		return ok, strings.Join(st, "; ")
	})
	sw := f.Switch()
	host := f.Host()
	lft := f.LFT()
	t.Logf("switch %#x LID %d, LinearFDBTop %d; SM host %#x LID %d (switch port %d) %v",
		sw.GUID, sw.LID, sw.LinearFDBTop, host.GUID, host.LID, host.SwitchPort, host.States)
	t.Logf("switch LFT (LID: port) %v", lftString(lft))
	lids := map[uint16]string{}
	check := func(name string, lid uint16, port int) {
		t.Helper()
		if lid == 0 || lid >= 0xC000 {
			t.Errorf("%s: LID %d", name, lid)
			return
		}
		if o, dup := lids[lid]; dup {
			t.Errorf("%s and %s share LID %d", name, o, lid)
		}
		lids[lid] = name
		if int(lid) >= len(lft) {
			t.Errorf("%s: LID %d beyond the LFT's top %d", name, lid, len(lft)-1)
		} else if int(lft[lid]) != port {
			t.Errorf("%s: LFT[%d] = %d, want switch port %d", name, lid, lft[lid], port)
		}
	}
	check("switch", sw.LID, 0)
	check("SM host", host.LID, 1)
	if host.State != mad.PortActive || host.SMLID != host.LID {
		t.Errorf("SM host: state %d, SM LID %d (its LID %d)", host.State, host.SMLID, host.LID)
	}
	for _, g := range guids {
		v, _ := f.Port(g)
		t.Logf("CA port %#x: switch port %d, LID %d LMC %d SM LID %d, states %v", g, v.SwitchPort, v.LID, v.LMC, v.SMLID, v.States)
		check(fmt.Sprintf("CA %#x", g), v.LID, v.SwitchPort)
		if v.SMLID != host.LID {
			t.Errorf("CA %#x: SM LID %d, OpenSM's port has LID %d", g, v.SMLID, host.LID)
		}
		if want := []uint8{mad.PortInit, mad.PortArmed, mad.PortActive}; !slicesHasSuffix(v.States, want) {
			t.Errorf("CA %#x: states %v, want them to end %v", g, v.States, want)
		}
	}
	for i, st := range sw.PortStates[1:] {
		if up := i+1 == host.SwitchPort || i+1 <= len(guids)+1; up && st != mad.PortActive {
			t.Errorf("switch port %d: state %d, want Active", i+1, st)
		}
	}

	ibnetdiscover(t, dir, env, sw.GUID, guids)
}

func slicesHasSuffix(s, suffix []uint8) bool {
	return len(s) >= len(suffix) && string(s[len(s)-len(suffix):]) == string(suffix)
}

// ibnetdiscover runs infiniband-diags' ibnetdiscover on the SM host and
// looks for the switch and every CA port in its topology.
func ibnetdiscover(t *testing.T, dir string, env []string, swGUID uint64, guids []uint64) {
	t.Helper()
	if _, err := exec.LookPath("ibnetdiscover"); err != nil {
		if testenv.CI() {
			t.Fatalf("ibnetdiscover not found (apt-get install infiniband-diags): %v", err)
		}
		t.Logf("ibnetdiscover not found (apt-get install infiniband-diags): its part is left out")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ibnetdiscover")
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ibnetdiscover: %v\n%s", err, out)
	}
	t.Logf("ibnetdiscover:\n%s", out)
	want := []string{fmt.Sprintf("switchguid=0x%x", swGUID), sma.SwitchDesc, sma.HostName}
	for _, g := range guids {
		want = append(want, fmt.Sprintf("caguid=0x%x", g))
	}
	for _, w := range want {
		if !strings.Contains(string(out), w) {
			t.Errorf("ibnetdiscover's topology lacks %q", w)
		}
	}
}

// lftString lists an LFT's routed entries as LID:port.
func lftString(lft []byte) string {
	var b strings.Builder
	for lid, p := range lft {
		if p != 0xFF {
			fmt.Fprintf(&b, " %d:%d", lid, p)
		}
	}
	return strings.TrimSpace(b.String())
}
