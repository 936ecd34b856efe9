//go:build capi

// cqex.c: extended CQs (ibv_create_cq_ex, an inline of verbs.h that calls
// the context's create_cq_ex) and their polling API (ibv_start_poll,
// ibv_next_poll, ibv_end_poll, ibv_wc_read_*), as rdma-core's rxe provider
// has them: the same wc_flags (IBV_WC_STANDARD_FLAGS; a completion
// timestamp, CVLAN, flow tag or TM info is refused with EOPNOTSUPP), the
// read_* ops of the fields asked for and no others, ENOENT from
// start_poll and next_poll when there is nothing (more) to poll.
//
// An extended CQ is a CQ of ibv_create_cq (the same Go object, events,
// ibv_req_notify_cq on ibv_cq_ex_to_cq, ibv_destroy_cq) with a polling
// state in C: completions are taken from the CQ SR_CQX_BATCH at a time
// (one entry into Go, or one round trip to the parent in a child of
// fork()) into buf, and the read_* ops read the current one there. A
// completion taken and not yet consumed stays in buf for the next poll:
// ibv_end_poll after one ibv_next_poll loses nothing, and ibv_poll_cq on
// the same CQ returns buf's completions first. The state has a lock held
// from a successful start_poll to end_poll, as rxe's spinlock.
//
// Nothing here enters Go: the same code serves the CQs of a child of
// fork() (forkchild.c), with the child's raw poll.

#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "capi.h"

void sr_fork_say(const char *call);

// What rxe's provider supports (providers/rxe/rxe.c RXE_SUP_WC_FLAGS).
enum { SR_CQX_WC_FLAGS = IBV_WC_STANDARD_FLAGS };

#define SR_CQX_BATCH 16

struct sr_cqx {
	pthread_mutex_t mu; // held from a successful start_poll to end_poll
	sr_poll_fn raw;
	int gen;	    // sr_fork_gen where the CQ was made
	int active;	    // a poll is under way (mu held)
	int cur;	    // buf[pos] is the poll's current completion, not consumed yet
	int pos, n;	    // buf[pos..n): taken from the CQ, not consumed
	struct ibv_wc buf[SR_CQX_BATCH];
};

_Static_assert(offsetof(struct ibv_cq_ex, context) == offsetof(struct ibv_cq, context) &&
		       offsetof(struct ibv_cq_ex, channel) == offsetof(struct ibv_cq, channel) &&
		       offsetof(struct ibv_cq_ex, cq_context) == offsetof(struct ibv_cq, cq_context) &&
		       offsetof(struct ibv_cq_ex, handle) == offsetof(struct ibv_cq, handle) &&
		       offsetof(struct ibv_cq_ex, cqe) == offsetof(struct ibv_cq, cqe) &&
		       offsetof(struct ibv_cq_ex, mutex) == offsetof(struct ibv_cq, mutex) &&
		       offsetof(struct ibv_cq_ex, cond) == offsetof(struct ibv_cq, cond) &&
		       offsetof(struct ibv_cq_ex, comp_events_completed) ==
			       offsetof(struct ibv_cq, comp_events_completed) &&
		       offsetof(struct ibv_cq_ex, async_events_completed) ==
			       offsetof(struct ibv_cq, async_events_completed) &&
		       offsetof(struct sr_cq, cqx) == 0,
	       "struct ibv_cq_ex does not begin with struct ibv_cq");

static inline struct sr_cqx *sr_cqx_of(struct ibv_cq_ex *cq) { return ((struct sr_cq *)cq)->x; }
static inline struct ibv_wc *sr_cqx_wc(struct ibv_cq_ex *cq)
{
	struct sr_cqx *x = sr_cqx_of(cq);
	return &x->buf[x->pos];
}

// sr_cqx_check is what rxe (its provider, libibverbs' ibv_cmd_create_cq_ex
// and the kernel's uverbs and rxe_create_cq) refuses before it makes an
// extended CQ, in their order: wc_flags it does not have (EOPNOTSUPP), a
// comp_mask bit other than FLAGS and PD (EOPNOTSUPP), a completion vector
// out of range (EINVAL), IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN (the kernel's
// rxe refuses every CQ flag, EOPNOTSUPP). IBV_CREATE_CQ_ATTR_SINGLE_THREADED
// (a hint to the provider) and a parent domain (IBV_CQ_INIT_ATTR_MASK_PD)
// are accepted and ignored, as rxe does. The number of entries is the
// device's to check (EINVAL), as for ibv_create_cq.
int sr_cqx_check(struct ibv_context *ctx, const struct ibv_cq_init_attr_ex *attr)
{
	if (!ctx || !attr)
		return EINVAL;
	if (attr->wc_flags & ~(uint64_t)SR_CQX_WC_FLAGS) {
		SR_UNSUPPORTED("ibv_create_cq_ex with wc_flags beyond IBV_WC_STANDARD_FLAGS (completion timestamps, "
			       "CVLAN, flow tag, TM info)");
		return EOPNOTSUPP;
	}
	if (attr->comp_mask & ~(uint32_t)(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD))
		return EOPNOTSUPP;
	if (attr->comp_vector >= (uint32_t)ctx->num_comp_vectors)
		return EINVAL;
	if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (attr->flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN)) {
		SR_UNSUPPORTED("ibv_create_cq_ex with IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN");
		return EOPNOTSUPP;
	}
	if (attr->cqe > INT_MAX)
		return EINVAL;
	return 0;
}

// sr_cqx_fill takes the next batch of completions into buf (x->mu held):
// 0, ENOENT when there is none, or the poll's error.
static int sr_cqx_fill(struct ibv_cq_ex *cq, struct sr_cqx *x)
{
	int n = x->raw(ibv_cq_ex_to_cq(cq), SR_CQX_BATCH, x->buf);
	if (n < 0)
		return -n;
	if (n == 0)
		return ENOENT;
	x->pos = 0;
	x->n = n;
	return 0;
}

// sr_cqx_current makes buf[pos] the poll's current completion.
static void sr_cqx_current(struct ibv_cq_ex *cq, struct sr_cqx *x)
{
	x->cur = 1;
	cq->status = x->buf[x->pos].status;
	cq->wr_id = x->buf[x->pos].wr_id;
}

// sr_cqx_inherited tells (once on stderr) that cq is an extended CQ of
// the process this one was forked from: it stays that process's.
static int sr_cqx_inherited(struct sr_cqx *x, const char *call)
{
	if (x->gen == sr_fork_gen)
		return 0;
	sr_fork_say(call);
	return 1;
}

static int sr_cqx_start_poll(struct ibv_cq_ex *cq, struct ibv_poll_cq_attr *attr)
{
	struct sr_cqx *x = sr_cqx_of(cq);
	int e;
	(void)attr; // comp_mask: none defined, and rxe does not look
	if (sr_cqx_inherited(x, "ibv_start_poll")) {
		errno = EINVAL;
		return EINVAL;
	}
	pthread_mutex_lock(&x->mu);
	if (x->pos == x->n && (e = sr_cqx_fill(cq, x))) {
		pthread_mutex_unlock(&x->mu);
		errno = e;
		return e;
	}
	x->active = 1;
	sr_cqx_current(cq, x);
	return 0;
}

static int sr_cqx_next_poll(struct ibv_cq_ex *cq)
{
	struct sr_cqx *x = sr_cqx_of(cq);
	int e;
	if (x->gen != sr_fork_gen || !x->active) {
		errno = EINVAL;
		return EINVAL;
	}
	if (x->cur) {
		x->pos++;
		x->cur = 0;
	}
	if (x->pos == x->n && (e = sr_cqx_fill(cq, x))) {
		errno = e;
		return e;
	}
	sr_cqx_current(cq, x);
	return 0;
}

// sr_cqx_end_poll consumes the current completion and ends the poll. Without
// a poll under way (start_poll failed: pyverbs calls it all the same) it
// does nothing.
static void sr_cqx_end_poll(struct ibv_cq_ex *cq)
{
	struct sr_cqx *x = sr_cqx_of(cq);
	if (x->gen != sr_fork_gen || !x->active)
		return;
	if (x->cur) {
		x->pos++;
		x->cur = 0;
	}
	x->active = 0;
	pthread_mutex_unlock(&x->mu);
}

static enum ibv_wc_opcode sr_cqx_read_opcode(struct ibv_cq_ex *cq) { return sr_cqx_wc(cq)->opcode; }
static uint32_t sr_cqx_read_vendor_err(struct ibv_cq_ex *cq) { return sr_cqx_wc(cq)->vendor_err; }
static unsigned int sr_cqx_read_wc_flags(struct ibv_cq_ex *cq) { return sr_cqx_wc(cq)->wc_flags; }
static uint32_t sr_cqx_read_byte_len(struct ibv_cq_ex *cq) { return sr_cqx_wc(cq)->byte_len; }
static __be32 sr_cqx_read_imm_data(struct ibv_cq_ex *cq) { return sr_cqx_wc(cq)->imm_data; }
static uint32_t sr_cqx_read_qp_num(struct ibv_cq_ex *cq) { return sr_cqx_wc(cq)->qp_num; }
static uint32_t sr_cqx_read_src_qp(struct ibv_cq_ex *cq) { return sr_cqx_wc(cq)->src_qp; }
static uint32_t sr_cqx_read_slid(struct ibv_cq_ex *cq) { return sr_cqx_wc(cq)->slid; }
static uint8_t sr_cqx_read_sl(struct ibv_cq_ex *cq) { return sr_cqx_wc(cq)->sl; }
static uint8_t sr_cqx_read_dlid_path_bits(struct ibv_cq_ex *cq) { return sr_cqx_wc(cq)->dlid_path_bits; }

// sr_cqx_make makes c, a CQ just made with attr's cqe, context, channel
// and vector, an extended one: its polling state and ops. As rxe, the
// read_* ops of fields not in attr->wc_flags stay NULL (calling one is the
// program's error), and opcode, vendor_err and wc_flags are always there.
int sr_cqx_make(struct sr_cq *c, const struct ibv_cq_init_attr_ex *attr, sr_poll_fn raw)
{
	struct ibv_cq_ex *cq = &c->cqx;
	struct sr_cqx *x = calloc(1, sizeof *x);
	uint64_t f = attr->wc_flags;
	if (!x)
		return ENOMEM;
	pthread_mutex_init(&x->mu, NULL);
	x->raw = raw;
	x->gen = sr_fork_gen;
	cq->start_poll = sr_cqx_start_poll;
	cq->next_poll = sr_cqx_next_poll;
	cq->end_poll = sr_cqx_end_poll;
	cq->read_opcode = sr_cqx_read_opcode;
	cq->read_vendor_err = sr_cqx_read_vendor_err;
	cq->read_wc_flags = sr_cqx_read_wc_flags;
	if (f & IBV_WC_EX_WITH_BYTE_LEN)
		cq->read_byte_len = sr_cqx_read_byte_len;
	if (f & IBV_WC_EX_WITH_IMM)
		cq->read_imm_data = sr_cqx_read_imm_data;
	if (f & IBV_WC_EX_WITH_QP_NUM)
		cq->read_qp_num = sr_cqx_read_qp_num;
	if (f & IBV_WC_EX_WITH_SRC_QP)
		cq->read_src_qp = sr_cqx_read_src_qp;
	if (f & IBV_WC_EX_WITH_SLID)
		cq->read_slid = sr_cqx_read_slid;
	if (f & IBV_WC_EX_WITH_SL)
		cq->read_sl = sr_cqx_read_sl;
	if (f & IBV_WC_EX_WITH_DLID_PATH_BITS)
		cq->read_dlid_path_bits = sr_cqx_read_dlid_path_bits;
	c->x = x;
	return 0;
}

// sr_cqx_poll_cq is ibv_poll_cq on an extended CQ: the completions taken
// into buf and not consumed first, then the CQ's. It waits for a poll of
// the extended API under way in another thread to end.
int sr_cqx_poll_cq(struct sr_cq *c, int n, struct ibv_wc *wc)
{
	struct sr_cqx *x = c->x;
	int k = 0;
	if (sr_cqx_inherited(x, "ibv_poll_cq"))
		return -EINVAL;
	pthread_mutex_lock(&x->mu);
	while (k < n && x->pos < x->n)
		wc[k++] = x->buf[x->pos++];
	if (k < n) {
		int r = x->raw(sr_cq_base(c), n - k, wc + k);
		if (r > 0)
			k += r;
		else if (r < 0 && k == 0)
			k = r;
	}
	pthread_mutex_unlock(&x->mu);
	return k;
}

void sr_cqx_free(struct sr_cqx *x)
{
	if (!x)
		return;
	pthread_mutex_destroy(&x->mu);
	free(x);
}
