// capistress.c: the data path of softrdma's libibverbs under threads, and
// its error cases.
//
// capistress DEVICE: on DEVICE, two UD QPs A and B of one context. First,
// in one thread, the errors of a chain: ibv_post_send of a chain whose
// third WR has more SGEs than the QP takes fails with EINVAL, *bad_wr on
// that WR, and the two before it arrive; the same with a NULL AH;
// ibv_post_recv of a chain with a bad WR likewise. Then three threads at
// once for N messages:
//
//	sender    posts A→B sends in chains of 1 to 8 (every eighth message
//	          signaled, every third inline from the stack), each carrying
//	          its sequence number, keeping at most WINDOW unreceived and
//	          the send queue from filling;
//	receiver  polls B's receive CQ and reposts each buffer (in chains of
//	          up to 4), checking the sequence numbers come in order;
//	completer polls A's send CQ, which only the sender's posts fill,
//	          checking the signaled WR ids come in order.
//
// Prints "PASSED" and exits 0 when every message and send completion came,
// in order, within 60 s; else prints what failed and exits 1.
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define QKEY 0x22222222
#define MSG 16
#define SLOTS 256
#define WINDOW 128
#define N 40000

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_ah *ah;
static struct ibv_cq *scq_a, *rcq_a, *scq_b, *rcq_b;
static struct ibv_qp *qa, *qb;
static char *rbuf, *sbuf;
static struct ibv_mr *rmr, *smr;
static volatile int received, completed, failed;
static int fails;

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "FAIL " __VA_ARGS__); fprintf(stderr, "\n"); fails++; } } while (0)

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static struct ibv_qp *make_qp(struct ibv_cq *scq, struct ibv_cq *rcq)
{
	struct ibv_qp_init_attr init;
	struct ibv_qp_attr a;
	struct ibv_qp *qp;
	memset(&init, 0, sizeof init);
	init.send_cq = scq;
	init.recv_cq = rcq;
	init.qp_type = IBV_QPT_UD;
	init.cap.max_send_wr = 2 * SLOTS;
	init.cap.max_recv_wr = SLOTS;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	init.cap.max_inline_data = 64;
	qp = ibv_create_qp(pd, &init);
	if (!qp)
		return NULL;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qkey = QKEY;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		return NULL;
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		return NULL;
	a.qp_state = IBV_QPS_RTS;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		return NULL;
	return qp;
}

static struct ibv_sge rsge(int slot)
{
	return (struct ibv_sge){ .addr = (uintptr_t)rbuf + slot * (40 + MSG), .length = 40 + MSG, .lkey = rmr->lkey };
}

// send_wr fills a send of sequence number seq from send buffer slot.
static void send_wr(struct ibv_send_wr *wr, struct ibv_sge *sge, uint32_t seq, int slot)
{
	memcpy(sbuf + slot * MSG, &seq, sizeof seq);
	*sge = (struct ibv_sge){ .addr = (uintptr_t)sbuf + slot * MSG, .length = MSG, .lkey = smr->lkey };
	memset(wr, 0, sizeof *wr);
	wr->wr_id = seq;
	wr->sg_list = sge;
	wr->num_sge = 1;
	wr->opcode = IBV_WR_SEND;
	wr->wr.ud.ah = ah;
	wr->wr.ud.remote_qpn = qb->qp_num;
	wr->wr.ud.remote_qkey = QKEY;
}

// take polls cq until it gave n completions into wc (at most 16), 5 s.
static int take(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	double end = now_s() + 5;
	int got = 0;
	while (got < n && now_s() < end) {
		int k = ibv_poll_cq(cq, n - got, wc + got);
		if (k < 0)
			return k;
		got += k;
	}
	return got;
}

static void errors_of_chains(void)
{
	struct ibv_send_wr wr[4], *bad = NULL;
	struct ibv_sge sge[4], two[2];
	struct ibv_recv_wr rw[3], *rbad = NULL;
	struct ibv_sge rs[4];
	struct ibv_wc wc[16];
	int e, k;

	for (int i = 0; i < 4; i++) {
		send_wr(&wr[i], &sge[i], 1000 + i, i);
		wr[i].next = i < 3 ? &wr[i + 1] : NULL;
	}
	two[0] = two[1] = sge[2];
	wr[2].sg_list = two;
	wr[2].num_sge = 2; // the QP takes 1
	e = ibv_post_send(qa, wr, &bad);
	CHECK(e == EINVAL && bad == &wr[2], "post_send with 2 SGEs in WR 2: %d, bad_wr %ld, want EINVAL and WR 2",
	      e, bad ? (long)(bad - wr) : -1L);
	k = take(rcq_b, 2, wc);
	CHECK(k == 2 && wc[0].wr_id == 0 && wc[1].wr_id == 1, "the 2 sends before the bad one: %d received", k);
	for (int i = 0; i < k && i < 2; i++)
		CHECK(*(uint32_t *)(rbuf + wc[i].wr_id * (40 + MSG) + 40) == 1000u + i, "send %d's payload", i);
	for (int i = 0; i < k; i++) {
		struct ibv_sge s = rsge(wc[i].wr_id);
		struct ibv_recv_wr r = { .wr_id = wc[i].wr_id, .sg_list = &s, .num_sge = 1 }, *rb;
		CHECK(ibv_post_recv(qb, &r, &rb) == 0, "repost");
	}

	wr[2].sg_list = &sge[2];
	wr[2].num_sge = 1;
	wr[1].wr.ud.ah = NULL;
	bad = NULL;
	e = ibv_post_send(qa, wr, &bad);
	CHECK(e == EINVAL && bad == &wr[1], "post_send with no AH in WR 1: %d, bad_wr %ld, want EINVAL and WR 1",
	      e, bad ? (long)(bad - wr) : -1L);
	k = take(rcq_b, 1, wc);
	CHECK(k == 1 && *(uint32_t *)(rbuf + wc[0].wr_id * (40 + MSG) + 40) == 1000u, "the send before the bad one");
	for (int i = 0; i < k; i++) {
		struct ibv_sge s = rsge(wc[i].wr_id);
		struct ibv_recv_wr r = { .wr_id = wc[i].wr_id, .sg_list = &s, .num_sge = 1 }, *rb;
		CHECK(ibv_post_recv(qb, &r, &rb) == 0, "repost");
	}

	// A's receive queue: a chain whose second WR has a NULL gather list.
	for (int i = 0; i < 3; i++) {
		rs[i] = rsge(SLOTS - 1 - i);
		rw[i] = (struct ibv_recv_wr){ .wr_id = 500 + i, .sg_list = &rs[i], .num_sge = 1, .next = i < 2 ? &rw[i + 1] : NULL };
	}
	rw[1].sg_list = NULL;
	e = ibv_post_recv(qa, rw, &rbad);
	CHECK(e == EINVAL && rbad == &rw[1], "post_recv with a NULL sg_list in WR 1: %d, bad_wr %ld", e,
	      rbad ? (long)(rbad - rw) : -1L);
	rw[1].sg_list = &rs[1];
	rw[1].num_sge = 3; // the QP takes 1
	rbad = NULL;
	e = ibv_post_recv(qa, &rw[1], &rbad);
	CHECK(e == EINVAL && rbad == &rw[1], "post_recv with 3 SGEs: %d, bad_wr %ld", e, rbad ? (long)(rbad - rw) : -1L);
}

static void *receiver(void *arg)
{
	struct ibv_wc wc[16];
	uint32_t want = 0;
	double end = now_s() + 60;
	(void)arg;
	while (want < N && !failed) {
		int k = ibv_poll_cq(rcq_b, 16, wc);
		if (k < 0) {
			fprintf(stderr, "FAIL receiver: ibv_poll_cq %d\n", k);
			failed = 1;
			break;
		}
		if (k == 0 && now_s() > end) {
			fprintf(stderr, "FAIL receiver: message %u not received in 60 s\n", want);
			failed = 1;
			break;
		}
		for (int i = 0; i < k; i += 4) {
			struct ibv_recv_wr r[4], *bad;
			struct ibv_sge s[4];
			int n = k - i < 4 ? k - i : 4;
			for (int j = 0; j < n; j++) {
				struct ibv_wc *w = &wc[i + j];
				uint32_t seq;
				memcpy(&seq, rbuf + w->wr_id * (40 + MSG) + 40, sizeof seq);
				if (w->status != IBV_WC_SUCCESS || w->byte_len != 40 + MSG || seq != want) {
					fprintf(stderr, "FAIL receiver: got %u (status %d, %u bytes), want %u\n", seq,
						w->status, w->byte_len, want);
					failed = 1;
				}
				want++;
				s[j] = rsge(w->wr_id);
				r[j] = (struct ibv_recv_wr){ .wr_id = w->wr_id, .sg_list = &s[j], .num_sge = 1,
							    .next = j + 1 < n ? &r[j + 1] : NULL };
			}
			if (ibv_post_recv(qb, r, &bad)) {
				fprintf(stderr, "FAIL receiver: ibv_post_recv\n");
				failed = 1;
			}
		}
		__atomic_store_n(&received, want, __ATOMIC_RELEASE);
	}
	return NULL;
}

static void *completer(void *arg)
{
	struct ibv_wc wc[16];
	uint64_t want = 7; // every eighth message is signaled
	double end = now_s() + 60;
	(void)arg;
	while (want < N && !failed) {
		int k = ibv_poll_cq(scq_a, 16, wc);
		if (k < 0 || (k == 0 && now_s() > end)) {
			fprintf(stderr, "FAIL completer: send completion %lu: %d\n", (unsigned long)want, k);
			failed = 1;
			break;
		}
		for (int i = 0; i < k; i++) {
			if (wc[i].status != IBV_WC_SUCCESS || wc[i].wr_id != want || wc[i].opcode != IBV_WC_SEND) {
				fprintf(stderr, "FAIL completer: completion of %lu (status %d), want %lu\n",
					(unsigned long)wc[i].wr_id, wc[i].status, (unsigned long)want);
				failed = 1;
			}
			__atomic_store_n(&completed, (int)want + 1, __ATOMIC_RELEASE);
			want += 8;
		}
	}
	return NULL;
}

static void *sender(void *arg)
{
	uint32_t seq = 0;
	unsigned r = 1;
	double end = now_s() + 60;
	(void)arg;
	while (seq < N && !failed) {
		struct ibv_send_wr wr[8], *bad;
		struct ibv_sge sge[8];
		char inl[8][MSG];
		int n = 1 + (r = r * 1103515245 + 12345) % 8;
		if (n > N - (int)seq)
			n = N - seq;
		// At most WINDOW unreceived, and the send queue never full: its
		// slots come back with the signaled completions the completer
		// polls (a completer off the CPU while the other two run on must
		// not make a post fail with ENOMEM).
		if ((int)(seq - __atomic_load_n(&received, __ATOMIC_ACQUIRE)) + n > WINDOW ||
		    (int)(seq - __atomic_load_n(&completed, __ATOMIC_ACQUIRE)) + n > 2 * SLOTS) {
			if (now_s() > end) {
				fprintf(stderr, "FAIL sender: no room in 60 s\n");
				failed = 1;
			}
			continue;
		}
		for (int i = 0; i < n; i++) {
			uint32_t s = seq + i;
			send_wr(&wr[i], &sge[i], s, s % SLOTS);
			if (s % 8 == 7)
				wr[i].send_flags |= IBV_SEND_SIGNALED;
			if (s % 3 == 0) {
				memset(inl[i], 0, MSG);
				memcpy(inl[i], &s, sizeof s);
				sge[i] = (struct ibv_sge){ .addr = (uintptr_t)inl[i], .length = MSG, .lkey = 0 };
				wr[i].send_flags |= IBV_SEND_INLINE;
			}
			wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
		}
		int e = ibv_post_send(qa, wr, &bad);
		if (e) {
			fprintf(stderr, "FAIL sender: ibv_post_send: %s\n", strerror(e));
			failed = 1;
		}
		seq += n;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	union ibv_gid gid;
	struct ibv_ah_attr aa;
	pthread_t t[3];
	int n;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 2) {
		fprintf(stderr, "usage: capistress DEVICE\n");
		return 2;
	}
	list = ibv_get_device_list(&n);
	for (int i = 0; list && i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			ctx = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	if (!ctx) {
		fprintf(stderr, "no device %s\n", argv[1]);
		return 1;
	}
	pd = ibv_alloc_pd(ctx);
	scq_a = ibv_create_cq(ctx, 4 * SLOTS, NULL, NULL, 0);
	rcq_a = ibv_create_cq(ctx, 4 * SLOTS, NULL, NULL, 0);
	scq_b = ibv_create_cq(ctx, 4 * SLOTS, NULL, NULL, 0);
	rcq_b = ibv_create_cq(ctx, 4 * SLOTS, NULL, NULL, 0);
	if (!pd || !scq_a || !rcq_a || !scq_b || !rcq_b || !(qa = make_qp(scq_a, rcq_a)) || !(qb = make_qp(scq_b, rcq_b))) {
		fprintf(stderr, "setup: %s\n", strerror(errno));
		return 1;
	}
	rbuf = calloc(SLOTS, 40 + MSG);
	sbuf = calloc(SLOTS, MSG);
	rmr = ibv_reg_mr(pd, rbuf, SLOTS * (40 + MSG), IBV_ACCESS_LOCAL_WRITE);
	smr = ibv_reg_mr(pd, sbuf, SLOTS * MSG, 0);
	if (!rmr || !smr || ibv_query_gid(ctx, 1, 0, &gid)) {
		fprintf(stderr, "setup: %s\n", strerror(errno));
		return 1;
	}
	memset(&aa, 0, sizeof aa);
	aa.is_global = 1;
	aa.grh.dgid = gid;
	aa.grh.hop_limit = 1;
	aa.port_num = 1;
	if (!(ah = ibv_create_ah(pd, &aa))) {
		fprintf(stderr, "ibv_create_ah: %s\n", strerror(errno));
		return 1;
	}
	for (int i = 0; i < SLOTS; i++) {
		struct ibv_sge s = rsge(i);
		struct ibv_recv_wr r = { .wr_id = i, .sg_list = &s, .num_sge = 1 }, *bad;
		if (ibv_post_recv(qb, &r, &bad)) {
			fprintf(stderr, "ibv_post_recv: %s\n", strerror(errno));
			return 1;
		}
	}

	errors_of_chains();
	printf("chains: %s\n", fails ? "FAILED" : "ok");

	pthread_create(&t[0], NULL, receiver, NULL);
	pthread_create(&t[1], NULL, completer, NULL);
	pthread_create(&t[2], NULL, sender, NULL);
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	if (failed)
		fails++;
	printf("threads: %s, %d messages received\n", failed ? "FAILED" : "ok", received);

	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	ibv_destroy_ah(ah);
	ibv_dereg_mr(rmr);
	ibv_dereg_mr(smr);
	ibv_destroy_cq(scq_a);
	ibv_destroy_cq(rcq_a);
	ibv_destroy_cq(scq_b);
	ibv_destroy_cq(rcq_b);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	if (fails)
		return 1;
	printf("PASSED\n");
	return 0;
}
