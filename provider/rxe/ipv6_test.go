package rxe

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// inNetns re-runs the test in a network namespace of its own
// (testenv.InNetns) and reports whether the caller is that re-run.
func inNetns(t *testing.T) bool {
	t.Helper()
	return testenv.InNetns(t)
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestIPv6Multicast exchanges a datagram over an IPv6 group (MLD) on a
// veth interface in a private network namespace.
func TestIPv6Multicast(t *testing.T) {
	if !inNetns(t) {
		return
	}
	ipCmd(t, "link", "set", "lo", "up")
	ipCmd(t, "link", "add", "va", "type", "veth", "peer", "name", "vb")
	ipCmd(t, "link", "set", "va", "up")
	ipCmd(t, "link", "set", "vb", "up")
	ipCmd(t, "addr", "add", "10.77.0.1/24", "dev", "va")
	ipCmd(t, "-6", "addr", "add", "fd00:77::1/64", "dev", "va", "nodad")

	d, err := ForName("va")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	eventually(t, "va running", func() bool { pa, _ := d.QueryPort(1); return pa.State == verbs.PortActive })
	tbl, _ := d.GIDTable(1)
	src := netip.MustParseAddr("fd00:77::1")
	sgid := -1
	for _, e := range tbl {
		if e.GID == wire.GIDFromAddr(src) {
			sgid = e.Index
		}
	}
	if sgid <= 0 || tbl[0].GID != wire.GIDFromAddr(netip.MustParseAddr("10.77.0.1")) {
		t.Fatalf("gid table %+v", tbl)
	}
	group := netip.MustParseAddr(fmt.Sprintf("ff0e::77:%x", 1+rand.IntN(0xfffe)))
	rxA, rxB := newFakeRx(), newFakeRx()
	a := newQP(t, d, rxA, verbs.CreateBlockSelfMcastLB, 7)
	b := newQP(t, d, rxB, 0, 7)
	for _, q := range []*tqp{a, b} {
		if err := q.AttachMcast(wire.RoCEv2MGID(group), 0); err != nil {
			t.Fatal(err)
		}
	}
	if !igmp6Has(t, "va", group) {
		t.Errorf("va not in %v", group)
	}
	ah := &verbs.AHAttr{IsGlobal: true, PortNum: 1, GRH: verbs.GlobalRoute{DGID: wire.RoCEv2MGID(group), SGIDIndex: uint8(sgid), HopLimit: 9, TrafficClass: 0x28}}
	if err := a.Send(&softverbs.UDSend{AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: 7, Payload: []byte("over ipv6"), HasImm: true, Imm: 5}); err != nil {
		t.Fatal(err)
	}
	got := rxB.wait(t)
	if string(got.payload) != "over ipv6" || got.srcQP != a.QPN() || !got.hasImm || got.imm != 5 {
		t.Errorf("delivery %+v", got)
	}
	ip := wire.IPv6(got.grh[:])
	if ip.Version() != 6 || ip.Src() != src || ip.Dst() != group || ip.HopLimit() != 9 || ip.TrafficClass() != 0x28 ||
		ip.NextHeader() != 17 || int(ip.PayloadLength()) != 8+wire.UDLen(9, true) {
		t.Errorf("grh % x", got.grh)
	}
	eventually(t, "self loopback blocked", func() bool { return d.Counters().Get(softverbs.SelfLoopbackDrops) == 1 })
	rxA.none(t, 50*time.Millisecond)
	if c := d.Counters(); c.Get(softverbs.ICRCErrors) != 0 {
		t.Errorf("counters %+v", c)
	}
	for _, q := range []*tqp{a, b} {
		if err := q.DetachMcast(wire.RoCEv2MGID(group), 0); err != nil {
			t.Fatal(err)
		}
	}
	if igmp6Has(t, "va", group) {
		t.Errorf("va still in %v", group)
	}
}

// igmp6Has reports whether /proc/net/igmp6 lists group on ifname.
func igmp6Has(t *testing.T, ifname string, group netip.Addr) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/net/igmp6")
	if err != nil {
		testenv.Require(t, "no /proc/net/igmp6: %v", err)
	}
	g := group.As16()
	want := fmt.Sprintf("%x", g[:])
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[1] == ifname && f[2] == want {
			return true
		}
	}
	return false
}
