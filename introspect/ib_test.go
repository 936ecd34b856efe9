package introspect

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/rdmacm/saclient"
	"github.com/softrdma/softrdma/test/testsm"
	"github.com/softrdma/softrdma/verbs"
)

// TestIBPort: an emulated InfiniBand port (an in-process SM) appears in
// the snapshot with its LIDs, GID and counters, and in /metrics.
func TestIBPort(t *testing.T) {
	s, err := sm.New(testsm.SMConfig(t, sm.Config{Listen: "127.0.0.1:0", SendOnlySupport: true})) // SOFTRDMA_TEST_SM=opensm: OpenSM in charge
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	testsm.WaitSMUp(t, s)
	cfg := ib.Config{SM: s.FabricAddr().String(), Local: netip.MustParseAddr("127.0.0.1")}
	if testsm.OnOpenSM() {
		cfg.ActivateTimeout = testsm.OpenSMActivate // Active at OpenSM's next sweep
	}
	p, err := ib.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	// A UD QP attached to a multicast group shows up with its attachment.
	vctx, err := p.Verbs().Open()
	if err != nil {
		t.Fatal(err)
	}
	pd, _ := vctx.AllocPD()
	cq, _ := vctx.CreateCQ(4)
	qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTypeUD})
	if err != nil {
		t.Fatal(err)
	}
	mgid, _ := verbs.ParseGID("ff12:4001:ffff::42")
	if err := qp.AttachMcast(mgid, 0xc042); err != nil {
		t.Fatal(err)
	}
	defer func() { qp.Destroy(); cq.Destroy(); pd.Dealloc(); vctx.Close() }()

	snap := Collect()
	var d *Device
	for i := range snap.Devices {
		if snap.Devices[i].Name == p.Name() {
			d = &snap.Devices[i]
		}
	}
	if d == nil {
		t.Fatalf("no %s in %+v", p.Name(), snap.Devices)
	}
	if d.Kind != "ib" || len(d.Ports) != 1 || len(d.CounterNames()) != len(softverbs.Schema()) {
		t.Fatalf("device %+v", d)
	}
	if len(d.QPs) != 1 || d.QPs[0].QPN != qp.Num() || d.QPs[0].State != "RESET" ||
		len(d.QPs[0].Groups) != 1 || d.QPs[0].Groups[0] != "ff12:4001:ffff::42 (mlid 0xc042)" {
		t.Errorf("IB QPs %+v", d.QPs)
	}
	// The SA membership of a join appears in the groups view.
	sa, ok := saclient.For(p.Verbs())
	if !ok {
		t.Fatal("no SA client")
	}
	bc, ok := sa.BroadcastGroup()
	if !ok {
		t.Fatal("no broadcast group")
	}
	req := bc
	req.MGID, req.PortGID, req.QKey, req.MLID, req.JoinState = mgid, p.PortGID(), 0x01234567, 0, 1
	joined := make(chan int, 1)
	m, err := sa.Join(req, 0x130C7, func(status int, _ *saclient.GroupRecord) {
		select {
		case joined <- status:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sa.Leave(m)
	if st := <-joined; st != 0 {
		t.Fatalf("join status %d", st)
	}
	// The join callback runs under the group's lock, which a snapshot does
	// not wait for: look again until the membership shows.
	var grp *Group
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		grp = nil
		for _, g := range Collect().Groups {
			if g.Device == p.Name() && g.MGID == mgid.String() {
				grp = &g
			}
		}
		if grp != nil && grp.SAJoinState != 0 {
			break
		}
	}
	if grp == nil || grp.SAJoinState != 1 || grp.MLID < 0xc001 || len(grp.AttachedQPs) != 1 || grp.AttachedQPs[0] != qp.Num() {
		t.Errorf("IB group %+v", grp)
	}
	pt := d.Ports[0]
	if pt.State != "PORT_ACTIVE" || pt.LinkLayer != "InfiniBand" || pt.LID != p.LID() || pt.LID == 0 || pt.SMLID == 0 ||
		len(pt.GIDs) != 1 || pt.GIDs[0].GID != p.PortGID().String() {
		t.Errorf("port %+v (LID %d, GID %v)", pt, p.LID(), p.PortGID())
	}
	for _, c := range softverbs.Schema() {
		if _, ok := d.Counters[c.Name]; !ok {
			t.Errorf("counter %s missing", c.Name)
		}
		if _, ok := d.QPs[0].Counters[c.Name]; ok != (c.Scope == verbs.ScopeQP) {
			t.Errorf("QP counter %s: present %v, scope %v", c.Name, ok, c.Scope)
		}
	}
	_, c := startServer(t)
	b, err := c.Metrics(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	fams := parseMetrics(t, b)
	if v, ok := metricValue(fams, "softrdma_port_state", map[string]string{"device": p.Name()}); !ok || v != 4 {
		t.Errorf("port state of %s: %v %v", p.Name(), v, ok)
	}
	if _, ok := metricValue(fams, "softrdma_dropped_packets_total", map[string]string{"device": p.Name(), "reason": "vcrc"}); !ok {
		t.Errorf("no vcrc drop counter for %s", p.Name())
	}
	// IB QPs have their counters too, and the QP appears in softrdma_qps.
	if _, ok := metricValue(fams, "softrdma_qp_dropped_packets_total", map[string]string{"device": p.Name(), "qpn": fmt.Sprintf("%#06x", qp.Num()), "reason": "qkey"}); !ok {
		t.Errorf("no per-QP qkey drop counter for %s", p.Name())
	}
	if v, ok := metricValue(fams, "softrdma_qps", map[string]string{"device": p.Name()}); !ok || v != 1 {
		t.Errorf("softrdma_qps of %s: %v %v", p.Name(), v, ok)
	}
}
