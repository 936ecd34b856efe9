package saoracle

import (
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
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/wire"
)

// Env is the variable that, set to 1, runs the comparison (.ci/run sets
// it for a step of its own).
const Env = "SOFTRDMA_TEST_OPENSM"

// umad2sim is where Debian's libumad2sim0 puts the preload library.
const umad2sim = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so"

func TestMain(m *testing.M) {
	testenv.OwnNetns() // lo to this package alone
	testenv.ClearSoftRDMA()
	goleak.VerifyTestMain(m)
}

// topology is ibsim's fabric: one switch, the SM's HCA and two hosts, A
// and B (ibnetdiscover's format).
const topology = `Switch	8 "Switch1"
[1]	"Hca1"[1]
[2]	"HcaA"[1]
[3]	"HcaB"[1]

Hca	1 "Hca1"
[1]	"Switch1"[1]

Hca	1 "HcaA"
[1]	"Switch1"[2]

Hca	1 "HcaB"
[1]	"Switch1"[3]
`

// prereqs checks for what the oracle needs and returns the path of the
// compiled client.
func prereqs(t *testing.T, dir string) string {
	t.Helper()
	if os.Getenv(Env) != "1" {
		t.Skipf("the OpenSM comparison runs with %s=1 (a step of .ci/run); it needs opensm, ibsim-utils, libumad2sim0, libibumad-dev and cc", Env)
	}
	for _, bin := range []string{"opensm", "ibsim", "cc"} {
		if _, err := exec.LookPath(bin); err != nil {
			testenv.Require(t, "%s not found (apt-get install opensm ibsim-utils libumad2sim0 libibumad-dev gcc): %v", bin, err)
		}
	}
	if _, err := os.Stat(umad2sim); err != nil {
		testenv.Require(t, "libumad2sim.so not found (apt-get install libumad2sim0): %v", err)
	}
	bin := filepath.Join(dir, "saclient")
	src, err := filepath.Abs(filepath.Join("testdata", "saclient.c"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("cc", "-O1", "-Wall", "-Werror", "-o", bin, src, "-libumad").CombinedOutput()
	if err != nil {
		testenv.Require(t, "compiling testdata/saclient.c against libibumad (apt-get install libibumad-dev): %v\n%s", err, out)
	}
	return bin
}

// oracle is OpenSM under ibsim with clients on HCAs A and B.
type oracle struct {
	a, b *umadClient
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

// waitFile polls a log file until it contains one of want.
func waitFile(t *testing.T, path string, d time.Duration, want ...string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		b, _ := os.ReadFile(path)
		for _, w := range want {
			if strings.Contains(string(b), w) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: none of %q within %v:\n%s", path, want, d, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func startOracle(t *testing.T, dir, client string) *oracle {
	t.Helper()
	net := filepath.Join(dir, "net")
	if err := os.WriteFile(net, []byte(topology), 0o644); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(),
		"IBSIM_SOCKNAME=softrdma-saoracle-"+filepath.Base(dir), // abstract unix sockets, per run
		"OSM_TMP_DIR="+dir, "OSM_CACHE_DIR="+dir)
	simLog := filepath.Join(dir, "ibsim.log")
	lf, err := os.Create(simLog)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	sim := exec.Command("ibsim", "-s", "-n", net)
	sim.Dir, sim.Env, sim.Stdout, sim.Stderr = dir, env, lf, lf
	startProc(t, sim)
	waitFile(t, simLog, 20*time.Second, "Network simulator ready")

	preload := append(env, "LD_PRELOAD="+umad2sim)
	// OpenSM's defaults, whatever /etc/opensm holds (opensm -c writes them).
	conf := filepath.Join(dir, "opensm.conf")
	if out, err := exec.Command("opensm", "-c", conf).CombinedOutput(); err != nil {
		t.Fatalf("opensm -c: %v\n%s", err, out)
	}
	osmLog := filepath.Join(dir, "osm.log")
	osmOut, err := os.Create(filepath.Join(dir, "opensm.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer osmOut.Close()
	// -V: every log line flushed as it is written. Without it, Debian's
	// umad2sim (ibsim 0.10) loses SMP answers of OpenSM's first sweep
	// now and then (no MAD timeouts under umad2sim, so OpenSM waits for
	// them forever and never reaches SUBNET UP); the flushing paces
	// OpenSM's threads enough for the sweep to finish every time.
	osm := exec.Command("opensm", "-F", conf, "-V", "-f", osmLog)
	osm.Dir, osm.Env, osm.Stdout, osm.Stderr = dir, append(preload, "SIM_HOST=Hca1"), osmOut, osmOut
	startProc(t, osm)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(osmLog)
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("OpenSM log (end):\n%s", b)
		}
	})
	waitFile(t, osmLog, 30*time.Second, "SUBNET UP")

	o := &oracle{
		a: startUMADClient(t, client, dir, "HcaA", preload),
		b: startUMADClient(t, client, dir, "HcaB", preload),
	}
	// The SA ignores requests until the first sweep is done: ask for
	// ClassPortInfo until it answers.
	deadline := time.Now().Add(30 * time.Second)
	for seq := uint32(1); ; seq++ {
		req := mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, uint64(0x5a000000|seq), 0)
		if err := o.a.send(req); err != nil {
			t.Fatal(err)
		}
		m, err := o.a.recv(500 * time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if m != nil && tidLow(m) == tidLow(req) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("OpenSM's SA does not answer ClassPortInfo")
		}
	}
	// Late answers to the tries before: drained by the probes of the
	// first exchange (they carry other TIDs).
	return o
}

// softsm is an in-process SM with its raw SA port, and fabric ports with
// the GUIDs of ibsim's HCAs A and B (so that every GID is the same on both
// subnets).
type softsm struct {
	raw  *rawPort
	a, b *fabricPort
}

func startSoftSM(t *testing.T, guidA, guidB uint64) *softsm {
	t.Helper()
	s, err := sm.New(sm.Config{
		Listen:          "127.0.0.1:0",
		SAListen:        "127.0.0.1:0",
		SendOnlySupport: true, // cmd/softsm's default
		PortTimeout:     10 * time.Minute,
		Logf:            t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunUntilEnd(t, "softsm", s.Run)
	return &softsm{
		raw: newRawPort(t, s.SAAddr()),
		a:   newFabricPort(t, s.FabricAddr(), guidA),
		b:   newFabricPort(t, s.FabricAddr(), guidB),
	}
}

// TestOpenSMOracle runs every case on OpenSM and on softsm and compares
// the answers field by field.
func TestOpenSMOracle(t *testing.T) {
	dir := t.TempDir()
	client := prereqs(t, dir)
	start := time.Now()
	o := startOracle(t, dir, client)
	if o.a.guid == o.b.guid {
		t.Fatalf("HCAs A and B share GUID %#x", o.a.guid)
	}
	s := startSoftSM(t, o.a.guid, o.b.guid)
	t.Logf("OpenSM up in %v; A %#x (LID %d), B %#x (LID %d), SM LID %d",
		time.Since(start).Round(time.Millisecond), o.a.guid, o.a.lid, o.b.guid, o.b.lid, o.a.smLID)

	env := caseEnv{a: o.a.guid, b: o.b.guid}
	var (
		report []string
		used   = map[diffKey]bool{}
	)
	for i, c := range cases(env) {
		req := c.req()
		req.SetTID(uint64(0x5000+i) << 8)
		osmTr, softTr := transport(o.a), transport(s.raw)
		if c.fromB {
			osmTr, softTr = o.b, s.b
		}
		want := exchange(t, osmTr, req, uint32(2*i))
		got := exchange(t, softTr, req, uint32(2*i+1))
		res := compare(c.name, want, got)
		line := res.summary()
		for _, d := range res.diffs {
			k := diffKey{c.name, d.name}
			if _, ok := documented[k]; !ok {
				k.field = "*"
			}
			if reason, ok := documented[k]; ok {
				used[k] = true
				line += "\n\t\tdocumented: " + d.String() + ": " + reason
				continue
			}
			t.Errorf("%s: %s: OpenSM %s, softsm %s", c.name, d.name, d.osm, d.soft)
		}
		report = append(report, line)
	}
	for k, reason := range documented {
		if !used[k] {
			t.Errorf("documented difference %s/%s no longer differs (%s): remove it", k.name, k.field, reason)
		}
	}
	t.Logf("comparison with OpenSM 3.3.23 (%v):\n\t%s", time.Since(start).Round(time.Millisecond), strings.Join(report, "\n\t"))
}

// caseEnv holds the port GUIDs the cases address.
type caseEnv struct{ a, b uint64 }

func (e caseEnv) gid(guid uint64) wire.GID { return fabric.PortGID(fabric.DefaultSubnetPrefix, guid) }
