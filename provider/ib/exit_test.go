package ib_test

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/rdmacm/saclient"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
)

const exitChildEnv = "IBTEST_EXIT_CHILD" // not SOFTRDMA_: TestMains clear those

// TestExitLeavesNothing: a process that joins a group through the RDMA CM
// on an IB port, destroys its id and exits at once (without closing the
// port, so no detach reaches the SM) leaves nothing at the SA: Destroy
// returned only after the SA answered the Delete. The SM still has the
// port attached when the membership is checked, so neither a detach nor
// an expiry removed it.
func TestExitLeavesNothing(t *testing.T) {
	if os.Getenv(exitChildEnv) != "" {
		exitChild()
		return
	}
	s := startSM(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestExitLeavesNothing$")
	// testenv.ChildEnv: the child's TestMain keeps the SOFTRDMA_SM set here.
	cmd.Env = []string{testenv.ChildEnv, exitChildEnv + "=1", "SOFTRDMA_SM=" + s.FabricAddr().String(), "PATH=" + os.Getenv("PATH")}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v (output %q)", err, lines)
	}
	var guid uint64
	var mlid uint16
	var mgidStr string
	for _, l := range lines {
		fmt.Sscanf(l, "joined guid %x mlid %x mgid %s", &guid, &mlid, &mgidStr)
	}
	if guid == 0 || mlid < 0xc001 {
		t.Fatalf("the child did not join: %q", lines)
	}
	attached := false
	for _, p := range s.Stats().Ports {
		if p.GUID == guid && p.Attached {
			attached = true
		}
	}
	if !attached {
		t.Fatalf("the SM no longer has the child's port %#x attached: the check would prove nothing", guid)
	}
	if s.Model() != nil {
		// OpenSM in charge: the exited process was the group's only
		// member, so OpenSM's SA still has the group if its membership
		// stayed; a GetTable of the MGID from a port of this process
		// (sharing the P_Key) finds it then.
		mgid, err := verbs.ParseGID(mgidStr)
		if err != nil {
			t.Fatalf("the child's MGID %q: %v", mgidStr, err)
		}
		p := openPort(t, s, "127.0.3.21")
		recs, err := saAgent(t, p.dev).GetTable(saclient.GroupRecord{MGID: mgid}, mad.CompMGID)
		if err != nil {
			t.Fatalf("GetTable of %v through OpenSM: %v", mgid, err)
		}
		if len(recs) != 0 {
			t.Fatalf("OpenSM's SA still has the group %v the exited process joined alone (MLID %#x)", mgid, recs[0].MLID)
		}
		return
	}
	for _, g := range s.Groups() {
		for _, m := range g.Members {
			if m.GUID == guid && g.Rec.MLID == mlid {
				t.Fatalf("the SA still holds the exited process's membership of %v (join state %#x)", g.Rec.MGID, m.JoinState)
			}
		}
	}
}

// exitChild joins, destroys its id and exits without closing the port.
func exitChild() {
	fail := func(err error) { fmt.Println("child:", err); os.Exit(2) }
	ch, err := rdmacm.CreateEventChannel()
	if err != nil {
		fail(err)
	}
	id, err := rdmacm.CreateID(ch, nil, rdmacm.PS_UDP)
	if err != nil {
		fail(err)
	}
	if err := id.BindAddr(rdmacm.UDPAddr(netip.MustParseAddr("127.0.3.20"))); err != nil {
		fail(err)
	}
	if err := id.JoinMulticast(rdmacm.UDPAddr(netip.MustParseAddr("230.20.20.20")), nil); err != nil {
		fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ev, err := ch.GetEvent(ctx)
	if err != nil {
		fail(err)
	}
	if ev.Event != rdmacm.EventMulticastJoin {
		fail(fmt.Errorf("event %v status %d", ev.Event, ev.Status))
	}
	mlid, mgid := ev.Param.AHAttr.DLID, ev.Param.AHAttr.GRH.DGID
	ev.Ack()
	port := ib.ForAddr(netip.MustParseAddr("127.0.3.20"))
	if port == nil {
		fail(fmt.Errorf("no IB port for 127.0.3.20"))
	}
	fmt.Printf("joined guid %x mlid %x mgid %v\n", port.GUID(), mlid, mgid)
	if err := id.Destroy(); err != nil {
		fail(err)
	}
	os.Exit(0) // no Close: the port sends no detach
}
