package ib

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
)

// openLinked opens a port on a fake SM that grants credits packets of
// credit in port_info, and a UD QP's transport on it.
func openLinked(t *testing.T, f *fakeSM, local string, credits int, stall time.Duration) (*Device, softverbs.DriverQP) {
	t.Helper()
	f.setPortInfo(func(c *fabric.Control) { c.Credits = credits })
	d, err := Open(Config{SM: f.addr(), Local: netip.MustParseAddr(local), SATimeout: 20 * time.Millisecond, SARetries: 1, LinkStallTimeout: stall})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	q, err := d.CreateQP(softverbs.DriverQPInit{Type: verbs.QPTypeUD})
	if err != nil {
		t.Fatal(err)
	}
	return d, q
}

// grant makes the fake SM give the port exactly n packets of credit from
// what it sent so far (the SA MADs of Open count), and waits until the
// port has it. It returns the port's FCTBS before.
func grant(t *testing.T, f *fakeSM, d *Device, n int) (base uint16) {
	t.Helper()
	d.lmu.Lock()
	base = d.link.FCTBS
	d.lmu.Unlock()
	var b [fabric.FlowLen]byte
	f.send(fabric.EncodeFlow(b[:], fabric.Flow{FCCL: (base + uint16(n)) & (fabric.FlowMod - 1)}))
	deadline := time.Now().Add(10 * time.Second)
	for {
		d.lmu.Lock()
		c := d.link.Credits()
		d.lmu.Unlock()
		if c == n {
			return base
		}
		if time.Now().After(deadline) {
			t.Fatalf("port has %d credits, want %d", c, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func udSend(q softverbs.DriverQP) error {
	return q.Send(&softverbs.UDSend{AH: &verbs.AHAttr{DLID: 7}, RemoteQPN: 9, RemoteQKey: 0x1234, Payload: []byte("payload")})
}

// dataPackets returns how many IB packets the fake SM received.
func (f *fakeSM) dataPackets() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.data
}

// TestSendHeldBackWithoutCredit: with 2 packets of credit the port sends
// 2; the third send waits (the port asks the switch for credit with its
// FCTBS) and a flow control packet from another address does not release
// it; the SM's grant does, and the packet goes out.
func TestSendHeldBackWithoutCredit(t *testing.T) {
	f := startFakeSM(t)
	d, q := openLinked(t, f, "127.0.3.30", 1, time.Minute)
	base := grant(t, f, d, 2)
	sent0 := f.dataPackets()
	for range 2 {
		if err := udSend(q); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- udSend(q) }()
	// The port asks for credit: it is out of it, having sent 2.
	f.waitUntil(func() bool {
		return len(f.flows) > 0 && f.flows[len(f.flows)-1].Op == fabric.FlowOpRequest && f.flows[len(f.flows)-1].FCTBS == base+2
	}, func() string {
		return fmt.Sprintf("flow control packets %+v, want a request with FCTBS %d", f.flows, base+2)
	})
	var b [fabric.FlowLen]byte
	f.sendFrom(attacker(t), fabric.EncodeFlow(b[:], fabric.Flow{FCCL: 100}))
	for d.Counters().Get(softverbs.UntrustedDrops) == 0 {
		select {
		case err := <-done:
			t.Fatalf("send returned (%v) on a foreign grant", err)
		case <-time.After(time.Millisecond):
		}
	}
	select {
	case err := <-done:
		t.Fatalf("send returned without credit: %v", err)
	default:
	}
	if n := f.dataPackets() - sent0; n != 2 {
		t.Fatalf("the SM got %d packets, want 2", n)
	}
	if n := d.Counters().Get(softverbs.LinkWaits); n != 1 {
		t.Errorf("link_waits %d, want 1", n)
	}
	f.send(fabric.EncodeFlow(b[:], fabric.Flow{FCCL: base + 3}))
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("send still waits after the grant")
	}
	f.waitUntil(func() bool { return f.data-sent0 == 3 }, func() string { return fmt.Sprintf("%d packets, want 3", f.data-sent0) })
	if n := d.Counters().Get(softverbs.LinkStallDrops); n != 0 {
		t.Errorf("link_stall_drops %d", n)
	}
}

// TestLinkStall: a switch that gives no credit holds a send back for the
// stall timeout only; then the packet is dropped and counted, and so is
// the next one at once, until credit comes.
func TestLinkStall(t *testing.T) {
	f := startFakeSM(t)
	const stall = 50 * time.Millisecond
	d, q := openLinked(t, f, "127.0.3.31", 1, stall)
	base := grant(t, f, d, 1)
	sent0 := f.dataPackets()
	if err := udSend(q); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := udSend(q); err != nil { // waits, then dropped
		t.Fatal(err)
	}
	if el := time.Since(start); el < stall {
		t.Errorf("send returned after %v, before the stall timeout %v", el, stall)
	}
	start = time.Now()
	if err := udSend(q); err != nil { // the link is stalled: dropped at once
		t.Fatal(err)
	}
	if el := time.Since(start); el >= stall {
		t.Errorf("send on a stalled link took %v", el)
	}
	if n := d.Counters().Get(softverbs.LinkStallDrops); n != 2 {
		t.Errorf("link_stall_drops %d, want 2", n)
	}
	if n := f.dataPackets() - sent0; n != 1 {
		t.Errorf("the SM got %d packets, want 1", n)
	}
	// Credit ends the stall: the next send goes out.
	var b [fabric.FlowLen]byte
	f.send(fabric.EncodeFlow(b[:], fabric.Flow{FCCL: base + 2}))
	grantDeadline := time.Now().Add(10 * time.Second)
	for {
		d.lmu.Lock()
		stalled := d.stalled
		d.lmu.Unlock()
		if !stalled {
			break
		}
		if time.Now().After(grantDeadline) {
			t.Fatal("the link stays stalled after a grant")
		}
		time.Sleep(time.Millisecond)
	}
	if err := udSend(q); err != nil {
		t.Fatal(err)
	}
	f.waitUntil(func() bool { return f.data-sent0 == 2 }, func() string { return fmt.Sprintf("%d packets, want 2", f.data-sent0) })
	if n := d.Counters().Get(softverbs.LinkStallDrops); n != 2 {
		t.Errorf("link_stall_drops %d after the grant, want 2", n)
	}
}
