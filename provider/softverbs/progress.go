package softverbs

import (
	"time"

	"github.com/softrdma/softrdma/internal/sys/pollfd"
)

// A Source is an input of a provider's device that a consumer may read
// itself (a receive socket): a consumer that finds its CQ empty makes
// progress instead of waiting for the provider's receive goroutine, and a
// consumer that must wait sleeps on the source, so that a datagram wakes
// the consumer's thread directly. The receive goroutine stays, for the
// completions nobody waits for; the two never read at the same time.
//
// A provider sets Burst.Src to the source of the datagrams it delivers
// with the Burst; each CQ remembers the source of its last completion.
type Source struct {
	in Input
	// yieldMask+1 is how many empty polls of a CQ on this source pass
	// between two yields of the polling thread's core (cqObj.Poll).
	yieldMask uint32
}

// Input is what a provider's input offers (mmsg.Reader does).
type Input interface {
	// Progress reads and delivers what waits without blocking, unless
	// another goroutine is reading (that one reads it), and keeps the
	// input to the consumers for a while (the provider's goroutine stays
	// out of the way of one that polls in a loop). It must not allocate:
	// Poll calls it on every empty poll.
	Progress()
	// ReadNow is Progress for a consumer that waits for the provider's
	// deliveries afterwards: the input is not kept.
	ReadNow()
	// EndLease gives the input back to the provider's goroutine at once:
	// for a consumer about to wait for its deliveries.
	EndLease()
	// Wait blocks the calling thread until the input is readable, kick
	// rings (its eventfd is readable, or Ring signalled the thread) or
	// timeout passes, then calls woke, makes progress (as Progress) and
	// reports whether kick rang; err: the input is closed (no progress).
	Wait(kick *pollfd.Kick, timeout time.Duration, woke func()) (kicked bool, err error)
}

// NewSource returns the source of in.
func NewSource(in Input) *Source { return &Source{in: in, yieldMask: yieldEvery} }

// NewRelayedSource returns the source of in for a device whose every
// datagram another process on the host relays (the emulated IB subnet's
// switch, softsm): a consumer polling it in a loop yields its core every
// 16 empty polls instead of 256, so that the relay, which its datagrams
// wait for, gets a core sooner. Measured with two busy pollers and softsm
// on 2 cores: the round trip's p99 540–630 µs → 140–180 µs (its p50 stays
// about 75 µs); on RoCEv2, where nothing relays, yielding that often made
// the p99 worse.
func NewRelayedSource(in Input) *Source { return &Source{in: in, yieldMask: relayedYieldEvery} }
