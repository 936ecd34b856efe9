package introspect

import "time"

// Snapshot is everything the endpoint tells about a process at one
// instant (GET /v1/snapshot). Its JSON form is what `softrdma … --json`
// prints.
type Snapshot struct {
	PID     int       `json:"pid"`
	Command string    `json:"command"`
	Time    time.Time `json:"time"`
	// Devices are the process's software RoCEv2 devices, by name.
	Devices []Device `json:"devices"`
	// Groups are the multicast groups the devices and CM ids use, by
	// device and MGID.
	Groups []Group `json:"groups"`
	// IDs are the RDMA CM ids bound to a device.
	IDs []CMID `json:"cm_ids"`
	// Channels are the event channels of those ids.
	Channels []Channel `json:"event_channels"`
	CM       CMStats   `json:"cm"`
	// Captures is the number of packet captures running in the process.
	Captures int `json:"captures"`
}

// Device describes one device (what ibv_devinfo -v shows, plus its QPs,
// usage and counters).
type Device struct {
	Name string `json:"name"`
	// Kind is the backend: "rxe" (software RoCEv2), "ib" (an emulated
	// InfiniBand port: no interface, MAC or sockets) or "other" (a device
	// whose backend tells only its attributes).
	Kind         string `json:"kind"`
	Ifname       string `json:"ifname"`
	Ifindex      int    `json:"ifindex"`
	MAC          string `json:"mac"`
	NodeGUID     string `json:"node_guid"`
	SysImageGUID string `json:"sys_image_guid"`
	VendorID     uint32 `json:"vendor_id"`
	VendorPartID uint32 `json:"vendor_part_id"`
	HWVer        uint32 `json:"hw_ver"`
	FWVer        string `json:"fw_ver"`
	PhysPortCnt  int    `json:"phys_port_cnt"`
	Limits       Limits `json:"limits"`
	Usage        Usage  `json:"usage"`
	Ports        []Port `json:"ports"`
	QPs          []QP   `json:"qps"`
	// CounterSchema describes the device's counters, in display order.
	CounterSchema []CounterInfo `json:"counter_schema"`
	// Counters holds the device counters named in CounterSchema.
	Counters Counters `json:"counters"`
}

// CounterInfo describes one counter of a device.
type CounterInfo struct {
	Name string `json:"name"`
	Help string `json:"help"`
	// Scope is "device" or "qp" (kept per QP too).
	Scope string `json:"scope"`
	// Metric is the Prometheus metric (without the softrdma_ prefix) and
	// Reason its "reason" label for drops.
	Metric string `json:"metric"`
	Reason string `json:"reason,omitempty"`
}

// Limits are a device's capabilities (struct ibv_device_attr).
type Limits struct {
	MaxQP                 int `json:"max_qp"`
	MaxQPWR               int `json:"max_qp_wr"`
	MaxSGE                int `json:"max_sge"`
	MaxCQ                 int `json:"max_cq"`
	MaxCQE                int `json:"max_cqe"`
	MaxMR                 int `json:"max_mr"`
	MaxPD                 int `json:"max_pd"`
	MaxAH                 int `json:"max_ah"`
	MaxMcastGrp           int `json:"max_mcast_grp"`
	MaxMcastQPAttach      int `json:"max_mcast_qp_attach"`
	MaxTotalMcastQPAttach int `json:"max_total_mcast_qp_attach"`
	MaxInlineData         int `json:"max_inline_data"`
}

// Usage is what a device uses of its limits and of the host.
type Usage struct {
	QPs int `json:"qps"`
	// McastGroups counts MGIDs with attached QPs (against max_mcast_grp).
	McastGroups int `json:"mcast_groups"`
	// McastAttachments counts QP attachments (against
	// max_total_mcast_qp_attach).
	McastAttachments int `json:"mcast_attachments"`
	// IPMemberships counts the IP multicast groups joined on the
	// interface (IGMP/MLD).
	IPMemberships int `json:"ip_memberships"`
	RecvSockets   int `json:"recv_sockets"`
	SendSockets   int `json:"send_sockets"`
	// SAMemberships counts the groups an InfiniBand port holds at the SA.
	SAMemberships int `json:"sa_memberships"`
}

// Port describes a port (struct ibv_port_attr and its GID table).
type Port struct {
	Port int `json:"port"`
	// State is the ibv_port_state name, e.g. "PORT_ACTIVE".
	State    string `json:"state"`
	StateNum int    `json:"state_num"`
	// MaxMTU and ActiveMTU are in bytes.
	MaxMTU       int    `json:"max_mtu"`
	ActiveMTU    int    `json:"active_mtu"`
	NetdevMTU    int    `json:"netdev_mtu"`
	LinkLayer    string `json:"link_layer"`
	LID          uint16 `json:"lid"`
	SMLID        uint16 `json:"sm_lid"`
	LMC          uint8  `json:"lmc"`
	GIDTableLen  int    `json:"gid_tbl_len"`
	PKeyTableLen int    `json:"pkey_tbl_len"`
	GIDs         []GID  `json:"gids"`
}

// GID is one GID table entry.
type GID struct {
	Index int    `json:"index"`
	GID   string `json:"gid"`
	// Type is "RoCE v2" (or another ibv GID type name).
	Type string `json:"type"`
}

// QP describes one QP of a device.
type QP struct {
	QPN  uint32 `json:"qpn"`
	Type string `json:"type"`
	// State is the ibv_qp_state name, e.g. "RTS".
	State            string `json:"state"`
	QKey             uint32 `json:"qkey"`
	Port             int    `json:"port"`
	BlockSelfMcastLB bool   `json:"block_self_mcast_lb"`
	// SrcPort is the UDP source port of the QP's IPv4 datagrams.
	SrcPort uint16 `json:"udp_src_port"`
	// Groups are the MGIDs the QP is attached to, in attach order.
	Groups []string `json:"groups"`
	// CMID is the id of the RDMA CM id owning the QP (0: none).
	CMID uint64 `json:"cm_id,omitempty"`
	// Counters holds the QP counters (the "qp" scope of the device's
	// CounterSchema).
	Counters Counters `json:"counters"`
}

// Group describes one multicast group of a device: the verbs group (MGID
// and attached QPs), the IP membership, and the CM joins.
type Group struct {
	Device string `json:"device"`
	MGID   string `json:"mgid"`
	// Addr is the IP group address the MGID stands for ("" when none).
	Addr string `json:"addr,omitempty"`
	// IPMembership reports that the device holds the IP membership on its
	// interface (the kernel sent the IGMP/MLD report).
	IPMembership bool `json:"ip_membership"`
	// CMRefs counts the membership references of full-member CM joins.
	CMRefs int `json:"cm_refs"`
	// MLID and SAJoinState describe an InfiniBand port's SA membership:
	// the group's multicast LID and the join-state bits the port holds
	// (0x1 full, 0x2 non, 0x4 send-only non, 0x8 send-only full member).
	MLID        uint16 `json:"mlid,omitempty"`
	SAJoinState uint8  `json:"sa_join_state,omitempty"`
	// AttachedQPs are the QPs attached to the MGID, in delivery order.
	AttachedQPs []uint32 `json:"attached_qps"`
	// Joins are the CM joins of the group.
	Joins []Join `json:"joins"`
}

// Join is one join of a CM id.
type Join struct {
	CMID uint64 `json:"cm_id"`
	// Src is the id's bound address.
	Src string `json:"src"`
	// Addr is the address given to the join.
	Addr string `json:"addr"`
	// JoinFlags is the rdma_cm_mc_join_flags value: 0 full member, 1
	// send-only full member; JoinType names it.
	JoinFlags uint32 `json:"join_flags"`
	JoinType  string `json:"join_type"`
	// State is "pending" until the MULTICAST_JOIN event is retrieved,
	// then "joined".
	State string `json:"state"`
	// QPN is the id's QP (0: none); Attached tells whether it is attached
	// to the group.
	QPN      uint32 `json:"qpn"`
	Attached bool   `json:"attached"`
	// MembershipRef reports that the join holds an IP membership reference.
	MembershipRef bool `json:"membership_ref"`
	EventsQueued  int  `json:"events_queued"`
	EventsUnacked int  `json:"events_unacked"`
}

// CMID describes one RDMA CM id.
type CMID struct {
	ID        uint64 `json:"id"`
	Channel   uint64 `json:"channel"`
	PortSpace string `json:"port_space"`
	State     string `json:"state"`
	Sync      bool   `json:"sync"`
	Device    string `json:"device"`
	Src       string `json:"src"`
	Dst       string `json:"dst,omitempty"`
	QPN       uint32 `json:"qpn"`
	QKey      uint32 `json:"qkey"`
	Joins     int    `json:"joins"`
	// EventsQueued counts the id's events not yet retrieved,
	// EventsUnacked the retrieved ones not yet acked.
	EventsQueued  int `json:"events_queued"`
	EventsUnacked int `json:"events_unacked"`
}

// Channel describes one event channel.
type Channel struct {
	ID uint64 `json:"id"`
	// Queued is the queue depth: events not yet retrieved.
	Queued      int  `json:"queued"`
	IDs         int  `json:"ids"`
	NonBlocking bool `json:"nonblocking"`
	Closed      bool `json:"closed"`
}

// CMStats sums up the RDMA CM side of the process.
type CMStats struct {
	IDs int `json:"ids"`
	// EventQueueDepth sums the channels' queued events; EventsUnacked the
	// ids' retrieved, unacked events.
	EventQueueDepth int `json:"event_queue_depth"`
	EventsUnacked   int `json:"events_unacked"`
	// Joins, JoinErrors, Leaves and AttachErrors count operations since
	// the process started (rdmacm.Stats).
	Joins        uint64 `json:"joins_total"`
	JoinErrors   uint64 `json:"join_errors_total"`
	Leaves       uint64 `json:"leaves_total"`
	AttachErrors uint64 `json:"attach_errors_total"`
}

// Counters maps counter names (see Device.CounterSchema) to values.
type Counters map[string]uint64

// CounterNames returns the names of the device's counters in display
// order. Every datagram a device reads is counted in rcvd_pkts; then once
// more: in one drop before a QP, as an SA MAD, or once per receiving QP as
// delivered or in a per-QP drop.
func (d *Device) CounterNames() []string {
	out := make([]string, 0, len(d.CounterSchema))
	for _, c := range d.CounterSchema {
		out = append(out, c.Name)
	}
	return out
}

// QPCounterNames returns the names of the counters the device keeps per
// QP, in display order.
func (d *Device) QPCounterNames() []string {
	var out []string
	for _, c := range d.CounterSchema {
		if c.Scope == "qp" {
			out = append(out, c.Name)
		}
	}
	return out
}
