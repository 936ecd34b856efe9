package softverbs

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// The frame tap of a software device (driver.Tapper): providers offer
// every frame they send and receive, built only while someone taps.

// taps is a device's tap list; the datapath reads view (nil: none).
type taps struct {
	mu   sync.Mutex
	next int
	fns  map[int]func(verbs.Frame)
	view atomic.Pointer[[]func(verbs.Frame)]
}

// LinkTyper is an optional interface of a Driver: the pcap link type of
// its frames (Ethernet when absent).
type LinkTyper interface{ LinkType() uint32 }

// LinkType returns the pcap link type of the device's frames (driver.Tapper).
func (d *Device) LinkType() uint32 {
	if lt, ok := d.drv.(LinkTyper); ok {
		return lt.LinkType()
	}
	return verbs.LinkTypeEthernet
}

// Tap calls fn with every frame the provider offers until cancel
// (driver.Tapper).
func (d *Device) Tap(fn func(verbs.Frame)) (cancel func()) {
	t := &d.taps
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.fns == nil {
		t.fns = map[int]func(verbs.Frame){}
	}
	id := t.next
	t.next++
	t.fns[id] = fn
	t.publishLocked()
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		delete(t.fns, id)
		t.publishLocked()
	}
}

func (t *taps) publishLocked() {
	if len(t.fns) == 0 {
		t.view.Store(nil)
		return
	}
	l := make([]func(verbs.Frame), 0, len(t.fns))
	for _, id := range slices.Sorted(maps.Keys(t.fns)) {
		l = append(l, t.fns[id])
	}
	t.view.Store(&l)
}

// Tapping reports whether anyone taps the device: a provider builds
// frames only then (one atomic load otherwise).
func (d *Device) Tapping() bool { return d.taps.view.Load() != nil }

// Emit hands a frame to every tap of the device.
func (d *Device) Emit(f verbs.Frame) {
	if v := d.taps.view.Load(); v != nil {
		for _, fn := range *v {
			fn(f)
		}
	}
}

var _ driver.Tapper = (*Device)(nil)
