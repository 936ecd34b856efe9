package rxe

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"time"
)

// Ports without an owner. A unicast datagram for a QPN whose port no
// device of this user holds costs a connection attempt to the port's
// hand-over socket (socket, connect, close and package net's bookkeeping:
// several times an ordinary drop), and anyone who can send to UDP 4791
// can send such datagrams at line rate. So a device remembers the ports
// it found without an owner, and drops their datagrams (no_owner_drops)
// without trying again:
//
//   - for a short while: time runs in periods of noOwnerPeriod; a port
//     found without an owner is remembered for the rest of its period and
//     the whole next one, between noOwnerPeriod and 2 × noOwnerPeriod. A
//     device of another process of this user that starts listening for
//     the port meanwhile is not seen (nothing cheap tells), so its
//     datagrams that this device reads are dropped for at most
//     2 × noOwnerPeriod (200 ms) after it opened the port;
//   - until a send block of this process opens: every device's cache is
//     cleared then (ownersGen), before the block has a QP, so an owner
//     in this process loses nothing;
//   - in a table of one bit per port and period (16 KiB a device): O(1),
//     nothing allocated, every port covered, so a flood cycling through
//     ports cannot push entries out.
//
// And however many ports are sent to, a device makes at most
// maxNoOwnerDials attempts that find no owner a period: beyond, a
// datagram for a port neither connected nor remembered is dropped without
// an attempt (forward_drops) until the period ends. During such a flood a
// new owner in another process may miss datagrams for longer than
// 2 × noOwnerPeriod, until an attempt of some period reaches it; owners
// already connected are not affected.

const (
	// noOwnerPeriod is the period of the no-owner cache; a port is
	// remembered for between one and two periods.
	noOwnerPeriod = 100 * time.Millisecond
	// maxNoOwnerDials bounds the connection attempts of one device that
	// find no owner, per noOwnerPeriod.
	maxNoOwnerDials = 64
)

// errDialBudget is the error of a hand-over connection not attempted
// because the period's attempts that found no owner are used up.
var errDialBudget = fmt.Errorf("hand-over: %d connections without an owner in %v: %w", maxNoOwnerDials, noOwnerPeriod, syscall.EAGAIN)

// ownersGen changes whenever a send block of this process opens (after it
// listens for hand-overs): every device's no-owner cache is stale then.
var ownersGen atomic.Uint64

// monoStart is the origin of the cache's monotonic clock.
var monoStart = time.Now()

// noOwnerCache is a device's table of the ports found without an owner:
// bits[p&1] holds those of period p, bits[(p+1)&1] those of the period
// before. Reads are lock-free; changes are made under the handover's mu.
// A read racing with the end of a period may see an entry that has just
// gone, which costs one more drop.
type noOwnerCache struct {
	// now is the clock; nil: monotonic time. Tests set it before the
	// device handles a datagram.
	now func() time.Duration

	period atomic.Int64  // the current period
	gen    atomic.Uint64 // the ownersGen the entries were found under
	bits   [2][65536 / 64]atomic.Uint64

	failed int // attempts of the current period that found no owner
}

func (c *noOwnerCache) periodNow() int64 {
	var t time.Duration
	if c.now != nil {
		t = c.now()
	} else {
		t = time.Since(monoStart)
	}
	return int64(t / noOwnerPeriod)
}

// fresh reports whether the cache is of the current period and
// generation.
func (c *noOwnerCache) fresh() bool {
	return c.period.Load() == c.periodNow() && c.gen.Load() == ownersGen.Load()
}

// has reports whether port is remembered without an owner; the cache is
// fresh.
func (c *noOwnerCache) has(port uint16) bool {
	w, bit := port>>6, uint64(1)<<(port&63)
	return (c.bits[0][w].Load()|c.bits[1][w].Load())&bit != 0
}

// syncLocked moves the cache to the current period and generation:
// entries of the period before last go, and all of them when a block of
// this process opened or more than a period passed.
func (c *noOwnerCache) syncLocked() {
	p, g := c.periodNow(), ownersGen.Load()
	cur := c.period.Load()
	if p == cur && g == c.gen.Load() {
		return
	}
	if g != c.gen.Load() || p != cur+1 {
		c.clear(0)
		c.clear(1)
	} else {
		c.clear(int(p & 1))
	}
	if p != cur {
		c.failed = 0
	}
	c.gen.Store(g)
	c.period.Store(p)
}

func (c *noOwnerCache) clear(k int) {
	for i := range c.bits[k] {
		c.bits[k][i].Store(0)
	}
}

// markLocked remembers port without an owner in the current period.
func (c *noOwnerCache) markLocked(port uint16) {
	c.bits[c.period.Load()&1][port>>6].Or(uint64(1) << (port & 63))
}

// ownerless reports whether a recent connection attempt found no owner of
// port (see above): its datagrams are dropped without another.
func (h *handover) ownerless(port uint16) bool {
	c := &h.none
	if !c.fresh() {
		h.mu.Lock()
		c.syncLocked()
		h.mu.Unlock()
	}
	return c.has(port)
}
