//go:build capi

// rdmacm.c: librdmacm's calls over softrdma's rdmacm package. Each
// softrdma_<call> is what the thin librdmacm.so.1 jumps to for <call>; the
// Go side (the sr* functions of rdmacm.go) returns an errno, turned here
// into librdmacm's convention (-1 and errno, or NULL and errno).

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rsocket.h>
#include "capi.h"
#include "_cgo_export.h"

#define SR_CHECK(name) \
	_Static_assert(__builtin_types_compatible_p(__typeof__(name), __typeof__(softrdma_##name)), #name " differs from the header")
#define SR_RET(e) do { if (e) { errno = (e); return -1; } return 0; } while (0)

struct sockaddr *sr_id_src(struct rdma_cm_id *id) { return &id->route.addr.src_addr; }
struct sockaddr *sr_id_dst(struct rdma_cm_id *id) { return &id->route.addr.dst_addr; }
struct rdma_ud_param *sr_event_ud(struct rdma_cm_event *ev) { return &ev->param.ud; }

struct rdma_event_channel *softrdma_rdma_create_event_channel(void)
{
	struct rdma_event_channel *ch = NULL;
	int e = srCreateEventChannel(&ch);
	if (e) {
		errno = e;
		return NULL;
	}
	return ch;
}
SR_CHECK(rdma_create_event_channel);

void softrdma_rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	if (channel)
		srDestroyEventChannel(channel);
}
SR_CHECK(rdma_destroy_event_channel);

int softrdma_rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
			    enum rdma_port_space ps)
{
	int e = id ? srCreateID(channel, context, ps, id) : EINVAL;
	SR_RET(e);
}
SR_CHECK(rdma_create_id);

int softrdma_rdma_destroy_id(struct rdma_cm_id *id)
{
	int e = id ? srDestroyID(id) : EINVAL;
	SR_RET(e);
}
SR_CHECK(rdma_destroy_id);

int softrdma_rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	int e = id && addr ? srBindAddr(id, addr) : EINVAL;
	SR_RET(e);
}
SR_CHECK(rdma_bind_addr);

int softrdma_rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr,
			       int timeout_ms)
{
	int e = id && dst_addr ? srResolveAddr(id, src_addr, dst_addr, timeout_ms) : EINVAL;
	SR_RET(e);
}
SR_CHECK(rdma_resolve_addr);

int softrdma_rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	int e = id ? srResolveRoute(id, timeout_ms) : EINVAL;
	SR_RET(e);
}
SR_CHECK(rdma_resolve_route);

static int sr_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct sr_qp_init *in, struct ibv_qp_cap *cap)
{
	int e;
	if (!id)
		return EINVAL;
	in->pd = pd;
	e = srCreateQP(id, in);
	if (!e && cap) {
		cap->max_send_wr = in->max_send_wr;
		cap->max_recv_wr = in->max_recv_wr;
		cap->max_send_sge = in->max_send_sge;
		cap->max_recv_sge = in->max_recv_sge;
		cap->max_inline_data = in->max_inline_data;
	}
	return e;
}

int softrdma_rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct sr_qp_init in;
	int e;
	if (!attr)
		SR_RET(EINVAL);
	if (attr->srq) {
		SR_UNSUPPORTED("rdma_create_qp with an SRQ");
		SR_RET(EOPNOTSUPP);
	}
	sr_qp_init_from(&in, attr->qp_context, attr->send_cq, attr->recv_cq, &attr->cap, attr->qp_type, attr->sq_sig_all);
	e = sr_create_qp(id, pd, &in, &attr->cap);
	SR_RET(e);
}
SR_CHECK(rdma_create_qp);

int softrdma_rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *attr)
{
	struct sr_qp_init in;
	const uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	const uint64_t ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
	struct ibv_pd *pd = NULL;
	int e;
	if (!attr)
		SR_RET(EINVAL);
	if (attr->comp_mask & ~known) {
		SR_UNSUPPORTED("rdma_create_qp_ex with comp_mask bits other than PD, CREATE_FLAGS and SEND_OPS_FLAGS");
		SR_RET(EOPNOTSUPP);
	}
	if ((attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && (attr->send_ops_flags & ~ops)) {
		SR_UNSUPPORTED("rdma_create_qp_ex with send_ops_flags other than IBV_QP_EX_WITH_SEND and _SEND_WITH_IMM (UD QPs)");
		SR_RET(EOPNOTSUPP);
	}
	if (attr->srq) {
		SR_UNSUPPORTED("rdma_create_qp_ex with an SRQ");
		SR_RET(EOPNOTSUPP);
	}
	sr_qp_init_from(&in, attr->qp_context, attr->send_cq, attr->recv_cq, &attr->cap, attr->qp_type, attr->sq_sig_all);
	if (attr->comp_mask & IBV_QP_INIT_ATTR_PD)
		pd = attr->pd;
	if (attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS)
		in.create_flags = attr->create_flags;
	e = sr_create_qp(id, pd, &in, &attr->cap);
	if (!e && (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS))
		sr_qp_make_ex(id->qp, attr->send_ops_flags);
	SR_RET(e);
}
SR_CHECK(rdma_create_qp_ex);

void softrdma_rdma_destroy_qp(struct rdma_cm_id *id)
{
	if (id)
		srDestroyQP(id);
}
SR_CHECK(rdma_destroy_qp);

int softrdma_rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
	int nonblock, e;
	if (!channel || !event)
		SR_RET(EINVAL);
	// O_NONBLOCK on the channel's fd (fcntl) makes the call return EAGAIN
	// instead of waiting, as the read of librdmacm does.
	nonblock = fcntl(channel->fd, F_GETFL) & O_NONBLOCK;
	e = srGetEvent(channel, nonblock ? 1 : 0, event);
	SR_RET(e);
}
SR_CHECK(rdma_get_cm_event);

int softrdma_rdma_ack_cm_event(struct rdma_cm_event *event)
{
	int e = event ? srAckEvent(event) : EINVAL;
	SR_RET(e);
}
SR_CHECK(rdma_ack_cm_event);

int softrdma_rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
	int e = id && addr ? srJoin(id, addr, RDMA_CM_JOIN_MC_ATTR_ADDRESS, 0, 0, context) : EINVAL;
	SR_RET(e);
}
SR_CHECK(rdma_join_multicast);

int softrdma_rdma_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *attr, void *context)
{
	int e = id && attr ? srJoin(id, attr->addr, attr->comp_mask, attr->join_flags, 1, context) : EINVAL;
	SR_RET(e);
}
SR_CHECK(rdma_join_multicast_ex);

int softrdma_rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
	int e = id && addr ? srLeave(id, addr) : EINVAL;
	SR_RET(e);
}
SR_CHECK(rdma_leave_multicast);

__be16 softrdma_rdma_get_src_port(struct rdma_cm_id *id) { return id ? srPort(id, 1) : 0; }
SR_CHECK(rdma_get_src_port);

__be16 softrdma_rdma_get_dst_port(struct rdma_cm_id *id) { return id ? srPort(id, 0) : 0; }
SR_CHECK(rdma_get_dst_port);

const char *softrdma_rdma_event_str(enum rdma_cm_event_type event)
{
	static const char *const s[] = {
		"RDMA_CM_EVENT_ADDR_RESOLVED",
		"RDMA_CM_EVENT_ADDR_ERROR",
		"RDMA_CM_EVENT_ROUTE_RESOLVED",
		"RDMA_CM_EVENT_ROUTE_ERROR",
		"RDMA_CM_EVENT_CONNECT_REQUEST",
		"RDMA_CM_EVENT_CONNECT_RESPONSE",
		"RDMA_CM_EVENT_CONNECT_ERROR",
		"RDMA_CM_EVENT_UNREACHABLE",
		"RDMA_CM_EVENT_REJECTED",
		"RDMA_CM_EVENT_ESTABLISHED",
		"RDMA_CM_EVENT_DISCONNECTED",
		"RDMA_CM_EVENT_DEVICE_REMOVAL",
		"RDMA_CM_EVENT_MULTICAST_JOIN",
		"RDMA_CM_EVENT_MULTICAST_ERROR",
		"RDMA_CM_EVENT_ADDR_CHANGE",
		"RDMA_CM_EVENT_TIMEWAIT_EXIT",
		"RDMA_CM_EVENT_ADDRINFO_RESOLVED",
		"RDMA_CM_EVENT_ADDRINFO_ERROR",
	};
	if ((int)event < 0 || (size_t)event >= sizeof s / sizeof s[0])
		return "UNKNOWN EVENT";
	return s[event];
}
SR_CHECK(rdma_event_str);

int softrdma_rdma_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints,
			      struct rdma_addrinfo **res)
{
	int ret;
	if (!res)
		SR_RET(EINVAL);
	// The Go side returns 0, an EAI code (< 0) with errno in *err, or an errno.
	int err = 0;
	ret = srGetAddrInfo((char *)node, (char *)service, (struct rdma_addrinfo *)hints, res, &err);
	if (ret)
		errno = err;
	return ret;
}
SR_CHECK(rdma_getaddrinfo);

void softrdma_rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	while (res) {
		struct rdma_addrinfo *next = res->ai_next;
		free(res->ai_src_addr);
		free(res->ai_dst_addr);
		free(res->ai_src_canonname);
		free(res->ai_dst_canonname);
		free(res->ai_route);
		free(res->ai_connect);
		free(res);
		res = next;
	}
}
SR_CHECK(rdma_freeaddrinfo);

// rpoll polls rsockets and ordinary fds; softrdma has no rsockets, so
// every fd is an ordinary one and rpoll is poll.
int softrdma_rpoll(struct pollfd *fds, nfds_t nfds, int timeout) { return poll(fds, nfds, timeout); }
SR_CHECK(rpoll);

// ---- options, migration, devices ----

int softrdma_rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval, size_t optlen)
{
	int e;
	if (!id || (!optval && optlen) || optlen > 1 << 20)
		SR_RET(EINVAL);
	e = srSetOption(id, level, optname, optval, optlen);
	SR_RET(e);
}
SR_CHECK(rdma_set_option);

int softrdma_rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel)
{
	int e = id ? srMigrateID(id, channel) : EINVAL;
	SR_RET(e);
}
SR_CHECK(rdma_migrate_id);

struct ibv_context **softrdma_rdma_get_devices(int *num_devices)
{
	struct ibv_context **list = NULL;
	int n = 0;
	int e = srGetDevices(&n, &list);
	if (num_devices)
		*num_devices = e ? 0 : n;
	if (e) {
		errno = e;
		return NULL;
	}
	return list;
}
SR_CHECK(rdma_get_devices);

void softrdma_rdma_free_devices(struct ibv_context **list) { free(list); }
SR_CHECK(rdma_free_devices);

// ---- endpoints ----

void softrdma_rdma_destroy_ep(struct rdma_cm_id *id);

// rdma_create_ep as librdmacm does it: a synchronous id, bound (RAI_PASSIVE,
// with pd kept as the id's) or resolved to res's destination and route
// (2 s each), then with qp_init_attr the QP by rdma_create_qp; a failed
// step destroys the endpoint.
int softrdma_rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd,
			    struct ibv_qp_init_attr *qp_init_attr)
{
	struct rdma_cm_id *cm = NULL;
	int e;
	if (!id || !res)
		SR_RET(EINVAL);
	e = srCreateEP(res, pd, &cm);
	if (e)
		SR_RET(e);
	if (!(res->ai_flags & RAI_PASSIVE) && qp_init_attr) {
		qp_init_attr->qp_type = res->ai_qp_type;
		if (softrdma_rdma_create_qp(cm, pd, qp_init_attr)) {
			e = errno;
			softrdma_rdma_destroy_ep(cm);
			SR_RET(e);
		}
	}
	*id = cm;
	return 0;
}
SR_CHECK(rdma_create_ep);

void softrdma_rdma_destroy_ep(struct rdma_cm_id *id)
{
	if (!id)
		return;
	if (id->qp)
		softrdma_rdma_destroy_qp(id);
	softrdma_rdma_destroy_id(id);
}
SR_CHECK(rdma_destroy_ep);

int softrdma_rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr, int *qp_attr_mask)
{
	int e = id && qp_attr && qp_attr_mask ? srInitQPAttr(id, qp_attr, qp_attr_mask) : EINVAL;
	SR_RET(e);
}
SR_CHECK(rdma_init_qp_attr);
