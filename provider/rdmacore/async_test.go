//go:build rdmacore && cgo

package rdmacore

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/verbs"
)

// asyncEnv runs TestAsyncPortEvents: it adds an rxe device of its own (on
// a new veth pair), which the kernel can delete only once this process,
// whose device query context stays open, has ended: test/interop's
// TestKernelVerbs runs it alone and deletes the device afterwards.
const asyncEnv = "SOFTRDMA_RDMACORE_ASYNC"

// asyncDevice and asyncVeth name the rxe device and the veth pair
// TestAsyncPortEvents adds.
const (
	asyncDevice = "rxeasync"
	asyncVeth   = "sraasync"
)

// TestAsyncPortEvents: a kernel context's asynchronous events reach the
// Go API (verbs.Context.GetAsyncEvent) from its async_fd: the rxe
// device's interface losing its carrier (its veth peer set down) raises
// IBV_EVENT_PORT_ERR of port 1, the carrier coming back
// IBV_EVENT_PORT_ACTIVE, as the kernel's rxe notifies them.
func TestAsyncPortEvents(t *testing.T) {
	if os.Getenv(asyncEnv) != "1" {
		t.Skipf("adds an rxe device: runs alone, with %s=1 (test/interop's TestKernelVerbs does)", asyncEnv)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to add a veth pair and an rxe device")
	}
	run := func(name string, args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
	}
	run("ip", "link", "add", asyncVeth, "type", "veth", "peer", "name", asyncVeth+"p")
	run("ip", "link", "set", asyncVeth, "up")
	run("ip", "link", "set", asyncVeth+"p", "up")
	run("rdma", "link", "add", asyncDevice, "type", "rxe", "netdev", asyncVeth)
	h := verbs.NewHost()
	defer h.Close()
	var dev *verbs.Device
	waitUntil(t, "the new rxe device is listed", func() bool {
		for _, d := range On(h) {
			if d.Name() == asyncDevice {
				dev = d
				return true
			}
		}
		return false
	})
	vc, err := dev.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer vc.Close()
	waitUntil(t, "port 1 active", func() bool {
		pa, err := vc.QueryPort(1)
		return err == nil && pa.State == verbs.PortActive
	})
	vc.WatchAsyncEvents()
	next := func(want verbs.AsyncEventType) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for {
			ev, err := vc.GetAsyncEvent(ctx)
			if err != nil {
				t.Fatalf("waiting for %v: %v", want, err)
			}
			vc.AckAsyncEvent(ev)
			t.Logf("event: %v port %d", ev.Type, ev.PortNum)
			if ev.Type == want {
				if ev.PortNum != 1 {
					t.Fatalf("%v of port %d, want port 1", ev.Type, ev.PortNum)
				}
				return
			}
		}
	}
	run("ip", "link", "set", asyncVeth+"p", "down")
	next(verbs.EventPortErr)
	run("ip", "link", "set", asyncVeth+"p", "up")
	next(verbs.EventPortActive)
}

// waitUntil polls cond until it holds, failing the test after 20 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20 s", what)
		}
	}
}
