package verbs

import "time"

// Link types of frames, as pcap names them (LINKTYPE_*).
const (
	// LinkTypeEthernet is Ethernet frames (RoCE).
	LinkTypeEthernet uint32 = 1
	// LinkTypeInfiniBand is InfiniBand packets from the LRH on (Wireshark
	// decodes them).
	LinkTypeInfiniBand uint32 = 247
)

// Frame is one packet a device sent or received, as its link carries it.
type Frame struct {
	Time time.Time
	// Data is the whole frame; a tap must not keep it past its call.
	Data []byte
	// Sent is true for a frame the device sent, false for one it read.
	Sent bool
}

// Tapper is an optional interface of a DeviceOps: a copy of every frame
// the device sends and receives, for packet captures.
type Tapper interface {
	// LinkType is the pcap link type of the device's frames.
	LinkType() uint32
	// Tap calls fn with every frame until cancel is called. fn runs on
	// the datapath: it must not block.
	Tap(fn func(Frame)) (cancel func())
}

// Tap calls fn with every frame the device sends and receives until
// cancel; false when its backend offers no tap.
func (d *Device) Tap(fn func(Frame)) (linkType uint32, cancel func(), ok bool) {
	t, ok := d.ops.(Tapper)
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
