package ib

import (
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
)

// TestCloseWithEventsQueued: Close returns while the port's event queue is
// full and the receive loop has one more event to queue. Before the fix
// the receive loop sent the event without watching for Close: once the
// event loop had exited, it blocked forever and Close waited for it (the
// event loop exits at a random point, so the scenario runs several times).
func TestCloseWithEventsQueued(t *testing.T) {
	f := startFakeSM(t)
	for round := range 8 {
		f.setPortInfo(func(c *fabric.Control) { c.Epoch = 1 })
		d := openOn(t, f, "127.0.3.1")
		entered, release := make(chan struct{}, 1), make(chan struct{})
		d.Watch(func(PortEvent) {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-release
		})
		// A new epoch is a client reregister: the subscriber blocks on it.
		pi := func(epoch uint64) []byte {
			return fabric.EncodeControl(&fabric.Control{Type: fabric.TypePortInfo, GUID: d.GUID(), LID: 2, SMLID: fabric.SMLID,
				SubnetPrefix: fabric.DefaultSubnetPrefix, Epoch: epoch, MTU: fabric.PortMTU, State: fabric.StateActive})
		}
		f.send(pi(2))
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("no event reached the subscriber")
		}
		for e := uint64(3); e < 3+uint64(cap(d.events))+8; e++ {
			f.send(pi(e))
		}
		for deadline := time.Now().Add(10 * time.Second); len(d.events) < cap(d.events); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: event queue %d of %d", round, len(d.events), cap(d.events))
			}
		}
		detaches := f.count(fabric.TypeDetach)
		closed := make(chan error, 1)
		go func() { closed <- d.Close() }()
		f.waitFor(fabric.TypeDetach, detaches+1) // Close is under way
		close(release)
		select {
		case err := <-closed:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: Close hangs with a full event queue", round)
		}
	}
}
