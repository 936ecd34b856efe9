package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs/driver"
)

// TestExecUdaddy runs Debian's unmodified udaddy (rdmacm-utils) through
// softrdma exec as server and client on RoCEv2 over lo: UD connections
// through the CM (rdma_listen, rdma_connect, CONNECT_REQUEST, rdma_accept,
// ESTABLISHED with the remote QP and Q_Key) between two processes, then
// its ping-pong of datagrams; both exit 0.
func TestExecUdaddy(t *testing.T) {
	requireRDMACore(t, "udaddy", "stdbuf")
	dir := execDir(t)
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, sout := startExec(t, ctx, dir, "stdbuf", "-oL", "udaddy", "-b", "127.0.0.1", "-c", "2", "-C", "10")
	if !sout.wait("udaddy: starting server") {
		srv.Wait()
		t.Fatalf("the server did not start:\n%s", sout)
	}
	// udaddy says nothing once it listens: its claim of the service (port
	// 7174 of RDMA_PS_UDP) shows in /proc/net/unix.
	claim := "@softrdma/" + fmt.Sprint(os.Geteuid()) + "/gsi/" + driver.GSIServiceKey(mad.ServiceID(0x0111, 7174))
	for !unixNameListed(t, claim) {
		if ctx.Err() != nil {
			t.Fatalf("the server never listened (%s):\n%s", claim, sout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cli, cout := startExec(t, ctx, dir, "stdbuf", "-oL", "udaddy", "-s", "127.0.0.1", "-b", "127.0.0.1", "-c", "2", "-C", "10")
	cerr := cli.Wait()
	cout.wait("\x00")
	serr := srv.Wait()
	sout.wait("\x00")
	t.Logf("server:\n%s\nclient:\n%s", sout, cout)
	if cerr != nil || serr != nil {
		t.Fatalf("client: %v, server: %v", cerr, serr)
	}
	for _, out := range []string{sout.String(), cout.String()} {
		if !strings.Contains(out, "data transfers complete") || !strings.Contains(out, "return status 0") {
			t.Errorf("udaddy did not complete its transfers:\n%s", out)
		}
	}
}

// unixNameListed reports whether a unix socket of the name (@ for the
// abstract namespace) is listed in /proc/net/unix.
func unixNameListed(t *testing.T, name string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), " "+name+"\n")
}
