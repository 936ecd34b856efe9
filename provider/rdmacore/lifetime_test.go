//go:build rdmacore && cgo

package rdmacore

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/verbs"
)

// TestDestroyWhilePosting destroys an AH while another goroutine posts
// sends with it: each post either uses the live AH or finds it destroyed
// (EINVAL), never a freed one; once Destroy returns, every post with it
// is EINVAL. Meant for -race (test/interop's TestKernelVerbs).
func TestDestroyWhilePosting(t *testing.T) {
	e := newEnv(t)
	u := e.newQP(t, 0)
	for round := range 20 {
		ah, err := e.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: e.port,
			GRH: verbs.GlobalRoute{DGID: e.gid.GID, SGIDIndex: uint8(e.gid.Index), HopLimit: 64}})
		if err != nil {
			t.Fatal(err)
		}
		wr := verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{u.mr.SGE(0, 16)},
			UD: verbs.UDWR{AH: ah, RemoteQPN: u.qp.Num(), RemoteQKey: testQKey}}
		var posted, refused atomic.Int64
		var bad atomic.Value
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			var wc [8]verbs.WC
			for {
				select {
				case <-stop:
					return
				default:
				}
				w := wr
				switch err := u.qp.PostSend(&w); {
				case err == nil:
					posted.Add(1)
					for n := 0; n == 0; { // its completion, so the send queue never fills
						if n, err = u.scq.Poll(wc[:]); err != nil {
							bad.Store(err)
							return
						}
					}
				case errors.Is(err, syscall.EINVAL):
					refused.Add(1)
				default:
					bad.Store(err)
					return
				}
			}
		}()
		for deadline := time.Now().Add(10 * time.Second); posted.Load() == 0 && bad.Load() == nil; {
			if time.Now().After(deadline) {
				t.Fatal("no send posted in 10 s")
			}
			runtime.Gosched()
		}
		if err := ah.Destroy(); err != nil {
			t.Fatalf("round %d: destroy: %v", round, err)
		}
		w := wr
		if err := u.qp.PostSend(&w); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("round %d: post with a destroyed AH: %v, want EINVAL", round, err)
		}
		close(stop)
		wg.Wait()
		if err := bad.Load(); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if round == 0 {
			t.Logf("round 0: %d posted, %d refused", posted.Load(), refused.Load())
		}
	}
}

// TestDestroyWhileWaiting destroys a completion channel while a goroutine
// waits on it in GetCQEvent: the wait ends with an error at once (the
// context has 30 s left) and touches no freed channel. A channel a CQ
// uses is EBUSY; destroyed twice, EINVAL.
func TestDestroyWhileWaiting(t *testing.T) {
	e := newEnv(t)
	for round := range 10 {
		ch, err := e.ctx.CreateCompChannel()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		done := make(chan error, 1)
		go func() {
			_, _, err := ch.GetCQEvent(ctx)
			done <- err
		}()
		runtime.Gosched()
		if err := ch.Destroy(); err != nil {
			t.Fatalf("round %d: destroy: %v", round, err)
		}
		select {
		case err := <-done:
			if err == nil || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("round %d: wait ended with %v, want an error of the destroyed channel", round, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: GetCQEvent still waits 10 s after the channel's Destroy", round)
		}
		cancel()
		if err := ch.Destroy(); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("second destroy: %v, want EINVAL", err)
		}
	}
	ch, err := e.ctx.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := e.ctx.CreateCQEx(4, verbs.CQInit{Channel: ch})
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Destroy(); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("destroy while a CQ uses it: %v, want EBUSY", err)
	}
	check(t, cq.Destroy())
	check(t, ch.Destroy())
}

// TestDroppedHandleReported drops a PD without Dealloc: when the
// collector finds it unreachable, the backend reports the leak.
func TestDroppedHandleReported(t *testing.T) {
	_, dev := kernelDevice(t)
	reports := make(chan string, 4)
	hook := func(kind string) {
		select {
		case reports <- kind:
		default:
		}
	}
	leakHook.Store(&hook)
	defer leakHook.Store(nil)
	// A context of its own: the leaked PD keeps it from closing (EBUSY),
	// and it is left open, as the program that leaked would leave it.
	ctx, err := dev.Open()
	if err != nil {
		t.Fatal(err)
	}
	func() {
		if _, err := ctx.AllocPD(); err != nil {
			t.Fatal(err)
		}
	}()
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	check(t, pd.Dealloc()) // freed: not reported
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		select {
		case kind := <-reports:
			if strings.Contains(kind, "protection domain") {
				return
			}
			t.Logf("another report: %q", kind) // a handle another test dropped
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no report of the dropped PD within 10 s")
		}
	}
}
