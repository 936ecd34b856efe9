package ib

import (
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/provider/softverbs"
)

// TestRetryAnswered: an SM that asks the port to prove
// its address (a retry with a cookie) gets the attach again at once with
// the cookie, and Open succeeds; once active, the port's keepalives carry
// no cookie. A retry for another GUID, with no cookie, or from another
// address is dropped and counted.
func TestRetryAnswered(t *testing.T) {
	f := startFakeSM(t)
	cookie := []byte("fake-sm-cookie-1")
	f.mu.Lock()
	f.cookie = cookie
	f.mu.Unlock()
	d := openOn(t, f, "127.0.3.20")
	defer d.Close()
	f.mu.Lock()
	got := append([][]byte(nil), f.cookies...)
	f.mu.Unlock()
	if len(got) < 2 || got[0] != nil || string(got[1]) != string(cookie) {
		t.Fatalf("attach cookies %q: want none, then %q", got, cookie)
	}
	n := f.count(fabric.TypeAttach)
	f.waitFor(fabric.TypeAttach, n+1) // the next keepalive
	f.mu.Lock()
	last := f.cookies[len(f.cookies)-1]
	f.mu.Unlock()
	if last != nil {
		t.Fatalf("keepalive of an active port carries cookie %q", last)
	}
	f.send(fabric.EncodeControl(&fabric.Control{Type: fabric.TypeRetry, GUID: d.GUID() + 1, Cookie: cookie}))
	f.send(fabric.EncodeControl(&fabric.Control{Type: fabric.TypeRetry, GUID: d.GUID()}))
	f.send(fabric.EncodeControl(&fabric.Control{Type: fabric.TypeRetry, GUID: d.GUID(), Cookie: make([]byte, fabric.MaxCookieLen+1)}))
	f.sendFrom(attacker(t), fabric.EncodeControl(&fabric.Control{Type: fabric.TypeRetry, GUID: d.GUID(), Cookie: cookie}))
	waitFor(t, "the bad retries to be counted", func() bool {
		c := d.Counters()
		return c.Get(softverbs.ControlDrops) == 3 && c.Get(softverbs.UntrustedDrops) == 1
	})
}

// TestRetryFlood: retries the port did not ask for (forged with the SM's
// address, or repeated) make it send at most one attach at once per
// keepalive: they cannot push its attaches over the SM's ControlRate for
// its address. Its keepalives carry the last cookie until a port_info
// comes.
func TestRetryFlood(t *testing.T) {
	f := startFakeSM(t)
	d := openOn(t, f, "127.0.3.21")
	defer d.Close()
	// Wait for a keepalive (it lets the port answer a retry at once), with
	// the fake SM quiet from then on: no port_info ends the cookie.
	n := f.count(fabric.TypeAttach)
	f.setQuiet(true)
	f.waitFor(fabric.TypeAttach, n+1)
	n = f.count(fabric.TypeAttach)
	start := time.Now()
	const retries = 50
	var last []byte
	for i := range retries {
		last = []byte(strings.Repeat(string(rune('a'+i%26)), 8) + string(rune('0'+i/26)))
		f.send(fabric.EncodeControl(&fabric.Control{Type: fabric.TypeRetry, GUID: d.GUID(), Cookie: last}))
	}
	// The next keepalive carries the last cookie.
	f.waitUntil(func() bool { c := f.cookies; return len(c) > 0 && string(c[len(c)-1]) == string(last) },
		func() string { return "no attach with the last retry's cookie" })
	keepalives := int(time.Since(start)/time.Second) + 1
	if got := f.count(fabric.TypeAttach) - n; got > 2*keepalives {
		t.Fatalf("%d retries: %d attaches in %v (%d keepalives), want at most one at once per keepalive", retries, got, time.Since(start), keepalives)
	}
	if c := d.Counters(); c.Get(softverbs.ControlDrops) != 0 {
		t.Fatalf("control_drops %d", c.Get(softverbs.ControlDrops))
	}
}

// TestVersionRefused: an SM that speaks another version of the fabric
// protocol refuses the attach with reason "version": Open fails at once
// with EPROTONOSUPPORT, saying so.
func TestVersionRefused(t *testing.T) {
	f := startFakeSM(t)
	f.setQuiet(true)
	const guid = 0x2c90000abcd01
	res := make(chan error, 1)
	go func() {
		d, err := Open(Config{SM: f.addr(), Local: netip.MustParseAddr("127.0.3.22"), GUID: guid, ActivateTimeout: time.Minute})
		if err == nil {
			d.Close()
		}
		res <- err
	}()
	f.waitFor(fabric.TypeAttach, 1)
	f.send(fabric.EncodeControl(&fabric.Control{Type: fabric.TypeRefused, GUID: guid, Reason: fabric.ReasonVersion}))
	err := <-res
	if !errors.Is(err, syscall.EPROTONOSUPPORT) || !strings.Contains(err.Error(), "another version of the fabric protocol") {
		t.Fatalf("open: %v, want EPROTONOSUPPORT", err)
	}
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
