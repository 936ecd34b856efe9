package rxe

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// victimEnv makes the test binary run TestSquattedHandover's victim part.
const victimEnv = "SOFTRDMA_TEST_RXE_VICTIM"

// victim is the uid of the user whose hand-over another user tries to
// disable in TestSquattedHandover.
const victim = 65533

// TestSquattedHandover: another user (root here) leaves in /tmp what a
// user's hand-over directory used to be, a directory anyone may write
// (then a symbolic link, then a file). That user's devices still create
// QPs, deliver multicast and unicast, and hand unicast datagrams over
// between devices: the victim runs TestForwardToOwner and
// TestTwoProcesses.
func TestSquattedHandover(t *testing.T) {
	if os.Getenv(victimEnv) != "" {
		t.Skip("the victim's process runs the tests it is given")
	}
	if !testenv.InNetns(t) {
		return
	}
	top := fmt.Sprintf("/tmp/softrdma-%d", victim)
	if _, err := os.Lstat(top); err == nil {
		t.Skipf("%s exists already", top)
	}
	for _, squat := range []string{"dir", "symlink", "file"} {
		t.Run(squat, func(t *testing.T) {
			var err error
			switch squat {
			case "dir":
				if err = os.Mkdir(top, 0o777); err == nil {
					err = os.Chmod(top, 0o777)
				}
			case "symlink":
				err = os.Symlink(t.TempDir(), top)
			case "file":
				err = os.WriteFile(top, nil, 0o644)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer os.Remove(top)
			cmd, _ := userCmd(t, victim, victimEnv+"=1", "-test.run=^(TestForwardToOwner|TestTwoProcesses)$", "-test.count=1", "-test.v")
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "--- PASS: TestForwardToOwner") || !strings.Contains(string(out), "--- PASS: TestTwoProcesses") {
				t.Fatalf("as uid %d beside %s (%s): %v\n%s", victim, top, squat, err, out)
			}
		})
	}
}

// TestHandoverNameSquatted: another user (nobody) listens on the name of a
// device's hand-over socket before the device does. The QP is created all
// the same, with the failure counted in handover_errors; the device
// delivers multicast and its own unicast; another device of the user,
// finding the name held by nobody's socket, hands nothing over to it
// (counted in forward_drops and handover_errors), and nobody reads nothing.
func TestHandoverNameSquatted(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Require(t, "needs root to start a process as another user")
	}
	name := fmt.Sprintf("@softrdma-test-squat/%d/%d", os.Getpid(), rand.Uint32())
	cmd, _ := nobodyCmd(t, "squat", name)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	lines := bufio.NewReader(stdout)
	if line, err := lines.ReadString('\n'); line != "squatted: ok\n" {
		t.Fatalf("the other user's process: %q %v", line, err)
	}
	saved := handoverName
	handoverName = func(uint16) string { return name }
	t.Cleanup(func() { handoverName = saved })

	a := loDev(t)
	const qkey = 0x5A
	rx := newFakeRx()
	q := newQP(t, a, rx, 0, qkey) // fails the test if the QP cannot be created
	if n := a.Counters().Get(softverbs.HandoverErrors); n != 1 {
		t.Errorf("handover_errors %d, want 1", n)
	}
	g := randGroup()
	if err := q.AttachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	if err := q.Send(&softverbs.UDSend{AH: mcastAH(g), RemoteQPN: verbs.MulticastQPN, RemoteQKey: qkey, Payload: []byte("mc")}); err != nil {
		t.Fatal(err)
	}
	if got := rx.wait(t); string(got.payload) != "mc" {
		t.Errorf("multicast: %+v", got)
	}
	in := &injector{port: 40005}
	uname, oob := unicastInput(in.port)
	lo := netip.MustParseAddr("127.0.0.1")
	own := peerReceiver(t, a)
	own.handle(in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: q.QPN(), QKey: qkey, SrcQP: 7}, []byte("uc"), nil), uname, oob, false)
	if got := rx.wait(t); string(got.payload) != "uc" {
		t.Errorf("unicast: %+v", got)
	}

	b := loPeer(t)
	r := peerReceiver(t, b)
	r.handle(in.craft(lo, wire.UDHeader{PKey: 0xFFFF, DestQP: q.QPN(), QKey: qkey, SrcQP: 8}, []byte("fwd"), nil), uname, oob, false)
	rx.none(t, 50*time.Millisecond)
	if c := b.Counters(); c.Get(softverbs.Forwarded) != 0 || c.Get(softverbs.ForwardDrops) != 1 || c.Get(softverbs.HandoverErrors) != 1 {
		t.Errorf("forwarder: forwarded %d forward_drops %d handover_errors %d, want 0, 1, 1",
			c.Get(softverbs.Forwarded), c.Get(softverbs.ForwardDrops), c.Get(softverbs.HandoverErrors))
	}
	stdin.Close()
	if line, err := lines.ReadString('\n'); line != "read 0\n" {
		t.Errorf("the other user's process: %q %v", line, err)
	}
}

// TestPeerLockSquatted: the peer-socket lock excludes the user's own
// devices, and a lock name another user (nobody) holds does not stop them:
// they go on without the lock at once.
func TestPeerLockSquatted(t *testing.T) {
	name := fmt.Sprintf("@softrdma-test-lock/%d/%d", os.Getpid(), rand.Uint32())
	saved := peerLockName
	peerLockName = func() string { return name }
	t.Cleanup(func() { peerLockName = saved })
	var d Device
	unlock := d.lockPeerSocks()
	got := make(chan struct{})
	go func() {
		d.lockPeerSocks()()
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("a second holder of the peer-socket lock")
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	<-got

	if os.Geteuid() != 0 {
		testenv.Require(t, "needs root to start a process as another user")
	}
	cmd, _ := nobodyCmd(t, "squat", name)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "squatted: ok\n" {
		t.Fatalf("the other user's process: %q %v", line, err)
	}
	start := time.Now()
	d.lockPeerSocks()()
	if el := time.Since(start); el > peerLockWait/2 {
		t.Errorf("lock held by another user: waited %v", el)
	}
}
