//go:build rdmacore && cgo

package cm

/*
#include <string.h>
#include <endian.h>
#include <rdma/rdma_cma.h>

// sr_path is a struct ibv_sa_path_rec in host order (which has no
// ServiceID or QoSClass: they stay 0).
struct sr_path {
	uint64_t service_id;
	uint8_t dgid[16], sgid[16];
	uint16_t dlid, slid, pkey, qos_class;
	uint32_t flow_label;
	int raw_traffic, reversible;
	uint8_t hop_limit, traffic_class, numb_path, sl;
	uint8_t mtu_selector, mtu, rate_selector, rate;
	uint8_t packet_life_time_selector, packet_life_time, preference;
};

// sr_route copies up to max paths of the id's route into out and returns
// how many it has.
static int sr_route(struct rdma_cm_id *id, struct sr_path *out, int max) {
	int n = id->route.num_paths;
	if (!id->route.path_rec)
		return 0;
	for (int i = 0; i < n && i < max; i++) {
		struct ibv_sa_path_rec *p = &id->route.path_rec[i];
		struct sr_path *o = &out[i];
		memcpy(o->dgid, p->dgid.raw, 16);
		memcpy(o->sgid, p->sgid.raw, 16);
		o->dlid = be16toh(p->dlid);
		o->slid = be16toh(p->slid);
		o->raw_traffic = p->raw_traffic;
		o->flow_label = be32toh(p->flow_label);
		o->hop_limit = p->hop_limit;
		o->traffic_class = p->traffic_class;
		o->reversible = p->reversible;
		o->numb_path = p->numb_path;
		o->pkey = be16toh(p->pkey);
		o->sl = p->sl;
		o->mtu_selector = p->mtu_selector;
		o->mtu = p->mtu;
		o->rate_selector = p->rate_selector;
		o->rate = p->rate;
		o->packet_life_time_selector = p->packet_life_time_selector;
		o->packet_life_time = p->packet_life_time;
		o->preference = p->preference;
	}
	return n;
}
*/
import "C"

import "github.com/softrdma/softrdma/rdmacm/kernelcm"

// maxPaths bounds the paths Route copies (librdmacm gives one or two).
const maxPaths = 8

// Route returns the paths of the id's route (id->route.path_rec, converted
// to host order); none once destroyed or before the route is resolved.
func (id *CMID) Route() []kernelcm.PathRecord {
	c := id.use()
	defer id.life.RUnlock()
	if c == nil {
		return nil
	}
	var buf [maxPaths]C.struct_sr_path
	n := min(int(C.sr_route(c, &buf[0], maxPaths)), maxPaths)
	out := make([]kernelcm.PathRecord, n)
	for i := range n {
		p := &buf[i]
		o := &out[i]
		o.ServiceID = uint64(p.service_id)
		for j := range 16 {
			o.DGID[j], o.SGID[j] = byte(p.dgid[j]), byte(p.sgid[j])
		}
		o.DLID, o.SLID, o.PKey, o.QoSClass = uint16(p.dlid), uint16(p.slid), uint16(p.pkey), uint16(p.qos_class)
		o.FlowLabel = uint32(p.flow_label)
		o.RawTraffic, o.Reversible = p.raw_traffic != 0, p.reversible != 0
		o.HopLimit, o.TrafficClass, o.NumbPath, o.SL = uint8(p.hop_limit), uint8(p.traffic_class), uint8(p.numb_path), uint8(p.sl)
		o.MTUSelector, o.MTU, o.RateSelector, o.Rate = uint8(p.mtu_selector), uint8(p.mtu), uint8(p.rate_selector), uint8(p.rate)
		o.PacketLifeTimeSelector, o.PacketLifeTime, o.Preference = uint8(p.packet_life_time_selector), uint8(p.packet_life_time), uint8(p.preference)
	}
	return out
}
