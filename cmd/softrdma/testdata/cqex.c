// cqex: extended CQs through softrdma's libibverbs (TestExecCQEx runs it
// through softrdma exec): `cqex DEVICE`.
//
// What rxe refuses, with its errno: wc_flags beyond IBV_WC_STANDARD_FLAGS
// (EOPNOTSUPP, each), an unknown comp_mask bit (EOPNOTSUPP),
// IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN (EOPNOTSUPP), cqe 0 or above max_cqe
// and a completion vector out of range (EINVAL); the read_* ops there
// are exactly those of the wc_flags asked for. Then traffic: a UD QP whose
// send and receive CQ is one extended CQ with a completion channel sends
// 16 datagrams to itself (odd ones with immediate data); the first event
// comes through the channel (ibv_req_notify_cq on ibv_cq_ex_to_cq), and
// the 32 completions are polled in polls of at most three completions
// (ibv_start_poll, ibv_next_poll, ibv_end_poll), with an ibv_poll_cq on the
// same CQ after every other poll; each completion's read_* values
// (opcode, vendor_err, byte_len, imm_data, qp_num, src_qp, wc_flags, slid,
// sl, dlid_path_bits), status and wr_id are checked, and nothing is lost
// or comes twice. Then a child of fork() does the same traffic on a
// context of its own, and gets EINVAL for the parent's extended CQ and
// context; the parent's CQ works after. Prints "ok NAME" per check,
// "FAIL NAME: ..." for a wrong one; exits 1 if any failed.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define N 16
#define QKEY 0x11111111
#define SLOT (40 + 64)

static int failed;
static const char *who = "parent";

static void check(const char *name, int cond, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void check(const char *name, int cond, const char *fmt, ...)
{
	if (cond) {
		printf("ok %s %s\n", who, name);
	} else {
		va_list ap;
		printf("FAIL %s %s: ", who, name);
		va_start(ap, fmt);
		vprintf(fmt, ap);
		va_end(ap);
		printf("\n");
		failed = 1;
	}
	fflush(stdout);
}

static struct ibv_context *open_dev(const char *name)
{
	int n = 0;
	struct ibv_context *ctx = NULL;
	struct ibv_device **list = ibv_get_device_list(&n);
	for (int i = 0; list && i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			ctx = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	return ctx;
}

// refused checks that ibv_create_cq_ex refuses attr with want.
static void refused(struct ibv_context *ctx, const char *name, struct ibv_cq_init_attr_ex attr, int want)
{
	struct ibv_cq_ex *cq;
	errno = 0;
	cq = ibv_create_cq_ex(ctx, &attr);
	check(name, !cq && errno == want, "got %p, errno %d (%s), want %s", (void *)cq, errno, strerror(errno),
	      strerror(want));
	if (cq)
		ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
}

static void bad_flow(struct ibv_context *ctx)
{
	struct ibv_device_attr da;
	static const struct {
		uint64_t flag;
		const char *name;
	} unsup[] = {
		{ IBV_WC_EX_WITH_COMPLETION_TIMESTAMP, "COMPLETION_TIMESTAMP" },
		{ IBV_WC_EX_WITH_CVLAN, "CVLAN" },
		{ IBV_WC_EX_WITH_FLOW_TAG, "FLOW_TAG" },
		{ IBV_WC_EX_WITH_TM_INFO, "TM_INFO" },
		{ IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK, "COMPLETION_TIMESTAMP_WALLCLOCK" },
	};
	char name[128];
	if (ibv_query_device(ctx, &da)) {
		check("ibv_query_device", 0, "%s", strerror(errno));
		return;
	}
	for (size_t i = 0; i < sizeof unsup / sizeof unsup[0]; i++) {
		snprintf(name, sizeof name, "wc_flags IBV_WC_EX_WITH_%s EOPNOTSUPP", unsup[i].name);
		refused(ctx, name, (struct ibv_cq_init_attr_ex){ .cqe = 8, .wc_flags = IBV_WC_STANDARD_FLAGS | unsup[i].flag },
			EOPNOTSUPP);
	}
	refused(ctx, "comp_mask unknown bit EOPNOTSUPP",
		(struct ibv_cq_init_attr_ex){ .cqe = 8, .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD << 1 }, EOPNOTSUPP);
	refused(ctx, "flags IGNORE_OVERRUN EOPNOTSUPP",
		(struct ibv_cq_init_attr_ex){ .cqe = 8, .comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS,
					      .flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN },
		EOPNOTSUPP);
	refused(ctx, "cqe max_cqe+1 EINVAL", (struct ibv_cq_init_attr_ex){ .cqe = da.max_cqe + 1 }, EINVAL);
	refused(ctx, "cqe 0 EINVAL", (struct ibv_cq_init_attr_ex){ .cqe = 0 }, EINVAL);
	refused(ctx, "comp_vector num_comp_vectors EINVAL",
		(struct ibv_cq_init_attr_ex){ .cqe = 8, .comp_vector = ctx->num_comp_vectors }, EINVAL);

	// The read_* ops are those of the flags asked for, as rxe's.
	for (int bit = -1; bit < 7; bit++) {
		struct ibv_cq_init_attr_ex a = { .cqe = 4, .wc_flags = bit < 0 ? 0 : 1ull << bit };
		struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &a);
		uint64_t f = a.wc_flags;
		snprintf(name, sizeof name, "wc_flags %#llx: its read ops", (unsigned long long)f);
		if (!cq) {
			check(name, 0, "ibv_create_cq_ex: %s", strerror(errno));
			continue;
		}
		check(name,
		      cq->start_poll && cq->next_poll && cq->end_poll && cq->read_opcode && cq->read_vendor_err &&
			      cq->read_wc_flags && !cq->read_byte_len == !(f & IBV_WC_EX_WITH_BYTE_LEN) &&
			      !cq->read_imm_data == !(f & IBV_WC_EX_WITH_IMM) &&
			      !cq->read_qp_num == !(f & IBV_WC_EX_WITH_QP_NUM) &&
			      !cq->read_src_qp == !(f & IBV_WC_EX_WITH_SRC_QP) &&
			      !cq->read_slid == !(f & IBV_WC_EX_WITH_SLID) && !cq->read_sl == !(f & IBV_WC_EX_WITH_SL) &&
			      !cq->read_dlid_path_bits == !(f & IBV_WC_EX_WITH_DLID_PATH_BITS) &&
			      !cq->read_completion_ts && !cq->read_cvlan && !cq->read_flow_tag && !cq->read_tm_info &&
			      !cq->read_completion_wallclock_ns,
		      "a read op differs from the flags");
		snprintf(name, sizeof name, "wc_flags %#llx: ibv_destroy_cq", (unsigned long long)f);
		int r = ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
		check(name, r == 0, "%s", strerror(r));
	}
	{
		struct ibv_cq_init_attr_ex a = { .cqe = 4, .comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS,
						 .flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED };
		struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &a);
		check("flags SINGLE_THREADED", cq != NULL, "%s", strerror(errno));
		if (cq)
			ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
	}
}

// got is one completion as read through either polling API.
struct got {
	uint64_t wr_id;
	int status, opcode, vendor_err, via_ex;
	uint32_t byte_len, imm, qp_num, src_qp, wc_flags, slid;
	uint8_t sl, dlid_path_bits;
};

static void read_ex(struct ibv_cq_ex *cq, struct got *g)
{
	g->wr_id = cq->wr_id;
	g->status = cq->status;
	g->opcode = ibv_wc_read_opcode(cq);
	g->vendor_err = ibv_wc_read_vendor_err(cq);
	g->byte_len = ibv_wc_read_byte_len(cq);
	g->wc_flags = ibv_wc_read_wc_flags(cq);
	g->imm = g->wc_flags & IBV_WC_WITH_IMM ? ibv_wc_read_imm_data(cq) : 0;
	g->qp_num = ibv_wc_read_qp_num(cq);
	g->src_qp = ibv_wc_read_src_qp(cq);
	g->slid = ibv_wc_read_slid(cq);
	g->sl = ibv_wc_read_sl(cq);
	g->dlid_path_bits = ibv_wc_read_dlid_path_bits(cq);
	g->via_ex = 1;
}

static void read_wc(const struct ibv_wc *wc, struct got *g)
{
	*g = (struct got){
		.wr_id = wc->wr_id, .status = wc->status, .opcode = wc->opcode, .vendor_err = wc->vendor_err,
		.byte_len = wc->byte_len, .imm = wc->wc_flags & IBV_WC_WITH_IMM ? wc->imm_data : 0,
		.qp_num = wc->qp_num, .src_qp = wc->src_qp, .wc_flags = wc->wc_flags, .slid = wc->slid,
		.sl = wc->sl, .dlid_path_bits = wc->dlid_path_bits,
	};
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		return -1;
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		return -1;
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) ? -1 : 0;
}

static int post_send(struct ibv_qp *qp, struct ibv_ah *ah, struct ibv_mr *mr, char *buf, int i)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 1 + i, .lkey = mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = i, .sg_list = &sge, .num_sge = 1, .send_flags = IBV_SEND_SIGNALED,
		.opcode = i % 2 ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND, .imm_data = htonl(0xabc000 + i),
	}, *bad;
	memset(buf, 'a' + i, 1 + i);
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qp->qp_num;
	wr.wr.ud.remote_qkey = QKEY;
	return ibv_post_send(qp, &wr, &bad);
}

// traffic: the UD traffic of the header through one extended CQ.
static void traffic(struct ibv_context *ctx)
{
	static int marker;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq_init_attr_ex ca = {
		.cqe = 4 * N, .cq_context = &marker, .channel = ch, .wc_flags = IBV_WC_STANDARD_FLAGS,
	};
	struct ibv_cq_ex *cqx = ch ? ibv_create_cq_ex(ctx, &ca) : NULL;
	struct ibv_cq *cq = cqx ? ibv_cq_ex_to_cq(cqx) : NULL, *evcq = NULL;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	char *buf = calloc(N + 1, SLOT);
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, (N + 1) * SLOT, IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_port_attr pa;
	union ibv_gid gid;
	struct got got[2 * N];
	int ngot = 0, r, e;
	void *evctx = NULL;
	struct ibv_poll_cq_attr pattr = { 0 };

	check("ibv_create_cq_ex with a channel", cqx && cq->channel == ch && cq->cq_context == &marker &&
						   cq->context == ctx && cq->cqe >= 4 * N,
	      "%s", strerror(errno));
	check("setup", pd && mr, "%s", strerror(errno));
	if (!cqx || !pd || !mr)
		return;
	r = ibv_start_poll(cqx, &pattr);
	check("ibv_start_poll on an empty CQ: ENOENT", r == ENOENT, "%d", r);
	ibv_end_poll(cqx); // after a failed start_poll (pyverbs does): nothing

	struct ibv_qp_init_attr qa = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = N + 1, .max_recv_wr = N + 1, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	check("ibv_create_qp on the extended CQ", qp && !to_rts(qp), "%s", strerror(errno));
	if (!qp)
		return;
	if (ibv_query_port(ctx, 1, &pa) || ibv_query_gid(ctx, 1, 0, &gid)) {
		check("ibv_query_port, ibv_query_gid", 0, "%s", strerror(errno));
		return;
	}
	struct ibv_ah_attr aa = { .port_num = 1 };
	if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
		aa.is_global = 1;
		aa.grh.dgid = gid;
		aa.grh.hop_limit = 1;
	} else {
		aa.dlid = pa.lid;
	}
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	check("ibv_create_ah to itself", ah != NULL, "%s", strerror(errno));
	if (!ah)
		return;
	for (int i = 0; i < N; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)buf + (i + 1) * SLOT, .length = SLOT, .lkey = mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 1000 + i, .sg_list = &sge, .num_sge = 1 }, *bad;
		if ((e = ibv_post_recv(qp, &wr, &bad))) {
			check("ibv_post_recv", 0, "%s", strerror(e));
			return;
		}
	}
	r = ibv_req_notify_cq(cq, 0);
	check("ibv_req_notify_cq(ibv_cq_ex_to_cq)", r == 0, "%s", strerror(r));
	for (int i = 0; i < N; i++)
		if ((e = post_send(qp, ah, mr, buf, i))) {
			check("ibv_post_send", 0, "%s", strerror(e));
			return;
		}
	{
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		r = poll(&p, 1, 5000);
		check("completion event (poll on the channel)", r == 1, "poll %d", r);
		r = ibv_get_cq_event(ch, &evcq, &evctx);
		check("ibv_get_cq_event: the extended CQ and its context", r == 0 && evcq == cq && evctx == &marker,
		      "%d %s", r, strerror(errno));
		if (r == 0)
			ibv_ack_cq_events(cq, 1);
	}

	// Polls of at most three completions; an ibv_poll_cq after every
	// other one.
	double deadline = now() + 10;
	for (int round = 0; ngot < 2 * N && now() < deadline; round++) {
		r = ibv_start_poll(cqx, &pattr);
		if (r == ENOENT) {
			ibv_end_poll(cqx);
			usleep(1000);
			continue;
		}
		if (r) {
			check("ibv_start_poll", 0, "%s", strerror(r));
			break;
		}
		read_ex(cqx, &got[ngot++]);
		for (int k = 0; k < 2 && ngot < 2 * N; k++) {
			r = ibv_next_poll(cqx);
			if (r == ENOENT)
				break;
			if (r) {
				check("ibv_next_poll", 0, "%s", strerror(r));
				break;
			}
			read_ex(cqx, &got[ngot++]);
		}
		ibv_end_poll(cqx);
		if (round % 2 && ngot < 2 * N) {
			struct ibv_wc wc;
			r = ibv_poll_cq(cq, 1, &wc);
			if (r == 1)
				read_wc(&wc, &got[ngot++]);
			else if (r < 0)
				check("ibv_poll_cq on the extended CQ", 0, "%d", r);
		}
	}
	check("all 32 completions", ngot == 2 * N, "got %d", ngot);

	// Each completion, once, in order per kind.
	int nsend = 0, nrecv = 0, viaex = 0, viawc = 0;
	for (int j = 0; j < ngot; j++) {
		struct got *g = &got[j];
		char name[64];
		(g->via_ex ? viaex++ : viawc++);
		if (g->status != IBV_WC_SUCCESS) {
			snprintf(name, sizeof name, "completion %d", j);
			check(name, 0, "status %s", ibv_wc_status_str(g->status));
			continue;
		}
		if (g->opcode == IBV_WC_SEND) {
			snprintf(name, sizeof name, "send %d", nsend);
			check(name, g->wr_id == (uint64_t)nsend && g->vendor_err == 0 && g->qp_num == qp->qp_num,
			      "wr_id %llu, vendor_err %d, qp_num %u (want %d, 0, %u)", (unsigned long long)g->wr_id,
			      g->vendor_err, g->qp_num, nsend, qp->qp_num);
			nsend++;
			continue;
		}
		int i = nrecv++;
		int imm = i % 2;
		char *data = buf + (i + 1) * SLOT + 40;
		int data_ok = 1;
		for (int b = 0; b < 1 + i; b++)
			data_ok &= data[b] == 'a' + i;
		snprintf(name, sizeof name, "receive %d (%s)", i, g->via_ex ? "read_*" : "ibv_poll_cq");
		check(name,
		      g->opcode == IBV_WC_RECV && g->wr_id == (uint64_t)(1000 + i) && g->vendor_err == 0 &&
			      g->byte_len == (uint32_t)(40 + 1 + i) && g->qp_num == qp->qp_num &&
			      g->src_qp == qp->qp_num && (g->wc_flags & IBV_WC_GRH) &&
			      !(g->wc_flags & IBV_WC_WITH_IMM) == !imm && (!imm || g->imm == htonl(0xabc000 + i)) &&
			      g->slid == (pa.link_layer == IBV_LINK_LAYER_ETHERNET ? 0 : pa.lid) && g->sl == 0 &&
			      g->dlid_path_bits == 0 && data_ok,
		      "opcode %d wr_id %llu vendor_err %d byte_len %u qp_num %u src_qp %u (qp %u) wc_flags %#x imm %#x "
		      "slid %u sl %u dlid_path_bits %u data %s",
		      g->opcode, (unsigned long long)g->wr_id, g->vendor_err, g->byte_len, g->qp_num, g->src_qp,
		      qp->qp_num, g->wc_flags, ntohl(g->imm), g->slid, g->sl, g->dlid_path_bits,
		      data_ok ? "ok" : "wrong");
	}
	check("16 sends and 16 receives, through both polling calls", nsend == N && nrecv == N && viaex && viawc,
	      "%d sends, %d receives, %d read_*, %d ibv_poll_cq", nsend, nrecv, viaex, viawc);
	r = ibv_start_poll(cqx, &pattr);
	check("nothing more", r == ENOENT, "%d", r);
	if (r == 0)
		ibv_end_poll(cqx);

	// An event again after the extended polls.
	{
		struct ibv_sge sge = { .addr = (uintptr_t)buf + SLOT, .length = SLOT, .lkey = mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad;
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		r = ibv_post_recv(qp, &wr, &bad) || ibv_req_notify_cq(cq, 0) || post_send(qp, ah, mr, buf, 0);
		check("post again", r == 0, "%s", strerror(errno));
		r = poll(&p, 1, 5000);
		check("second event", r == 1 && ibv_get_cq_event(ch, &evcq, &evctx) == 0 && evcq == cq, "poll %d", r);
		ibv_ack_cq_events(cq, 1);
		int n = 0;
		deadline = now() + 5;
		while (n < 2 && now() < deadline) {
			if (ibv_start_poll(cqx, &pattr)) {
				ibv_end_poll(cqx);
				continue;
			}
			do
				n++;
			while (ibv_next_poll(cqx) == 0);
			ibv_end_poll(cqx);
		}
		check("the two completions after it", n == 2, "%d", n);
	}

	check("ibv_destroy_qp", ibv_destroy_qp(qp) == 0, "%s", strerror(errno));
	ibv_destroy_ah(ah);
	ibv_dereg_mr(mr);
	r = ibv_destroy_cq(cq);
	check("ibv_destroy_cq(ibv_cq_ex_to_cq)", r == 0, "%s", strerror(r));
	r = ibv_destroy_comp_channel(ch);
	check("ibv_destroy_comp_channel", r == 0, "%s", strerror(r));
	ibv_dealloc_pd(pd);
	free(buf);
}

int main(int argc, char **argv)
{
	struct ibv_context *ctx;
	struct ibv_cq_ex *pcq;
	struct ibv_cq_init_attr_ex a = { .cqe = 4, .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_poll_cq_attr pattr = { 0 };
	int status, r;
	pid_t pid;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 2) {
		fprintf(stderr, "usage: cqex DEVICE\n");
		return 2;
	}
	if (!(ctx = open_dev(argv[1]))) {
		fprintf(stderr, "cqex: %s: %s\n", argv[1], strerror(errno ? errno : ENODEV));
		return 1;
	}
	bad_flow(ctx);
	traffic(ctx);

	pcq = ibv_create_cq_ex(ctx, &a);
	check("an extended CQ for the child", pcq != NULL, "%s", strerror(errno));
	if (!pcq)
		return 1;
	pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0) {
		struct ibv_context *own;
		who = "child";
		r = ibv_start_poll(pcq, &pattr);
		check("ibv_start_poll on the parent's CQ: EINVAL", r == EINVAL, "%d", r);
		ibv_end_poll(pcq); // nothing: no poll under way
		errno = 0;
		check("ibv_create_cq_ex on the parent's context: EINVAL", !ibv_create_cq_ex(ctx, &a) && errno == EINVAL,
		      "%s", strerror(errno));
		r = ibv_destroy_cq(ibv_cq_ex_to_cq(pcq));
		check("ibv_destroy_cq of the parent's CQ: EINVAL", r == EINVAL, "%d", r);
		if (!(own = open_dev(argv[1]))) {
			check("ibv_open_device", 0, "%s", strerror(errno));
			_exit(1);
		}
		bad_flow(own);
		traffic(own);
		check("ibv_close_device", ibv_close_device(own) == 0, "%s", strerror(errno));
		fflush(stdout);
		_exit(failed);
	}
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
		check("the child", 0, "status %#x", status);
	}
	r = ibv_start_poll(pcq, &pattr);
	check("the CQ after the child: ENOENT", r == ENOENT, "%d", r);
	check("its ibv_destroy_cq", ibv_destroy_cq(ibv_cq_ex_to_cq(pcq)) == 0, "%s", strerror(errno));
	traffic(ctx);
	check("ibv_close_device", ibv_close_device(ctx) == 0, "%s", strerror(errno));
	printf("%s\n", failed ? "FAILED" : "PASS");
	return failed;
}
