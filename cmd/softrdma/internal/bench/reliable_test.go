package bench

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
)

// TestReliableQuick runs a tiny reliable part — 1 receiver, 1 KiB, loss 0
// and 1 % — for the built-in peers (udp, norm, pgm): every JSON line
// parses, the reliable peers lose, reorder and duplicate nothing at loss
// 0, NORM (ACK-based flow control) nothing at 1 % either, and OpenPGM
// delivers at 1 % (what it lost is logged: without flow control it may
// lose). A peer whose library is missing is skipped by the part, and here.
func TestReliableQuick(t *testing.T) {
	testenv.RequireBench(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, nftables)")
	}
	cfg := QuickConfig()
	cfg.Parts = []string{PartReliable}
	cfg.RelPeers = []string{"udp", "norm", "pgm"}
	cfg.RelTimeout = 30 * time.Second
	var table, js bytes.Buffer
	cfg.Table, cfg.JSON = &table, &js
	rep, err := Run(cfg)
	t.Log("\n" + table.String())
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(table.Bytes(), []byte("skipped: not root")) {
		t.Fatal("the part skipped as root")
	}
	kinds := lineKinds(t, js.Bytes())
	if kinds["reliable"] == 0 {
		t.Fatalf("no reliable line:\n%s", js.String())
	}
	ran := map[string]bool{}
	for _, r := range rep.Reliable {
		ran[r.Peer] = true
		if r.Err != "" {
			t.Errorf("%s, loss %d‰: %s", r.Peer, r.LossPerMille, r.Err)
			continue
		}
		if r.MsgsPerS <= 0 || r.Sent != int64(r.Count) {
			t.Errorf("%s, loss %d‰: sent %d of %d, %.0f msgs/s", r.Peer, r.LossPerMille, r.Sent, r.Count, r.MsgsPerS)
		}
		if r.Corrupted > 0 {
			t.Errorf("%s, loss %d‰: %d corrupted", r.Peer, r.LossPerMille, r.Corrupted)
		}
		bad := r.Lost + r.Reordered + r.Duplicated
		switch {
		case r.Reliable && r.LossPerMille == 0 && bad > 0,
			r.Peer == "norm" && bad > 0:
			t.Errorf("%s, loss %d‰: lost %d, reordered %d, duplicated %d", r.Peer, r.LossPerMille, r.Lost, r.Reordered, r.Duplicated)
		case r.Peer == "pgm" && r.LossPerMille > 0:
			t.Logf("pgm at %d‰ loss: lost %d, reordered %d, duplicated %d of %d", r.LossPerMille, r.Lost, r.Reordered, r.Duplicated, r.Count)
		}
		if r.LossPerMille > 0 && r.LostPkts == 0 {
			t.Errorf("%s, loss %d‰: nothing dropped", r.Peer, r.LossPerMille)
		}
	}
	for _, p := range cfg.RelPeers {
		if !ran[p] {
			t.Logf("%s did not run (see the table)", p)
		}
	}
	if !ran["udp"] {
		t.Error("the udp peer did not run")
	}
	if !slices.ContainsFunc(rep.Targets, func(x Target) bool { return x.Unmeasured == "softrdma peer missing" }) &&
		!slices.ContainsFunc(rep.Reliable, func(r RelResult) bool { return r.Peer == relSoftrdmaPeer }) {
		t.Error("no reliable target line")
	}
}

// TestRMsg checks the message format, the receiver's accounting and the
// peers' command line.
func TestRMsg(t *testing.T) {
	b := make([]byte, 64)
	FillRMsg(b, 7, 12345)
	if seq, sent, ok := ParseRMsg(b, 64); !ok || seq != 7 || sent != 12345 {
		t.Fatalf("ParseRMsg = %d, %d, %v", seq, sent, ok)
	}
	if _, _, ok := ParseRMsg(b[:63], 64); ok {
		t.Error("short message accepted")
	}
	b[40]++
	if _, _, ok := ParseRMsg(b, 64); ok {
		t.Error("bad pattern accepted")
	}
	s := NewRStats(4, 32)
	for _, seq := range []uint64{0, 2, 1, 2, 9} {
		m := make([]byte, 32)
		FillRMsg(m, seq, 100)
		s.Deliver(m, 100+int64(seq+1)*10)
	}
	l := s.Line("x", "")
	if l.Delivered != 5 || l.Distinct != 3 || l.Duplicated != 1 || l.Reordered != 1 || l.Corrupted != 1 || l.Lost != 1 || s.Done() {
		t.Errorf("stats %+v", l)
	}
	if l.P50Ns != 20 || l.P99Ns != 30 || l.MaxNs != 30 {
		t.Errorf("latency p50 %d, p99 %d, max %d", l.P50Ns, l.P99Ns, l.MaxNs)
	}
	if _, err := json.Marshal(l); err != nil {
		t.Fatal(err)
	}

	a := PeerArgs{Send: true, Group: netip.MustParseAddr("239.1.2.3"), Port: 5000, Iface: "rm0", Addr: netip.MustParseAddr("10.0.0.1"),
		Size: 1024, Count: 10, Rate: 500, Receivers: []netip.Addr{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")},
		Timeout: 5 * time.Second, Idle: time.Second, Extra: map[string]string{"txrate": "1e9"}}
	got, err := ParsePeerArgs(a.Args())
	if err != nil {
		t.Fatalf("%v: %q", err, a.Args())
	}
	if got.Send != a.Send || got.Group != a.Group || got.Port != a.Port || got.Iface != a.Iface || got.Addr != a.Addr ||
		got.Size != a.Size || got.Count != a.Count || got.Rate != a.Rate || !slices.Equal(got.Receivers, a.Receivers) ||
		got.Timeout != a.Timeout || got.Idle != a.Idle || got.Extra["txrate"] != "1e9" {
		t.Errorf("round trip: %+v\nwant %+v", got, a)
	}
	if _, err := ParsePeerArgs([]string{"recv", "-group", "10.0.0.1", "-port", "1", "-iface", "x", "-addr", "10.0.0.2", "-size", "64", "-count", "1"}); err == nil {
		t.Error("unicast group accepted")
	}
}
