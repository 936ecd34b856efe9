package ib

import (
	"context"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/verbs"
)

// TestAsyncEvents: the port's events reach a verbs context as libibverbs'
// asynchronous events of port 1: an SM restart (new epoch) is
// IBV_EVENT_CLIENT_REREGISTER, a new LID IBV_EVENT_LID_CHANGE.
func TestAsyncEvents(t *testing.T) {
	f := startFakeSM(t)
	f.setPortInfo(func(c *fabric.Control) { c.Epoch = 1 })
	d := openOn(t, f, "127.0.3.1")
	c, err := d.Verbs().Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.WatchAsyncEvents()
	pi := func(lid uint16, epoch uint64) []byte {
		return fabric.EncodeControl(&fabric.Control{Type: fabric.TypePortInfo, GUID: d.GUID(), LID: lid, SMLID: fabric.SMLID,
			SubnetPrefix: fabric.DefaultSubnetPrefix, Epoch: epoch, MTU: fabric.PortMTU, State: fabric.StateActive})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	next := func(want verbs.AsyncEventType) {
		t.Helper()
		ev, err := c.GetAsyncEvent(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type != want || ev.PortNum != 1 {
			t.Fatalf("event %+v (%v), want %v on port 1", ev, ev.Type, want)
		}
		c.AckAsyncEvent(ev)
	}
	lid := d.LID()
	f.send(pi(lid, 2))
	next(verbs.EventClientReregister)
	f.send(pi(lid+1, 2))
	next(verbs.EventLIDChange)
}
