package rxe

import "github.com/softrdma/softrdma/provider/softverbs"

// Counters returns a snapshot of the device's counters (indexed by
// softverbs.Counter; see softverbs.Schema).
func (d *Device) Counters() softverbs.Snapshot { return d.core.Counters() }

// QPCounters returns a snapshot of the counters of the device's QP qpn;
// false when the device has no such QP (never created or destroyed).
func (d *Device) QPCounters(qpn uint32) (softverbs.Snapshot, bool) {
	c, ok := d.core.QPCounters(qpn)
	return c, ok
}
