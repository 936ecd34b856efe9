package ib

import "github.com/softrdma/softrdma/provider/softverbs"

// Counters returns a snapshot of the port's counters (indexed by
// softverbs.Counter; see softverbs.Schema).
func (d *Device) Counters() softverbs.Snapshot { return d.core.Counters() }
