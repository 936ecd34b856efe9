//go:build rdmacore && cgo

package rdmacore

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
)

// TestInspectAndCounters: a kernel device shows in the tools as
// ibv_devinfo shows it (port, GIDs, network interface), and its sysfs
// counters come with the schema: rxe's sent_pkts under softrdma's name and
// metric, growing with a send.
func TestInspectAndCounters(t *testing.T) {
	e := newEnv(t)
	rep, ok := e.dev.Inspect()
	if !ok || rep.Kind != "kernel" || rep.Port.State != verbs.PortActive || len(rep.GIDs) == 0 {
		t.Fatalf("report %v: %+v", ok, rep)
	}
	if rep.Port.LinkLayer == verbs.LinkLayerEthernet && (rep.Netdev.Name == "" || rep.Netdev.Index == 0) {
		t.Errorf("RoCE device without its network interface: %+v", rep.Netdev)
	}
	schema, _, ok := e.dev.Counters()
	if !ok || len(schema) == 0 {
		t.Fatalf("counters %v: %v", ok, schema)
	}
	i := slices.IndexFunc(schema, func(c verbs.CounterDesc) bool { return c.Name == "sent_pkts" })
	if i < 0 {
		t.Fatalf("no sent_pkts in %v", schema)
	}
	soft := softverbs.Schema()[slices.IndexFunc(softverbs.Schema(), func(c verbs.CounterDesc) bool { return c.Name == "sent_pkts" })]
	if schema[i].Metric != soft.Metric {
		t.Errorf("sent_pkts feeds %q, softrdma's %q", schema[i].Metric, soft.Metric)
	}
	_, before, _ := e.dev.Counters()
	u := e.newQP(t, 0)
	ah := e.selfAH(t)
	u.postRecv(t, 0)
	wr := verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{u.mr.SGE(4*slot, 8)},
		UD: verbs.UDWR{AH: ah, RemoteQPN: u.qp.Num(), RemoteQKey: testQKey}}
	if err := u.qp.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	waitWC(t, u.scq)
	waitWC(t, u.rcq)
	_, after, _ := e.dev.Counters()
	if after[i] <= before[i] {
		t.Errorf("sent_pkts %d before a send, %d after", before[i], after[i])
	}
	t.Logf("%d counters; sent_pkts %d → %d", len(schema), before[i], after[i])
}

// readdEnv runs TestDeviceAddedAgain: it must run in a process of its
// own, as the kernel waits, on rdma link delete, for every process that
// holds the device open to close it (rxe cannot disassociate a process),
// and the other tests keep a query context open for the process's life.
const readdEnv = "SOFTRDMA_RDMACORE_READD"

// TestDeviceAddedAgain deletes the rxe device and adds it again under its
// name (rdma link): the host drops the device that is gone and then lists
// the new one, which opens and has its GIDs. It opens nothing before the
// delete, and puts the device back whatever happens.
func TestDeviceAddedAgain(t *testing.T) {
	if os.Getenv(readdEnv) != "1" {
		t.Skipf("deletes and adds the kernel device again: runs alone, with %s=1 (test/interop's TestKernelVerbs does)", readdEnv)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to delete and add an rxe device")
	}
	rdma, err := exec.LookPath("rdma")
	if err != nil {
		t.Skipf("no rdma tool (iproute2): %v", err)
	}
	h, dev := kernelDevice(t)
	name := dev.Name()
	ndevB, err := os.ReadFile(filepath.Join(sysfsRoot, name, "ports", "1", "gid_attrs", "ndevs", "0"))
	if err != nil {
		t.Skipf("%s has no network interface: %v", name, err)
	}
	ndev := strings.TrimSpace(string(ndevB))
	if out, err := exec.Command(rdma, "link", "show", name+"/1").CombinedOutput(); err != nil || !strings.Contains(string(out), "netdev "+ndev) {
		t.Skipf("%s is not an rxe link of %s: %v %s", name, ndev, err, out)
	}
	run := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if out, err := exec.CommandContext(ctx, rdma, args...).CombinedOutput(); err != nil {
			t.Fatalf("rdma %s: %v (a process that holds the device open blocks a delete): %s", strings.Join(args, " "), err, out)
		}
	}
	listed := func() *verbs.Device {
		for _, d := range On(h) {
			if d.Name() == name {
				return d
			}
		}
		return nil
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 20 s", what)
			}
		}
	}
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(sysfsRoot, name)); err != nil {
			exec.Command(rdma, "link", "add", name, "type", "rxe", "netdev", ndev).Run()
		}
	})
	run("link", "delete", name)
	waitFor("the deleted device leaves the host", func() bool { return listed() == nil })
	run("link", "add", name, "type", "rxe", "netdev", ndev)
	var again *verbs.Device
	waitFor("the device added again is listed", func() bool { again = listed(); return again != nil })
	if again == dev || again.Ops() == dev.Ops() {
		t.Fatal("the host kept the old device")
	}
	ctx, err := again.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	waitFor("an IPv4 RoCEv2 GID on the new device", func() bool {
		tbl, err := ctx.QueryGIDTable(1)
		if err != nil {
			return false
		}
		return slices.ContainsFunc(tbl, func(g verbs.GIDEntry) bool {
			return g.Type == verbs.GIDTypeRoCEv2 && netip.AddrFrom16(g.GID).Is4In6()
		})
	})
	pa, err := ctx.QueryPort(1)
	if err != nil || pa.State != verbs.PortActive {
		t.Errorf("new device's port: %+v %v", pa, err)
	}
}
