package verbs

// Counters are how a backend tells the tools what happened to datagrams.
// A backend declares its counters once, as a schema; the operator tools
// (stat, --json, Prometheus) read only the schema and the values, so a new
// counter shows up everywhere from its one declaration.

// CounterScope says where a counter is kept.
type CounterScope uint8

// Counter scopes.
const (
	// ScopeDevice counters are kept per device only.
	ScopeDevice CounterScope = iota
	// ScopeQP counters are kept per device and per QP.
	ScopeQP
)

// CounterDesc is one counter of a device's schema.
type CounterDesc struct {
	// Name is the counter's name in stat and --json, e.g. "qkey_violations".
	Name string
	// Help says what the counter counts.
	Help string
	// Scope says whether QPs have the counter too.
	Scope CounterScope
	// Metric is the Prometheus metric the counter feeds, without the
	// softrdma_ (or softrdma_qp_) prefix, e.g. "dropped_packets_total".
	Metric string
	// Reason is the drop reason, the metric's "reason" label; "" when the
	// counter is not a drop.
	Reason string
}

// The counters every backend has with the same meaning: a software
// device counts them itself, the kernel backend maps its device's own
// counters onto them, so the tools and metrics show one name for each.
var (
	CounterRcvdPkts   = CounterDesc{Name: "rcvd_pkts", Help: "Packets the device received, before any check.", Scope: ScopeDevice, Metric: "received_packets_total"}
	CounterSentPkts   = CounterDesc{Name: "sent_pkts", Help: "Packets sent.", Scope: ScopeQP, Metric: "sent_packets_total"}
	CounterSendErrors = CounterDesc{Name: "send_errors", Help: "Sends that failed (the completion has an error status).", Scope: ScopeQP, Metric: "send_errors_total"}
)

// CounterSource is an optional interface of a DeviceOps: the device's
// counter schema and values. Values come in schema order.
type CounterSource interface {
	// CounterSchema returns the device's counters; the slice is shared and
	// must not be modified.
	CounterSchema() []CounterDesc
	// DeviceCounters returns every counter of the device.
	DeviceCounters() []uint64
	// QPCounters returns the counters of QP qpn (zero for device-scope
	// ones); false when the device has no such QP.
	QPCounters(qpn uint32) ([]uint64, bool)
}

// Counters returns the device's counter schema and values; false when its
// backend keeps no counters.
func (d *Device) Counters() ([]CounterDesc, []uint64, bool) {
	cs, ok := d.ops.(CounterSource)
	if !ok {
		return nil, nil, false
	}
	return cs.CounterSchema(), cs.DeviceCounters(), true
}

// QPCounters returns the counter values of a QP of the device, in the order
// of the device's counter schema; false when the backend keeps no counters
// or has no such QP.
func (d *Device) QPCounters(qpn uint32) ([]uint64, bool) {
	cs, ok := d.ops.(CounterSource)
	if !ok {
		return nil, false
	}
	return cs.QPCounters(qpn)
}
