package introspect

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Prometheus metrics. The collector takes a Snapshot at each scrape and
// turns it into const metrics, so nothing is updated on the datapath.
//
// Device metrics carry a "device" label, QP metrics "device" and "qpn"
// (hex, e.g. "0xc35a01"), drop metrics a "reason" label: the counter name
// without "_drops"/"_errors"/"_violations" (truncated, tver, opcode,
// destqp0, oversized_recv, icrc, no_group, no_qp, not_ready, pkey, qkey,
// self_loopback, no_recv_wr, too_long, cq_full, oversized_send; and on
// emulated InfiniBand ports also malformed, crc, other).

// metricDef maps a counter name to a metric and, for drops, a reason.
type metricDef struct {
	counter string
	metric  string // without the softrdma_ / softrdma_qp_ prefix
	reason  string
	ibOnly  bool // a counter of emulated InfiniBand ports only
}

var counterMetrics = []metricDef{
	{"rcvd_pkts", "received_packets_total", "", false},
	{"rcvd_bytes", "received_bytes_total", "", false},
	{"delivered", "delivered_packets_total", "", false},
	{"sent_pkts", "sent_packets_total", "", false},
	{"sent_bytes", "sent_bytes_total", "", false},
	{"send_errors", "send_errors_total", "", false},
	{"truncated_drops", "dropped_packets_total", "truncated", false},
	{"tver_drops", "dropped_packets_total", "tver", false},
	{"opcode_drops", "dropped_packets_total", "opcode", false},
	{"destqp0_drops", "dropped_packets_total", "destqp0", false},
	{"oversized_recv_drops", "dropped_packets_total", "oversized_recv", false},
	{"icrc_errors", "dropped_packets_total", "icrc", false},
	{"no_group_drops", "dropped_packets_total", "no_group", false},
	{"no_qp_drops", "dropped_packets_total", "no_qp", false},
	{"not_ready_drops", "dropped_packets_total", "not_ready", false},
	{"pkey_violations", "dropped_packets_total", "pkey", false},
	{"qkey_violations", "dropped_packets_total", "qkey", false},
	{"self_loopback_drops", "dropped_packets_total", "self_loopback", false},
	{"no_recv_wr_drops", "dropped_packets_total", "no_recv_wr", false},
	{"too_long_drops", "dropped_packets_total", "too_long", false},
	{"cq_full_drops", "dropped_packets_total", "cq_full", false},
	{"oversized_send_drops", "dropped_packets_total", "oversized_send", false},
	// Emulated InfiniBand ports (on rxe devices malformed_drops is the sum
	// of the first five reasons above, so it is not exported).
	{"malformed_drops", "dropped_packets_total", "malformed", true},
	{"crc_errors", "dropped_packets_total", "crc", true},
	{"other_drops", "dropped_packets_total", "other", true},
}

var metricHelp = map[string]string{
	"received_packets_total":  "Datagrams read from the UDP 4791 sockets, before any check.",
	"received_bytes_total":    "UDP payload bytes of the datagrams read.",
	"delivered_packets_total": "Datagrams handed to a QP's receive queue (one per receiving QP).",
	"sent_packets_total":      "Datagrams sent.",
	"sent_bytes_total":        "UDP payload bytes sent.",
	"send_errors_total":       "Sends the kernel refused.",
	"dropped_packets_total":   "Datagrams dropped, by reason.",
}

type descSet struct {
	dev, qp map[string]*prometheus.Desc

	deviceInfo, portState, activeMTU, qps, groups, attachments, memberships *prometheus.Desc
	qpInfo                                                                  *prometheus.Desc
	cmIDs, cmJoins, queueDepth, unacked                                     *prometheus.Desc
	joinsTotal, joinErrors, leavesTotal, attachErrors, captures             *prometheus.Desc
}

func newDescSet() *descSet {
	d := &descSet{dev: map[string]*prometheus.Desc{}, qp: map[string]*prometheus.Desc{}}
	for _, m := range counterMetrics {
		if d.dev[m.metric] != nil {
			continue
		}
		var extra []string
		if m.reason != "" {
			extra = []string{"reason"}
		}
		d.dev[m.metric] = prometheus.NewDesc("softrdma_"+m.metric, metricHelp[m.metric], append([]string{"device"}, extra...), nil)
		d.qp[m.metric] = prometheus.NewDesc("softrdma_qp_"+m.metric, "Per QP: "+metricHelp[m.metric], append([]string{"device", "qpn"}, extra...), nil)
	}
	n := prometheus.NewDesc
	d.deviceInfo = n("softrdma_device_info", "A software RoCEv2 device of the process (always 1).", []string{"device", "ifname", "node_guid", "gid0"}, nil)
	d.portState = n("softrdma_port_state", "Port 1 state (ibv_port_state: 1 DOWN, 4 ACTIVE).", []string{"device"}, nil)
	d.activeMTU = n("softrdma_port_active_mtu_bytes", "Port 1 active MTU in bytes.", []string{"device"}, nil)
	d.qps = n("softrdma_qps", "QPs of the device.", []string{"device"}, nil)
	d.groups = n("softrdma_mcast_groups", "Multicast groups (MGIDs) with attached QPs.", []string{"device"}, nil)
	d.attachments = n("softrdma_mcast_attachments", "QP attachments over all multicast groups.", []string{"device"}, nil)
	d.memberships = n("softrdma_mcast_memberships", "IP multicast memberships held on the interface (IGMP/MLD).", []string{"device"}, nil)
	d.qpInfo = n("softrdma_qp_info", "A QP (always 1), with its state and Q_Key.", []string{"device", "qpn", "state", "qkey"}, nil)
	d.cmIDs = n("softrdma_cm_ids", "RDMA CM ids bound to a device.", nil, nil)
	d.cmJoins = n("softrdma_cm_joins", "Current CM joins, by device, join type and state.", []string{"device", "join_type", "state"}, nil)
	d.queueDepth = n("softrdma_cm_event_queue_depth", "Events waiting to be retrieved on an event channel.", []string{"channel"}, nil)
	d.unacked = n("softrdma_cm_events_unacked", "Retrieved CM events not acked yet (leave and destroy wait for them).", nil, nil)
	d.joinsTotal = n("softrdma_cm_joins_total", "Multicast joins that succeeded.", nil, nil)
	d.joinErrors = n("softrdma_cm_join_errors_total", "Multicast joins that failed synchronously.", nil, nil)
	d.leavesTotal = n("softrdma_cm_leaves_total", "Multicast joins removed (leave or destroy).", nil, nil)
	d.attachErrors = n("softrdma_cm_attach_errors_total", "MULTICAST_JOIN events turned into MULTICAST_ERROR by a failed QP attach.", nil, nil)
	d.captures = n("softrdma_captures_active", "Packet captures running.", nil, nil)
	return d
}

func (d *descSet) all() []*prometheus.Desc {
	out := []*prometheus.Desc{d.deviceInfo, d.portState, d.activeMTU, d.qps, d.groups, d.attachments, d.memberships,
		d.qpInfo, d.cmIDs, d.cmJoins, d.queueDepth, d.unacked, d.joinsTotal, d.joinErrors, d.leavesTotal, d.attachErrors, d.captures}
	for _, m := range counterMetrics {
		out = append(out, d.dev[m.metric], d.qp[m.metric])
	}
	return out
}

// collector is a prometheus.Collector over Collect.
type collector struct{ d *descSet }

// NewCollector returns a prometheus.Collector that exports the process's
// softrdma state at each scrape: packets and bytes sent and received,
// deliveries, each drop reason (device and QP), QPs, groups, memberships,
// CM ids, joins and leaves, and event-queue depth. Register it in a
// registry of your own to serve the metrics from your own HTTP server.
func NewCollector() prometheus.Collector { return &collector{d: newDescSet()} }

// Describe sends the descriptors of every metric.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.d.all() {
		ch <- d
	}
}

// Collect takes a snapshot and sends its metrics.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	s := Collect()
	gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	counter := func(desc *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v), labels...)
	}
	for _, dev := range s.Devices {
		gid0 := ""
		if len(dev.Ports) > 0 && len(dev.Ports[0].GIDs) > 0 {
			gid0 = dev.Ports[0].GIDs[0].GID
		}
		gauge(d.deviceInfo, 1, dev.Name, dev.Ifname, dev.NodeGUID, gid0)
		if len(dev.Ports) > 0 {
			gauge(d.portState, float64(dev.Ports[0].StateNum), dev.Name)
			gauge(d.activeMTU, float64(dev.Ports[0].ActiveMTU), dev.Name)
		}
		gauge(d.qps, float64(dev.Usage.QPs), dev.Name)
		gauge(d.groups, float64(dev.Usage.McastGroups), dev.Name)
		gauge(d.attachments, float64(dev.Usage.McastAttachments), dev.Name)
		gauge(d.memberships, float64(dev.Usage.IPMemberships), dev.Name)
		for _, m := range counterMetrics {
			v, ok := dev.Counters[m.counter]
			if !ok || (m.ibOnly && dev.Kind != "ib") {
				continue
			}
			if m.reason != "" {
				counter(d.dev[m.metric], v, dev.Name, m.reason)
			} else {
				counter(d.dev[m.metric], v, dev.Name)
			}
		}
		for _, q := range dev.QPs {
			qpn := fmt.Sprintf("%#06x", q.QPN)
			gauge(d.qpInfo, 1, dev.Name, qpn, q.State, fmt.Sprintf("%#08x", q.QKey))
			for _, m := range counterMetrics {
				v, ok := q.Counters[m.counter]
				if !ok {
					continue
				}
				if m.reason != "" {
					counter(d.qp[m.metric], v, dev.Name, qpn, m.reason)
				} else {
					counter(d.qp[m.metric], v, dev.Name, qpn)
				}
			}
		}
	}
	type jk struct{ dev, typ, state string }
	joins := map[jk]int{}
	for _, g := range s.Groups {
		for _, j := range g.Joins {
			joins[jk{g.Device, j.JoinType, j.State}]++
		}
	}
	for k, n := range joins {
		gauge(d.cmJoins, float64(n), k.dev, k.typ, k.state)
	}
	for _, chn := range s.Channels {
		gauge(d.queueDepth, float64(chn.Queued), strconv.FormatUint(chn.ID, 10))
	}
	gauge(d.cmIDs, float64(s.CM.IDs))
	gauge(d.unacked, float64(s.CM.EventsUnacked))
	counter(d.joinsTotal, s.CM.Joins)
	counter(d.joinErrors, s.CM.JoinErrors)
	counter(d.leavesTotal, s.CM.Leaves)
	counter(d.attachErrors, s.CM.AttachErrors)
	gauge(d.captures, float64(s.Captures))
}

var registry = sync.OnceValue(func() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(NewCollector(),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
})

// Registry returns the registry the endpoint's /metrics serves: the
// softrdma collector, Go runtime and process metrics.
func Registry() *prometheus.Registry { return registry() }
