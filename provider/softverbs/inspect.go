package softverbs

import (
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// TransportInspector is an optional interface of a Driver: it adds what
// only the transport knows to the core's view of the device (its kind,
// network interface, sockets, IP or SA memberships).
type TransportInspector interface {
	InspectTransport(r *verbs.DeviceReport)
}

// Inspect returns the device's view (driver.Inspector): port 1, GID table,
// QPs with their attachments and counters, multicast groups, usage, and
// what the provider adds.
func (d *Device) Inspect() verbs.DeviceReport {
	var r verbs.DeviceReport
	r.Port, _ = d.drv.QueryPort(1)
	r.GIDs, _ = d.drv.GIDTable(1)
	qps := d.QPs()
	for _, q := range qps {
		qr := verbs.QPReport{QPN: q.QPN, State: q.State, QKey: q.QKey, Port: q.Port,
			BlockSelfMcastLB: q.BlockSelfMcastLB, Counters: q.Counters}
		for _, a := range q.Groups {
			qr.Groups = append(qr.Groups, verbs.McastAttachment{MGID: a.MGID, MLID: a.LID})
		}
		if sp, ok := q.Transport.(interface{ SrcPort() uint16 }); ok {
			qr.SrcPort = sp.SrcPort()
		}
		r.QPs = append(r.QPs, qr)
	}
	groups := d.Groups()
	for _, g := range groups {
		r.Groups = append(r.Groups, verbs.GroupReport{MGID: g.MGID, QPNs: g.QPNs})
	}
	r.Usage = []verbs.UsageCount{
		{Name: "qps", Value: len(qps)},
		{Name: "mcast_groups", Value: len(groups)},
		{Name: "mcast_attachments", Value: d.Attachments()},
	}
	if ti, ok := d.drv.(TransportInspector); ok {
		ti.InspectTransport(&r)
	}
	return r
}

// Subscribe forwards to the provider's events (driver.EventSource); a
// provider without events gives a cancel that does nothing.
func (d *Device) Subscribe(fn func(verbs.DeviceEvent)) (cancel func()) {
	if es, ok := d.drv.(driver.EventSource); ok {
		return es.Subscribe(fn)
	}
	return func() {}
}

var (
	_ driver.Inspector   = (*Device)(nil)
	_ driver.EventSource = (*Device)(nil)
)
