// capibench.c: the per-call and per-message cost of the verbs data path
// through softrdma's libibverbs (softrdma bench -parts capi runs it, and
// the same cases from the Go API, capibench.go).
//
// capibench DEVICE ITERS: opens DEVICE, makes two UD QPs A and B on it
// (each with its own send and receive CQ), walks them to RTS and an AH to
// the device's own GID 0, then times, in this one thread:
//
//	poll_empty      ibv_poll_cq on a CQ that never had a completion
//	req_notify      ibv_req_notify_cq on a CQ without a channel
//	post_recv       ibv_post_recv of one WR (B's receive queue is emptied
//	                by a reset between rounds, outside the timing)
//	pingpong        A sends 64 bytes to B, B answers, each polling its
//	                receive CQ and reposting: per round trip
//	stream          A sends 64-byte messages to B in chains of 16 (one
//	                signaled), B polls and reposts: per message
//	poll_idle       ibv_poll_cq on B's receive CQ after the stream, with
//	                nothing coming (an empty poll reads the socket)
//	post_send       ibv_post_send of one unsignaled 64-byte send to a QP
//	                number nobody has (the datagram goes out, is dropped)
//	poll_full       ibv_poll_cq of 16 at a time on a CQ holding 256 send
//	                completions, per completion
//
// and prints one line per case: "NAME NS_PER_OP OPS". Exits 1 on an error.
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define QKEY 0x11111111
#define MSG 64
#define SLOTS 256
#define CHAIN 16

struct side {
	struct ibv_cq *scq, *rcq;
	struct ibv_qp *qp;
	char *buf; // SLOTS receive buffers of 40 + MSG bytes, then one send buffer
	struct ibv_mr *mr;
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_ah *ah;

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void die(const char *what, int e)
{
	fprintf(stderr, "capibench: %s: %s\n", what, strerror(e));
	exit(1);
}

static void to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qkey = QKEY;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		die("modify INIT", errno);
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		die("modify RTR", errno);
	a.qp_state = IBV_QPS_RTS;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		die("modify RTS", errno);
}

static void make_side(struct side *s)
{
	struct ibv_qp_init_attr init;
	size_t len = SLOTS * (40 + MSG) + MSG;
	s->scq = ibv_create_cq(ctx, 4 * SLOTS, NULL, NULL, 0);
	s->rcq = ibv_create_cq(ctx, 4 * SLOTS, NULL, NULL, 0);
	if (!s->scq || !s->rcq)
		die("ibv_create_cq", errno);
	memset(&init, 0, sizeof init);
	init.send_cq = s->scq;
	init.recv_cq = s->rcq;
	init.qp_type = IBV_QPT_UD;
	init.cap.max_send_wr = 2 * SLOTS;
	init.cap.max_recv_wr = 2 * SLOTS;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	s->qp = ibv_create_qp(pd, &init);
	if (!s->qp)
		die("ibv_create_qp", errno);
	to_rts(s->qp);
	s->buf = calloc(1, len);
	s->mr = ibv_reg_mr(pd, s->buf, len, IBV_ACCESS_LOCAL_WRITE);
	if (!s->mr)
		die("ibv_reg_mr", errno);
}

static void post_recv(struct side *s, int slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)s->buf + slot * (40 + MSG), .length = 40 + MSG, .lkey = s->mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 }, *bad;
	int e = ibv_post_recv(s->qp, &wr, &bad);
	if (e)
		die("ibv_post_recv", e);
}

// post_sends posts a chain of n sends from s to qpn, the last signaled
// when sig.
static void post_sends(struct side *s, uint32_t qpn, int n, int sig)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)s->buf + SLOTS * (40 + MSG), .length = MSG, .lkey = s->mr->lkey,
	};
	struct ibv_send_wr wr[CHAIN], *bad;
	for (int i = 0; i < n; i++) {
		memset(&wr[i], 0, sizeof wr[i]);
		wr[i].wr_id = i;
		wr[i].sg_list = &sge;
		wr[i].num_sge = 1;
		wr[i].opcode = IBV_WR_SEND;
		wr[i].send_flags = sig && i == n - 1 ? IBV_SEND_SIGNALED : 0;
		wr[i].wr.ud.ah = ah;
		wr[i].wr.ud.remote_qpn = qpn;
		wr[i].wr.ud.remote_qkey = QKEY;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	int e = ibv_post_send(s->qp, &wr[0], &bad);
	if (e)
		die("ibv_post_send", e);
}

// wait_cq polls cq until it gave n completions (every one a success),
// reposting a receive for each when s is not NULL; 0 after 5 s without.
static int wait_cq(struct ibv_cq *cq, int n, struct side *s)
{
	struct ibv_wc wc[CHAIN];
	double deadline = now_ns() + 5e9;
	long spins = 0;
	while (n > 0) {
		int k = ibv_poll_cq(cq, CHAIN, wc);
		if (k < 0)
			die("ibv_poll_cq", -k);
		for (int i = 0; i < k; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "capibench: completion status %s\n", ibv_wc_status_str(wc[i].status));
				exit(1);
			}
			if (s)
				post_recv(s, wc[i].wr_id);
		}
		n -= k;
		if (k == 0 && (++spins & 1023) == 0 && now_ns() > deadline)
			return 0;
	}
	return 1;
}

static void report(const char *name, double t0, long ops)
{
	printf("%s %.1f %ld\n", name, (now_ns() - t0) / ops, ops);
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_wc wc[CHAIN];
	struct side a, b;
	union ibv_gid gid;
	struct ibv_ah_attr aa;
	long iters;
	int n;
	double t0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 3 || (iters = atol(argv[2])) < CHAIN) {
		fprintf(stderr, "usage: capibench DEVICE ITERS (ITERS >= %d)\n", CHAIN);
		return 2;
	}
	list = ibv_get_device_list(&n);
	if (!list)
		die("ibv_get_device_list", errno);
	for (int i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!ctx)
		die(argv[1], errno ? errno : ENODEV);
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd", errno);
	make_side(&a);
	make_side(&b);
	if (ibv_query_gid(ctx, 1, 0, &gid))
		die("ibv_query_gid", errno);
	memset(&aa, 0, sizeof aa);
	aa.is_global = 1;
	aa.grh.dgid = gid;
	aa.grh.hop_limit = 1;
	aa.port_num = 1;
	ah = ibv_create_ah(pd, &aa);
	if (!ah)
		die("ibv_create_ah", errno);

	// poll_empty: A's receive CQ has had no completion yet.
	t0 = now_ns();
	for (long i = 0; i < iters; i++)
		if (ibv_poll_cq(a.rcq, 1, wc) != 0)
			die("poll_empty", EIO);
	report("poll_empty", t0, iters);

	t0 = now_ns();
	for (long i = 0; i < iters; i++)
		if (ibv_req_notify_cq(a.rcq, 0))
			die("ibv_req_notify_cq", EIO);
	report("req_notify", t0, iters);

	// post_recv: rounds of SLOTS posts on A, the queue reset between.
	{
		double total = 0;
		long ops = 0;
		while (ops < iters) {
			t0 = now_ns();
			for (int i = 0; i < SLOTS; i++)
				post_recv(&a, i);
			total += now_ns() - t0;
			ops += SLOTS;
			struct ibv_qp_attr r = { .qp_state = IBV_QPS_RESET };
			if (ibv_modify_qp(a.qp, &r, IBV_QP_STATE))
				die("modify RESET", errno);
			to_rts(a.qp);
			while (ibv_poll_cq(a.rcq, CHAIN, wc) > 0)
				; // flushed WRs, if any
		}
		printf("post_recv %.1f %ld\n", total / ops, ops);
	}

	for (int i = 0; i < SLOTS; i++) {
		post_recv(&a, i);
		post_recv(&b, i);
	}
	// pingpong: per round trip.
	{
		long rounds = iters / 16, lost = 0;
		t0 = now_ns();
		for (long i = 0; i < rounds; i++) {
			post_sends(&a, b.qp->qp_num, 1, 0);
			if (!wait_cq(b.rcq, 1, &b)) {
				lost++;
				continue;
			}
			post_sends(&b, a.qp->qp_num, 1, 0);
			if (!wait_cq(a.rcq, 1, &a))
				lost++;
		}
		report("pingpong", t0, rounds);
		if (lost)
			fprintf(stderr, "capibench: pingpong: %ld messages lost\n", lost);
	}
	// stream: per message.
	{
		long chains = iters / CHAIN;
		t0 = now_ns();
		for (long i = 0; i < chains; i++) {
			post_sends(&a, b.qp->qp_num, CHAIN, 1);
			if (!wait_cq(b.rcq, CHAIN, &b))
				die("stream: messages lost", EIO);
			if (!wait_cq(a.scq, 1, NULL))
				die("stream: no send completion", EIO);
		}
		report("stream", t0, chains * CHAIN);
	}
	// poll_idle: B's receive CQ, which has had completions (its
	// receive socket is read on every empty poll), with nothing coming.
	t0 = now_ns();
	for (long i = 0; i < iters; i++)
		if (ibv_poll_cq(b.rcq, 1, wc) != 0)
			die("poll_idle", EIO);
	report("poll_idle", t0, iters);

	// post_send: to QP number 0xfffff0, which nobody has.
	t0 = now_ns();
	for (long i = 0; i < iters; i++)
		post_sends(&a, 0xfffff0, 1, 0);
	report("post_send", t0, iters);

	// poll_full: SLOTS signaled sends complete on A's send CQ, then are
	// polled CHAIN at a time.
	{
		double total = 0;
		long ops = 0;
		while (ops < iters) {
			for (int i = 0; i < SLOTS; i += CHAIN) {
				struct ibv_sge sge = { .addr = (uintptr_t)a.buf + SLOTS * (40 + MSG), .length = MSG, .lkey = a.mr->lkey };
				struct ibv_send_wr wr[CHAIN], *bad;
				for (int j = 0; j < CHAIN; j++) {
					memset(&wr[j], 0, sizeof wr[j]);
					wr[j].sg_list = &sge;
					wr[j].num_sge = 1;
					wr[j].opcode = IBV_WR_SEND;
					wr[j].send_flags = IBV_SEND_SIGNALED;
					wr[j].wr.ud.ah = ah;
					wr[j].wr.ud.remote_qpn = 0xfffff0;
					wr[j].wr.ud.remote_qkey = QKEY;
					wr[j].next = j + 1 < CHAIN ? &wr[j + 1] : NULL;
				}
				if (ibv_post_send(a.qp, wr, &bad))
					die("ibv_post_send", errno);
			}
			int got = 0;
			t0 = now_ns();
			while (got < SLOTS) {
				int k = ibv_poll_cq(a.scq, CHAIN, wc);
				if (k < 0)
					die("poll_full", -k);
				got += k;
			}
			total += now_ns() - t0;
			ops += SLOTS;
		}
		printf("poll_full %.1f %ld\n", total / ops, ops);
	}

	return 0;
}
