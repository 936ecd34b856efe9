package bench

import (
	"bytes"
	"net/netip"
	"testing"
)

// TestSASmoke runs the SA measurement of the IB part against a softsm in
// this process: joins over the fabric on an IB port, the RoCEv2 baseline,
// and the SA alone creating groups; its target lines are printed. It
// asserts no timing.
func TestSASmoke(t *testing.T) {
	sub, err := startSubnet()
	if err != nil {
		t.Fatal(err)
	}
	defer sub.stop()
	cfg := QuickConfig()
	cfg.IBJoins, cfg.IBCreate = 20, 500
	dev, err := ibPort(sub.addr, netip.MustParseAddr("127.0.4.2"))
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	r, err := measureSA(&cfg, dev)
	if err != nil {
		t.Fatal(err)
	}
	if r.JoinsPerS <= 0 || r.LeavesPerS <= 0 || r.RoCEJoinsPerS <= 0 || r.CreateSeconds <= 0 || r.Create != 500 {
		t.Fatalf("%+v", r)
	}
	if g := sub.s.Groups(); len(g) != 1 { // the broadcast group only: every join was left
		t.Errorf("groups left at the SA: %+v", g)
	}
	var table bytes.Buffer
	w := &writer{cfg: &Config{Table: &table}}
	ts := targets(&Report{SA: &r})
	for _, tg := range ts {
		w.tablef("%s %v\n", tg.Name, tg.Met)
	}
	if len(ts) != 2 {
		t.Errorf("targets %+v", ts)
	}
}
