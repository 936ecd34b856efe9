package interop

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/nettest"
)

// cudaddy starts Debian's udaddy (rdmacm-utils, the guests' build) in h0
// through softrdma exec: a UD exchange set up by the RDMA CM's SIDR
// (rdma_listen, rdma_connect, rdma_accept on RDMA_PS_UDP).
func (l *lab) cudaddy(t *testing.T, args ...string) *nettest.Proc {
	t.Helper()
	udaddy, err := exec.LookPath("udaddy")
	if err != nil {
		if required {
			t.Fatalf("no udaddy on the host (apt-get install rdmacm-utils): %v", err)
		}
		t.Skipf("no udaddy on the host (apt-get install rdmacm-utils): %v", err)
	}
	bin, libdir, _ := softrdmaExec(t)
	return startProc(t, l.h0, bin, append([]string{"exec", "-libdir", libdir, "--", "stdbuf", "-oL", udaddy}, args...)...)
}

// udaddyRetry is how long a client is started again while the server's
// listen may not be there yet (its "starting server" line comes first).
const udaddyRetry = 60 * time.Second

// TestCUdaddy: rdma-core's udaddy, unmodified, between the host (through
// softrdma exec) and g1 (the kernel's rxe), each way round: the client's
// SIDR_REQ and the server's SIDR_REP cross the wire as CM MADs on QP1,
// then the client's datagrams go to the QPN and Q_Key of the REP and the
// server's replies to the address handle of each completion. Both exit 0
// ("test complete") only once every message came back; g1's rxe counters
// show the kernel carried them.
func TestCUdaddy(t *testing.T) {
	l := needLab(t)
	g1 := l.guests[0]
	const n, size = 10, 100
	count, sz := fmt.Sprint(n), fmt.Sprint(size)

	t.Run("host-server", func(t *testing.T) {
		note := report(t)
		srv := l.cudaddy(t, "-b", l.hostAddr.String(), "-C", count, "-S", sz)
		srv.WaitLine("udaddy: starting server", lineTimeout)
		rcvd := g1.counter(t, "rcvd_pkts")
		var cli *gcmd
		for deadline := time.Now().Add(udaddyRetry); ; {
			cli = g1.start(t, "udaddy client", fmt.Sprintf("exec timeout -s KILL 150 stdbuf -oL -eL udaddy -s %s -b %s -C %s -S %s", l.hostAddr, g1.addr, count, sz))
			rc := cli.wait(exitTimeout)
			if rc == 0 || time.Now().After(deadline) {
				if rc != 0 {
					t.Fatalf("the guest's udaddy client: exit %d\n%s", rc, nettest.Indent(cli.output()))
				}
				break
			}
			if srv.Exited() {
				t.Fatalf("the host's udaddy server exited while the client failed:\n%s", nettest.Indent(srv.Output()))
			}
		}
		srv.ExpectExit(0, exitTimeout)
		if !strings.Contains(cli.output(), "test complete") {
			t.Errorf("the guest's client did not complete:\n%s", nettest.Indent(cli.output()))
		}
		if d := g1.counter(t, "rcvd_pkts") - rcvd; d < n {
			t.Errorf("%s rxe0 rcvd_pkts +%d, want ≥ %d (the server's replies)", g1.name, d, n)
		}
		note.set("rdma-core udaddy: client on rxe (%s) → server on softrdma (softrdma exec, host): SIDR, %d×%dB each way", g1.name, n, size)
	})

	t.Run("guest-server", func(t *testing.T) {
		note := report(t)
		srv := g1.start(t, "udaddy server", fmt.Sprintf("exec timeout -s KILL 150 stdbuf -oL -eL udaddy -b %s -C %s -S %s", g1.addr, count, sz))
		srv.waitLine("udaddy: starting server", lineTimeout)
		sent := g1.counter(t, "sent_pkts")
		var cli *nettest.Proc
		for deadline := time.Now().Add(udaddyRetry); ; {
			cli = l.cudaddy(t, "-s", g1.addr.String(), "-b", l.hostAddr.String(), "-C", count, "-S", sz)
			rc := cli.Wait(exitTimeout)
			if rc == 0 || time.Now().After(deadline) {
				if rc != 0 {
					t.Fatalf("the host's udaddy client: exit %d\n%s", rc, nettest.Indent(cli.Output()))
				}
				break
			}
			if srv.exited() {
				t.Fatalf("the guest's udaddy server exited while the client failed:\n%s", nettest.Indent(srv.output()))
			}
		}
		srv.expectExit(0, exitTimeout)
		if !strings.Contains(cli.Output(), "test complete") {
			t.Errorf("the host's client did not complete:\n%s", nettest.Indent(cli.Output()))
		}
		if d := g1.counter(t, "sent_pkts") - sent; d < n {
			t.Errorf("%s rxe0 sent_pkts +%d, want ≥ %d (the server's replies)", g1.name, d, n)
		}
		note.set("rdma-core udaddy: client on softrdma (softrdma exec, host) → server on rxe (%s): SIDR, %d×%dB each way", g1.name, n, size)
	})
}
