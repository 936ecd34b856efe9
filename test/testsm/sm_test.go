package testsm

import (
	"slices"
	"testing"

	"github.com/softrdma/softrdma/ib/sm"
)

// TestSMSwitch: SOFTRDMA_TEST_SM unset (or softsm) leaves softsm's own
// SM; opensm selects OpenSM in SMConfig and SMArgs.
func TestSMSwitch(t *testing.T) {
	for _, v := range []string{"", sm.ManagerSoftsm} {
		t.Setenv(SMEnv, v)
		cfg := SMConfig(t, sm.Config{Listen: "127.0.0.1:0", SAListen: "127.0.0.1:0"})
		if cfg.Manager != sm.ManagerSoftsm || cfg.SAListen == "" || SMArgs(t) != nil || OnOpenSM() {
			t.Errorf("%s=%q: config %+v, args %q", SMEnv, v, cfg, SMArgs(t))
		}
	}
	t.Setenv(SMEnv, sm.ManagerOpenSM)
	if why := missingOpenSM(); why != "" {
		t.Skipf("the opensm half: %s", why)
	}
	t.Setenv(OpenSMDirEnv, "/tmp/osm")
	cfg := SMConfig(t, sm.Config{Listen: "127.0.0.1:0"})
	if cfg.Manager != sm.ManagerOpenSM || cfg.OpenSM.Dir != "/tmp/osm/TestSMSwitch" || !cfg.OpenSM.Verbose || !OnOpenSM() {
		t.Errorf("opensm: config %+v", cfg)
	}
	if a := SMArgs(t); !slices.Equal(a, []string{"-sm", "opensm", "-opensm-dir", "/tmp/osm/TestSMSwitch", "-v"}) {
		t.Errorf("opensm: args %q", a)
	}
}
