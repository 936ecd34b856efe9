package ib

import (
	"github.com/softrdma/softrdma/verbs"
)

// String returns the event kind's name.
func (k PortEventKind) String() string {
	switch k {
	case ClientReregister:
		return "ClientReregister"
	case LIDChange:
		return "LIDChange"
	case PortError:
		return "PortError"
	case PortActive:
		return "PortActive"
	}
	return "unknown"
}

// InspectTransport adds the port's side to the core's view of the device
// (softverbs.TransportInspector). Its SA memberships are the host's SA
// client's, which adds them (verbs.ClientInspector).
func (d *Device) InspectTransport(r *verbs.DeviceReport) { r.Kind = "ib" }

// Subscribe reports the port's events as device events (driver.EventSource,
// through the verbs core), for operator tools.
func (d *Device) Subscribe(fn func(verbs.DeviceEvent)) (cancel func()) {
	return d.Watch(func(ev PortEvent) { fn(verbs.DeviceEvent{Kind: ev.Kind.String()}) })
}
