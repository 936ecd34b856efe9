package bench

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/test/testsm"
)

// TestSASmoke runs the SA measurement of the IB part against a softsm in
// this process (OpenSM in charge under SOFTRDMA_TEST_SM=opensm): joins
// over the fabric on an IB port, the RoCEv2 baseline, and the SA alone
// creating groups; its target lines are printed. It asserts no timing.
func TestSASmoke(t *testing.T) {
	manager := testsm.SM(t)
	sub, err := startSubnet(manager, testsm.OnViaSwitch())
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
	t.Logf("SA on %s: %.0f joins/s (p50 %.1f µs, p99 %.1f µs), %.0f leaves/s over the fabric", manager, r.JoinsPerS, r.JoinP50us, r.JoinP99us, r.LeavesPerS)
	if manager == sm.ManagerOpenSM {
		// OpenSM's SA holds the groups (softsm's own SA, which Groups
		// reads, is idle): when every join was left, OpenSM's multicast
		// forwarding table leads no MLID above the IPoIB broadcast
		// group's (0xC000, OpenSM's first) to a CA port (switch ports 2
		// and up).
		f := sub.s.Model()
		deadline := time.Now().Add(10 * time.Second)
		for {
			var left []string
			for mlid := uint16(0xC001); mlid < 0xC001+uint16(2*cfg.IBJoins); mlid++ {
				for _, p := range f.MFT(mlid) {
					if p >= 2 {
						left = append(left, fmt.Sprintf("%#x→%d", mlid, p))
					}
				}
			}
			if len(left) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("OpenSM's MFT still leads groups to CA ports after every leave: %v", left)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	} else if g := sub.s.Groups(); len(g) != 1 { // the broadcast group only: every join was left
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
