package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
)

// TestExecBlocking runs testdata/blocking.c through softrdma exec: on
// loopback in the test's network namespace for rdma_get_cm_event,
// ibv_get_cq_event (a channel of the program's), rdma_get_recv_comp and
// rdma_get_send_comp (the CQs and channels rdma_create_qp makes), and on
// the RoCE device of a veth interface of the namespace for
// ibv_get_async_event, each call made before its event exists waits
// until a thread of the program makes the event (only once the calling
// thread sleeps in the call) and then returns it; with O_NONBLOCK set on
// the fd by the program it fails with EAGAIN, and poll() on the fd
// returns once the event is made, after which the call returns it; with
// O_NONBLOCK cleared again it waits again.
func TestExecBlocking(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	prog := buildCTest(t, dir, "blocking", "-lrdmacm", "-lpthread")
	if !testenv.InNetns(t) {
		return
	}
	const ifname = "srblock0"
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("route", "add", "224.0.0.0/4", "dev", "lo")
	ip("link", "add", ifname, "type", "veth", "peer", "name", ifname+"p")
	// No IPv6 on the pair: a link-local address coming after the program
	// started would be an asynchronous event the program did not make.
	for _, i := range []string{ifname, ifname + "p"} {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+i+"/disable_ipv6", []byte("1"), 0o644); err != nil {
			t.Fatalf("disable IPv6 on %s: %v", i, err)
		}
	}
	ip("link", "set", ifname, "up")
	ip("link", "set", ifname+"p", "up")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	waitOperUp(t, ctx, ifname)
	cmd, out := startExec(t, ctx, dir, prog, "rxe_"+ifname, ifname)
	err := cmd.Wait()
	out.wait("\x00") // the whole output
	t.Logf("blocking:\n%s", out)
	if err != nil {
		t.Fatalf("blocking: %v", err)
	}
	for _, want := range []string{"ok rdma_get_cm_event", "ok ibv_get_cq_event", "ok rdma_get_recv_comp",
		"ok rdma_get_send_comp", "ok ibv_get_async_event"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// waitOperUp waits until the interface's operstate is UP (its carrier is
// on, after the kernel's link watch), so that the port's own coming up is
// over before a program looks at its events. (ip(8), not /sys: sysfs
// shows the network namespace it was mounted in.)
func waitOperUp(t *testing.T, ctx context.Context, ifname string) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		out, err := exec.Command("ip", "-o", "link", "show", "dev", ifname).CombinedOutput()
		if err == nil && strings.Contains(string(out), "state UP") {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s not up: %v %s", ifname, ctx.Err(), out)
		case <-tick.C:
		}
	}
}
