//go:build capi

// forkchild.c: the calls of a child of fork() (see fork.c). Each
// softrdma_child_<name> is what the thin libraries' trampolines jump to
// in the child (internal/capibuild's forkServed): it checks that the
// objects it is given are the child's own (one of the parent's gets
// EINVAL, as before), sends the call to the parent (forkserve.c) and
// mirrors the answer into rdma-core's structs of the child. Each thread
// of the child has a connection of its own, so that a call that waits
// (rdma_get_cm_event, ibv_get_cq_event) holds up no other thread.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>
#include <infiniband/ib.h>
#include "capi.h"
#include "forkrpc.h"

#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

void sr_fork_say(const char *call);
extern char fk_addr[64];
extern int fk_addr_len;

// ---- the child's objects ----

// Every object the child makes is one of these: rdma-core's struct first,
// then the parent's object (rh) and what kind it is.
enum { FKC_DEV = 1, FKC_CTX, FKC_PD, FKC_MR, FKC_CHAN, FKC_CQ, FKC_QP, FKC_AH, FKC_ECH, FKC_ID, FKC_EV };

struct fkc_obj {
	struct fkc_obj *next;
	int kind;
	uint64_t rh;
	void *p; // the rdma-core struct handed to the program
};

struct fkc_dev { struct ibv_device dev; };
struct fkc_ctx { struct verbs_context vc; };
struct fkc_id { struct rdma_cm_id id; };
struct fkc_ev { struct rdma_cm_event ev; uint64_t rh; char priv[256]; };

static pthread_mutex_t fkc_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fkc_obj *fkc_objs;

static void fkc_add(int kind, uint64_t rh, void *p)
{
	struct fkc_obj *o = calloc(1, sizeof *o);
	if (!o)
		return;
	o->kind = kind;
	o->rh = rh;
	o->p = p;
	pthread_mutex_lock(&fkc_mu);
	o->next = fkc_objs;
	fkc_objs = o;
	pthread_mutex_unlock(&fkc_mu);
}

// fkc_rh_quiet returns the parent's object behind p, a child's object of
// kind, or 0 (one of the parent's, or none).
static uint64_t fkc_rh_quiet(int kind, const void *p)
{
	uint64_t rh = 0;
	if (!p)
		return 0;
	pthread_mutex_lock(&fkc_mu);
	for (struct fkc_obj *o = fkc_objs; o; o = o->next)
		if (o->p == p && o->kind == kind) {
			rh = o->rh;
			break;
		}
	pthread_mutex_unlock(&fkc_mu);
	return rh;
}

// fkc_rh is fkc_rh_quiet, saying on stderr (once) when p is the parent's.
static uint64_t fkc_rh(int kind, const void *p)
{
	uint64_t rh = fkc_rh_quiet(kind, p);
	if (p && !rh)
		sr_fork_say("a call on an object of the parent");
	return rh;
}

// fkc_local returns the child's object of kind for the parent's rh, or NULL.
static void *fkc_local(int kind, uint64_t rh)
{
	void *p = NULL;
	if (!rh)
		return NULL;
	pthread_mutex_lock(&fkc_mu);
	for (struct fkc_obj *o = fkc_objs; o; o = o->next)
		if (o->rh == rh && o->kind == kind) {
			p = o->p;
			break;
		}
	pthread_mutex_unlock(&fkc_mu);
	return p;
}

static void fkc_del(const void *p)
{
	struct fkc_obj **pp, *o = NULL;
	pthread_mutex_lock(&fkc_mu);
	for (pp = &fkc_objs; *pp; pp = &(*pp)->next)
		if ((*pp)->p == p) {
			o = *pp;
			*pp = o->next;
			break;
		}
	pthread_mutex_unlock(&fkc_mu);
	free(o);
}

static struct ibv_pd *fkc_pd_get(uint64_t rh, struct ibv_context *ctx);
static struct ibv_cq_ex *fkc_op_create_cq_ex(struct ibv_context *context, struct ibv_cq_init_attr_ex *attr);

// ---- the connection ----

static __thread int fkc_fd = -1;
static __thread pid_t fkc_fd_pid;
static int fkc_have_owner;
static pthread_key_t fkc_key;
static pthread_once_t fkc_key_once = PTHREAD_ONCE_INIT;

static void fkc_close_conn(void *p)
{
	int fd = (int)(intptr_t)p - 1;
	if (fd >= 0)
		close(fd);
}

static void fkc_make_key(void) { pthread_key_create(&fkc_key, fkc_close_conn); }

static int fkc_rpc(struct fk_hdr *h, const void *in, size_t inlen, void *out, size_t outcap, int *fdout);

static int fkc_conn(void)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct fk_hdr h = { .op = FK_HELLO };
	int fd, owner = 0;
	if (fkc_fd >= 0 && fkc_fd_pid == getpid())
		return 0;
	if (!fk_addr_len)
		return ENOSYS;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return errno;
	memcpy(a.sun_path, fk_addr, fk_addr_len);
	if (connect(fd, (struct sockaddr *)&a, offsetof(struct sockaddr_un, sun_path) + fk_addr_len)) {
		int e = errno;
		close(fd);
		return e == ECONNREFUSED || e == ENOENT ? ENODEV : e;
	}
	// The first connection of the process owns its objects: when it
	// closes (exit, exec), the parent destroys them. It is never closed
	// before; the others close with their thread.
	pthread_mutex_lock(&fkc_mu);
	if (!fkc_have_owner)
		owner = fkc_have_owner = 1;
	pthread_mutex_unlock(&fkc_mu);
	fkc_fd = fd;
	fkc_fd_pid = getpid();
	if (!owner) {
		pthread_once(&fkc_key_once, fkc_make_key);
		pthread_setspecific(fkc_key, (void *)(intptr_t)(fd + 1));
	}
	h.a[0] = owner;
	int e = fkc_rpc(&h, NULL, 0, NULL, 0, NULL);
	if (e) {
		close(fd);
		fkc_fd = -1;
		return e;
	}
	return 0;
}

// fkc_rpc sends h and in, and waits for the answer: h, up to outcap bytes
// in out, a descriptor in *fdout. It returns 0 or the errno of the
// transport (EIO when the parent is gone); the call's own is h->err.
static int fkc_rpc(struct fk_hdr *h, const void *in, size_t inlen, void *out, size_t outcap, int *fdout)
{
	struct iovec iov[2] = { { h, sizeof *h }, { (void *)in, inlen } };
	struct msghdr m = { .msg_iov = iov, .msg_iovlen = 2 };
	char cbuf[CMSG_SPACE(sizeof(int))];
	ssize_t n;
	if (h->op != FK_HELLO) {
		int e = fkc_conn();
		if (e)
			return e;
	}
	h->len = inlen;
	if (sendmsg(fkc_fd, &m, MSG_NOSIGNAL) < 0)
		return EIO;
	iov[1] = (struct iovec){ out, outcap };
	m = (struct msghdr){ .msg_iov = iov, .msg_iovlen = out ? 2 : 1, .msg_control = cbuf,
			     .msg_controllen = sizeof cbuf };
	do
		n = recvmsg(fkc_fd, &m, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < (ssize_t)sizeof *h)
		return EIO;
	if (fdout)
		*fdout = -1;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			int fd;
			memcpy(&fd, CMSG_DATA(c), sizeof fd);
			if (fdout)
				*fdout = fd;
			else
				close(fd);
		}
	return 0;
}

// fkc_call is fkc_rpc with the call's errno: 0 or the errno (set).
static int fkc_call(struct fk_hdr *h, const void *in, size_t inlen, void *out, size_t outcap, int *fdout)
{
	int e = fkc_rpc(h, in, inlen, out, outcap, fdout);
	if (!e)
		e = h->err;
	if (e)
		errno = e;
	return e;
}

// fkc_obj_call is fkc_call of a call on the child's object p of kind,
// which becomes h->a[0] (the parent's object): EINVAL (set) when p is not
// the child's (one of the parent's, said once on stderr).
static int fkc_obj_call(struct fk_hdr *h, int kind, const void *p, const void *in, size_t inlen, void *out,
			size_t outcap)
{
	if (!(h->a[0] = fkc_rh(kind, p))) {
		errno = EINVAL;
		return EINVAL;
	}
	return fkc_call(h, in, inlen, out, outcap, NULL);
}

// fkc_destroy is a call that destroys the child's object p of kind.
static int fkc_destroy(int op, int kind, void *p)
{
	struct fk_hdr h = { .op = op };
	int e = fkc_obj_call(&h, kind, p, NULL, 0, NULL, 0);
	if (!e)
		fkc_del(p);
	return e;
}

#define RET_PTR(e, p) do { if (e) { errno = (e); return NULL; } return (p); } while (0)
#define RET_NEG(e) do { if (e) { errno = (e); return -1; } return 0; } while (0)
#define RET_ERRNO(e) do { if (e) errno = (e); return (e); } while (0)

// ---- the ops of the child's contexts ----

// fkc_raw_poll_cq polls the parent's CQ (an extended CQ's batches, cqex.c).
static int fkc_raw_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	struct fk_hdr h = { .op = FK_POLL_CQ };
	int e;
	if (!(h.a[0] = fkc_rh(FKC_CQ, cq)))
		return -EINVAL;
	if ((size_t)n > FK_MAX / sizeof *wc)
		n = FK_MAX / sizeof *wc;
	h.a[1] = n;
	if ((e = fkc_rpc(&h, NULL, 0, wc, n * sizeof *wc, NULL)))
		return -e;
	return h.ret;
}

// The child's CQs are struct sr_cq, as the parent's (their h and hint
// unused), so that an extended one has cqex.c's polling state. (A CQ
// whose context has these ops is one of the child's: the parent's
// contexts have fork.c's.)
static int fkc_op_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	if (n < 0)
		return -EINVAL;
	if (n == 0)
		return 0;
	if (cq && ((struct sr_cq *)cq)->x)
		return sr_cqx_poll_cq((struct sr_cq *)cq, n, wc);
	return fkc_raw_poll_cq(cq, n, wc);
}

static int fkc_op_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	struct fk_hdr h = { .op = FK_REQ_NOTIFY, .a = { 0, solicited_only } };
	return fkc_obj_call(&h, FKC_CQ, cq, NULL, 0, NULL, 0);
}

static int fkc_op_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	char buf[FK_MAX / 4];
	struct fk_hdr h = { .op = FK_POST_SEND, .a = { fkc_rh(FKC_QP, qp) } };
	if (!h.a[0]) {
		if (bad_wr)
			*bad_wr = wr;
		return EINVAL;
	}
	while (wr) {
		struct ibv_send_wr *first = wr;
		size_t off = 0;
		int n = 0, e;
		for (; wr; wr = wr->next, n++) {
			struct fk_swr w = {
				.wr_id = wr->wr_id, .opcode = wr->opcode, .flags = wr->send_flags, .imm = wr->imm_data,
				.rqpn = wr->wr.ud.remote_qpn, .rqkey = wr->wr.ud.remote_qkey, .num_sge = wr->num_sge,
			};
			size_t need = sizeof w + (wr->num_sge > 0 ? wr->num_sge : 0) * sizeof(struct fk_wr_sge);
			if (wr->num_sge < 0 || (wr->num_sge > 0 && !wr->sg_list) || wr->num_sge > 64 ||
			    (qp->qp_type == IBV_QPT_UD && !(w.ah = fkc_rh(FKC_AH, wr->wr.ud.ah)))) {
				if (n == 0) {
					if (bad_wr)
						*bad_wr = wr;
					return EINVAL;
				}
				break;
			}
			if (off + need > sizeof buf)
				break;
			memcpy(buf + off, &w, sizeof w);
			off += sizeof w;
			for (int i = 0; i < wr->num_sge; i++) {
				struct fk_wr_sge s = { wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey };
				memcpy(buf + off, &s, sizeof s);
				off += sizeof s;
			}
		}
		h.a[1] = n;
		if ((e = fkc_call(&h, buf, off, NULL, 0, NULL))) {
			if (bad_wr) {
				*bad_wr = first;
				for (uint64_t i = 0; i < h.a[0] && (*bad_wr)->next; i++)
					*bad_wr = (*bad_wr)->next;
			}
			return e;
		}
		h.a[0] = fkc_rh(FKC_QP, qp);
	}
	return 0;
}

static int fkc_op_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	char buf[FK_MAX / 4];
	struct fk_hdr h = { .op = FK_POST_RECV, .a = { fkc_rh(FKC_QP, qp) } };
	if (!h.a[0]) {
		if (bad_wr)
			*bad_wr = wr;
		return EINVAL;
	}
	while (wr) {
		struct ibv_recv_wr *first = wr;
		size_t off = 0;
		int n = 0, e;
		for (; wr; wr = wr->next, n++) {
			struct fk_rwr w = { .wr_id = wr->wr_id, .num_sge = wr->num_sge };
			size_t need = sizeof w + (wr->num_sge > 0 ? wr->num_sge : 0) * sizeof(struct fk_wr_sge);
			if (wr->num_sge < 0 || (wr->num_sge > 0 && !wr->sg_list) || wr->num_sge > 64) {
				if (n == 0) {
					if (bad_wr)
						*bad_wr = wr;
					return EINVAL;
				}
				break;
			}
			if (off + need > sizeof buf)
				break;
			memcpy(buf + off, &w, sizeof w);
			off += sizeof w;
			for (int i = 0; i < wr->num_sge; i++) {
				struct fk_wr_sge s = { wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey };
				memcpy(buf + off, &s, sizeof s);
				off += sizeof s;
			}
		}
		h.a[1] = n;
		if ((e = fkc_call(&h, buf, off, NULL, 0, NULL))) {
			if (bad_wr) {
				*bad_wr = first;
				for (uint64_t i = 0; i < h.a[0] && (*bad_wr)->next; i++)
					*bad_wr = (*bad_wr)->next;
			}
			return e;
		}
		h.a[0] = fkc_rh(FKC_QP, qp);
	}
	return 0;
}

static int fkc_op_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr, size_t len)
{
	struct ibv_port_attr full;
	struct fk_hdr h = { .op = FK_QUERY_PORT, .a = { 0, port } };
	int e;
	if (!attr)
		return EINVAL;
	memset(&full, 0, sizeof full);
	if ((e = fkc_obj_call(&h, FKC_CTX, ctx, NULL, 0, &full, sizeof full)))
		return e;
	memcpy(attr, &full, len < sizeof full ? len : sizeof full);
	return 0;
}

static int fkc_op_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	(void)srq;
	if (bad_wr)
		*bad_wr = wr;
	return EOPNOTSUPP;
}

// ---- devices and contexts ----

static struct ibv_device *fkc_dev_of(uint64_t rh, const struct ibv_device *d)
{
	struct fkc_dev *dv = fkc_local(FKC_DEV, rh);
	if (dv)
		return &dv->dev;
	if (!d || !(dv = calloc(1, sizeof *dv)))
		return NULL;
	dv->dev = *d;
	fkc_add(FKC_DEV, rh, &dv->dev);
	return &dv->dev;
}

struct ibv_device **softrdma_child_ibv_get_device_list(int *num_devices)
{
	static char buf[FK_MAX];
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	struct fk_hdr h = { .op = FK_GET_DEVICES };
	size_t each = sizeof(uint64_t) + sizeof(struct ibv_device);
	struct ibv_device **l;
	int e, n;
	pthread_mutex_lock(&mu);
	if ((e = fkc_call(&h, NULL, 0, buf, sizeof buf, NULL))) {
		pthread_mutex_unlock(&mu);
		RET_PTR(e, NULL);
	}
	n = h.ret;
	if (!(l = calloc(n + 1, sizeof *l))) {
		pthread_mutex_unlock(&mu);
		RET_PTR(ENOMEM, NULL);
	}
	for (int i = 0; i < n; i++) {
		uint64_t rh;
		memcpy(&rh, buf + i * each, sizeof rh);
		l[i] = fkc_dev_of(rh, (struct ibv_device *)(buf + i * each + sizeof rh));
	}
	pthread_mutex_unlock(&mu);
	if (num_devices)
		*num_devices = n;
	return l;
}

// fkc_device_info asks the parent for a device's GUID and index (r[0],
// r[1]); an errno.
static int fkc_device_info(struct ibv_device *device, uint64_t r[2])
{
	struct fk_hdr h = { .op = FK_DEVICE_INFO };
	return device ? fkc_obj_call(&h, FKC_DEV, device, NULL, 0, r, 2 * sizeof *r) : EINVAL;
}

__be64 softrdma_child_ibv_get_device_guid(struct ibv_device *device)
{
	uint64_t r[2];
	int e = fkc_device_info(device, r);
	if (e) {
		errno = e;
		return 0;
	}
	return (__be64)r[0];
}

int softrdma_child_ibv_get_device_index(struct ibv_device *device)
{
	uint64_t r[2];
	return fkc_device_info(device, r) ? -1 : (int)r[1];
}

static struct ibv_context *fkc_ctx_of(uint64_t rh, int fd, int ncv, uint64_t dev)
{
	struct fkc_ctx *c;
	struct ibv_context *known = fkc_local(FKC_CTX, rh);
	if (known) {
		if (fd >= 0)
			close(fd);
		return known;
	}
	if (!(c = calloc(1, sizeof *c))) {
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	c->vc.sz = sizeof c->vc;
	c->vc.query_port = fkc_op_query_port;
	c->vc.create_cq_ex = fkc_op_create_cq_ex;
	c->vc.context.device = fkc_local(FKC_DEV, dev);
	if (!c->vc.context.device) {
		// A device the child has not listed: list them.
		struct ibv_device **l = softrdma_child_ibv_get_device_list(NULL);
		free(l);
		c->vc.context.device = fkc_local(FKC_DEV, dev);
	}
	c->vc.context.cmd_fd = -1;
	c->vc.context.async_fd = fd;
	c->vc.context.num_comp_vectors = ncv;
	c->vc.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
	pthread_mutex_init(&c->vc.context.mutex, NULL);
	c->vc.context.ops.poll_cq = fkc_op_poll_cq;
	c->vc.context.ops.req_notify_cq = fkc_op_req_notify_cq;
	c->vc.context.ops.post_send = fkc_op_post_send;
	c->vc.context.ops.post_recv = fkc_op_post_recv;
	c->vc.context.ops.post_srq_recv = fkc_op_post_srq_recv;
	fkc_add(FKC_CTX, rh, &c->vc.context);
	return &c->vc.context;
}

// fkc_ctx_get is the child's context of the parent's rh, asking the
// parent about it when the child has none yet (one rdma_cm made).
static struct ibv_context *fkc_ctx_get(uint64_t rh)
{
	struct ibv_context *c = fkc_local(FKC_CTX, rh);
	struct fk_hdr h = { .op = FK_CTX_INFO, .a = { rh } };
	int fd = -1;
	if (c || !rh)
		return c;
	if (fkc_call(&h, NULL, 0, NULL, 0, &fd))
		return NULL;
	return fkc_ctx_of(rh, fd, h.a[1], h.a[2]);
}

// softrdma_child_rdma_get_devices gives the contexts of the RDMA CM (the
// ones its ids' verbs point to) as the child's own.
struct ibv_context **softrdma_child_rdma_get_devices(int *num_devices)
{
	static uint64_t rh[FK_MAX / sizeof(uint64_t)];
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	struct fk_hdr h = { .op = FK_CM_DEVICES };
	struct ibv_context **l = NULL;
	int e, n;
	pthread_mutex_lock(&mu);
	if ((e = fkc_call(&h, NULL, 0, rh, sizeof rh, NULL)))
		goto out;
	n = h.ret;
	if (!(l = calloc(n + 1, sizeof *l))) {
		e = ENOMEM;
		goto out;
	}
	for (int i = 0; i < n; i++)
		if (!(l[i] = fkc_ctx_get(rh[i]))) {
			free(l);
			l = NULL;
			e = ENODEV;
			goto out;
		}
	if (num_devices)
		*num_devices = n;
out:
	pthread_mutex_unlock(&mu);
	if (e && num_devices)
		*num_devices = 0;
	RET_PTR(e, l);
}

struct ibv_context *softrdma_child_ibv_open_device(struct ibv_device *device)
{
	struct fk_hdr h = { .op = FK_OPEN_DEVICE };
	int fd = -1, e;
	if (!device)
		RET_PTR(ENODEV, NULL);
	if (!(h.a[0] = fkc_rh_quiet(FKC_DEV, device))) {
		// A device of the parent's list: the same device, by name.
		struct ibv_device **l = softrdma_child_ibv_get_device_list(NULL);
		for (int i = 0; l && l[i]; i++)
			if (!strcmp(l[i]->name, device->name))
				h.a[0] = fkc_rh(FKC_DEV, l[i]);
		free(l);
		if (!h.a[0])
			RET_PTR(ENODEV, NULL);
	}
	if ((e = fkc_call(&h, NULL, 0, NULL, 0, &fd)))
		RET_PTR(e, NULL);
	return fkc_ctx_of(h.a[0], fd, h.a[1], h.a[2]);
}

int softrdma_child_ibv_close_device(struct ibv_context *context)
{
	int e = fkc_destroy(FK_CLOSE_DEVICE, FKC_CTX, context);
	if (e)
		return e;
	if (context->async_fd >= 0)
		close(context->async_fd);
	// The struct stays: a program may still hold it (an id's verbs).
	return 0;
}

int softrdma_child_ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
	struct fk_hdr h = { .op = FK_QUERY_DEVICE };
	if (!attr)
		RET_ERRNO(EINVAL);
	return fkc_obj_call(&h, FKC_CTX, context, NULL, 0, attr, sizeof *attr);
}

int softrdma_child_ibv_query_port(struct ibv_context *context, uint8_t port_num, struct _compat_ibv_port_attr *attr)
{
	int e = fkc_op_query_port(context, port_num, (struct ibv_port_attr *)attr, offsetof(struct ibv_port_attr, flags));
	RET_ERRNO(e);
}

int softrdma_child_ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
	struct fk_hdr h = { .op = FK_QUERY_GID, .a = { 0, port_num, index } };
	int e = gid ? fkc_obj_call(&h, FKC_CTX, context, NULL, 0, gid, sizeof *gid) : EINVAL;
	RET_NEG(e);
}

int softrdma_child_ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey)
{
	struct fk_hdr h = { .op = FK_QUERY_PKEY, .a = { 0, port_num, (uint64_t)(uint32_t)index } };
	int e = pkey ? fkc_obj_call(&h, FKC_CTX, context, NULL, 0, pkey, sizeof *pkey) : EINVAL;
	RET_NEG(e);
}

// fkc_gid_entry asks the parent for GID entry index of port (an errno).
static int fkc_gid_entry(struct ibv_context *context, uint32_t port_num, uint32_t index, struct ibv_gid_entry *e)
{
	struct fk_hdr h = { .op = FK_QUERY_GID_EX, .a = { 0, port_num, index } };
	return fkc_obj_call(&h, FKC_CTX, context, NULL, 0, e, sizeof *e);
}

int softrdma_child__ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
				     struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	struct ibv_gid_entry e;
	int r;
	if (!context || !entry || flags || entry_size < sizeof e || port_num > 255)
		return EINVAL;
	memset(&e, 0, sizeof e);
	if ((r = fkc_gid_entry(context, port_num, gid_index, &e)))
		return r;
	memcpy(entry, &e, sizeof e);
	return 0;
}

// softrdma_child__ibv_query_gid_table is the parent's table walk (verbs.c)
// with each query made through the parent.
ssize_t softrdma_child__ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
					    size_t max_entries, uint32_t flags, size_t entry_size)
{
	struct ibv_device_attr da;
	ssize_t n = 0;
	int r;
	if (!context || (!entries && max_entries) || flags || entry_size < sizeof *entries)
		return -EINVAL;
	if ((r = softrdma_child_ibv_query_device(context, &da)))
		return -r;
	for (int port = 1; port <= da.phys_port_cnt; port++) {
		struct ibv_port_attr pa;
		if (fkc_op_query_port(context, port, &pa, sizeof pa))
			continue;
		for (int i = 0; i < pa.gid_tbl_len; i++) {
			struct ibv_gid_entry e;
			memset(&e, 0, sizeof e);
			if (fkc_gid_entry(context, port, i, &e))
				continue; // an empty entry
			if ((size_t)n == max_entries)
				return -EINVAL; // as rdma-core: the table does not fit
			memcpy((char *)entries + n * entry_size, &e, sizeof e);
			n++;
		}
	}
	return n;
}

// ---- PD, MR, AH ----

struct ibv_pd *softrdma_child_ibv_alloc_pd(struct ibv_context *context)
{
	struct fk_hdr h = { .op = FK_ALLOC_PD, .a = { fkc_rh(FKC_CTX, context) } };
	struct ibv_pd *pd;
	int e;
	if (!h.a[0])
		RET_PTR(EINVAL, NULL);
	if ((e = fkc_call(&h, NULL, 0, NULL, 0, NULL)))
		RET_PTR(e, NULL);
	if (!(pd = calloc(1, sizeof *pd)))
		RET_PTR(ENOMEM, NULL);
	pd->context = context;
	fkc_add(FKC_PD, h.a[0], pd);
	return pd;
}

int softrdma_child_ibv_dealloc_pd(struct ibv_pd *pd)
{
	int e = fkc_destroy(FK_DEALLOC_PD, FKC_PD, pd);
	if (!e)
		free(pd);
	return e;
}

struct ibv_mr *softrdma_child_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	struct fk_hdr h = { .op = FK_REG_MR, .a = { fkc_rh(FKC_PD, pd), (uintptr_t)addr, length, access } };
	struct ibv_mr *mr;
	int e;
	if (!h.a[0])
		RET_PTR(EINVAL, NULL);
	if ((e = fkc_call(&h, NULL, 0, NULL, 0, NULL)))
		RET_PTR(e, NULL);
	if (!(mr = calloc(1, sizeof *mr)))
		RET_PTR(ENOMEM, NULL);
	mr->context = pd->context;
	mr->pd = pd;
	mr->addr = addr;
	mr->length = length;
	mr->lkey = h.a[1];
	mr->rkey = h.a[2];
	mr->handle = h.a[3];
	fkc_add(FKC_MR, h.a[0], mr);
	return mr;
}

struct ibv_mr *softrdma_child_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
					       unsigned int access)
{
	if (iova != (uintptr_t)addr)
		RET_PTR(EOPNOTSUPP, NULL);
	return softrdma_child_ibv_reg_mr(pd, addr, length, access);
}

struct ibv_mr *softrdma_child_ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access)
{
	return softrdma_child_ibv_reg_mr_iova2(pd, addr, length, iova, access);
}

int softrdma_child_ibv_dereg_mr(struct ibv_mr *mr)
{
	int e = fkc_destroy(FK_DEREG_MR, FKC_MR, mr);
	if (!e)
		free(mr);
	return e;
}

struct ibv_ah *softrdma_child_ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	struct fk_hdr h = { .op = FK_CREATE_AH, .a = { fkc_rh(FKC_PD, pd) } };
	struct ibv_ah *ah;
	int e;
	if (!h.a[0] || !attr)
		RET_PTR(EINVAL, NULL);
	if ((e = fkc_call(&h, attr, sizeof *attr, NULL, 0, NULL)))
		RET_PTR(e, NULL);
	if (!(ah = calloc(1, sizeof *ah)))
		RET_PTR(ENOMEM, NULL);
	ah->context = pd->context;
	ah->pd = pd;
	fkc_add(FKC_AH, h.a[0], ah);
	return ah;
}

int softrdma_child_ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num, struct ibv_wc *wc,
				       struct ibv_grh *grh, struct ibv_ah_attr *ah_attr)
{
	struct fk_hdr h = { .op = FK_INIT_AH_FROM_WC, .a = { fkc_rh(FKC_CTX, context), port_num, grh != NULL } };
	struct {
		struct ibv_wc wc;
		struct ibv_grh grh;
	} in;
	int e;
	if (!h.a[0] || !wc || !ah_attr)
		RET_NEG(EINVAL);
	memset(&in, 0, sizeof in);
	in.wc = *wc;
	if (grh)
		in.grh = *grh;
	if ((e = fkc_call(&h, &in, sizeof in.wc + (grh ? sizeof in.grh : 0), ah_attr, sizeof *ah_attr, NULL)))
		RET_NEG(e);
	return 0;
}

struct ibv_ah *softrdma_child_ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh,
						    uint8_t port_num)
{
	struct ibv_ah_attr attr;
	if (!pd || !wc || !fkc_rh(FKC_PD, pd))
		RET_PTR(EINVAL, NULL);
	if (softrdma_child_ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr))
		return NULL;
	return softrdma_child_ibv_create_ah(pd, &attr);
}

int softrdma_child_ibv_destroy_ah(struct ibv_ah *ah)
{
	int e = fkc_destroy(FK_DESTROY_AH, FKC_AH, ah);
	if (!e)
		free(ah);
	return e;
}

// ---- CQs and completion channels ----

struct ibv_comp_channel *softrdma_child_ibv_create_comp_channel(struct ibv_context *context)
{
	struct fk_hdr h = { .op = FK_CREATE_COMP_CHANNEL, .a = { fkc_rh(FKC_CTX, context) } };
	struct ibv_comp_channel *ch;
	int fd = -1, e;
	if (!h.a[0])
		RET_PTR(EINVAL, NULL);
	if ((e = fkc_call(&h, NULL, 0, NULL, 0, &fd)))
		RET_PTR(e, NULL);
	if (!(ch = calloc(1, sizeof *ch))) {
		if (fd >= 0)
			close(fd);
		RET_PTR(ENOMEM, NULL);
	}
	ch->context = context;
	ch->fd = fd;
	fkc_add(FKC_CHAN, h.a[0], ch);
	return ch;
}

int softrdma_child_ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	int e = fkc_destroy(FK_DESTROY_COMP_CHANNEL, FKC_CHAN, channel);
	if (!e) {
		if (channel->fd >= 0)
			close(channel->fd);
		free(channel);
	}
	return e;
}

static struct ibv_cq *fkc_cq_new(uint64_t rh, struct ibv_context *ctx, struct ibv_comp_channel *ch, void *cq_context,
				 int cqe)
{
	struct sr_cq *c = sr_cq_alloc(ctx, ch, cq_context, cqe);
	if (!c)
		return NULL;
	fkc_add(FKC_CQ, rh, sr_cq_base(c));
	return sr_cq_base(c);
}

struct ibv_cq *softrdma_child_ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
					    struct ibv_comp_channel *channel, int comp_vector)
{
	struct fk_hdr h = { .op = FK_CREATE_CQ, .a = { fkc_rh(FKC_CTX, context), cqe, fkc_rh(FKC_CHAN, channel),
						       comp_vector } };
	struct ibv_cq *cq;
	int e;
	if (!h.a[0] || (channel && !h.a[2]))
		RET_PTR(EINVAL, NULL);
	if ((e = fkc_call(&h, NULL, 0, NULL, 0, NULL)))
		RET_PTR(e, NULL);
	if (!(cq = fkc_cq_new(h.a[0], context, channel, cq_context, h.a[1])))
		RET_PTR(ENOMEM, NULL);
	return cq;
}

int softrdma_child_ibv_destroy_cq(struct ibv_cq *cq)
{
	int e = fkc_destroy(FK_DESTROY_CQ, FKC_CQ, cq);
	if (!e)
		sr_cq_free((struct sr_cq *)cq);
	return e;
}

// fkc_op_create_cq_ex is the child's ibv_create_cq_ex: the parent makes
// an ibv_create_cq CQ, and cqex.c's polling state is the child's.
static struct ibv_cq_ex *fkc_op_create_cq_ex(struct ibv_context *context, struct ibv_cq_init_attr_ex *attr)
{
	struct ibv_cq *cq;
	int e = sr_cqx_check(context, attr);
	if (e)
		RET_PTR(e, NULL);
	if (!(cq = softrdma_child_ibv_create_cq(context, attr->cqe, attr->cq_context, attr->channel,
						attr->comp_vector)))
		return NULL;
	if ((e = sr_cqx_make((struct sr_cq *)cq, attr, fkc_raw_poll_cq))) {
		softrdma_child_ibv_destroy_cq(cq);
		RET_PTR(e, NULL);
	}
	return &((struct sr_cq *)cq)->cqx;
}

int softrdma_child_ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
	struct fk_hdr h = { .op = FK_GET_CQ_EVENT, .a = { fkc_rh(FKC_CHAN, channel) } };
	struct ibv_cq *c;
	if (!h.a[0] || !cq || !cq_context)
		RET_NEG(EINVAL);
	// O_NONBLOCK on channel->fd is on the parent's file too (the same one).
	if (fkc_call(&h, NULL, 0, NULL, 0, NULL))
		return -1;
	if (!(c = fkc_local(FKC_CQ, h.a[0])))
		RET_NEG(EINVAL);
	*cq = c;
	*cq_context = c->cq_context;
	return 0;
}

void softrdma_child_ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	struct fk_hdr h = { .op = FK_ACK_CQ_EVENTS, .a = { 0, nevents } };
	fkc_obj_call(&h, FKC_CQ, cq, NULL, 0, NULL, 0);
}

// ---- QPs ----

static struct ibv_qp *fkc_qp_of(struct fk_qpinfo *qi, struct ibv_context *ctx, void *qp_context)
{
	struct ibv_qp *qp = fkc_local(FKC_QP, qi->qp);
	if (qp || !qi->qp)
		return qp;
	if (!(qp = calloc(1, sizeof *qp)))
		return NULL;
	qp->context = ctx;
	qp->qp_context = qp_context;
	qp->pd = fkc_pd_get(qi->pd, ctx);
	qp->send_cq = fkc_local(FKC_CQ, qi->send_cq);
	qp->recv_cq = fkc_local(FKC_CQ, qi->recv_cq);
	if (!qp->send_cq && qi->send_cq)
		qp->send_cq = fkc_cq_new(qi->send_cq, ctx, NULL, NULL, 0);
	if (!qp->recv_cq && qi->recv_cq)
		qp->recv_cq = qi->recv_cq == qi->send_cq ? qp->send_cq : fkc_cq_new(qi->recv_cq, ctx, NULL, NULL, 0);
	qp->qp_num = qi->qp_num;
	qp->state = qi->state;
	qp->qp_type = qi->qp_type;
	pthread_mutex_init(&qp->mutex, NULL);
	pthread_cond_init(&qp->cond, NULL);
	fkc_add(FKC_QP, qi->qp, qp);
	return qp;
}

static int fkc_qp_attr(struct ibv_qp_init_attr *in, struct ibv_qp_init_attr *out)
{
	*out = *in;
	out->qp_context = NULL;
	out->send_cq = (struct ibv_cq *)(uintptr_t)fkc_rh(FKC_CQ, in->send_cq);
	out->recv_cq = (struct ibv_cq *)(uintptr_t)fkc_rh(FKC_CQ, in->recv_cq);
	if ((in->send_cq && !out->send_cq) || (in->recv_cq && !out->recv_cq) || in->srq)
		return EINVAL;
	return 0;
}

struct ibv_qp *softrdma_child_ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct fk_hdr h = { .op = FK_CREATE_QP, .a = { fkc_rh(FKC_PD, pd) } };
	struct ibv_qp_init_attr a;
	struct fk_qpinfo qi;
	struct ibv_qp *qp;
	int e;
	if (!h.a[0] || !attr || fkc_qp_attr(attr, &a))
		RET_PTR(EINVAL, NULL);
	if ((e = fkc_call(&h, &a, sizeof a, &qi, sizeof qi, NULL)))
		RET_PTR(e, NULL);
	attr->cap = qi.cap;
	if (!(qp = fkc_qp_of(&qi, pd->context, attr->qp_context)))
		RET_PTR(ENOMEM, NULL);
	return qp;
}

int softrdma_child_ibv_destroy_qp(struct ibv_qp *qp)
{
	int e = fkc_destroy(FK_DESTROY_QP, FKC_QP, qp);
	if (!e)
		free(qp);
	return e;
}

int softrdma_child_ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	struct fk_hdr h = { .op = FK_MODIFY_QP, .a = { 0, attr_mask } };
	int e = attr ? fkc_obj_call(&h, FKC_QP, qp, attr, sizeof *attr, NULL, 0) : EINVAL;
	if (!e)
		qp->state = h.a[0];
	RET_ERRNO(e);
}

int softrdma_child_ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
				struct ibv_qp_init_attr *init_attr)
{
	struct fk_hdr h = { .op = FK_QUERY_QP, .a = { 0, attr_mask } };
	struct fk_qpattr r;
	int e = attr && init_attr ? fkc_obj_call(&h, FKC_QP, qp, NULL, 0, &r, sizeof r) : EINVAL;
	if (e)
		RET_ERRNO(e);
	*attr = r.attr;
	// The parent's pointers become the child's own.
	*init_attr = r.init;
	init_attr->qp_context = qp->qp_context;
	init_attr->send_cq = qp->send_cq;
	init_attr->recv_cq = qp->recv_cq;
	init_attr->srq = NULL;
	qp->state = attr->qp_state;
	return 0;
}

static int fkc_mcast(int op, struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	struct fk_hdr h = { .op = op, .a = { 0, lid } };
	int e = gid ? fkc_obj_call(&h, FKC_QP, qp, gid, sizeof *gid, NULL, 0) : EINVAL;
	RET_ERRNO(e);
}

int softrdma_child_ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	return fkc_mcast(FK_ATTACH_MCAST, qp, gid, lid);
}

int softrdma_child_ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	return fkc_mcast(FK_DETACH_MCAST, qp, gid, lid);
}

// ---- rdma_cm ----

struct rdma_event_channel *softrdma_child_rdma_create_event_channel(void)
{
	struct fk_hdr h = { .op = FK_CREATE_EVENT_CHANNEL };
	struct rdma_event_channel *ch;
	int fd = -1, e;
	if ((e = fkc_call(&h, NULL, 0, NULL, 0, &fd)))
		RET_PTR(e, NULL);
	if (!(ch = calloc(1, sizeof *ch))) {
		if (fd >= 0)
			close(fd);
		RET_PTR(ENOMEM, NULL);
	}
	ch->fd = fd;
	fkc_add(FKC_ECH, h.a[0], ch);
	return ch;
}

void softrdma_child_rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	if (fkc_destroy(FK_DESTROY_EVENT_CHANNEL, FKC_ECH, channel) == 0) {
		if (channel->fd >= 0)
			close(channel->fd);
		free(channel);
	}
}

// fkc_pd_get is the child's PD of the parent's rh, made for the child when
// it has none (the PD rdma_create_qp made for an id).
static struct ibv_pd *fkc_pd_get(uint64_t rh, struct ibv_context *ctx)
{
	struct ibv_pd *pd = fkc_local(FKC_PD, rh);
	if (pd || !rh || !ctx || !(pd = calloc(1, sizeof *pd)))
		return pd;
	pd->context = ctx;
	fkc_add(FKC_PD, rh, pd);
	return pd;
}

// fkc_chan_get is the child's completion channel of the parent's rh,
// made for the child when it has none (one rdma_create_qp made).
static struct ibv_comp_channel *fkc_chan_get(uint64_t rh, struct ibv_context *ctx)
{
	struct ibv_comp_channel *ch = fkc_local(FKC_CHAN, rh);
	struct fk_hdr h = { .op = FK_CHAN_INFO, .a = { rh } };
	int fd = -1;
	if (ch || !rh)
		return ch;
	if (fkc_call(&h, NULL, 0, NULL, 0, &fd))
		return NULL;
	if (!(ch = calloc(1, sizeof *ch))) {
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	ch->context = ctx;
	ch->fd = fd;
	fkc_add(FKC_CHAN, rh, ch);
	return ch;
}

// fkc_port is the port of a, as librdmacm reads it (an AF_IB address's
// is its service ID's low 16 bits).
static __be16 fkc_port(const struct sockaddr *a)
{
	switch (a->sa_family) {
	case AF_INET:
		return ((const struct sockaddr_in *)a)->sin_port;
	case AF_INET6:
		return ((const struct sockaddr_in6 *)a)->sin6_port;
	case AF_IB:
		return htobe16((uint16_t)be64toh(((const struct sockaddr_ib *)a)->sib_sid));
	}
	return 0;
}

// A child's id mirrors its parent's addresses (fkc_id_update): its ports
// are read from them, as librdmacm does, without asking the parent.
__be16 softrdma_child_rdma_get_src_port(struct rdma_cm_id *id)
{
	return id ? fkc_port((struct sockaddr *)&id->route.addr.src_addr) : 0;
}

__be16 softrdma_child_rdma_get_dst_port(struct rdma_cm_id *id)
{
	return id ? fkc_port((struct sockaddr *)&id->route.addr.dst_addr) : 0;
}

// fkc_id_update mirrors the parent's id into the child's.
static void fkc_id_update(struct rdma_cm_id *id, struct fk_idinfo *ii)
{
	if (ii->verbs)
		id->verbs = fkc_ctx_get(ii->verbs);
	if (ii->pd)
		id->pd = fkc_pd_get(ii->pd, id->verbs);
	id->ps = ii->ps;
	id->qp_type = ii->qp_type;
	id->port_num = ii->port_num;
	id->route.addr = ii->addr;
	if (ii->qp.qp && id->verbs) {
		id->qp = fkc_qp_of(&ii->qp, id->verbs, id->qp ? id->qp->qp_context : NULL);
		if (id->qp) {
			id->send_cq = id->qp->send_cq;
			id->recv_cq = id->qp->recv_cq;
			// The CQs rdma_create_qp made: their channels, and the id
			// as their context (as librdmacm's).
			if (ii->scq_ch && !id->send_cq_channel)
				id->send_cq_channel = fkc_chan_get(ii->scq_ch, id->verbs);
			if (ii->rcq_ch && !id->recv_cq_channel)
				id->recv_cq_channel = ii->rcq_ch == ii->scq_ch ? id->send_cq_channel
									       : fkc_chan_get(ii->rcq_ch, id->verbs);
			if (id->send_cq && ii->scq_ch && !id->send_cq->channel) {
				id->send_cq->channel = id->send_cq_channel;
				id->send_cq->cq_context = id;
			}
			if (id->recv_cq && ii->rcq_ch && !id->recv_cq->channel) {
				id->recv_cq->channel = id->recv_cq_channel;
				id->recv_cq->cq_context = id;
			}
		}
	} else if (!ii->qp.qp) {
		id->qp = NULL;
	}
}

int softrdma_child_rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
				  enum rdma_port_space ps)
{
	struct fk_hdr h = { .op = FK_CREATE_ID, .a = { fkc_rh(FKC_ECH, channel), ps } };
	struct fk_idinfo ii;
	struct rdma_cm_id *c;
	int e;
	// Without a channel the id is a synchronous one (its calls wait in
	// the parent for their events).
	if (!id || (channel && !h.a[0]))
		RET_NEG(EINVAL);
	if ((e = fkc_call(&h, NULL, 0, &ii, sizeof ii, NULL)))
		RET_NEG(e);
	if (!(c = calloc(1, sizeof *c)))
		RET_NEG(ENOMEM);
	c->channel = channel;
	c->context = context;
	fkc_id_update(c, &ii);
	fkc_add(FKC_ID, ii.id, c);
	*id = c;
	return 0;
}

int softrdma_child_rdma_destroy_id(struct rdma_cm_id *id)
{
	int e = fkc_destroy(FK_DESTROY_ID, FKC_ID, id);
	if (e)
		RET_NEG(e);
	if (id->qp)
		fkc_del(id->qp);
	free(id);
	return 0;
}

static size_t fkc_salen(const struct sockaddr *sa)
{
	if (!sa)
		return 0;
	switch (sa->sa_family) {
	case AF_INET: return sizeof(struct sockaddr_in);
	case AF_INET6: return sizeof(struct sockaddr_in6);
	case AF_IB: return sizeof(struct sockaddr_ib);
	}
	return sizeof(struct sockaddr);
}

static int fkc_id_call5(int op, struct rdma_cm_id *id, const struct sockaddr *s0, const struct sockaddr *s1,
			uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4);

// fkc_id_call runs op on id with the addresses s0 and s1 (each in a
// struct sockaddr_storage of the request) and mirrors the id after.
static int fkc_id_call(int op, struct rdma_cm_id *id, const struct sockaddr *s0, const struct sockaddr *s1,
		       uint64_t a1, uint64_t a2)
{
	return fkc_id_call5(op, id, s0, s1, a1, a2, 0, 0);
}

int softrdma_child_rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval, size_t optlen)
{
	struct fk_hdr h = { .op = FK_SET_OPTION, .a = { 0, level, optname } };
	int e = (!optval && optlen) || optlen > FK_MAX ? EINVAL : fkc_obj_call(&h, FKC_ID, id, optval, optlen, NULL, 0);
	RET_NEG(e);
}

int softrdma_child_rdma_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *attr, void *context)
{
	if (!attr || !attr->addr)
		RET_NEG(EINVAL);
	return fkc_id_call5(FK_JOIN, id, attr->addr, NULL, (uintptr_t)context, attr->comp_mask, attr->join_flags, 1);
}

static int fkc_id_call5(int op, struct rdma_cm_id *id, const struct sockaddr *s0, const struct sockaddr *s1,
			uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4)
{
	struct fk_hdr h = { .op = op, .a = { fkc_rh(FKC_ID, id), a1, a2, a3, a4 } };
	struct sockaddr_storage s[2];
	struct fk_idinfo ii;
	int e;
	if (!h.a[0])
		RET_NEG(EINVAL);
	memset(s, 0, sizeof s);
	if (s0)
		memcpy(&s[0], s0, fkc_salen(s0));
	if (s1)
		memcpy(&s[1], s1, fkc_salen(s1));
	if ((e = fkc_call(&h, s, s1 ? sizeof s : sizeof s[0], &ii, sizeof ii, NULL)))
		RET_NEG(e);
	fkc_id_update(id, &ii);
	return 0;
}

// fkc_conn_call runs a UD connection call (FK_CONNECT, FK_ACCEPT) with its
// struct rdma_conn_param (NULL: none) and mirrors the id after.
static int fkc_conn_call(int op, struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	struct fk_hdr h = { .op = op, .a = { fkc_rh(FKC_ID, id) } };
	struct {
		struct fk_connp fc;
		char priv[256];
	} in;
	struct fk_idinfo ii;
	int e;
	if (!h.a[0])
		RET_NEG(EINVAL);
	memset(&in, 0, sizeof in);
	if (p) {
		in.fc.has = 1;
		in.fc.qp_num = p->qp_num;
		in.fc.responder_resources = p->responder_resources;
		in.fc.initiator_depth = p->initiator_depth;
		in.fc.flow_control = p->flow_control;
		in.fc.retry_count = p->retry_count;
		in.fc.rnr_retry_count = p->rnr_retry_count;
		in.fc.srq = p->srq;
		if (p->private_data && p->private_data_len) {
			in.fc.private_data_len = p->private_data_len;
			memcpy(in.priv, p->private_data, p->private_data_len);
		}
	}
	if ((e = fkc_call(&h, &in, sizeof in.fc + in.fc.private_data_len, &ii, sizeof ii, NULL)))
		RET_NEG(e);
	fkc_id_update(id, &ii);
	return 0;
}

int softrdma_child_rdma_listen(struct rdma_cm_id *id, int backlog)
{
	return fkc_id_call(FK_LISTEN, id, NULL, NULL, (uint64_t)(uint32_t)backlog, 0);
}

int softrdma_child_rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	return fkc_conn_call(FK_CONNECT, id, conn_param);
}

int softrdma_child_rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	return fkc_conn_call(FK_ACCEPT, id, conn_param);
}

int softrdma_child_rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	struct fk_hdr h = { .op = FK_REJECT, .a = { fkc_rh(FKC_ID, id), private_data ? private_data_len : 0 } };
	struct fk_idinfo ii;
	int e;
	if (!h.a[0])
		RET_NEG(EINVAL);
	if ((e = fkc_call(&h, private_data, h.a[1], &ii, sizeof ii, NULL)))
		RET_NEG(e);
	fkc_id_update(id, &ii);
	return 0;
}

int softrdma_child_rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	if (!addr)
		RET_NEG(EINVAL);
	return fkc_id_call(FK_BIND_ADDR, id, addr, NULL, 0, 0);
}

int softrdma_child_rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr,
				     int timeout_ms)
{
	if (!dst_addr)
		RET_NEG(EINVAL);
	return fkc_id_call(FK_RESOLVE_ADDR, id, src_addr, dst_addr, timeout_ms, src_addr != NULL);
}

int softrdma_child_rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	return fkc_id_call(FK_RESOLVE_ROUTE, id, NULL, NULL, timeout_ms, 0);
}

int softrdma_child_rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
	if (!addr)
		RET_NEG(EINVAL);
	// The context comes back in the join's event as the parent's: the
	// child's pointer travels as a number.
	return fkc_id_call(FK_JOIN, id, addr, NULL, (uintptr_t)context, 0);
}

int softrdma_child_rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
	if (!addr)
		RET_NEG(EINVAL);
	return fkc_id_call(FK_LEAVE, id, addr, NULL, 0, 0);
}

int softrdma_child_rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct fk_hdr h = { .op = FK_CM_CREATE_QP, .a = { fkc_rh(FKC_ID, id), fkc_rh(FKC_PD, pd) } };
	struct ibv_qp_init_attr a;
	struct fk_qpinfo qi;
	int e;
	if (!h.a[0] || !attr || (pd && !h.a[1]) || fkc_qp_attr(attr, &a))
		RET_NEG(EINVAL);
	if ((e = fkc_call(&h, &a, sizeof a, &qi, sizeof qi, NULL)))
		RET_NEG(e);
	attr->cap = qi.cap;
	if (!id->verbs || !(id->qp = fkc_qp_of(&qi, id->verbs, attr->qp_context)))
		RET_NEG(ENOMEM);
	id->send_cq = id->qp->send_cq;
	id->recv_cq = id->qp->recv_cq;
	if (!id->pd)
		id->pd = id->qp->pd;
	return 0;
}

void softrdma_child_rdma_destroy_qp(struct rdma_cm_id *id)
{
	struct fk_hdr h = { .op = FK_CM_DESTROY_QP, .a = { fkc_rh(FKC_ID, id) } };
	if (!h.a[0] || fkc_call(&h, NULL, 0, NULL, 0, NULL))
		return;
	if (id->qp) {
		fkc_del(id->qp);
		free(id->qp);
		id->qp = NULL;
	}
}

int softrdma_child_rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
	struct fk_hdr h = { .op = FK_GET_CM_EVENT, .a = { fkc_rh(FKC_ECH, channel) } };
	struct {
		struct fk_event fe;
		char priv[256];
	} r;
	struct fkc_ev *ev;
	int e;
	if (!h.a[0] || !event)
		RET_NEG(EINVAL);
	memset(&r, 0, sizeof r);
	if ((e = fkc_call(&h, NULL, 0, &r, sizeof r, NULL)))
		RET_NEG(e);
	if (!(ev = calloc(1, sizeof *ev)))
		RET_NEG(ENOMEM);
	ev->rh = r.fe.ev;
	ev->ev.id = fkc_local(FKC_ID, r.fe.id);
	ev->ev.listen_id = fkc_local(FKC_ID, r.fe.listen_id);
	if (!ev->ev.id && r.fe.event == RDMA_CM_EVENT_CONNECT_REQUEST && ev->ev.listen_id) {
		// A new id, as librdmacm's ucma_process_conn_req makes it: the
		// listening id's channel and context.
		struct rdma_cm_id *c = calloc(1, sizeof *c);
		if (c) {
			c->channel = ev->ev.listen_id->channel;
			c->context = ev->ev.listen_id->context;
			fkc_add(FKC_ID, r.fe.id, c);
			ev->ev.id = c;
		}
	}
	ev->ev.event = r.fe.event;
	ev->ev.status = r.fe.status;
	ev->ev.param.ud = r.fe.ud;
	if (r.fe.ud.private_data_len && r.fe.ud.private_data) {
		size_t n = r.fe.ud.private_data_len < sizeof ev->priv ? r.fe.ud.private_data_len : sizeof ev->priv;
		memcpy(ev->priv, r.priv, n);
		ev->ev.param.ud.private_data = ev->priv;
	}
	if (ev->ev.id)
		fkc_id_update(ev->ev.id, &r.fe.info);
	fkc_add(FKC_EV, r.fe.ev, &ev->ev);
	*event = &ev->ev;
	return 0;
}

int softrdma_child_rdma_ack_cm_event(struct rdma_cm_event *event)
{
	int e = fkc_destroy(FK_ACK_CM_EVENT, FKC_EV, event);
	if (e)
		RET_NEG(e);
	free(event);
	return 0;
}

int softrdma_child_rdma_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints,
				    struct rdma_addrinfo **res)
{
	char in[4096], out[8192];
	struct fk_hdr h = { .op = FK_GETADDRINFO, .a = { node != NULL, service != NULL, hints != NULL } };
	struct rdma_addrinfo *head = NULL, **tail = &head;
	size_t off = 0;
	char *p, *end;
	int e;
	if (!res)
		RET_NEG(EINVAL);
	if ((node && strlen(node) > 1024) || (service && strlen(service) > 1024))
		RET_NEG(EINVAL);
	if (node)
		off += strlen(strcpy(in + off, node)) + 1;
	if (service)
		off += strlen(strcpy(in + off, service)) + 1;
	if (hints) {
		// The hints' addresses follow them (their lengths in them).
		struct rdma_addrinfo hc = *hints;
		if (!hc.ai_src_addr || hc.ai_src_len > sizeof(struct sockaddr_storage))
			hc.ai_src_len = 0;
		if (!hc.ai_dst_addr || hc.ai_dst_len > sizeof(struct sockaddr_storage))
			hc.ai_dst_len = 0;
		memcpy(in + off, &hc, sizeof hc);
		off += sizeof hc;
		memcpy(in + off, hints->ai_src_addr, hc.ai_src_len), off += hc.ai_src_len;
		memcpy(in + off, hints->ai_dst_addr, hc.ai_dst_len), off += hc.ai_dst_len;
	}
	if ((e = fkc_rpc(&h, in, off, out, sizeof out, NULL)))
		RET_NEG(e);
	if (h.ret) {
		errno = h.err;
		return h.ret;
	}
	for (p = out, end = out + h.len; p + sizeof(struct fk_ai) <= end;) {
		struct fk_ai ai;
		struct rdma_addrinfo *r = calloc(1, sizeof *r);
		memcpy(&ai, p, sizeof ai);
		p += sizeof ai;
		if (!r)
			break;
		r->ai_flags = ai.flags;
		r->ai_family = ai.family;
		r->ai_qp_type = ai.qp_type;
		r->ai_port_space = ai.port_space;
		if (ai.src_len && (r->ai_src_addr = malloc(ai.src_len))) {
			memcpy(r->ai_src_addr, p, ai.src_len);
			r->ai_src_len = ai.src_len;
		}
		p += ai.src_len;
		if (ai.dst_len && (r->ai_dst_addr = malloc(ai.dst_len))) {
			memcpy(r->ai_dst_addr, p, ai.dst_len);
			r->ai_dst_len = ai.dst_len;
		}
		p += ai.dst_len;
		if (ai.src_canon_len)
			r->ai_src_canonname = strndup(p, ai.src_canon_len);
		p += ai.src_canon_len;
		if (ai.dst_canon_len)
			r->ai_dst_canonname = strndup(p, ai.dst_canon_len);
		p += ai.dst_canon_len;
		*tail = r;
		tail = &r->ai_next;
	}
	*res = head;
	return 0;
}

// softrdma_child_nop is one round trip to the parent (the latency test).
int softrdma_child_nop(void)
{
	struct fk_hdr h = { .op = FK_NOP };
	return fkc_call(&h, NULL, 0, NULL, 0, NULL);
}

// sr_forkchild_reset runs in the child of a fork() of a child: the objects
// it inherited are its parent's (they give EINVAL), and it connects anew.
void sr_forkchild_reset(void (*fail_ctx)(struct ibv_context *))
{
	struct fkc_obj *o = fkc_objs;
	pthread_mutex_init(&fkc_mu, NULL);
	fkc_objs = NULL;
	fkc_have_owner = 0;
	fkc_fd = -1;
	for (; o; o = o->next)
		if (o->kind == FKC_CTX)
			fail_ctx(o->p);
}

// rdma_create_ep in a child, as softrdma's (rdmacm.c) and librdmacm's: a
// synchronous id, bound (RAI_PASSIVE) or resolved to res's destination and
// route (2 s each), then with qp_init_attr the QP; a failed step destroys
// the endpoint.
int softrdma_child_rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd,
				  struct ibv_qp_init_attr *qp_init_attr)
{
	struct rdma_cm_id *cm = NULL;
	int e;
	if (!id || !res)
		RET_NEG(EINVAL);
	if (pd && !fkc_rh(FKC_PD, pd))
		RET_NEG(EINVAL);
	if (softrdma_child_rdma_create_id(NULL, &cm, NULL, res->ai_port_space))
		return -1;
	if (res->ai_flags & RAI_PASSIVE) {
		if (softrdma_child_rdma_bind_addr(cm, res->ai_src_addr))
			goto fail;
		cm->pd = pd;
	} else {
		if (softrdma_child_rdma_resolve_addr(cm, res->ai_src_addr, res->ai_dst_addr, 2000) ||
		    softrdma_child_rdma_resolve_route(cm, 2000))
			goto fail;
		if (qp_init_attr) {
			qp_init_attr->qp_type = res->ai_qp_type;
			if (softrdma_child_rdma_create_qp(cm, pd, qp_init_attr))
				goto fail;
		}
	}
	*id = cm;
	return 0;
fail:
	e = errno;
	if (cm->qp)
		softrdma_child_rdma_destroy_qp(cm);
	softrdma_child_rdma_destroy_id(cm);
	RET_NEG(e);
}

void softrdma_child_rdma_destroy_ep(struct rdma_cm_id *id)
{
	if (!id || !fkc_rh(FKC_ID, id))
		return;
	if (id->qp)
		softrdma_child_rdma_destroy_qp(id);
	softrdma_child_rdma_destroy_id(id);
}
