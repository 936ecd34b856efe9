// capi.h: the C side of softrdma's librdmacm and libibverbs (see main.go).
// Every object handed to a C program is one of these malloc'd structs: the
// rdma-core struct first (so a pointer to it is a pointer to the wrapper),
// then the handle of the Go object behind it (see registry in capi.go).
#ifndef SOFTRDMA_CAPI_H
#define SOFTRDMA_CAPI_H

#include <stdint.h>
#include <stddef.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <infiniband/ib.h>

struct sr_device { struct ibv_device dev; uintptr_t h; };
// The context is an extended one (struct verbs_context) as rdma-core's
// providers give: the inline functions of verbs.h find it with
// container_of, so the Go handle sits before it.
struct sr_context { uintptr_t h; struct verbs_context vc; };
struct sr_pd { struct ibv_pd pd; uintptr_t h; };
struct sr_mr { struct ibv_mr mr; uintptr_t h; };
// A CQ is an extended one (struct ibv_cq_ex, whose first fields are
// struct ibv_cq's: ibv_cq_ex_to_cq is a cast). hint is what softverbs says
// of the CQ (SetPollHint): 0 while a poll would find nothing and do
// nothing, so that ibv_poll_cq returns at once without entering Go; all
// ones (enter Go) where the device gives no hint. x is the polling state
// of a CQ made with ibv_create_cq_ex (cqex.c), NULL for ibv_create_cq's.
struct sr_cqx;
struct sr_cq { struct ibv_cq_ex cqx; uintptr_t h; uint32_t hint; struct sr_cqx *x; };
static inline struct ibv_cq *sr_cq_base(struct sr_cq *c) { return ibv_cq_ex_to_cq(&c->cqx); }
// A QP is an extended one (ibv_qp_to_qp_ex): qpx.qp_base is the struct
// ibv_qp. The WR API's requests between wr_start and wr_complete are
// kept in wrs (qp.c).
struct sr_wr;
struct sr_qp {
	struct ibv_qp_ex qpx;
	uintptr_t h;
	int ex;			// made with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
	struct sr_wr *wrs;	// the WR API's pending requests
	int nwr, capwr;
	int wr_err;		// the first error of the WR API since wr_start
};
struct sr_ah { struct ibv_ah ah; uintptr_t h; };
struct sr_comp_channel { struct ibv_comp_channel ch; uintptr_t h; };
struct sr_channel { struct rdma_event_channel ch; uintptr_t h; };
struct sr_id { struct rdma_cm_id id; uintptr_t h; };
struct sr_event { struct rdma_cm_event ev; uintptr_t h; };

// sr_qp_init is struct ibv_qp_init_attr and its _ex flattened for Go.
struct sr_qp_init {
	void *qp_context;
	struct ibv_cq *send_cq, *recv_cq;
	struct ibv_pd *pd;
	uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data;
	int qp_type;
	int sq_sig_all;
	uint32_t create_flags;
};

static inline struct sr_context *sr_ctx_of(struct ibv_context *c) {
	return (struct sr_context *)((char *)c - offsetof(struct sr_context, vc.context));
}

struct sr_context *sr_context_alloc(struct ibv_device *dev, int num_comp_vectors);
void sr_context_free(struct sr_context *c);
struct sr_cq *sr_cq_alloc(struct ibv_context *ctx, struct ibv_comp_channel *ch, void *cq_context, int cqe);
void sr_cq_free(struct sr_cq *cq);
// Extended CQs (cqex.c), in the parent and in a child of fork(): raw
// polls the CQ itself (what its ibv_poll_cq does without cqex.c's buffer).
typedef int (*sr_poll_fn)(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int sr_cqx_check(struct ibv_context *ctx, const struct ibv_cq_init_attr_ex *attr);
int sr_cqx_make(struct sr_cq *c, const struct ibv_cq_init_attr_ex *attr, sr_poll_fn raw);
int sr_cqx_poll_cq(struct sr_cq *c, int n, struct ibv_wc *wc);
void sr_cqx_free(struct sr_cqx *x);
// sr_fork_gen counts the fork()s from the process that loaded the
// libraries to this one (fork.c): an object made where it differs is
// inherited, not the process's own.
extern int sr_fork_gen;
struct sr_qp *sr_qp_alloc(void);
static inline struct ibv_qp *sr_qp_base(struct sr_qp *q) { return &q->qpx.qp_base; }
void sr_qp_init_from(struct sr_qp_init *in, void *ctx, struct ibv_cq *scq, struct ibv_cq *rcq,
		     struct ibv_qp_cap *cap, int qp_type, int sq_sig_all);
void sr_unsupported_qpt(const char *call, int qp_type);
void sr_qp_make_ex(struct ibv_qp *qp, uint64_t send_ops_flags);
struct ibv_qp *sr_create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *attr);
void sr_qp_free(struct sr_qp *qp);
void sr_unsupported(int *once, const char *call);
// SR_UNSUPPORTED prints, once per process, that call is not supported.
#define SR_UNSUPPORTED(call) do { static int sr_once_; sr_unsupported(&sr_once_, call); } while (0)
// sr_stubs names the stubs of stubs.c (the calls softrdma does not
// implement), for a child of fork() (fork.c).
struct sr_stub { const char *name; long (*fn)(void); };
extern const struct sr_stub sr_stubs[];
int sr_eventfd_signal(int fd);
int sr_eventfd_clear(int fd);
int sr_channel_fd(int evfd);

// Socket address helpers for Go (unions are opaque to cgo).
struct sockaddr *sr_id_src(struct rdma_cm_id *id);
struct sockaddr *sr_id_dst(struct rdma_cm_id *id);
struct rdma_ud_param *sr_event_ud(struct rdma_cm_event *ev);
uint32_t sr_wc_imm(struct ibv_wc *wc);

// The data path: ibv_post_send and ibv_post_recv hand Go a chain's work
// requests SR_CHAIN at a time, flattened (the unions of the WR structs are
// opaque to cgo), in one call; Go writes imm_data of a struct ibv_wc at
// SR_WC_IMM_OFF.
#define SR_CHAIN 32
struct sr_swr {
	uint64_t wr_id;
	struct ibv_sge *sg;
	struct ibv_ah *ah;
	int num_sge;
	uint32_t opcode, flags, imm, rqpn, rqkey;
};
struct sr_rwr {
	uint64_t wr_id;
	struct ibv_sge *sg;
	int num_sge;
};
enum { SR_WC_IMM_OFF = offsetof(struct ibv_wc, imm_data) };
void sr_wc_set_imm(struct ibv_wc *wc, uint32_t be);

#endif
