package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/test/testenv"
)

// startSM runs softsm's subnet manager, SA and switch in the test's
// process on loopback ports of its own and returns the SOFTRDMA_SM
// variable that names it; it stops when the test ends.
func startSM(t *testing.T) string {
	t.Helper()
	s, err := sm.New(sm.Config{Listen: "127.0.0.1:0", SAListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return "SOFTRDMA_SM=" + s.FabricAddr().String()
}

// TestExecMckeyIB runs Debian's unmodified mckey through softrdma exec on
// the emulated InfiniBand subnet: softsm runs in the test, SOFTRDMA_SM
// names it, and receiver and sender each open an IB port whose IPoIB
// address is the 127.0.3.x address they bind. Both join the group's IPoIB
// MGID (ff12:4001:ffff:: and the low 28 bits of 230.23.0.1, as the
// kernel's cma_set_mgid maps it) with a multicast LID from 0xC000, the
// receiver gets every message and both exit 0.
func TestExecMckeyIB(t *testing.T) {
	requireRDMACore(t, "mckey", "stdbuf")
	dir := execDir(t)
	if !testenv.InNetns(t) {
		return
	}
	smEnv := []string{startSM(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const count = 20
	group := "230.23.0.1"
	joined := regexp.MustCompile(`mckey: joined dgid: ff12:4001:ffff::617:1 mlid 0xc0[0-9a-f]{2} sl 0`)
	recv, rout := startExecEnv(t, ctx, dir, smEnv, "stdbuf", "-oL", "mckey", "-m", group, "-b", "127.0.3.1", "-C", fmt.Sprint(count), "-S", "64")
	if !rout.wait("mckey: joined dgid:") {
		recv.Wait()
		t.Fatalf("the receiver did not join:\n%s", rout)
	}
	send, sout := startExecEnv(t, ctx, dir, smEnv, "stdbuf", "-oL", "mckey", "-m", group, "-b", "127.0.3.2", "-s", "-C", fmt.Sprint(count), "-S", "64")
	serr := send.Wait()
	sout.wait("\x00") // the whole output
	rerr := recv.Wait()
	rout.wait("\x00")
	t.Logf("receiver:\n%s\nsender:\n%s", rout, sout)
	if serr != nil || rerr != nil {
		t.Fatalf("sender: %v, receiver: %v", serr, rerr)
	}
	for _, o := range []*lineWaiter{rout, sout} {
		if !joined.MatchString(o.String()) {
			t.Errorf("no line matching %q: not the IB port's join", joined)
		}
	}
	checkMckeyRun(t, rout.String(), sout.String())
}

// TestExecEndpoint compiles testdata/endpoint.c against the distribution's
// headers and runs it through softrdma exec on RoCEv2 over lo and on the
// emulated IB subnet: rdma_create_ep passive (bound, the id's device and
// port) and active (address and route resolved, its UD QP in RTS),
// rdma_destroy_ep, rdma_init_qp_attr (the kernel's mask and values for a
// UD id, RDMA_PS_IPOIB's Q_Key from the IB port's broadcast group, EINVAL
// without a device) and the IB port as ibv_query_port, ibv_query_gid and
// ibv_query_pkey show it (LID, SM LID, port GID, P_Key 0xffff).
func TestExecEndpoint(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	prog := buildCTest(t, dir, "endpoint", "-lrdmacm")
	if !testenv.InNetns(t) {
		return
	}
	for _, tc := range []struct {
		kind, addr string
		env        func() []string
	}{
		{"roce", "127.0.0.1", func() []string { return nil }},
		{"ib", "127.0.3.1", func() []string { return []string{startSM(t)} }},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd, out := startExecEnv(t, ctx, dir, tc.env(), prog, tc.kind, tc.addr)
			err := cmd.Wait()
			out.wait("\x00")
			t.Logf("endpoint %s:\n%s", tc.kind, out)
			if err != nil {
				t.Fatalf("endpoint: %v", err)
			}
			if s := out.String(); !strings.Contains(s, "\nPASSED") || strings.Contains(s, "FAIL ") || strings.Contains(s, "not supported on softrdma") {
				t.Errorf("endpoint did not pass")
			}
		})
	}
}
