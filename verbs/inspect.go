package verbs

import "github.com/softrdma/softrdma/verbs/driver"

// What operator tools see of a device. verbs asks its backend for the
// optional interfaces of package driver (Inspector, EventSource, and
// CounterSource, Tapper), never for a backend's concrete types, so any
// backend can offer them.

// Inspect returns the device's report, with what the host's clients add
// (ClientInspector); false when its backend offers none.
func (d *Device) Inspect() (DeviceReport, bool) {
	in, ok := d.ops.(driver.Inspector)
	if !ok {
		return DeviceReport{}, false
	}
	r := in.Inspect()
	for _, c := range registeredClients() {
		if ci, ok := c.(ClientInspector); ok {
			ci.InspectDevice(d, &r)
		}
	}
	return r, true
}

// Subscribe calls fn for every change of the device until cancel is
// called; false when its backend reports none.
func (d *Device) Subscribe(fn func(DeviceEvent)) (cancel func(), ok bool) {
	es, ok := d.ops.(driver.EventSource)
	if !ok {
		return nil, false
	}
	return es.Subscribe(fn), true
}
