package sm

import (
	"strings"
	"testing"
)

// TestManagerConfig: a manager other than softsm's or OpenSM is refused;
// OpenSM mode takes no raw SA port and says what is missing.
func TestManagerConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Listen: "127.0.0.1:0", Manager: "bogus"}, `manager "bogus"`},
		{Config{Listen: "127.0.0.1:0", Manager: ManagerOpenSM, SAListen: "127.0.0.1:0"}, "raw SA port"},
		{Config{Listen: "127.0.0.1:0", Manager: ManagerOpenSM, OpenSM: OpenSMConfig{Path: "/nonexistent/opensm"}}, "needs opensm (apt-get install opensm)"},
		{Config{Listen: "127.0.0.1:0", Manager: ManagerOpenSM, OpenSM: OpenSMConfig{Path: "/bin/sh", Umad2sim: "/nonexistent/libumad2sim.so"}}, "libumad2sim.so (apt-get install libumad2sim0)"},
	} {
		s, err := New(c.cfg)
		if err == nil {
			s.Close()
			t.Errorf("%+v: no error", c.cfg)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
	// The default manager is softsm's: no model, no OpenSM.
	s, err := New(Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Model() != nil || s.OpenSMUp() != nil || s.OpenSMDir() != "" {
		t.Fatal("softsm's own SM has OpenSM's parts")
	}
}
