package ib

import (
	"slices"

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
// (softverbs.TransportInspector): its SA memberships (MLID, join state).
func (d *Device) InspectTransport(r *verbs.DeviceReport) {
	r.Kind = "ib"
	ms := d.Memberships()
	for _, m := range ms {
		i := slices.IndexFunc(r.Groups, func(g verbs.GroupReport) bool { return g.MGID == m.MGID })
		if i < 0 {
			r.Groups = append(r.Groups, verbs.GroupReport{MGID: m.MGID})
			i = len(r.Groups) - 1
		}
		r.Groups[i].MLID, r.Groups[i].SAJoinState = m.MLID, m.JoinState
	}
	r.Usage = append(r.Usage, verbs.UsageCount{Name: "sa_memberships", Value: len(ms)})
	slices.SortFunc(r.Groups, func(a, b verbs.GroupReport) int { return slices.Compare(a.MGID[:], b.MGID[:]) })
}

// Subscribe reports the port's events as device events (verbs.EventSource,
// through the verbs core), for operator tools.
func (d *Device) Subscribe(fn func(verbs.DeviceEvent)) (cancel func()) {
	return d.Watch(func(ev PortEvent) { fn(verbs.DeviceEvent{Kind: ev.Kind.String()}) })
}
