//go:build capi

// verbs.c: libibverbs' calls over softrdma's verbs package. Each
// softrdma_<call> is what the thin libibverbs.so.1 jumps to for <call>;
// the work is done in Go (the sr* functions of verbs.go), which returns an
// errno that is turned into rdma-core's return convention here.

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <endian.h>
#include "capi.h"
#include "_cgo_export.h"

// The macros of verbs.h that wrap exported calls in inline code.
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

// SR_CHECK fails the build when softrdma_<name> has another type than the
// distribution header's <name>.
#define SR_CHECK(name) \
	_Static_assert(__builtin_types_compatible_p(__typeof__(name), __typeof__(softrdma_##name)), #name " differs from the header")

#define SR_RET_PTR(e, p) do { if (e) { errno = (e); return NULL; } return (p); } while (0)
#define SR_RET_ERRNO(e) do { if (e) errno = (e); return (e); } while (0)

void sr_unsupported(int *once, const char *call)
{
	if (__atomic_exchange_n(once, 1, __ATOMIC_RELAXED))
		return;
	fprintf(stderr, "softrdma: %s is not supported on softrdma's devices\n", call);
}

int sr_eventfd_signal(int fd)
{
	uint64_t one = 1;
	return write(fd, &one, sizeof one) == sizeof one ? 0 : errno;
}

// sr_channel_fd returns the fd a completion channel gives the program
// (channel->fd): an epoll fd that watches the channel's eventfd, so that
// it is readable exactly while the eventfd is (an event is pending), for
// the program's poll, select or epoll, and so that its file status flags
// are the program's own: the eventfd is non-blocking for the library's
// sake, while the program asks for a non-blocking ibv_get_cq_event by
// setting O_NONBLOCK on channel->fd (fcntl), which reaches only this
// file. -errno on failure.
int sr_channel_fd(int evfd)
{
	struct epoll_event ev = { .events = EPOLLIN };
	int fd = epoll_create1(EPOLL_CLOEXEC), e;
	if (fd < 0)
		return -errno;
	if (epoll_ctl(fd, EPOLL_CTL_ADD, evfd, &ev)) {
		e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

int sr_eventfd_clear(int fd)
{
	uint64_t v;
	return read(fd, &v, sizeof v) == sizeof v ? 0 : errno;
}

// ---- the ops a context hands to the inline functions of verbs.h ----

// sr_raw_poll_cq polls the CQ itself (an extended CQ's batches, cqex.c).
static int sr_raw_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	// The common case of a program that polls in a loop: nothing there,
	// nothing to read, and no entry into Go.
	if (cq && __atomic_load_n(&((struct sr_cq *)cq)->hint, __ATOMIC_ACQUIRE) == 0)
		return 0;
	return srPollCQ(cq, num_entries, wc);
}

static int sr_op_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	if (num_entries < 0)
		return -EINVAL;
	if (num_entries == 0)
		return 0;
	if (cq && ((struct sr_cq *)cq)->x)
		return sr_cqx_poll_cq((struct sr_cq *)cq, num_entries, wc);
	return sr_raw_poll_cq(cq, num_entries, wc);
}

// sr_op_create_cq_ex is the context's create_cq_ex, which the inline
// ibv_create_cq_ex calls: ibv_create_cq's CQ with the extended polling
// API of cqex.c.
static struct ibv_cq_ex *sr_op_create_cq_ex(struct ibv_context *context, struct ibv_cq_init_attr_ex *attr)
{
	struct ibv_cq *cq = NULL;
	int e = sr_cqx_check(context, attr);
	if (!e)
		e = srCreateCQ(context, attr->cqe, attr->cq_context, attr->channel, attr->comp_vector, &cq);
	if (!e && (e = sr_cqx_make((struct sr_cq *)cq, attr, sr_raw_poll_cq)))
		srDestroyCQ(cq);
	if (e) {
		errno = e;
		return NULL;
	}
	return &((struct sr_cq *)cq)->cqx;
}

static int sr_op_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return srReqNotifyCQ(cq, solicited_only);
}

// sr_op_post_send hands Go the chain SR_CHAIN requests at a time. A
// request whose gather list is malformed ends the chain with EINVAL after
// the requests before it were posted; *bad_wr names the request that
// failed, as rdma-core's providers.
static int sr_op_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	struct sr_swr f[SR_CHAIN];
	struct ibv_send_wr *p[SR_CHAIN];
	while (wr) {
		int n = 0, e = 0, bad = 0;
		for (; wr && n < SR_CHAIN; wr = wr->next) {
			if (wr->num_sge < 0 || (wr->num_sge > 0 && !wr->sg_list)) {
				e = EINVAL;
				break;
			}
			f[n] = (struct sr_swr){
				.wr_id = wr->wr_id, .sg = wr->sg_list, .ah = wr->wr.ud.ah, .num_sge = wr->num_sge,
				.opcode = wr->opcode, .flags = wr->send_flags, .imm = wr->imm_data,
				.rqpn = wr->wr.ud.remote_qpn, .rqkey = wr->wr.ud.remote_qkey,
			};
			p[n++] = wr;
		}
		if (n > 0) {
			int r = srPostSendFlat(qp, f, n, &bad);
			if (r) {
				if (bad_wr)
					*bad_wr = p[bad >= 0 && bad < n ? bad : 0];
				return r;
			}
		}
		if (e) {
			if (bad_wr)
				*bad_wr = wr;
			return e;
		}
	}
	return 0;
}

static int sr_op_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct sr_rwr f[SR_CHAIN];
	struct ibv_recv_wr *p[SR_CHAIN];
	while (wr) {
		int n = 0, e = 0, bad = 0;
		for (; wr && n < SR_CHAIN; wr = wr->next) {
			if (wr->num_sge < 0 || (wr->num_sge > 0 && !wr->sg_list)) {
				e = EINVAL;
				break;
			}
			f[n] = (struct sr_rwr){ .wr_id = wr->wr_id, .sg = wr->sg_list, .num_sge = wr->num_sge };
			p[n++] = wr;
		}
		if (n > 0) {
			int r = srPostRecvFlat(qp, f, n, &bad);
			if (r) {
				if (bad_wr)
					*bad_wr = p[bad >= 0 && bad < n ? bad : 0];
				return r;
			}
		}
		if (e) {
			if (bad_wr)
				*bad_wr = wr;
			return e;
		}
	}
	return 0;
}

static int sr_op_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	(void)srq;
	if (bad_wr)
		*bad_wr = wr;
	SR_UNSUPPORTED("ibv_post_srq_recv");
	return EOPNOTSUPP;
}

static int sr_op_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr, size_t len)
{
	struct ibv_port_attr full;
	int e;
	if (!attr)
		return EINVAL;
	memset(&full, 0, sizeof full);
	e = srQueryPort(ctx, port, &full);
	if (e)
		SR_RET_ERRNO(e);
	memcpy(attr, &full, len < sizeof full ? len : sizeof full);
	return 0;
}

// sr_op_query_device_ex is the context's query_device_ex, which the
// inline ibv_query_device_ex calls: the attributes of ibv_query_device,
// and of the extended ones what a provider's ibv_cmd_query_device_any
// gives where the device has no such capability: phys_port_cnt_ex is
// phys_port_cnt, device_cap_flags_ex device_cap_flags, the others zero. Only the first attr_size bytes are
// written, as rdma-core does for a program built with an older verbs.h.
static int sr_op_query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
				 struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct ibv_device_attr_ex full;
	int e;
	if (!context || !attr)
		return EINVAL;
	if (input && input->comp_mask)
		return EINVAL;
	if (attr_size < sizeof attr->orig_attr)
		return EINVAL;
	memset(&full, 0, sizeof full);
	e = srQueryDevice(context, &full.orig_attr);
	if (e)
		return e;
	full.device_cap_flags_ex = full.orig_attr.device_cap_flags;
	full.phys_port_cnt_ex = full.orig_attr.phys_port_cnt;
	memcpy(attr, &full, attr_size < sizeof full ? attr_size : sizeof full);
	return 0;
}

struct sr_context *sr_context_alloc(struct ibv_device *dev, int num_comp_vectors)
{
	struct sr_context *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->vc.sz = sizeof c->vc;
	c->vc.query_port = sr_op_query_port;
	c->vc.query_device_ex = sr_op_query_device_ex;
	c->vc.create_qp_ex = sr_create_qp_ex;
	c->vc.create_cq_ex = sr_op_create_cq_ex;
	c->vc.context.device = dev;
	c->vc.context.cmd_fd = -1;
	c->vc.context.async_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	c->vc.context.num_comp_vectors = num_comp_vectors;
	c->vc.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
	pthread_mutex_init(&c->vc.context.mutex, NULL);
	c->vc.context.ops.poll_cq = sr_op_poll_cq;
	c->vc.context.ops.req_notify_cq = sr_op_req_notify_cq;
	c->vc.context.ops.post_send = sr_op_post_send;
	c->vc.context.ops.post_recv = sr_op_post_recv;
	c->vc.context.ops.post_srq_recv = sr_op_post_srq_recv;
	return c;
}

void sr_context_free(struct sr_context *c)
{
	if (c->vc.context.async_fd >= 0)
		close(c->vc.context.async_fd);
	pthread_mutex_destroy(&c->vc.context.mutex);
	free(c);
}

struct sr_cq *sr_cq_alloc(struct ibv_context *ctx, struct ibv_comp_channel *ch, void *cq_context, int cqe)
{
	struct sr_cq *cq = calloc(1, sizeof *cq);
	if (!cq)
		return NULL;
	cq->cqx.context = ctx;
	cq->cqx.channel = ch;
	cq->cqx.cq_context = cq_context;
	cq->cqx.cqe = cqe;
	cq->hint = UINT32_MAX;
	pthread_mutex_init(&cq->cqx.mutex, NULL);
	pthread_cond_init(&cq->cqx.cond, NULL);
	return cq;
}

void sr_cq_free(struct sr_cq *cq)
{
	sr_cqx_free(cq->x);
	pthread_cond_destroy(&cq->cqx.cond);
	pthread_mutex_destroy(&cq->cqx.mutex);
	free(cq);
}


uint32_t sr_wc_imm(struct ibv_wc *wc) { return wc->imm_data; }
void sr_wc_set_imm(struct ibv_wc *wc, uint32_t be) { wc->imm_data = be; }

// ---- devices ----

struct ibv_device **softrdma_ibv_get_device_list(int *num_devices)
{
	struct ibv_device **list = NULL;
	int n = 0;
	int e = srGetDeviceList(&n, &list);
	if (e) {
		errno = e;
		return NULL;
	}
	if (num_devices)
		*num_devices = n;
	return list;
}
SR_CHECK(ibv_get_device_list);

void softrdma_ibv_free_device_list(struct ibv_device **list) { free(list); }
SR_CHECK(ibv_free_device_list);

const char *softrdma_ibv_get_device_name(struct ibv_device *device)
{
	if (!device) {
		errno = EINVAL;
		return NULL;
	}
	return device->name;
}
SR_CHECK(ibv_get_device_name);

__be64 softrdma_ibv_get_device_guid(struct ibv_device *device)
{
	if (!device) {
		errno = EINVAL;
		return 0;
	}
	return srDeviceGUID(device);
}
SR_CHECK(ibv_get_device_guid);

int softrdma_ibv_get_device_index(struct ibv_device *device)
{
	if (!device)
		return -1;
	return srDeviceIndex(device);
}
SR_CHECK(ibv_get_device_index);

struct ibv_context *softrdma_ibv_open_device(struct ibv_device *device)
{
	struct ibv_context *ctx = NULL;
	int e = device ? srOpenDevice(device, &ctx) : ENODEV;
	SR_RET_PTR(e, ctx);
}
SR_CHECK(ibv_open_device);

int softrdma_ibv_close_device(struct ibv_context *context)
{
	int e = context ? srCloseDevice(context) : EINVAL;
	SR_RET_ERRNO(e);
}
SR_CHECK(ibv_close_device);

int softrdma_ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
	int e;
	if (!context || !attr)
		SR_RET_ERRNO(EINVAL);
	memset(attr, 0, sizeof *attr);
	e = srQueryDevice(context, attr);
	SR_RET_ERRNO(e);
}
SR_CHECK(ibv_query_device);

// The exported ibv_query_port takes the port attributes of the ABI before
// the extended context: the fields up to link_layer.
int softrdma_ibv_query_port(struct ibv_context *context, uint8_t port_num, struct _compat_ibv_port_attr *attr)
{
	if (!context || !attr)
		SR_RET_ERRNO(EINVAL);
	return sr_op_query_port(context, port_num, (struct ibv_port_attr *)attr,
				offsetof(struct ibv_port_attr, flags));
}
SR_CHECK(ibv_query_port);

int softrdma_ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
	int e;
	if (!context || !gid)
		SR_RET_ERRNO(EINVAL);
	e = srQueryGID(context, port_num, index, gid);
	if (e) {
		errno = e;
		return -1;
	}
	return 0;
}
SR_CHECK(ibv_query_gid);

// ibv_query_gid_type is rdma-core's private call ibv_devinfo uses (driver.h):
// enum ibv_gid_type_sysfs, 0 IB/RoCE v1, 1 RoCE v2.
int softrdma_ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index, int *type)
{
	int e;
	if (!context || !type)
		SR_RET_ERRNO(EINVAL);
	e = srQueryGIDType(context, port_num, index, type);
	if (e) {
		errno = e;
		return -1;
	}
	return 0;
}

int softrdma_ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey)
{
	int e;
	if (!context || !pkey)
		SR_RET_ERRNO(EINVAL);
	e = srQueryPKey(context, port_num, index, pkey);
	if (e) {
		errno = e;
		return -1;
	}
	return 0;
}
SR_CHECK(ibv_query_pkey);

// ibv_read_sysfs_file (driver.h): the file's first line, or -1.
int softrdma_ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	char *path;
	int fd, len;
	if (asprintf(&path, "%s/%s", dir, file) < 0)
		return -1;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	free(path);
	if (fd < 0)
		return -1;
	len = read(fd, buf, size);
	close(fd);
	if (len > 0) {
		if (buf[len - 1] == '\n')
			buf[--len] = '\0';
		else if ((size_t)len < size)
			buf[len] = '\0';
		else
			buf[size - 1] = '\0';
	}
	return len;
}

int softrdma_ibv_fork_init(void) { return 0; }
SR_CHECK(ibv_fork_init);

enum ibv_fork_status softrdma_ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }
SR_CHECK(ibv_is_fork_initialized);

// ---- PD, MR, AH ----

struct ibv_pd *softrdma_ibv_alloc_pd(struct ibv_context *context)
{
	struct ibv_pd *pd = NULL;
	int e = context ? srAllocPD(context, &pd) : EINVAL;
	SR_RET_PTR(e, pd);
}
SR_CHECK(ibv_alloc_pd);

int softrdma_ibv_dealloc_pd(struct ibv_pd *pd)
{
	int e = pd ? srDeallocPD(pd) : EINVAL;
	SR_RET_ERRNO(e);
}
SR_CHECK(ibv_dealloc_pd);

struct ibv_mr *softrdma_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	struct ibv_mr *mr = NULL;
	int e = pd ? srRegMR(pd, addr, length, access, &mr) : EINVAL;
	SR_RET_PTR(e, mr);
}
SR_CHECK(ibv_reg_mr);

struct ibv_mr *softrdma_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
	struct ibv_mr *mr = NULL;
	int e;
	if (iova != (uintptr_t)addr) {
		SR_UNSUPPORTED("ibv_reg_mr_iova2 (an iova other than the address)");
		errno = EOPNOTSUPP;
		return NULL;
	}
	e = pd ? srRegMR(pd, addr, length, access, &mr) : EINVAL;
	SR_RET_PTR(e, mr);
}
SR_CHECK(ibv_reg_mr_iova2);

struct ibv_mr *softrdma_ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access)
{
	return softrdma_ibv_reg_mr_iova2(pd, addr, length, iova, access);
}
SR_CHECK(ibv_reg_mr_iova);

int softrdma_ibv_dereg_mr(struct ibv_mr *mr)
{
	int e = mr ? srDeregMR(mr) : EINVAL;
	SR_RET_ERRNO(e);
}
SR_CHECK(ibv_dereg_mr);

struct ibv_ah *softrdma_ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	struct ibv_ah *ah = NULL;
	int e = pd && attr ? srCreateAH(pd, attr, &ah) : EINVAL;
	SR_RET_PTR(e, ah);
}
SR_CHECK(ibv_create_ah);

int softrdma_ibv_destroy_ah(struct ibv_ah *ah)
{
	int e = ah ? srDestroyAH(ah) : EINVAL;
	SR_RET_ERRNO(e);
}
SR_CHECK(ibv_destroy_ah);

// ---- CQ and completion channels ----

struct ibv_comp_channel *softrdma_ibv_create_comp_channel(struct ibv_context *context)
{
	struct ibv_comp_channel *ch = NULL;
	int e = context ? srCreateCompChannel(context, &ch) : EINVAL;
	SR_RET_PTR(e, ch);
}
SR_CHECK(ibv_create_comp_channel);

int softrdma_ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	int e = channel ? srDestroyCompChannel(channel) : EINVAL;
	SR_RET_ERRNO(e);
}
SR_CHECK(ibv_destroy_comp_channel);

struct ibv_cq *softrdma_ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
				      struct ibv_comp_channel *channel, int comp_vector)
{
	struct ibv_cq *cq = NULL;
	int e = context ? srCreateCQ(context, cqe, cq_context, channel, comp_vector, &cq) : EINVAL;
	SR_RET_PTR(e, cq);
}
SR_CHECK(ibv_create_cq);

int softrdma_ibv_destroy_cq(struct ibv_cq *cq)
{
	int e = cq ? srDestroyCQ(cq) : EINVAL;
	SR_RET_ERRNO(e);
}
SR_CHECK(ibv_destroy_cq);

int softrdma_ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
	int e = channel && cq && cq_context ? srGetCQEvent(channel, cq, cq_context) : EINVAL;
	if (e) {
		errno = e;
		return -1;
	}
	return 0;
}
SR_CHECK(ibv_get_cq_event);

void softrdma_ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	if (cq)
		srAckCQEvents(cq, nevents);
}
SR_CHECK(ibv_ack_cq_events);

// ---- QP multicast ----

int softrdma_ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	int e = qp && gid ? srAttachMcast(qp, (union ibv_gid *)gid, lid, 1) : EINVAL;
	SR_RET_ERRNO(e);
}
SR_CHECK(ibv_attach_mcast);

int softrdma_ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	int e = qp && gid ? srAttachMcast(qp, (union ibv_gid *)gid, lid, 0) : EINVAL;
	SR_RET_ERRNO(e);
}
SR_CHECK(ibv_detach_mcast);

// ---- strings (rdma-core's texts) ----

const char *softrdma_ibv_node_type_str(enum ibv_node_type node_type)
{
	static const char *const s[] = {
		[IBV_NODE_CA] = "InfiniBand channel adapter",
		[IBV_NODE_SWITCH] = "InfiniBand switch",
		[IBV_NODE_ROUTER] = "InfiniBand router",
		[IBV_NODE_RNIC] = "iWARP NIC",
		[IBV_NODE_USNIC] = "usNIC",
		[IBV_NODE_USNIC_UDP] = "usNIC UDP",
		[IBV_NODE_UNSPECIFIED] = "unspecified",
	};
	if (node_type < IBV_NODE_CA || node_type > IBV_NODE_UNSPECIFIED)
		return "unknown";
	return s[node_type];
}
SR_CHECK(ibv_node_type_str);

const char *softrdma_ibv_port_state_str(enum ibv_port_state port_state)
{
	static const char *const s[] = {
		[IBV_PORT_NOP] = "PORT_NOP",
		[IBV_PORT_DOWN] = "PORT_DOWN",
		[IBV_PORT_INIT] = "PORT_INIT",
		[IBV_PORT_ARMED] = "PORT_ARMED",
		[IBV_PORT_ACTIVE] = "PORT_ACTIVE",
		[IBV_PORT_ACTIVE_DEFER] = "PORT_ACTIVE_DEFER",
	};
	if (port_state < IBV_PORT_NOP || port_state > IBV_PORT_ACTIVE_DEFER)
		return "unknown";
	return s[port_state];
}
SR_CHECK(ibv_port_state_str);

const char *softrdma_ibv_event_type_str(enum ibv_event_type event)
{
	static const char *const s[] = {
		[IBV_EVENT_CQ_ERR] = "CQ error",
		[IBV_EVENT_QP_FATAL] = "local work queue catastrophic error",
		[IBV_EVENT_QP_REQ_ERR] = "invalid request local work queue error",
		[IBV_EVENT_QP_ACCESS_ERR] = "local access violation work queue error",
		[IBV_EVENT_COMM_EST] = "communication established",
		[IBV_EVENT_SQ_DRAINED] = "send queue drained",
		[IBV_EVENT_PATH_MIG] = "path migrated",
		[IBV_EVENT_PATH_MIG_ERR] = "path migration request error",
		[IBV_EVENT_DEVICE_FATAL] = "local catastrophic error",
		[IBV_EVENT_PORT_ACTIVE] = "port active",
		[IBV_EVENT_PORT_ERR] = "port error",
		[IBV_EVENT_LID_CHANGE] = "LID change",
		[IBV_EVENT_PKEY_CHANGE] = "P_Key change",
		[IBV_EVENT_SM_CHANGE] = "SM change",
		[IBV_EVENT_SRQ_ERR] = "SRQ catastrophic error",
		[IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
		[IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
		[IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
		[IBV_EVENT_GID_CHANGE] = "GID table change",
		[IBV_EVENT_WQ_FATAL] = "WQ fatal",
	};
	if (event < IBV_EVENT_CQ_ERR || event > IBV_EVENT_WQ_FATAL)
		return "unknown";
	return s[event];
}
SR_CHECK(ibv_event_type_str);

const char *softrdma_ibv_wc_status_str(enum ibv_wc_status status)
{
	static const char *const s[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
		[IBV_WC_MW_BIND_ERR] = "memory management operation error",
		[IBV_WC_BAD_RESP_ERR] = "bad response error",
		[IBV_WC_LOC_ACCESS_ERR] = "local access error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
		[IBV_WC_REM_ABORT_ERR] = "aborted error",
		[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
		[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
		[IBV_WC_FATAL_ERR] = "fatal error",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
		[IBV_WC_GENERAL_ERR] = "general error",
		[IBV_WC_TM_ERR] = "TM error",
		[IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
	};
	if (status < IBV_WC_SUCCESS || status > IBV_WC_TM_RNDV_INCOMPLETE)
		return "unknown";
	return s[status];
}
SR_CHECK(ibv_wc_status_str);

// verbs_register_driver_34 (driver.h) is what rdma-core's provider
// libraries call from their constructors when a program links one (perftest
// links libmlx5 and libefa for their direct verbs). softrdma loads no
// providers: the call is accepted and ignored, without a message.
void softrdma_verbs_register_driver_34(const void *ops) { (void)ops; }

// ---- GID entries (rdma-core 32's calls; perftest picks its GID with them) ----

int softrdma__ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
			       struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	struct ibv_gid_entry e;
	int r;
	if (!context || !entry || flags || entry_size < sizeof e)
		return EINVAL;
	if (port_num > 255)
		return EINVAL;
	memset(&e, 0, sizeof e);
	r = srQueryGIDEntry(context, port_num, gid_index, &e);
	if (r)
		return r;
	memcpy(entry, &e, sizeof e);
	return 0;
}
SR_CHECK(_ibv_query_gid_ex);

ssize_t softrdma__ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
				      size_t max_entries, uint32_t flags, size_t entry_size)
{
	struct ibv_device_attr da;
	ssize_t n = 0;
	if (!context || (!entries && max_entries) || flags || entry_size < sizeof *entries)
		return -EINVAL;
	if (softrdma_ibv_query_device(context, &da))
		return -errno;
	for (int port = 1; port <= da.phys_port_cnt; port++) {
		struct ibv_port_attr pa;
		memset(&pa, 0, sizeof pa);
		if (srQueryPort(context, port, &pa))
			continue;
		for (int i = 0; i < pa.gid_tbl_len; i++) {
			struct ibv_gid_entry e;
			memset(&e, 0, sizeof e);
			if (srQueryGIDEntry(context, port, i, &e))
				continue; // an empty entry
			if ((size_t)n == max_entries)
				return -EINVAL; // as rdma-core: the table does not fit
			memcpy((char *)entries + n * entry_size, &e, sizeof e);
			n++;
		}
	}
	return n;
}
SR_CHECK(_ibv_query_gid_table);

// ---- async events ----

// sr_port_event tells the event types whose element is a port number.
static int sr_port_event(int type)
{
	switch (type) {
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		return 1;
	}
	return 0;
}

// The context's async_fd is an eventfd with EFD_SEMAPHORE that counts the
// events queued for it (async.go): the read takes one (waiting for it, or
// EAGAIN when the program set O_NONBLOCK on async_fd), then the event is
// taken from the queue.
int softrdma_ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	uint64_t v;
	int type = 0, port = 0, e;
	if (!context || !event) {
		errno = EINVAL;
		return -1;
	}
	if (read(context->async_fd, &v, sizeof v) != sizeof v)
		return -1;
	e = srTakeAsyncEvent(context, &type, &port);
	if (e) {
		errno = e;
		return -1;
	}
	memset(event, 0, sizeof *event);
	event->event_type = type;
	if (sr_port_event(type))
		event->element.port_num = port;
	return 0;
}
SR_CHECK(ibv_get_async_event);

void softrdma_ibv_ack_async_event(struct ibv_async_event *event)
{
	if (event)
		srAckAsyncEvent(event->event_type, sr_port_event(event->event_type) ? event->element.port_num : 0);
}
SR_CHECK(ibv_ack_async_event);
