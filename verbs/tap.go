package verbs

import "github.com/softrdma/softrdma/verbs/driver"

// Tap calls fn with every frame the device sends and receives until
// cancel; false when its backend offers no tap.
func (d *Device) Tap(fn func(Frame)) (linkType uint32, cancel func(), ok bool) {
	t, ok := d.ops.(driver.Tapper)
	if !ok {
		return 0, nil, false
	}
	return t.LinkType(), t.Tap(fn), true
}

// WatchDevices calls fn for each device of the host and for each device
// registered later, until cancel is called.
func (h *Host) WatchDevices(fn func(*Device)) (cancel func()) {
	h.mu.Lock()
	id := h.nextWatch
	h.nextWatch++
	if h.watchers == nil {
		h.watchers = map[int]func(*Device){}
	}
	h.watchers[id] = fn
	devs := append([]*Device(nil), h.devs...)
	h.mu.Unlock()
	for _, d := range devs {
		fn(d)
	}
	return func() {
		h.mu.Lock()
		delete(h.watchers, id)
		h.mu.Unlock()
	}
}
