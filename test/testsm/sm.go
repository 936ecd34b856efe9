// Package testsm selects the subnet manager of the tests that start one
// on the emulated InfiniBand subnet (SMEnv): softsm's own or OpenSM in
// charge. Apart from package testenv, which ib/sm's own tests import.
package testsm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/test/testenv"
)

// SMEnv names the variable that selects the subnet manager of every test
// that starts one on the emulated InfiniBand subnet: unset or "softsm",
// softsm's own SM, SA and switch tables (the default); "opensm", OpenSM in
// charge of the subnet (ib/sm's ManagerOpenSM, softsm -sm opensm), which
// needs opensm and ibsim's libumad2sim.so. .ci/run runs the IB tests once
// more with SOFTRDMA_TEST_SM=opensm, and once with "switch": softsm's own SM
// without direct forwarding (sm.Config.ViaSwitch, softsm -via-switch),
// every data packet through the switch. The tests' helpers that start an SM
// consult it (SMConfig, SMArgs), so that the same test code runs on both;
// a test that asserts what only softsm's SM does skips on OpenSM
// (SkipOnOpenSM), saying what differs.
const SMEnv = "SOFTRDMA_TEST_SM"

// OpenSMDirEnv, when set to a directory, keeps OpenSM's files (its
// osm.log, verbose: opensm -V) of each test under it (one directory per
// test) instead of a temporary directory removed when the SM stops.
const OpenSMDirEnv = "SOFTRDMA_TEST_OPENSM_DIR"

// OpenSMActivate is how long a port may wait for OpenSM to make it Active
// (provider/ib's ActivateTimeout; its default, 5 s, is softsm's): OpenSM
// brings the first ports up in a few seconds, a later one at its next
// light sweep (every second).
const OpenSMActivate = 60 * time.Second

// SM returns the subnet manager SMEnv selects, sm.ManagerSoftsm or
// sm.ManagerOpenSM; another value fails the test. Under OpenSM it checks
// OpenSM's prerequisites first (Require: a skip, or a failure under CI).
func SM(t testing.TB) string {
	t.Helper()
	switch v := os.Getenv(SMEnv); v {
	case "", sm.ManagerSoftsm, ViaSwitch:
		return sm.ManagerSoftsm
	case sm.ManagerOpenSM:
		if why := missingOpenSM(); why != "" {
			testenv.Require(t, "%s=opensm: %s", SMEnv, why)
		}
		return sm.ManagerOpenSM
	default:
		t.Fatalf("%s=%q: want %q, %q or %q", SMEnv, v, sm.ManagerSoftsm, ViaSwitch, sm.ManagerOpenSM)
		return ""
	}
}

// ViaSwitch is SMEnv's value for softsm's own SM without direct
// forwarding: every data packet through the switch.
const ViaSwitch = "switch"

// OnViaSwitch reports whether SMEnv asks for every packet through the
// switch.
func OnViaSwitch() bool { return os.Getenv(SMEnv) == ViaSwitch }

// OnOpenSM reports whether SMEnv puts OpenSM in charge of the tests'
// subnets (without checking its prerequisites: SM does).
func OnOpenSM() bool { return os.Getenv(SMEnv) == sm.ManagerOpenSM }

// missingOpenSM says what OpenSM in charge lacks on this machine, or "".
func missingOpenSM() string {
	if _, err := exec.LookPath("opensm"); err != nil {
		if _, err := os.Stat(sm.DefaultOpenSMPath); err != nil {
			return "opensm not found (apt-get install opensm)"
		}
	}
	if _, err := os.Stat(sm.DefaultUmad2simPath); err != nil {
		if g, _ := filepath.Glob("/usr/lib/*/umad2sim/libumad2sim.so"); len(g) == 0 {
			return "libumad2sim.so not found (apt-get install libumad2sim0)"
		}
	}
	return ""
}

// SMConfig returns cfg with the manager SMEnv selects (SM), and
// ViaSwitch set when SMEnv asks for it: under OpenSM,
// Manager is sm.ManagerOpenSM and OpenSM's files go to a directory of the
// test's under OpenSMDirEnv when it is set. Under OpenSM a cfg with
// softsm's raw SA port (SAListen) fails the test: the raw port is
// softsm's SA.
func SMConfig(t testing.TB, cfg sm.Config) sm.Config {
	t.Helper()
	cfg.Manager = SM(t)
	cfg.ViaSwitch = cfg.ViaSwitch || OnViaSwitch()
	if cfg.Manager == sm.ManagerOpenSM {
		if cfg.SAListen != "" {
			t.Fatalf("%s=opensm: the raw SA port (SAListen) is softsm's SA; the test must not ask for it on OpenSM", SMEnv)
		}
		if d := os.Getenv(OpenSMDirEnv); d != "" {
			cfg.OpenSM.Dir = filepath.Join(d, filepath.Base(t.Name()))
			cfg.OpenSM.Verbose = true
		}
	}
	return cfg
}

// SMArgs returns the softsm flags that select SMEnv's manager (nil for
// softsm's own SM, "-via-switch" without direct forwarding; "-sm opensm" under OpenSM, with -opensm-dir under
// OpenSMDirEnv).
func SMArgs(t testing.TB) []string {
	t.Helper()
	if SM(t) != sm.ManagerOpenSM {
		if OnViaSwitch() {
			return []string{"-via-switch"}
		}
		return nil
	}
	args := []string{"-sm", sm.ManagerOpenSM}
	if d := os.Getenv(OpenSMDirEnv); d != "" {
		args = append(args, "-opensm-dir", filepath.Join(d, filepath.Base(t.Name())), "-v")
	}
	return args
}

// SkipOnOpenSM skips the test when OpenSM is in charge (SMEnv=opensm),
// saying why: what the test asserts is softsm's own SM's, and OpenSM
// does otherwise.
func SkipOnOpenSM(t testing.TB, why string) {
	t.Helper()
	if OnOpenSM() {
		t.Skipf("on OpenSM (%s=opensm): %s", SMEnv, why)
	}
}

// WaitSMUp waits until the subnet manager of s is ready for ports: at
// once for softsm's own SM, until OpenSM logged SUBNET UP under OpenSM
// (then a port attaching is made Active at OpenSM's next light sweep).
// It fails the test after OpenSMActivate.
func WaitSMUp(t testing.TB, s *sm.SM) {
	t.Helper()
	up := s.OpenSMUp()
	if up == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), OpenSMActivate)
	defer cancel()
	start := time.Now()
	select {
	case <-up:
		t.Logf("OpenSM in charge: SUBNET UP after %v", time.Since(start).Round(time.Millisecond))
	case <-ctx.Done():
		t.Fatalf("OpenSM: no SUBNET UP within %v (its files: %s)", OpenSMActivate, s.OpenSMDir())
	}
}
