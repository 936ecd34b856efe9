//go:build capi

// qp.c: libibverbs' QP calls (UD QPs, as softrdma's devices have) and the
// extended QP's work request API (ibv_wr_start … ibv_wr_complete), over
// the Go side of qp.go.

#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "capi.h"
#include "_cgo_export.h"

#define SR_CHECK(name) \
	_Static_assert(__builtin_types_compatible_p(__typeof__(name), __typeof__(softrdma_##name)), #name " differs from the header")
#define SR_RET_PTR(e, p) do { if (e) { errno = (e); return NULL; } return (p); } while (0)
#define SR_RET_ERRNO(e) do { if (e) errno = (e); return (e); } while (0)

struct sr_qp *sr_qp_alloc(void)
{
	struct sr_qp *q = calloc(1, sizeof *q);
	if (!q)
		return NULL;
	pthread_mutex_init(&q->qpx.qp_base.mutex, NULL);
	pthread_cond_init(&q->qpx.qp_base.cond, NULL);
	return q;
}

static void sr_wrs_clear(struct sr_qp *q);

void sr_qp_free(struct sr_qp *q)
{
	sr_wrs_clear(q);
	free(q->wrs);
	pthread_cond_destroy(&q->qpx.qp_base.cond);
	pthread_mutex_destroy(&q->qpx.qp_base.mutex);
	free(q);
}

void sr_qp_init_from(struct sr_qp_init *in, void *ctx, struct ibv_cq *scq, struct ibv_cq *rcq,
		     struct ibv_qp_cap *cap, int qp_type, int sq_sig_all)
{
	memset(in, 0, sizeof *in);
	in->qp_context = ctx;
	in->send_cq = scq;
	in->recv_cq = rcq;
	in->max_send_wr = cap->max_send_wr;
	in->max_recv_wr = cap->max_recv_wr;
	in->max_send_sge = cap->max_send_sge;
	in->max_recv_sge = cap->max_recv_sge;
	in->max_inline_data = cap->max_inline_data;
	in->qp_type = qp_type;
	in->sq_sig_all = sq_sig_all;
}

static const char *sr_qpt_name(int t)
{
	switch (t) {
	case IBV_QPT_RC: return "IBV_QPT_RC";
	case IBV_QPT_UC: return "IBV_QPT_UC";
	case IBV_QPT_UD: return "IBV_QPT_UD";
	case IBV_QPT_RAW_PACKET: return "IBV_QPT_RAW_PACKET";
	case IBV_QPT_XRC_SEND: return "IBV_QPT_XRC_SEND";
	case IBV_QPT_XRC_RECV: return "IBV_QPT_XRC_RECV";
	case IBV_QPT_DRIVER: return "IBV_QPT_DRIVER";
	}
	return NULL;
}

// sr_unsupported_qpt prints, once per process and QP type, that call
// cannot make a QP of that type.
void sr_unsupported_qpt(const char *call, int qp_type)
{
	static int once[3][8];
	int row = strcmp(call, "ibv_create_qp") == 0 ? 0 : strcmp(call, "ibv_create_qp_ex") == 0 ? 1 : 2;
	int col;
	switch (qp_type) {
	case IBV_QPT_RC: col = 0; break;
	case IBV_QPT_UC: col = 1; break;
	case IBV_QPT_RAW_PACKET: col = 2; break;
	case IBV_QPT_XRC_SEND: col = 3; break;
	case IBV_QPT_XRC_RECV: col = 4; break;
	case IBV_QPT_DRIVER: col = 5; break;
	default: col = 6;
	}
	if (__atomic_exchange_n(&once[row][col], 1, __ATOMIC_RELAXED))
		return;
	if (sr_qpt_name(qp_type))
		fprintf(stderr, "softrdma: %s with %s is not supported on softrdma's devices (UD QPs only)\n",
			call, sr_qpt_name(qp_type));
	else
		fprintf(stderr, "softrdma: %s with QP type %d is not supported on softrdma's devices (UD QPs only)\n",
			call, qp_type);
}

// sr_qpt_errno is what creating a QP of type t gives: 0 for UD, EOPNOTSUPP
// (with the line on stderr) for the types rdma-core knows, EINVAL for
// others, as the kernel's checks.
static int sr_qpt_errno(const char *call, int t)
{
	if (t == IBV_QPT_UD)
		return 0;
	sr_unsupported_qpt(call, t);
	return sr_qpt_name(t) ? EOPNOTSUPP : EINVAL;
}

static void sr_cap_out(struct ibv_qp_cap *cap, const struct sr_qp_init *in)
{
	cap->max_send_wr = in->max_send_wr;
	cap->max_recv_wr = in->max_recv_wr;
	cap->max_send_sge = in->max_send_sge;
	cap->max_recv_sge = in->max_recv_sge;
	cap->max_inline_data = in->max_inline_data;
}

struct ibv_qp *softrdma_ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct sr_qp_init in;
	struct sr_qp *q = NULL;
	int e;
	if (!pd || !attr) {
		errno = EINVAL;
		return NULL;
	}
	if ((e = sr_qpt_errno("ibv_create_qp", attr->qp_type)))
		SR_RET_PTR(e, NULL);
	if (attr->srq) {
		SR_UNSUPPORTED("ibv_create_qp with an SRQ");
		SR_RET_PTR(EOPNOTSUPP, NULL);
	}
	sr_qp_init_from(&in, attr->qp_context, attr->send_cq, attr->recv_cq, &attr->cap, attr->qp_type, attr->sq_sig_all);
	in.pd = pd;
	e = srCreateVerbsQP(&in, &q);
	if (e)
		SR_RET_PTR(e, NULL);
	sr_cap_out(&attr->cap, &in);
	return sr_qp_base(q);
}
SR_CHECK(ibv_create_qp);

static void sr_qpx_setup(struct sr_qp *q, uint64_t ops);

// sr_create_qp_ex is the context's create_qp_ex, which the inline
// ibv_create_qp_ex of verbs.h calls for any comp_mask but PD alone.
struct ibv_qp *sr_create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *attr)
{
	const uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	const uint64_t ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
	struct sr_qp_init in;
	struct sr_qp *q = NULL;
	int e;
	if (!context || !attr) {
		errno = EINVAL;
		return NULL;
	}
	if ((e = sr_qpt_errno("ibv_create_qp_ex", attr->qp_type)))
		SR_RET_PTR(e, NULL);
	if (attr->comp_mask & ~known) {
		SR_UNSUPPORTED("ibv_create_qp_ex with comp_mask bits other than PD, CREATE_FLAGS and SEND_OPS_FLAGS");
		SR_RET_PTR(EOPNOTSUPP, NULL);
	}
	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd || attr->pd->context != context)
		SR_RET_PTR(EINVAL, NULL);
	if ((attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && (attr->send_ops_flags & ~ops)) {
		SR_UNSUPPORTED("ibv_create_qp_ex with send_ops_flags other than IBV_QP_EX_WITH_SEND and _SEND_WITH_IMM (UD QPs)");
		SR_RET_PTR(EOPNOTSUPP, NULL);
	}
	if (attr->srq) {
		SR_UNSUPPORTED("ibv_create_qp_ex with an SRQ");
		SR_RET_PTR(EOPNOTSUPP, NULL);
	}
	sr_qp_init_from(&in, attr->qp_context, attr->send_cq, attr->recv_cq, &attr->cap, attr->qp_type, attr->sq_sig_all);
	in.pd = attr->pd;
	if (attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS)
		in.create_flags = attr->create_flags;
	e = srCreateVerbsQP(&in, &q);
	if (e)
		SR_RET_PTR(e, NULL);
	sr_cap_out(&attr->cap, &in);
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
		sr_qpx_setup(q, attr->send_ops_flags);
	return sr_qp_base(q);
}

// sr_qp_make_ex gives a QP rdma_create_qp_ex made the WR API.
void sr_qp_make_ex(struct ibv_qp *qp, uint64_t send_ops_flags)
{
	sr_qpx_setup((struct sr_qp *)qp, send_ops_flags);
}

int softrdma_ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	int e = qp && attr ? srModifyQP(qp, attr, attr_mask) : EINVAL;
	SR_RET_ERRNO(e);
}
SR_CHECK(ibv_modify_qp);

int softrdma_ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask, struct ibv_qp_init_attr *init_attr)
{
	int e;
	(void)attr_mask; // as the kernel's, every attribute is reported
	if (!qp || !attr || !init_attr)
		SR_RET_ERRNO(EINVAL);
	memset(attr, 0, sizeof *attr);
	memset(init_attr, 0, sizeof *init_attr);
	e = srQueryQP(qp, attr, init_attr);
	SR_RET_ERRNO(e);
}
SR_CHECK(ibv_query_qp);

int softrdma_ibv_destroy_qp(struct ibv_qp *qp)
{
	int e = qp ? srDestroyVerbsQP(qp) : EINVAL;
	SR_RET_ERRNO(e);
}
SR_CHECK(ibv_destroy_qp);

struct ibv_qp_ex *softrdma_ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	struct sr_qp *q = (struct sr_qp *)qp;
	if (!qp || !srQPValid(qp) || !q->ex) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	return &q->qpx;
}
SR_CHECK(ibv_qp_to_qp_ex);

// ---- AH from a work completion ----

int softrdma_ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num, struct ibv_wc *wc,
				 struct ibv_grh *grh, struct ibv_ah_attr *ah_attr)
{
	int e;
	if (!context || !wc || !ah_attr) {
		errno = EINVAL;
		return -1;
	}
	e = srInitAHFromWC(context, port_num, wc, grh, ah_attr);
	if (e) {
		errno = e;
		return -1;
	}
	return 0;
}
SR_CHECK(ibv_init_ah_from_wc);

struct ibv_ah *softrdma_ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh,
					      uint8_t port_num)
{
	struct ibv_ah_attr attr;
	struct ibv_ah *ah = NULL;
	int e;
	if (!pd || !wc) {
		errno = EINVAL;
		return NULL;
	}
	if (!srPDValid(pd)) {
		errno = EINVAL;
		return NULL;
	}
	if (softrdma_ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr))
		return NULL;
	e = srCreateAH(pd, &attr, &ah);
	SR_RET_PTR(e, ah);
}
SR_CHECK(ibv_create_ah_from_wc);

// ---- the WR API of an extended QP ----

// sr_wr is one request between wr_start and wr_complete: the send WR and
// its gather list (one element inline in one, else malloc'd in sges), and
// the copy of its inline data.
struct sr_wr {
	struct ibv_send_wr wr;
	struct ibv_sge one;
	struct ibv_sge *sges;
	void *inl;
};

static void sr_wrs_clear(struct sr_qp *q)
{
	for (int i = 0; i < q->nwr; i++) {
		free(q->wrs[i].sges);
		free(q->wrs[i].inl);
	}
	q->nwr = 0;
	q->wr_err = 0;
}

static void sr_wr_start(struct ibv_qp_ex *qx)
{
	sr_wrs_clear((struct sr_qp *)qx);
}

static struct sr_wr *sr_wr_new(struct ibv_qp_ex *qx, enum ibv_wr_opcode op)
{
	struct sr_qp *q = (struct sr_qp *)qx;
	struct sr_wr *w;
	if (q->nwr == q->capwr) {
		int n = q->capwr ? 2 * q->capwr : 16;
		struct sr_wr *p = realloc(q->wrs, n * sizeof *p);
		if (!p) {
			if (!q->wr_err)
				q->wr_err = ENOMEM;
			return NULL;
		}
		q->wrs = p;
		q->capwr = n;
	}
	w = &q->wrs[q->nwr++];
	memset(w, 0, sizeof *w);
	w->wr.wr_id = qx->wr_id;
	w->wr.send_flags = qx->wr_flags;
	w->wr.opcode = op;
	return w;
}

// sr_wr_last is the request the wr_set_* calls complete.
static struct sr_wr *sr_wr_last(struct ibv_qp_ex *qx)
{
	struct sr_qp *q = (struct sr_qp *)qx;
	if (q->nwr == 0) {
		if (!q->wr_err)
			q->wr_err = EINVAL;
		return NULL;
	}
	return &q->wrs[q->nwr - 1];
}

static void sr_wr_send(struct ibv_qp_ex *qx) { sr_wr_new(qx, IBV_WR_SEND); }

static void sr_wr_send_imm(struct ibv_qp_ex *qx, __be32 imm)
{
	struct sr_wr *w = sr_wr_new(qx, IBV_WR_SEND_WITH_IMM);
	if (w)
		w->wr.imm_data = imm;
}

static void sr_wr_set_ud_addr(struct ibv_qp_ex *qx, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey)
{
	struct sr_wr *w = sr_wr_last(qx);
	if (!w)
		return;
	w->wr.wr.ud.ah = ah;
	w->wr.wr.ud.remote_qpn = qpn;
	w->wr.wr.ud.remote_qkey = qkey;
}

static void sr_wr_set_sge(struct ibv_qp_ex *qx, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct sr_wr *w = sr_wr_last(qx);
	if (!w)
		return;
	w->one = (struct ibv_sge){ .addr = addr, .length = length, .lkey = lkey };
	w->wr.num_sge = 1;
}

static void sr_wr_set_sge_list(struct ibv_qp_ex *qx, size_t n, const struct ibv_sge *list)
{
	struct sr_qp *q = (struct sr_qp *)qx;
	struct sr_wr *w = sr_wr_last(qx);
	if (!w)
		return;
	free(w->sges);
	w->sges = NULL;
	w->wr.num_sge = 0;
	if (n == 0)
		return;
	if (!list || n > 1024) {
		q->wr_err = q->wr_err ? q->wr_err : EINVAL;
		return;
	}
	w->sges = malloc(n * sizeof *list);
	if (!w->sges) {
		q->wr_err = q->wr_err ? q->wr_err : ENOMEM;
		return;
	}
	memcpy(w->sges, list, n * sizeof *list);
	w->wr.num_sge = n;
}

static void sr_wr_set_inline_data_list(struct ibv_qp_ex *qx, size_t n, const struct ibv_data_buf *bufs)
{
	struct sr_qp *q = (struct sr_qp *)qx;
	struct sr_wr *w = sr_wr_last(qx);
	size_t len = 0, off = 0;
	if (!w)
		return;
	for (size_t i = 0; i < n; i++)
		len += bufs[i].length;
	free(w->inl);
	w->inl = malloc(len ? len : 1);
	if (!w->inl) {
		q->wr_err = q->wr_err ? q->wr_err : ENOMEM;
		return;
	}
	for (size_t i = 0; i < n; i++) {
		memcpy((char *)w->inl + off, bufs[i].addr, bufs[i].length);
		off += bufs[i].length;
	}
	w->one = (struct ibv_sge){ .addr = (uintptr_t)w->inl, .length = len, .lkey = 0 };
	w->wr.num_sge = 1;
	w->wr.send_flags |= IBV_SEND_INLINE;
}

static void sr_wr_set_inline_data(struct ibv_qp_ex *qx, void *addr, size_t length)
{
	struct ibv_data_buf b = { .addr = addr, .length = length };
	sr_wr_set_inline_data_list(qx, 1, &b);
}

static int sr_wr_complete(struct ibv_qp_ex *qx)
{
	struct sr_qp *q = (struct sr_qp *)qx;
	struct ibv_send_wr *bad = NULL;
	int e = q->wr_err;
	if (!e && q->nwr > 0) {
		for (int i = 0; i < q->nwr; i++) {
			struct sr_wr *w = &q->wrs[i];
			w->wr.sg_list = w->sges ? w->sges : &w->one;
			w->wr.next = i + 1 < q->nwr ? &q->wrs[i + 1].wr : NULL;
		}
		e = qx->qp_base.context->ops.post_send(&qx->qp_base, &q->wrs[0].wr, &bad);
	}
	sr_wrs_clear(q);
	return e;
}

static void sr_wr_abort(struct ibv_qp_ex *qx) { sr_wrs_clear((struct sr_qp *)qx); }

static void sr_qpx_setup(struct sr_qp *q, uint64_t ops)
{
	struct ibv_qp_ex *x = &q->qpx;
	q->ex = 1;
	if (ops & IBV_QP_EX_WITH_SEND)
		x->wr_send = sr_wr_send;
	if (ops & IBV_QP_EX_WITH_SEND_WITH_IMM)
		x->wr_send_imm = sr_wr_send_imm;
	x->wr_set_ud_addr = sr_wr_set_ud_addr;
	x->wr_set_sge = sr_wr_set_sge;
	x->wr_set_sge_list = sr_wr_set_sge_list;
	x->wr_set_inline_data = sr_wr_set_inline_data;
	x->wr_set_inline_data_list = sr_wr_set_inline_data_list;
	x->wr_start = sr_wr_start;
	x->wr_complete = sr_wr_complete;
	x->wr_abort = sr_wr_abort;
}
