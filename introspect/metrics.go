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
// (hex, e.g. "0xc35a01"). The counter metrics come from each device's
// counter schema (Device.CounterSchema): a counter feeds softrdma_<metric>
// and, when kept per QP, softrdma_qp_<metric>; a drop counter adds its
// reason as the "reason" label of softrdma_dropped_packets_total.

// metricHelp is the help of the metrics several counters feed; the others
// take their counter's help.
var metricHelp = map[string]string{
	"dropped_packets_total": "Datagrams dropped, by reason.",
}

type descSet struct {
	mu      sync.Mutex
	dev, qp map[string]*prometheus.Desc // counter metrics, made on first use

	deviceInfo, portState, activeMTU, qps, groups, attachments, memberships *prometheus.Desc
	qpInfo                                                                  *prometheus.Desc
	cmIDs, cmJoins, queueDepth, unacked                                     *prometheus.Desc
	joinsTotal, joinErrors, leavesTotal, attachErrors, captures             *prometheus.Desc
}

func newDescSet() *descSet {
	d := &descSet{dev: map[string]*prometheus.Desc{}, qp: map[string]*prometheus.Desc{}}
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

// counterDescs returns the device and QP descriptors of a counter's metric.
func (d *descSet) counterDescs(c CounterInfo) (dev, qp *prometheus.Desc) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dev[c.Metric] == nil {
		var extra []string
		if c.Reason != "" {
			extra = []string{"reason"}
		}
		help := metricHelp[c.Metric]
		if help == "" {
			help = c.Help
		}
		d.dev[c.Metric] = prometheus.NewDesc("softrdma_"+c.Metric, help, append([]string{"device"}, extra...), nil)
		d.qp[c.Metric] = prometheus.NewDesc("softrdma_qp_"+c.Metric, "Per QP: "+help, append([]string{"device", "qpn"}, extra...), nil)
	}
	return d.dev[c.Metric], d.qp[c.Metric]
}

// collector is a prometheus.Collector over Collect.
type collector struct{ d *descSet }

// NewCollector returns a prometheus.Collector that exports the process's
// softrdma state at each scrape: packets and bytes sent and received,
// deliveries, each drop reason (device and QP), QPs, groups, memberships,
// CM ids, joins and leaves, and event-queue depth. Register it in a
// registry of your own to serve the metrics from your own HTTP server.
func NewCollector() prometheus.Collector { return &collector{d: newDescSet()} }

// Describe sends nothing: the counter metrics depend on the devices'
// schemas, so the collector is unchecked.
func (c *collector) Describe(chan<- *prometheus.Desc) {}

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
		for _, ci := range dev.CounterSchema {
			v, ok := dev.Counters[ci.Name]
			if !ok || ci.Metric == "" {
				continue
			}
			desc, _ := d.counterDescs(ci)
			if ci.Reason != "" {
				counter(desc, v, dev.Name, ci.Reason)
			} else {
				counter(desc, v, dev.Name)
			}
		}
		for _, q := range dev.QPs {
			qpn := fmt.Sprintf("%#06x", q.QPN)
			gauge(d.qpInfo, 1, dev.Name, qpn, q.State, fmt.Sprintf("%#08x", q.QKey))
			for _, ci := range dev.CounterSchema {
				v, ok := q.Counters[ci.Name]
				if !ok || ci.Metric == "" {
					continue
				}
				_, desc := d.counterDescs(ci)
				if ci.Reason != "" {
					counter(desc, v, dev.Name, qpn, ci.Reason)
				} else {
					counter(desc, v, dev.Name, qpn)
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
