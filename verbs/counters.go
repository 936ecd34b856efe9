package verbs

import "github.com/softrdma/softrdma/verbs/driver"

// Counters are how a backend tells the tools what happened to datagrams.
// A backend declares its counters once, as a schema; the operator tools
// (stat, --json, Prometheus) read only the schema and the values, so a new
// counter shows up everywhere from its one declaration.

// Counters returns the device's counter schema and values; false when its
// backend keeps no counters.
func (d *Device) Counters() ([]CounterDesc, []uint64, bool) {
	cs, ok := d.ops.(driver.CounterSource)
	if !ok {
		return nil, nil, false
	}
	return cs.CounterSchema(), cs.DeviceCounters(), true
}

// QPCounters returns the counter values of a QP of the device, in the order
// of the device's counter schema; false when the backend keeps no counters
// or has no such QP.
func (d *Device) QPCounters(qpn uint32) ([]uint64, bool) {
	cs, ok := d.ops.(driver.CounterSource)
	if !ok {
		return nil, false
	}
	return cs.QPCounters(qpn)
}
