//go:build capi

// forkserve.c: the parent's side of a child of fork() (see fork.c).
//
// At its first fork() the process listens on an abstract unix socket
// (SOCK_SEQPACKET) and a thread accepts on it; each connection of a child
// (or grandchild: only descendants are served) gets a thread that runs the
// child's calls with the parent's softrdma, on objects of the child's own:
// the objects a child makes are kept per child process and destroyed when
// its first connection closes (the child exited or exec'd). Registered
// memory of the child is mirrored by a buffer of the parent's (the MR
// softrdma sees): a send reads the child's memory into it
// (process_vm_readv) before it is posted, a receive's completion writes
// what arrived into the child's memory (process_vm_writev) before
// ibv_poll_cq returns it to the child. The descriptors of channels
// (completion, CM event) and of a context's async events are the
// parent's, handed to the child (SCM_RIGHTS): they are readable in the
// child when they are in the parent.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>
#include "capi.h"
#include "forkrpc.h"

#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

#define SR_DECL(name) extern __typeof__(name) softrdma_##name
SR_DECL(ibv_get_device_list);
SR_DECL(ibv_free_device_list);
SR_DECL(ibv_open_device);
SR_DECL(ibv_close_device);
SR_DECL(ibv_query_device);
SR_DECL(ibv_query_gid);
SR_DECL(ibv_alloc_pd);
SR_DECL(ibv_dealloc_pd);
SR_DECL(ibv_reg_mr);
SR_DECL(ibv_dereg_mr);
SR_DECL(ibv_create_comp_channel);
SR_DECL(ibv_destroy_comp_channel);
SR_DECL(ibv_create_cq);
SR_DECL(ibv_destroy_cq);
SR_DECL(ibv_get_cq_event);
SR_DECL(ibv_ack_cq_events);
SR_DECL(ibv_create_ah);
SR_DECL(ibv_init_ah_from_wc);
SR_DECL(ibv_destroy_ah);
SR_DECL(ibv_create_qp);
SR_DECL(ibv_destroy_qp);
SR_DECL(ibv_modify_qp);
SR_DECL(ibv_query_qp);
SR_DECL(ibv_query_pkey);
SR_DECL(_ibv_query_gid_ex);
SR_DECL(ibv_get_device_guid);
SR_DECL(ibv_get_device_index);
SR_DECL(rdma_get_devices);
SR_DECL(rdma_free_devices);
SR_DECL(ibv_attach_mcast);
SR_DECL(ibv_detach_mcast);
SR_DECL(rdma_set_option);
SR_DECL(rdma_create_event_channel);
SR_DECL(rdma_destroy_event_channel);
SR_DECL(rdma_create_id);
SR_DECL(rdma_destroy_id);
SR_DECL(rdma_bind_addr);
SR_DECL(rdma_resolve_addr);
SR_DECL(rdma_resolve_route);
SR_DECL(rdma_create_qp);
SR_DECL(rdma_destroy_qp);
SR_DECL(rdma_get_cm_event);
SR_DECL(rdma_ack_cm_event);
SR_DECL(rdma_join_multicast);
SR_DECL(rdma_join_multicast_ex);
SR_DECL(rdma_leave_multicast);
SR_DECL(rdma_listen);
SR_DECL(rdma_connect);
SR_DECL(rdma_accept);
SR_DECL(rdma_reject);
SR_DECL(rdma_getaddrinfo);
SR_DECL(rdma_freeaddrinfo);

// fk_addr is the listening socket's abstract name (sun_path[0] is NUL);
// a child inherits it.
char fk_addr[64];
int fk_addr_len;

// ---- what a child owns ----

// FKO_EV and FKO_CQEV are events the child has not acknowledged: they are
// acknowledged first when the child is gone (destroying an id or a CQ
// waits for its events' acknowledgements).
enum { FKO_CTX = 1, FKO_PD, FKO_MR, FKO_CHAN, FKO_CQ, FKO_QP, FKO_CMQP, FKO_AH, FKO_ECH, FKO_ID, FKO_EV, FKO_CQEV };

struct fk_own {
	struct fk_own *next;
	int type;
	void *p;
	// FKO_MR
	uint64_t caddr;
	size_t len;
	void *shadow;
	uint32_t lkey;
};

// A receive's token: the request's wr_id and where its data goes in the child.
struct fk_rtok {
	struct fk_rtok *hnext;
	uint64_t wr_id;
	int n;
	struct { uint64_t caddr; char *saddr; uint32_t len; } sg[];
};

#define FK_NBUCKET 1024

struct fk_group {
	struct fk_group *next;
	pid_t pid;
	int refs;
	int dead; // the owner's connection closed: the child exited or exec'd
	pthread_mutex_t mu;
	struct fk_own *own; // newest first
	struct fk_rtok *tok[FK_NBUCKET];
};

static pthread_mutex_t fk_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fk_group *fk_groups;

static struct fk_group *fk_group_get(pid_t pid)
{
	struct fk_group *g;
	pthread_mutex_lock(&fk_mu);
	for (g = fk_groups; g && (g->pid != pid || g->dead); g = g->next)
		;
	if (!g && (g = calloc(1, sizeof *g))) {
		g->pid = pid;
		pthread_mutex_init(&g->mu, NULL);
		g->next = fk_groups;
		fk_groups = g;
	}
	if (g)
		g->refs++;
	pthread_mutex_unlock(&fk_mu);
	return g;
}

static struct fk_own *fk_own_add(struct fk_group *g, int type, void *p)
{
	struct fk_own *o = calloc(1, sizeof *o);
	if (!o)
		return NULL;
	o->type = type;
	o->p = p;
	pthread_mutex_lock(&g->mu);
	o->next = g->own;
	g->own = o;
	pthread_mutex_unlock(&g->mu);
	return o;
}

// fk_own_del forgets p (destroyed by the child) and returns its record.
static struct fk_own *fk_own_take(struct fk_group *g, void *p)
{
	struct fk_own **pp, *o = NULL;
	pthread_mutex_lock(&g->mu);
	for (pp = &g->own; *pp; pp = &(*pp)->next)
		if ((*pp)->p == p) {
			o = *pp;
			*pp = o->next;
			break;
		}
	pthread_mutex_unlock(&g->mu);
	return o;
}

// fk_owns_as tells whether p is the child's object of type (any: 0).
static int fk_owns_as(struct fk_group *g, void *p, int type)
{
	int ok = 0;
	pthread_mutex_lock(&g->mu);
	for (struct fk_own *o = g->own; o; o = o->next)
		if (o->p == p && (!type || o->type == type)) {
			ok = 1;
			break;
		}
	pthread_mutex_unlock(&g->mu);
	return ok;
}

static int fk_owns(struct fk_group *g, void *p) { return fk_owns_as(g, p, 0); }

// fk_owns_qp tells whether qp is the child's: made with ibv_create_qp,
// or with rdma_create_qp on an id of the child's.
static int fk_owns_qp(struct fk_group *g, struct ibv_qp *qp)
{
	int ok = 0;
	pthread_mutex_lock(&g->mu);
	for (struct fk_own *o = g->own; o && !ok; o = o->next)
		ok = (o->type == FKO_QP && o->p == qp) ||
		     (o->type == FKO_CMQP && ((struct rdma_cm_id *)o->p)->qp == qp);
	pthread_mutex_unlock(&g->mu);
	return qp && ok;
}

static void fk_destroy(struct fk_own *o)
{
	switch (o->type) {
	case FKO_AH: softrdma_ibv_destroy_ah(o->p); break;
	case FKO_QP: softrdma_ibv_destroy_qp(o->p); break;
	case FKO_CMQP: softrdma_rdma_destroy_qp(o->p); break;
	case FKO_ID: softrdma_rdma_destroy_id(o->p); break;
	case FKO_MR:
		softrdma_ibv_dereg_mr(o->p);
		munmap(o->shadow, o->len ? o->len : 1);
		break;
	case FKO_CQ: softrdma_ibv_destroy_cq(o->p); break;
	case FKO_CHAN: softrdma_ibv_destroy_comp_channel(o->p); break;
	case FKO_PD: softrdma_ibv_dealloc_pd(o->p); break;
	case FKO_ECH: softrdma_rdma_destroy_event_channel(o->p); break;
	case FKO_CTX: softrdma_ibv_close_device(o->p); break;
	}
	free(o);
}

static void fk_group_put(struct fk_group *g, int owner)
{
	struct fk_group **pp;
	if (owner) {
		// The child is gone (or exec'd): what it made goes, newest first.
		struct fk_own *o;
		pthread_mutex_lock(&g->mu);
		o = g->own;
		g->own = NULL;
		pthread_mutex_unlock(&g->mu);
		for (struct fk_own **pp = &o; *pp;) {
			struct fk_own *e = *pp;
			if (e->type != FKO_EV && e->type != FKO_CQEV) {
				pp = &e->next;
				continue;
			}
			*pp = e->next;
			if (e->type == FKO_EV)
				softrdma_rdma_ack_cm_event(e->p);
			else
				softrdma_ibv_ack_cq_events(e->p, 1);
			free(e);
		}
		while (o) {
			struct fk_own *n = o->next;
			fk_destroy(o);
			o = n;
		}
	}
	pthread_mutex_lock(&fk_mu);
	g->refs--;
	if (owner)
		g->dead = 1;
	if (g->refs == 0 && g->dead) {
		for (pp = &fk_groups; *pp; pp = &(*pp)->next)
			if (*pp == g) {
				*pp = g->next;
				break;
			}
		for (int i = 0; i < FK_NBUCKET; i++)
			while (g->tok[i]) {
				struct fk_rtok *t = g->tok[i];
				g->tok[i] = t->hnext;
				free(t);
			}
		pthread_mutex_unlock(&fk_mu);
		pthread_mutex_destroy(&g->mu);
		free(g);
		return;
	}
	pthread_mutex_unlock(&fk_mu);
}

// fk_mr_by_lkey finds the child's MR of lkey; g->mu is held.
static struct fk_own *fk_mr_by_lkey(struct fk_group *g, uint32_t lkey)
{
	for (struct fk_own *o = g->own; o; o = o->next)
		if (o->type == FKO_MR && o->lkey == lkey)
			return o;
	return NULL;
}

// ---- one connection ----

struct fk_conn {
	int fd;
	pid_t pid;
	int owner;
	struct fk_group *g;
	struct fk_hdr h;
	char in[FK_MAX];
	char out[FK_MAX];
	int outfd;
};

static int fk_is_descendant(pid_t pid)
{
	pid_t me = getpid();
	for (int depth = 0; pid > 1 && depth < 64; depth++) {
		char path[64], buf[512], *p;
		int ppid;
		FILE *f;
		snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
		if (!(f = fopen(path, "re")))
			return 0;
		p = fgets(buf, sizeof buf, f);
		fclose(f);
		if (!p || !(p = strrchr(buf, ')')) || sscanf(p + 1, " %*c %d", &ppid) != 1)
			return 0;
		if (ppid == me)
			return 1;
		pid = ppid;
	}
	return 0;
}

static int fk_read_child(struct fk_conn *c, void *dst, uint64_t src, size_t n)
{
	struct iovec l = { dst, n }, r = { (void *)(uintptr_t)src, n };
	if (n == 0)
		return 0;
	return process_vm_readv(c->pid, &l, 1, &r, 1, 0) == (ssize_t)n ? 0 : EFAULT;
}

static int fk_write_child(struct fk_conn *c, uint64_t dst, const void *src, size_t n)
{
	struct iovec l = { (void *)src, n }, r = { (void *)(uintptr_t)dst, n };
	if (n == 0)
		return 0;
	return process_vm_writev(c->pid, &l, 1, &r, 1, 0) == (ssize_t)n ? 0 : EFAULT;
}

static void fk_qpinfo_of(struct fk_qpinfo *qi, struct ibv_qp *qp, struct ibv_qp_cap *cap)
{
	memset(qi, 0, sizeof *qi);
	if (!qp)
		return;
	qi->qp = (uintptr_t)qp;
	qi->pd = (uintptr_t)qp->pd;
	qi->send_cq = (uintptr_t)qp->send_cq;
	qi->recv_cq = (uintptr_t)qp->recv_cq;
	qi->qp_num = qp->qp_num;
	qi->state = qp->state;
	qi->qp_type = qp->qp_type;
	if (cap)
		qi->cap = *cap;
}

static void fk_idinfo_of(struct fk_idinfo *ii, struct rdma_cm_id *id)
{
	memset(ii, 0, sizeof *ii);
	if (!id)
		return;
	ii->id = (uintptr_t)id;
	ii->verbs = (uintptr_t)id->verbs;
	ii->pd = (uintptr_t)id->pd;
	fk_qpinfo_of(&ii->qp, id->qp, NULL);
	ii->scq_ch = (uintptr_t)id->send_cq_channel;
	ii->rcq_ch = (uintptr_t)id->recv_cq_channel;
	ii->ps = id->ps;
	ii->qp_type = id->qp_type;
	ii->port_num = id->port_num;
	ii->addr = id->route.addr;
}

static void *fk_p(uint64_t h) { return (void *)(uintptr_t)h; }

// fk_sge maps the child's gather list onto the shadows of its MRs: for a
// send it copies the child's bytes into them first. Inline data outside
// any MR is copied into a buffer of *tmp (freed by the caller).
static int fk_sges(struct fk_conn *c, struct fk_wr_sge *in, int n, struct ibv_sge *out, int send, int inl,
		   char **tmp)
{
	for (int i = 0; i < n; i++) {
		struct fk_own *m;
		uint64_t caddr = 0;
		size_t mlen = 0;
		char *shadow = NULL;
		pthread_mutex_lock(&c->g->mu);
		if ((m = fk_mr_by_lkey(c->g, in[i].lkey))) {
			caddr = m->caddr;
			mlen = m->len;
			shadow = m->shadow;
		}
		pthread_mutex_unlock(&c->g->mu);
		out[i].length = in[i].length;
		out[i].lkey = in[i].lkey;
		if (shadow && in[i].addr >= caddr && in[i].addr + in[i].length <= caddr + mlen) {
			char *s = shadow + (in[i].addr - caddr);
			out[i].addr = (uintptr_t)s;
			if (send && fk_read_child(c, s, in[i].addr, in[i].length))
				return EFAULT;
		} else if (send && inl) {
			char *b = malloc(in[i].length ? in[i].length : 1);
			if (!b)
				return ENOMEM;
			b[0] = 0;
			tmp[i] = b;
			out[i].addr = (uintptr_t)b;
			if (fk_read_child(c, b, in[i].addr, in[i].length))
				return EFAULT;
		} else {
			return EINVAL;
		}
	}
	return 0;
}

// fk_call runs one request; its results go in c->h, c->out and c->outfd.
static void fk_call(struct fk_conn *c)
{
	struct fk_hdr *h = &c->h;
	uint64_t *a = h->a;
	int e = 0;
	uint32_t len = h->len;
	h->len = 0;
	h->ret = 0;
	c->outfd = -1;
#define FAIL(x) do { e = (x); goto out; } while (0)
#define ERRNO_OR(x) (errno ? errno : (x))
	switch (h->op) {
	case FK_NOP:
		break;
	case FK_GET_DEVICES: {
		int n = 0;
		struct ibv_device **l = softrdma_ibv_get_device_list(&n);
		size_t each = sizeof(uint64_t) + sizeof(struct ibv_device);
		if (!l)
			FAIL(ERRNO_OR(ENODEV));
		if ((size_t)n * each > FK_MAX)
			n = FK_MAX / each;
		for (int i = 0; i < n; i++) {
			uint64_t p = (uintptr_t)l[i];
			memcpy(c->out + i * each, &p, sizeof p);
			memcpy(c->out + i * each + sizeof p, l[i], sizeof *l[i]);
		}
		softrdma_ibv_free_device_list(l);
		h->ret = n;
		h->len = n * each;
		break;
	}
	case FK_OPEN_DEVICE: {
		struct ibv_context *ctx = softrdma_ibv_open_device(fk_p(a[0]));
		if (!ctx)
			FAIL(ERRNO_OR(ENODEV));
		fk_own_add(c->g, FKO_CTX, ctx);
		a[0] = (uintptr_t)ctx;
		goto ctxinfo;
	}
	case FK_CTX_INFO: {
		struct ibv_context *ctx;
	ctxinfo:
		ctx = fk_p(a[0]);
		a[1] = ctx->num_comp_vectors;
		a[2] = (uintptr_t)ctx->device;
		c->outfd = ctx->async_fd;
		break;
	}
	case FK_CHAN_INFO:
		c->outfd = ((struct ibv_comp_channel *)fk_p(a[0]))->fd;
		break;
	case FK_CLOSE_DEVICE: {
		struct fk_own *o = fk_own_take(c->g, fk_p(a[0]));
		if (!o)
			FAIL(EINVAL);
		free(o);
		e = softrdma_ibv_close_device(fk_p(a[0]));
		break;
	}
	case FK_QUERY_DEVICE:
		e = softrdma_ibv_query_device(fk_p(a[0]), (struct ibv_device_attr *)c->out);
		if (!e)
			h->len = sizeof(struct ibv_device_attr);
		break;
	case FK_QUERY_PORT: {
		struct ibv_context *ctx = fk_p(a[0]);
		struct verbs_context *vc = verbs_get_ctx(ctx);
		memset(c->out, 0, sizeof(struct ibv_port_attr));
		e = vc->query_port(ctx, a[1], (struct ibv_port_attr *)c->out, sizeof(struct ibv_port_attr));
		if (!e)
			h->len = sizeof(struct ibv_port_attr);
		break;
	}
	case FK_QUERY_GID:
		if (softrdma_ibv_query_gid(fk_p(a[0]), a[1], a[2], (union ibv_gid *)c->out))
			FAIL(ERRNO_OR(EINVAL));
		h->len = sizeof(union ibv_gid);
		break;
	case FK_CM_DEVICES: {
		int n = 0;
		struct ibv_context **l = softrdma_rdma_get_devices(&n);
		if (!l)
			FAIL(ERRNO_OR(ENODEV));
		if ((size_t)n * sizeof(uint64_t) > FK_MAX)
			n = FK_MAX / sizeof(uint64_t);
		for (int i = 0; i < n; i++)
			((uint64_t *)c->out)[i] = (uintptr_t)l[i];
		softrdma_rdma_free_devices(l);
		h->ret = n;
		h->len = n * sizeof(uint64_t);
		break;
	}
	case FK_DEVICE_INFO: {
		uint64_t *r = (uint64_t *)c->out;
		r[0] = (uint64_t)softrdma_ibv_get_device_guid(fk_p(a[0]));
		r[1] = (uint64_t)(int64_t)softrdma_ibv_get_device_index(fk_p(a[0]));
		h->len = 2 * sizeof *r;
		break;
	}
	case FK_QUERY_GID_EX:
		e = softrdma__ibv_query_gid_ex(fk_p(a[0]), a[1], a[2], (struct ibv_gid_entry *)c->out, 0,
					       sizeof(struct ibv_gid_entry));
		if (!e)
			h->len = sizeof(struct ibv_gid_entry);
		break;
	case FK_QUERY_PKEY:
		if (softrdma_ibv_query_pkey(fk_p(a[0]), a[1], (int)(uint32_t)a[2], (__be16 *)c->out))
			FAIL(ERRNO_OR(EINVAL));
		h->len = sizeof(__be16);
		break;
	case FK_ALLOC_PD: {
		struct ibv_pd *pd = softrdma_ibv_alloc_pd(fk_p(a[0]));
		if (!pd)
			FAIL(ERRNO_OR(ENOMEM));
		fk_own_add(c->g, FKO_PD, pd);
		a[0] = (uintptr_t)pd;
		break;
	}
	case FK_DEALLOC_PD:
	case FK_DESTROY_COMP_CHANNEL:
	case FK_DESTROY_CQ:
	case FK_DESTROY_AH:
	case FK_DESTROY_QP:
	case FK_DEREG_MR: {
		void *p = fk_p(a[0]);
		struct fk_own *o;
		if (!fk_owns(c->g, p))
			FAIL(EINVAL);
		switch (h->op) {
		case FK_DEALLOC_PD: e = softrdma_ibv_dealloc_pd(p); break;
		case FK_DESTROY_COMP_CHANNEL: e = softrdma_ibv_destroy_comp_channel(p); break;
		case FK_DESTROY_CQ: e = softrdma_ibv_destroy_cq(p); break;
		case FK_DESTROY_AH: e = softrdma_ibv_destroy_ah(p); break;
		case FK_DESTROY_QP: e = softrdma_ibv_destroy_qp(p); break;
		case FK_DEREG_MR: e = softrdma_ibv_dereg_mr(p); break;
		}
		if (!e && (o = fk_own_take(c->g, p))) {
			if (o->type == FKO_MR)
				munmap(o->shadow, o->len ? o->len : 1);
			free(o);
		}
		break;
	}
	case FK_REG_MR: {
		size_t n = a[2];
		void *s = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		struct ibv_mr *mr;
		struct fk_own *o;
		if (s == MAP_FAILED)
			FAIL(ENOMEM);
		// The shadow starts as the child's memory is.
		if (fk_read_child(c, s, a[1], n)) {
			munmap(s, n ? n : 1);
			FAIL(EFAULT);
		}
		mr = softrdma_ibv_reg_mr(fk_p(a[0]), s, n, a[3]);
		if (!mr) {
			e = ERRNO_OR(EINVAL);
			munmap(s, n ? n : 1);
			goto out;
		}
		if (!(o = fk_own_add(c->g, FKO_MR, mr))) {
			softrdma_ibv_dereg_mr(mr);
			munmap(s, n ? n : 1);
			FAIL(ENOMEM);
		}
		pthread_mutex_lock(&c->g->mu);
		o->caddr = a[1];
		o->len = n;
		o->shadow = s;
		o->lkey = mr->lkey;
		pthread_mutex_unlock(&c->g->mu);
		a[0] = (uintptr_t)mr;
		a[1] = mr->lkey;
		a[2] = mr->rkey;
		a[3] = mr->handle;
		break;
	}
	case FK_CREATE_COMP_CHANNEL: {
		struct ibv_comp_channel *ch = softrdma_ibv_create_comp_channel(fk_p(a[0]));
		if (!ch)
			FAIL(ERRNO_OR(ENOMEM));
		fk_own_add(c->g, FKO_CHAN, ch);
		a[0] = (uintptr_t)ch;
		c->outfd = ch->fd;
		break;
	}
	case FK_CREATE_CQ: {
		struct ibv_cq *cq = softrdma_ibv_create_cq(fk_p(a[0]), a[1], NULL, fk_p(a[2]), a[3]);
		if (!cq)
			FAIL(ERRNO_OR(ENOMEM));
		fk_own_add(c->g, FKO_CQ, cq);
		a[0] = (uintptr_t)cq;
		a[1] = cq->cqe;
		break;
	}
	case FK_GET_CQ_EVENT: {
		struct ibv_cq *cq = NULL;
		void *ctx = NULL;
		if (softrdma_ibv_get_cq_event(fk_p(a[0]), &cq, &ctx))
			FAIL(ERRNO_OR(EINVAL));
		fk_own_add(c->g, FKO_CQEV, cq);
		a[0] = (uintptr_t)cq;
		break;
	}
	case FK_ACK_CQ_EVENTS: {
		// As many of the CQ's events as it acknowledges are no longer the
		// child's to acknowledge.
		int n = 0;
		pthread_mutex_lock(&c->g->mu);
		for (struct fk_own **pp = &c->g->own; *pp && (uint64_t)n < a[1];) {
			struct fk_own *o = *pp;
			if (o->type == FKO_CQEV && o->p == fk_p(a[0])) {
				*pp = o->next;
				free(o);
				n++;
			} else {
				pp = &o->next;
			}
		}
		pthread_mutex_unlock(&c->g->mu);
		softrdma_ibv_ack_cq_events(fk_p(a[0]), a[1]);
		break;
	}
	case FK_REQ_NOTIFY:
		e = ibv_req_notify_cq((struct ibv_cq *)fk_p(a[0]), a[1]);
		break;
	case FK_POLL_CQ: {
		struct ibv_wc *wc = (struct ibv_wc *)c->out;
		int n = a[1], got;
		if (n > (int)(FK_MAX / sizeof *wc))
			n = FK_MAX / sizeof *wc;
		got = ibv_poll_cq((struct ibv_cq *)fk_p(a[0]), n, wc);
		if (got < 0) {
			h->ret = got;
			break;
		}
		for (int i = 0; i < got; i++) {
			struct fk_rtok **pp, *t = NULL;
			pthread_mutex_lock(&c->g->mu);
			for (pp = &c->g->tok[(wc[i].wr_id >> 4) % FK_NBUCKET]; *pp; pp = &(*pp)->hnext)
				if ((uintptr_t)*pp == wc[i].wr_id) {
					t = *pp;
					*pp = t->hnext;
					break;
				}
			pthread_mutex_unlock(&c->g->mu);
			if (!t)
				continue; // a send's
			wc[i].wr_id = t->wr_id;
			if (wc[i].status == IBV_WC_SUCCESS) {
				uint32_t left = wc[i].byte_len;
				for (int j = 0; j < t->n && left; j++) {
					uint32_t k = left < t->sg[j].len ? left : t->sg[j].len;
					if (fk_write_child(c, t->sg[j].caddr, t->sg[j].saddr, k))
						wc[i].status = IBV_WC_LOC_PROT_ERR;
					left -= k;
				}
			}
			free(t);
		}
		h->ret = got;
		h->len = got * sizeof *wc;
		break;
	}
	case FK_POST_SEND: {
		struct ibv_send_wr wr;
		struct ibv_sge sg[64];
		char *tmp[64];
		char *p = c->in, *end = c->in + len;
		int i, n = a[1];
		for (i = 0; i < n; i++) {
			struct fk_swr w;
			struct ibv_send_wr *bad = NULL;
			if (p + sizeof w > end)
				break;
			memcpy(&w, p, sizeof w);
			p += sizeof w;
			if (w.num_sge < 0 || w.num_sge > 64 || p + w.num_sge * sizeof(struct fk_wr_sge) > end) {
				e = EINVAL;
				break;
			}
			memset(tmp, 0, sizeof tmp);
			e = fk_sges(c, (struct fk_wr_sge *)p, w.num_sge, sg, 1, w.flags & IBV_SEND_INLINE, tmp);
			p += w.num_sge * sizeof(struct fk_wr_sge);
			if (!e) {
				memset(&wr, 0, sizeof wr);
				wr.wr_id = w.wr_id;
				wr.sg_list = sg;
				wr.num_sge = w.num_sge;
				wr.opcode = w.opcode;
				wr.send_flags = w.flags;
				wr.imm_data = w.imm;
				wr.wr.ud.ah = fk_p(w.ah);
				wr.wr.ud.remote_qpn = w.rqpn;
				wr.wr.ud.remote_qkey = w.rqkey;
				e = ibv_post_send((struct ibv_qp *)fk_p(a[0]), &wr, &bad);
			}
			for (int j = 0; j < w.num_sge; j++)
				free(tmp[j]);
			if (e)
				break;
		}
		a[0] = i;
		break;
	}
	case FK_POST_RECV: {
		struct ibv_recv_wr wr;
		struct ibv_sge sg[64];
		char *p = c->in, *end = c->in + len;
		int i, n = a[1];
		for (i = 0; i < n; i++) {
			struct fk_rwr w;
			struct ibv_recv_wr *bad = NULL;
			struct fk_rtok *t;
			if (p + sizeof w > end)
				break;
			memcpy(&w, p, sizeof w);
			p += sizeof w;
			if (w.num_sge < 0 || w.num_sge > 64 || p + w.num_sge * sizeof(struct fk_wr_sge) > end) {
				e = EINVAL;
				break;
			}
			e = fk_sges(c, (struct fk_wr_sge *)p, w.num_sge, sg, 0, 0, NULL);
			if (e)
				break;
			if (!(t = malloc(sizeof *t + w.num_sge * sizeof t->sg[0]))) {
				e = ENOMEM;
				break;
			}
			t->wr_id = w.wr_id;
			t->n = w.num_sge;
			for (int j = 0; j < w.num_sge; j++) {
				struct fk_wr_sge *s = (struct fk_wr_sge *)p + j;
				t->sg[j].caddr = s->addr;
				t->sg[j].saddr = (char *)(uintptr_t)sg[j].addr;
				t->sg[j].len = s->length;
			}
			p += w.num_sge * sizeof(struct fk_wr_sge);
			memset(&wr, 0, sizeof wr);
			wr.wr_id = (uintptr_t)t;
			wr.sg_list = sg;
			wr.num_sge = w.num_sge;
			pthread_mutex_lock(&c->g->mu);
			t->hnext = c->g->tok[((uintptr_t)t >> 4) % FK_NBUCKET];
			c->g->tok[((uintptr_t)t >> 4) % FK_NBUCKET] = t;
			pthread_mutex_unlock(&c->g->mu);
			e = ibv_post_recv((struct ibv_qp *)fk_p(a[0]), &wr, &bad);
			if (e) {
				struct fk_rtok **pp;
				pthread_mutex_lock(&c->g->mu);
				for (pp = &c->g->tok[((uintptr_t)t >> 4) % FK_NBUCKET]; *pp; pp = &(*pp)->hnext)
					if (*pp == t) {
						*pp = t->hnext;
						break;
					}
				pthread_mutex_unlock(&c->g->mu);
				free(t);
				break;
			}
		}
		a[0] = i;
		break;
	}
	case FK_INIT_AH_FROM_WC: {
		// in: the struct ibv_wc, then the struct ibv_grh when a[2]; out:
		// the struct ibv_ah_attr.
		struct ibv_wc wc;
		struct ibv_grh grh;
		// The context may be a CM device's (an id's verbs), as for
		// FK_QUERY_GID: read only.
		if (len < sizeof wc + (a[2] ? sizeof grh : 0))
			FAIL(EINVAL);
		memcpy(&wc, c->in, sizeof wc);
		if (a[2])
			memcpy(&grh, c->in + sizeof wc, sizeof grh);
		if (softrdma_ibv_init_ah_from_wc(fk_p(a[0]), a[1], &wc, a[2] ? &grh : NULL, (struct ibv_ah_attr *)c->out))
			FAIL(ERRNO_OR(EINVAL));
		h->len = sizeof(struct ibv_ah_attr);
		break;
	}
	case FK_CREATE_AH: {
		struct ibv_ah_attr attr;
		struct ibv_ah *ah;
		if (len < sizeof attr)
			FAIL(EINVAL);
		memcpy(&attr, c->in, sizeof attr);
		if (!(ah = softrdma_ibv_create_ah(fk_p(a[0]), &attr)))
			FAIL(ERRNO_OR(EINVAL));
		fk_own_add(c->g, FKO_AH, ah);
		a[0] = (uintptr_t)ah;
		break;
	}
	case FK_CREATE_QP:
	case FK_CM_CREATE_QP: {
		struct ibv_qp_init_attr attr;
		struct ibv_qp *qp;
		if (len < sizeof attr)
			FAIL(EINVAL);
		memcpy(&attr, c->in, sizeof attr);
		attr.qp_context = NULL;
		attr.srq = NULL;
		if (h->op == FK_CREATE_QP) {
			if (!(qp = softrdma_ibv_create_qp(fk_p(a[0]), &attr)))
				FAIL(ERRNO_OR(EINVAL));
			fk_own_add(c->g, FKO_QP, qp);
		} else {
			struct rdma_cm_id *id = fk_p(a[0]);
			if (softrdma_rdma_create_qp(id, fk_p(a[1]), &attr))
				FAIL(ERRNO_OR(EINVAL));
			fk_own_add(c->g, FKO_CMQP, id);
			qp = id->qp;
		}
		fk_qpinfo_of((struct fk_qpinfo *)c->out, qp, &attr.cap);
		h->len = sizeof(struct fk_qpinfo);
		break;
	}
	case FK_MODIFY_QP: {
		struct ibv_qp_attr attr;
		if (len < sizeof attr)
			FAIL(EINVAL);
		memcpy(&attr, c->in, sizeof attr);
		e = softrdma_ibv_modify_qp(fk_p(a[0]), &attr, a[1]);
		a[0] = ((struct ibv_qp *)fk_p(a[0]))->state;
		break;
	}
	case FK_QUERY_QP: {
		struct fk_qpattr *r = (struct fk_qpattr *)c->out;
		if (!fk_owns_qp(c->g, fk_p(a[0])))
			FAIL(EINVAL);
		e = softrdma_ibv_query_qp(fk_p(a[0]), &r->attr, a[1], &r->init);
		if (!e)
			h->len = sizeof *r;
		break;
	}
	case FK_ATTACH_MCAST:
	case FK_DETACH_MCAST: {
		union ibv_gid gid;
		if (!fk_owns_qp(c->g, fk_p(a[0])) || len < sizeof gid)
			FAIL(EINVAL);
		memcpy(&gid, c->in, sizeof gid);
		e = (h->op == FK_ATTACH_MCAST ? softrdma_ibv_attach_mcast : softrdma_ibv_detach_mcast)(fk_p(a[0]), &gid,
													 a[1]);
		break;
	}
	case FK_SET_OPTION:
		if (!fk_owns_as(c->g, fk_p(a[0]), FKO_ID))
			FAIL(EINVAL);
		if (softrdma_rdma_set_option(fk_p(a[0]), a[1], a[2], len ? c->in : NULL, len))
			FAIL(ERRNO_OR(EINVAL));
		break;
	case FK_CM_DESTROY_QP: {
		struct fk_own *o;
		pthread_mutex_lock(&c->g->mu);
		for (o = c->g->own; o && !(o->type == FKO_CMQP && o->p == fk_p(a[0])); o = o->next)
			;
		pthread_mutex_unlock(&c->g->mu);
		if (!o)
			FAIL(EINVAL);
		softrdma_rdma_destroy_qp(fk_p(a[0]));
		// The record of the QP (not the id's) goes.
		pthread_mutex_lock(&c->g->mu);
		for (struct fk_own **pp = &c->g->own; *pp; pp = &(*pp)->next)
			if (*pp == o) {
				*pp = o->next;
				break;
			}
		pthread_mutex_unlock(&c->g->mu);
		free(o);
		break;
	}
	case FK_CREATE_EVENT_CHANNEL: {
		struct rdma_event_channel *ch = softrdma_rdma_create_event_channel();
		if (!ch)
			FAIL(ERRNO_OR(ENOMEM));
		fk_own_add(c->g, FKO_ECH, ch);
		a[0] = (uintptr_t)ch;
		c->outfd = ch->fd;
		break;
	}
	case FK_DESTROY_EVENT_CHANNEL: {
		struct fk_own *o = fk_own_take(c->g, fk_p(a[0]));
		if (!o)
			FAIL(EINVAL);
		free(o);
		softrdma_rdma_destroy_event_channel(fk_p(a[0]));
		break;
	}
	case FK_CREATE_ID: {
		struct rdma_cm_id *id = NULL;
		if (softrdma_rdma_create_id(fk_p(a[0]), &id, NULL, a[1]))
			FAIL(ERRNO_OR(EINVAL));
		fk_own_add(c->g, FKO_ID, id);
		fk_idinfo_of((struct fk_idinfo *)c->out, id);
		h->len = sizeof(struct fk_idinfo);
		break;
	}
	case FK_DESTROY_ID: {
		struct rdma_cm_id *id = fk_p(a[0]);
		if (!fk_owns(c->g, id))
			FAIL(EINVAL);
		if (softrdma_rdma_destroy_id(id))
			FAIL(ERRNO_OR(EINVAL));
		// The id's records go, its QP's (rdma_create_qp) too.
		for (struct fk_own *o; (o = fk_own_take(c->g, id));)
			free(o);
		break;
	}
	case FK_BIND_ADDR:
	case FK_RESOLVE_ADDR:
	case FK_RESOLVE_ROUTE:
	case FK_JOIN:
	case FK_LEAVE:
	case FK_ID_INFO: {
		struct rdma_cm_id *id = fk_p(a[0]);
		struct sockaddr_storage s[2];
		int r = 0;
		if (len > sizeof s)
			FAIL(EINVAL);
		memset(s, 0, sizeof s);
		memcpy(s, c->in, len);
		switch (h->op) {
		case FK_BIND_ADDR: r = softrdma_rdma_bind_addr(id, (struct sockaddr *)&s[0]); break;
		case FK_RESOLVE_ADDR:
			r = softrdma_rdma_resolve_addr(id, a[2] ? (struct sockaddr *)&s[0] : NULL, (struct sockaddr *)&s[1], a[1]);
			break;
		case FK_RESOLVE_ROUTE: r = softrdma_rdma_resolve_route(id, a[1]); break;
		case FK_JOIN:
			if (a[4]) {
				struct rdma_cm_join_mc_attr_ex ja = { .comp_mask = a[2], .join_flags = a[3],
								      .addr = (struct sockaddr *)&s[0] };
				r = softrdma_rdma_join_multicast_ex(id, &ja, fk_p(a[1]));
			} else {
				r = softrdma_rdma_join_multicast(id, (struct sockaddr *)&s[0], fk_p(a[1]));
			}
			break;
		case FK_LEAVE: r = softrdma_rdma_leave_multicast(id, (struct sockaddr *)&s[0]); break;
		}
		if (r)
			FAIL(ERRNO_OR(EINVAL));
		fk_idinfo_of((struct fk_idinfo *)c->out, id);
		h->len = sizeof(struct fk_idinfo);
		break;
	}
	case FK_GET_CM_EVENT: {
		struct rdma_cm_event *ev = NULL;
		struct fk_event *fe = (struct fk_event *)c->out;
		if (softrdma_rdma_get_cm_event(fk_p(a[0]), &ev))
			FAIL(ERRNO_OR(EINVAL));
		fk_own_add(c->g, FKO_EV, ev);
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && ev->id && !fk_owns(c->g, ev->id))
			fk_own_add(c->g, FKO_ID, ev->id); // a new id, the child's
		memset(fe, 0, sizeof *fe);
		fe->ev = (uintptr_t)ev;
		fe->id = (uintptr_t)ev->id;
		fe->listen_id = (uintptr_t)ev->listen_id;
		fe->event = ev->event;
		fe->status = ev->status;
		fe->ud = ev->param.ud;
		fk_idinfo_of(&fe->info, ev->id);
		h->len = sizeof *fe;
		if (ev->param.ud.private_data && ev->param.ud.private_data_len) {
			memcpy(c->out + sizeof *fe, ev->param.ud.private_data, ev->param.ud.private_data_len);
			h->len += ev->param.ud.private_data_len;
		}
		break;
	}
	case FK_LISTEN:
	case FK_CONNECT:
	case FK_ACCEPT:
	case FK_REJECT: {
		// UD connections (sidr.c): in, a struct fk_connp and the private
		// data (FK_REJECT: the private data only, a[1] bytes).
		struct rdma_cm_id *id = fk_p(a[0]);
		struct fk_connp fc;
		struct rdma_conn_param cp;
		int r = 0;
		if (!fk_owns(c->g, id))
			FAIL(EINVAL);
		memset(&cp, 0, sizeof cp);
		memset(&fc, 0, sizeof fc);
		if (h->op == FK_CONNECT || h->op == FK_ACCEPT) {
			if (len < sizeof fc)
				FAIL(EINVAL);
			memcpy(&fc, c->in, sizeof fc);
			if (sizeof fc + fc.private_data_len > len)
				FAIL(EINVAL);
			cp.private_data = fc.private_data_len ? c->in + sizeof fc : NULL;
			cp.private_data_len = fc.private_data_len;
			cp.responder_resources = fc.responder_resources;
			cp.initiator_depth = fc.initiator_depth;
			cp.flow_control = fc.flow_control;
			cp.retry_count = fc.retry_count;
			cp.rnr_retry_count = fc.rnr_retry_count;
			cp.srq = fc.srq;
			cp.qp_num = fc.qp_num;
		}
		switch (h->op) {
		case FK_LISTEN: r = softrdma_rdma_listen(id, a[1]); break;
		case FK_CONNECT: r = softrdma_rdma_connect(id, fc.has ? &cp : NULL); break;
		case FK_ACCEPT: r = softrdma_rdma_accept(id, fc.has ? &cp : NULL); break;
		case FK_REJECT:
			if (a[1] > len || a[1] > 255)
				FAIL(EINVAL);
			r = softrdma_rdma_reject(id, a[1] ? c->in : NULL, a[1]);
			break;
		}
		if (r)
			FAIL(ERRNO_OR(EINVAL));
		fk_idinfo_of((struct fk_idinfo *)c->out, id);
		h->len = sizeof(struct fk_idinfo);
		break;
	}
	case FK_ACK_CM_EVENT: {
		struct fk_own *o = fk_own_take(c->g, fk_p(a[0]));
		if (!o)
			FAIL(EINVAL);
		free(o);
		if (softrdma_rdma_ack_cm_event(fk_p(a[0])))
			FAIL(ERRNO_OR(EINVAL));
		break;
	}
	case FK_GETADDRINFO: {
		// in: node (a[0] set) and service (a[1] set), NUL-terminated,
		// then struct rdma_addrinfo hints when a[2] (its pointers NULL).
		char *node = NULL, *service = NULL, *p = c->in;
		struct rdma_addrinfo hints, *res = NULL;
		char *o = c->out;
		c->in[len < FK_MAX ? len : FK_MAX - 1] = 0;
		if (a[0]) {
			node = p;
			p += strlen(p) + 1;
		}
		if (a[1]) {
			service = p;
			p += strlen(p) + 1;
		}
		struct sockaddr_storage hs, hd;
		if (a[2]) {
			memcpy(&hints, p, sizeof hints);
			p += sizeof hints;
			hints.ai_src_addr = hints.ai_dst_addr = NULL;
			if (hints.ai_src_len > sizeof hs || hints.ai_dst_len > sizeof hd ||
			    p + hints.ai_src_len + hints.ai_dst_len > c->in + len)
				FAIL(EINVAL);
			if (hints.ai_src_len) {
				memcpy(&hs, p, hints.ai_src_len);
				p += hints.ai_src_len;
				hints.ai_src_addr = (struct sockaddr *)&hs;
			}
			if (hints.ai_dst_len) {
				memcpy(&hd, p, hints.ai_dst_len);
				hints.ai_dst_addr = (struct sockaddr *)&hd;
			}
			hints.ai_src_canonname = hints.ai_dst_canonname = NULL;
			hints.ai_route = hints.ai_connect = NULL;
			hints.ai_route_len = hints.ai_connect_len = 0;
			hints.ai_next = NULL;
		}
		h->ret = softrdma_rdma_getaddrinfo(node, service, a[2] ? &hints : NULL, &res);
		if (h->ret) {
			h->err = errno;
			return;
		}
		for (struct rdma_addrinfo *r = res; r; r = r->ai_next) {
			struct fk_ai ai = {
				.flags = r->ai_flags, .family = r->ai_family, .qp_type = r->ai_qp_type,
				.port_space = r->ai_port_space,
				.src_len = r->ai_src_addr ? r->ai_src_len : 0, .dst_len = r->ai_dst_addr ? r->ai_dst_len : 0,
				.src_canon_len = r->ai_src_canonname ? strlen(r->ai_src_canonname) + 1 : 0,
				.dst_canon_len = r->ai_dst_canonname ? strlen(r->ai_dst_canonname) + 1 : 0,
			};
			size_t need = sizeof ai + ai.src_len + ai.dst_len + ai.src_canon_len + ai.dst_canon_len;
			if (o + need > c->out + FK_MAX)
				break;
			memcpy(o, &ai, sizeof ai);
			o += sizeof ai;
			memcpy(o, r->ai_src_addr, ai.src_len), o += ai.src_len;
			memcpy(o, r->ai_dst_addr, ai.dst_len), o += ai.dst_len;
			memcpy(o, r->ai_src_canonname, ai.src_canon_len), o += ai.src_canon_len;
			memcpy(o, r->ai_dst_canonname, ai.dst_canon_len), o += ai.dst_canon_len;
		}
		softrdma_rdma_freeaddrinfo(res);
		h->len = o - c->out;
		break;
	}
	default:
		e = ENOSYS;
	}
out:
	h->err = e;
	if (e && !h->ret)
		h->ret = -1;
#undef FAIL
#undef ERRNO_OR
}

static void *fk_serve(void *arg)
{
	struct fk_conn *c = arg;
	for (;;) {
		struct iovec iov[2] = { { &c->h, sizeof c->h }, { c->in, sizeof c->in } };
		struct msghdr m = { .msg_iov = iov, .msg_iovlen = 2 };
		ssize_t n = recvmsg(c->fd, &m, 0);
		if (n < (ssize_t)sizeof c->h)
			break;
		if (c->h.len > n - sizeof c->h)
			c->h.len = n - sizeof c->h;
		if (c->h.op == FK_HELLO) {
			if (!c->g && (c->g = fk_group_get(c->pid)))
				c->owner = c->h.a[0] != 0;
			c->h.len = 0;
			c->h.ret = c->g ? 0 : -1;
			c->h.err = c->g ? 0 : ENOMEM;
			c->outfd = -1;
		} else if (!c->g) {
			break;
		} else {
			fk_call(c);
		}
		char cbuf[CMSG_SPACE(sizeof(int))];
		struct iovec oiov[2] = { { &c->h, sizeof c->h }, { c->out, c->h.len } };
		struct msghdr om = { .msg_iov = oiov, .msg_iovlen = 2 };
		if (c->outfd >= 0) {
			memset(cbuf, 0, sizeof cbuf);
			om.msg_control = cbuf;
			om.msg_controllen = sizeof cbuf;
			struct cmsghdr *cm = CMSG_FIRSTHDR(&om);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(cm), &c->outfd, sizeof(int));
		}
		if (sendmsg(c->fd, &om, MSG_NOSIGNAL) < 0)
			break;
	}
	close(c->fd);
	if (c->g)
		fk_group_put(c->g, c->owner);
	free(c);
	return NULL;
}

static int fk_lfd = -1;

static void *fk_accept(void *arg)
{
	(void)arg;
	for (;;) {
		int fd = accept4(fk_lfd, NULL, NULL, SOCK_CLOEXEC);
		struct ucred cr;
		socklen_t cl = sizeof cr;
		struct fk_conn *c;
		pthread_t t;
		pthread_attr_t at;
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE)
				continue;
			return NULL;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) || !fk_is_descendant(cr.pid) ||
		    !(c = calloc(1, sizeof *c))) {
			close(fd);
			continue;
		}
		c->fd = fd;
		c->pid = cr.pid;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &at, fk_serve, c)) {
			close(fd);
			free(c);
		}
		pthread_attr_destroy(&at);
	}
}

// sr_fork_listen starts the service for the children of this process, once
// (fork.c's prepare handler calls it in the parent, before a fork).
void sr_fork_listen(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	void fk_listen_once(void);
	pthread_once(&once, fk_listen_once);
}

void fk_listen_once(void)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	pthread_t t;
	pthread_attr_t at;
	uint64_t r = 0;
	int fd, n;
	FILE *f = fopen("/dev/urandom", "re");
	if (f) {
		if (fread(&r, sizeof r, 1, f) != 1)
			r = 0;
		fclose(f);
	}
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	n = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "softrdma-fork-%d-%016llx", (int)getpid(),
		     (unsigned long long)r);
	if (bind(fd, (struct sockaddr *)&a, offsetof(struct sockaddr_un, sun_path) + 1 + n) || listen(fd, 64)) {
		close(fd);
		return;
	}
	fk_lfd = fd;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&t, &at, fk_accept, NULL)) {
		close(fd);
		fk_lfd = -1;
		pthread_attr_destroy(&at);
		return;
	}
	pthread_attr_destroy(&at);
	memcpy(fk_addr, a.sun_path, 1 + n);
	fk_addr_len = 1 + n;
}
