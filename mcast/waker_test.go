package mcast

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestWakerContext: the loop's waker handed to the context package, as
// provider/rdmacore's CQ Wait does (context.AfterFunc) and as any
// provider may (WithCancel): a kick runs the callbacks, whose Err is not
// nil (the context package panics on a nil one), a kick before the
// registration runs it at once, stop cancels it, and reset takes the
// wake-up.
func TestWakerContext(t *testing.T) {
	w := newWaker()
	if w.Err() != nil {
		t.Fatal("a new waker is woken")
	}
	fired := make(chan struct{})
	context.AfterFunc(w, func() { close(fired) })
	cctx, cancel := context.WithCancel(w)
	defer cancel()
	w.kick()
	<-fired
	<-cctx.Done()
	if !errors.Is(context.Cause(cctx), errWoken) || !errors.Is(w.Err(), errWoken) {
		t.Fatalf("after a kick: %v, %v", context.Cause(cctx), w.Err())
	}
	// Kicked already: at once; the token is still there for a select.
	again := make(chan struct{})
	context.AfterFunc(w, func() { close(again) })
	<-again
	w.reset()
	if w.Err() != nil {
		t.Fatal("woken after reset")
	}
	select {
	case <-w.Done():
		t.Fatal("a token after reset")
	default:
	}
	// Stopped before a kick: never runs.
	ran := make(chan struct{}, 1)
	stop := context.AfterFunc(w, func() { ran <- struct{}{} })
	if !stop() {
		t.Fatal("stop before the kick reported false")
	}
	w.kick()
	select {
	case <-w.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("no token after a kick")
	}
	w.reset()
	select {
	case <-ran:
		t.Fatal("a stopped callback ran")
	default:
	}
	if len(w.fns) != 0 {
		t.Fatalf("%d callbacks left", len(w.fns))
	}
}
