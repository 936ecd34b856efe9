package bench

import (
	"strings"
	"testing"
)

// TestFanoutTargets checks the fan-out target lines against results made
// up to sit on either side of each threshold, and that a case measured in
// one mode only (-modes) is left out.
func TestFanoutTargets(t *testing.T) {
	good := FanoutResult{Receivers: 1, Size: 64, Runs: 4, UDPMsgsPerS: 100, RDMASentPerS: 100, Ratio: 0.99,
		UDPRxCPUns: 1000, RDMARxCPUns: 1080, UDPTxCPUns: 1000, RDMATxCPUns: 1040, UDPLoss: 0.02, RDMALoss: 0.029}
	met := func(fs []FanoutResult) map[string]bool {
		m := map[string]bool{}
		for _, tg := range targets(&Report{Fanout: fs}) {
			m[tg.Name] = tg.Met
		}
		return m
	}
	m := met([]FanoutResult{good, good})
	if len(m) != 6 {
		t.Fatalf("targets %v", m)
	}
	for name, ok := range m {
		if !ok {
			t.Errorf("%s: NOT MET for results within every target", name)
		}
	}
	// Each edit breaks one target: applied to every case (all) or to one
	// case of six, which must not move the geometric means past theirs.
	for _, c := range []struct {
		target string
		all    bool
		edit   func(*FanoutResult)
	}{
		{"msg/s vs UDP (geomean", true, func(r *FanoutResult) { r.Ratio = 0.9 }},
		{"msg/s vs UDP (every case)", false, func(r *FanoutResult) { r.Ratio = 0.84 }},
		{"receivers' CPU", true, func(r *FanoutResult) { r.RDMARxCPUns = 1150 }},
		{"sender's CPU", true, func(r *FanoutResult) { r.RDMATxCPUns = 1060 }},
		{"loss above", false, func(r *FanoutResult) { r.RDMALoss = 0.031 }},
		{"without a device counter", false, func(r *FanoutResult) { r.RDMAUncounted = 1 }},
	} {
		fs := []FanoutResult{good, good, good, good, good, good}
		for i := range fs {
			if c.all || i == 2 {
				c.edit(&fs[i])
			}
		}
		for name, ok := range met(fs) {
			if strings.Contains(name, c.target) == ok {
				t.Errorf("%s changed: %q met=%v", c.target, name, ok)
			}
		}
	}
	onlyRDMA := good
	onlyRDMA.UDPMsgsPerS, onlyRDMA.Ratio = 0, 0
	if m := met([]FanoutResult{onlyRDMA}); len(m) != 0 {
		t.Errorf("targets of a case without the baseline: %v", m)
	}
}

// TestGroupTargetsUnmeasured: a run that asked for fewer groups than the
// group targets are about (-quick) marks them not measured instead of NOT
// MET; one that asked for 10,000 and held them judges them; one that held
// fewer than it asked fails.
func TestGroupTargetsUnmeasured(t *testing.T) {
	judge := func(g GroupsResult) (unmeasured []string, met []bool) {
		for _, tg := range targets(&Report{Groups: &g}) {
			unmeasured, met = append(unmeasured, tg.Unmeasured), append(met, tg.Met)
		}
		return
	}
	u, _ := judge(GroupsResult{Groups: 200, Held: 200, Delivered: true, HeapPerGrp: 680})
	if len(u) != 2 || u[0] == "" || u[1] == "" {
		t.Errorf("quick run: unmeasured %q, want both targets marked", u)
	}
	u, m := judge(GroupsResult{Groups: 10000, Held: 10000, Delivered: true, HeapPerGrp: 740})
	if len(u) != 2 || u[0] != "" || u[1] != "" || !m[0] || !m[1] {
		t.Errorf("full run: unmeasured %q met %v", u, m)
	}
	u, m = judge(GroupsResult{Groups: 200, Held: 150, Delivered: true, HeapPerGrp: 680})
	if u[0] != "" || m[0] {
		t.Errorf("a run that held fewer groups than it asked: unmeasured %q met %v, want NOT MET", u, m)
	}
}

// TestLatencyTargets: every latency target of runs within the bounds is met, and
// each ratio past its bound (busy-poll p99, p99.9 in either wait) fails
// its own target.
func TestLatencyTargets(t *testing.T) {
	good := []LatencyResult{
		{Mode: "rdma", Link: "lo", Wait: WaitBlock, Size: 64, RatioP50: 1.2, RatioP99: 1.4, RatioP999: 1.9},
		{Mode: "rdma", Link: "lo", Wait: WaitPoll, Size: 64, RatioP50: 1.05, RatioP99: 1.4, RatioP999: 1.5},
		{Mode: "ib", Link: "lo", Wait: WaitBlock, Size: 64, RatioP50: 1.9},
	}
	met := func(rs []LatencyResult) map[string]bool {
		m := map[string]bool{}
		for _, tg := range latencyTargets(rs) {
			m[tg.Name] = tg.Met
		}
		return m
	}
	m := met(good)
	if len(m) != 6 {
		t.Fatalf("targets %v, want 6", m)
	}
	for name, ok := range m {
		if !ok {
			t.Errorf("%s: NOT MET within every bound", name)
		}
	}
	for _, c := range []struct {
		i      int
		edit   func(*LatencyResult)
		target string
	}{
		{1, func(r *LatencyResult) { r.RatioP99 = 1.6 }, "latency RoCEv2 busy-poll p99 vs UDP"},
		{0, func(r *LatencyResult) { r.RatioP999 = 2.1 }, "latency RoCEv2 p99.9 vs UDP (either wait)"},
		{1, func(r *LatencyResult) { r.RatioP999 = 2.1 }, "latency RoCEv2 p99.9 vs UDP (either wait)"},
	} {
		rs := append([]LatencyResult(nil), good...)
		c.edit(&rs[c.i])
		for name, ok := range met(rs) {
			if ok == (name == c.target) {
				t.Errorf("case %d edited: %s met=%v", c.i, name, ok)
			}
		}
	}
}
