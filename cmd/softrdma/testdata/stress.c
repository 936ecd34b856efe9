// stress.c: a C program calling softrdma's libraries from several threads
// at once.
//
// stress SECONDS: on rxe_lo, NQP UD QPs, each with a CQ of its own, all
// CQs on one completion channel. For SECONDS:
//   - two sender threads post sends from QP i to QP i+1 (mod NQP) on the
//     same QPs at once, each signaled, at most about WINDOW in flight per
//     pair so that the receiver's queue never runs dry;
//   - the poller thread waits on the completion channel (poll on its fd,
//     ibv_get_cq_event, ibv_ack_cq_events, ibv_req_notify_cq), polls the
//     CQ, checks every completion (status, length, the payload's source
//     and sequence) and posts the receive again;
//   - the CM thread makes ids on an event channel, binds them to
//     127.0.0.1, joins a multicast group, reads MULTICAST_JOIN with
//     rdma_get_cm_event, acks it, leaves and destroys the id, over and
//     over;
//   - the objects thread creates and destroys AHs, registers and
//     deregisters MRs and queries the port and GID 0;
//   - the async thread polls the context's async_fd: a quiet device has
//     no event.
// Then the senders stop, every send must complete and arrive exactly
// once; the program prints its counts and "ok", or the first mismatch
// and exits 1. An alarm of SECONDS+60 kills a hung run.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define NQP 4
#define RQ 64
#define SQ 64
#define WINDOW 32
#define PAYLOAD 64
#define GRH 40
#define QKEY 0x11111111u
#define MAGIC 0x5eed5eedu
#define NTHREAD 6 // two senders, the poller, CM, objects, async

struct msg {
	uint32_t magic, src;
	uint64_t seq;
};

struct qpx {
	int i;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	char *rbuf, *sbuf;
	struct ibv_mr *rmr, *smr;
	atomic_ulong sent, sendcomp;	// as the source
	atomic_ulong recvd;		// as the destination (from QP i-1)
	unsigned long seqsum;		// the poller's: sum of received sequence numbers
	int errors;
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_comp_channel *cch;
static struct ibv_ah *ah;
static union ibv_gid gid0;
static struct qpx q[NQP];
static atomic_int stop_send, stop_all, failed;
static atomic_ulong joins, ahs, mrs, queries, cq_events;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "stress: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	atomic_store(&failed, 1);
	atomic_store(&stop_send, 1);
	atomic_store(&stop_all, 1);
}

static int post_recv(struct qpx *x, int slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(x->rbuf + slot * (GRH + PAYLOAD)),
		.length = GRH + PAYLOAD,
		.lkey = x->rmr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 }, *bad;
	return ibv_post_recv(x->qp, &wr, &bad);
}

static void *sender(void *arg)
{
	// Each sender has SQ buffers per QP of its own: its post n reuses
	// the buffer of its post n-SQ, which completed (a QP completes sends
	// in the order they were posted, and fewer than SQ are in flight).
	int k = (int)(intptr_t)arg;
	unsigned long mine[NQP] = { 0 };
	while (!atomic_load(&stop_send)) {
		int posted = 0;
		for (int i = 0; i < NQP && !atomic_load(&stop_send); i++) {
			struct qpx *x = &q[i], *d = &q[(i + 1) % NQP];
			unsigned long s = atomic_load(&x->sent);
			// Both senders may pass these checks at once: a QP has at most
			// WINDOW + NSENDERS in flight, fewer than its RQ receives and
			// its SQ send buffers.
			if (s - atomic_load(&d->recvd) >= WINDOW || s - atomic_load(&x->sendcomp) >= SQ / 2)
				continue;
			// Counted before the post: the poller may see the completion
			// before ibv_post_send returns.
			if (!atomic_compare_exchange_strong(&x->sent, &s, s + 1))
				continue; // the other sender took s
			struct msg *m = (struct msg *)(x->sbuf + (k * SQ + mine[i]++ % SQ) * PAYLOAD);
			m->magic = MAGIC;
			m->src = i;
			m->seq = s;
			struct ibv_sge sge = { .addr = (uintptr_t)m, .length = PAYLOAD, .lkey = x->smr->lkey };
			struct ibv_send_wr wr = {
				.wr_id = s, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				.send_flags = IBV_SEND_SIGNALED,
				.wr.ud = { .ah = ah, .remote_qpn = d->qp->qp_num, .remote_qkey = QKEY },
			}, *bad;
			int e = ibv_post_send(x->qp, &wr, &bad);
			if (e) {
				fail("ibv_post_send on QP %d: %s", i, strerror(e));
				return NULL;
			}
			posted++;
		}
		if (!posted) {
			struct timespec ts = { 0, 50 * 1000 };
			nanosleep(&ts, NULL);
		}
	}
	return NULL;
}

static void complete(struct qpx *x, struct ibv_wc *wc)
{
	if (wc->status != IBV_WC_SUCCESS) {
		fail("QP %d: completion %s (opcode %d, vendor_err %u)", x->i, ibv_wc_status_str(wc->status), wc->opcode,
		     wc->vendor_err);
		return;
	}
	if (wc->opcode == IBV_WC_SEND) {
		unsigned long c = atomic_fetch_add(&x->sendcomp, 1) + 1;
		if (c > atomic_load(&x->sent))
			fail("QP %d: %lu send completions, %lu sends", x->i, c, atomic_load(&x->sent));
		return;
	}
	if (wc->opcode != IBV_WC_RECV) {
		fail("QP %d: completion opcode %d", x->i, wc->opcode);
		return;
	}
	int slot = wc->wr_id;
	struct msg *m = (struct msg *)(x->rbuf + slot * (GRH + PAYLOAD) + GRH);
	int from = (x->i + NQP - 1) % NQP;
	if (slot < 0 || slot >= RQ || wc->byte_len != GRH + PAYLOAD || m->magic != MAGIC || (int)m->src != from ||
	    m->seq >= atomic_load(&q[from].sent) || wc->src_qp != q[from].qp->qp_num) {
		fail("QP %d: bad receive: slot %d len %u magic %#x src %u seq %llu src_qp %u", x->i, slot, wc->byte_len,
		     m->magic, m->src, (unsigned long long)m->seq, wc->src_qp);
		return;
	}
	x->seqsum += m->seq;
	atomic_fetch_add(&x->recvd, 1);
	int e = post_recv(x, slot);
	if (e)
		fail("ibv_post_recv on QP %d: %s", x->i, strerror(e));
}

static void *poller(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop_all)) {
		struct pollfd pfd = { .fd = cch->fd, .events = POLLIN };
		int r = poll(&pfd, 1, 100);
		if (r < 0 && errno != EINTR) {
			fail("poll on the completion channel: %s", strerror(errno));
			return NULL;
		}
		if (r <= 0)
			continue;
		struct ibv_cq *cq;
		void *cqctx;
		if (ibv_get_cq_event(cch, &cq, &cqctx)) {
			fail("ibv_get_cq_event: %s", strerror(errno));
			return NULL;
		}
		struct qpx *x = cqctx;
		if (x < q || x >= q + NQP || x->cq != cq) {
			fail("ibv_get_cq_event: a CQ or context not ours");
			return NULL;
		}
		atomic_fetch_add(&cq_events, 1);
		ibv_ack_cq_events(cq, 1);
		if (ibv_req_notify_cq(cq, 0)) {
			fail("ibv_req_notify_cq");
			return NULL;
		}
		for (;;) {
			struct ibv_wc wc[16];
			int n = ibv_poll_cq(cq, 16, wc);
			if (n < 0) {
				fail("ibv_poll_cq: %d", n);
				return NULL;
			}
			for (int k = 0; k < n; k++)
				complete(x, &wc[k]);
			if (n < 16)
				break;
		}
	}
	return NULL;
}

static int cm_wait(struct rdma_event_channel *ch, enum rdma_cm_event_type want, struct rdma_cm_id *id)
{
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;
	int r;
	do
		r = poll(&pfd, 1, 10000);
	while (r < 0 && errno == EINTR);
	if (r <= 0) {
		fail("no %s within 10 s", rdma_event_str(want));
		return -1;
	}
	if (rdma_get_cm_event(ch, &ev)) {
		fail("rdma_get_cm_event: %s", strerror(errno));
		return -1;
	}
	if (ev->event != want || ev->id != id || ev->status) {
		fail("CM event %s status %d, want %s", rdma_event_str(ev->event), ev->status, rdma_event_str(want));
		rdma_ack_cm_event(ev);
		return -1;
	}
	return rdma_ack_cm_event(ev);
}

static void *cm(void *arg)
{
	(void)arg;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch) {
		fail("rdma_create_event_channel: %s", strerror(errno));
		return NULL;
	}
	for (unsigned n = 0; !atomic_load(&stop_all); n++) {
		struct rdma_cm_id *id;
		struct sockaddr_in src = { .sin_family = AF_INET }, grp = { .sin_family = AF_INET };
		inet_pton(AF_INET, "127.0.0.1", &src.sin_addr);
		grp.sin_addr.s_addr = htonl(0xef170000u | (1 + n % 200)); // 239.23.0.x
		if (rdma_create_id(ch, &id, NULL, RDMA_PS_UDP)) {
			fail("rdma_create_id: %s", strerror(errno));
			break;
		}
		if (rdma_bind_addr(id, (struct sockaddr *)&src)) {
			fail("rdma_bind_addr: %s", strerror(errno));
			break;
		}
		if (rdma_join_multicast(id, (struct sockaddr *)&grp, NULL)) {
			fail("rdma_join_multicast: %s", strerror(errno));
			break;
		}
		if (cm_wait(ch, RDMA_CM_EVENT_MULTICAST_JOIN, id))
			break;
		if (rdma_leave_multicast(id, (struct sockaddr *)&grp)) {
			fail("rdma_leave_multicast: %s", strerror(errno));
			break;
		}
		if (rdma_destroy_id(id)) {
			fail("rdma_destroy_id: %s", strerror(errno));
			break;
		}
		atomic_fetch_add(&joins, 1);
	}
	rdma_destroy_event_channel(ch);
	return NULL;
}

static void *objects(void *arg)
{
	(void)arg;
	char *buf = malloc(4096);
	while (!atomic_load(&stop_all)) {
		struct ibv_ah_attr aa = {
			.is_global = 1, .port_num = 1,
			.grh = { .dgid = gid0, .sgid_index = 0, .hop_limit = 1 },
		};
		struct ibv_ah *a = ibv_create_ah(pd, &aa);
		if (!a) {
			fail("ibv_create_ah: %s", strerror(errno));
			break;
		}
		if (ibv_destroy_ah(a)) {
			fail("ibv_destroy_ah");
			break;
		}
		atomic_fetch_add(&ahs, 1);
		struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
		if (!mr) {
			fail("ibv_reg_mr: %s", strerror(errno));
			break;
		}
		if (ibv_dereg_mr(mr)) {
			fail("ibv_dereg_mr");
			break;
		}
		atomic_fetch_add(&mrs, 1);
		struct ibv_port_attr pa;
		union ibv_gid g;
		if (ibv_query_port(ctx, 1, &pa) || pa.state != IBV_PORT_ACTIVE || ibv_query_gid(ctx, 1, 0, &g) ||
		    memcmp(&g, &gid0, sizeof g)) {
			fail("ibv_query_port/ibv_query_gid changed");
			break;
		}
		atomic_fetch_add(&queries, 1);
	}
	free(buf);
	return NULL;
}

static void *async_reader(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop_all)) {
		struct pollfd pfd = { .fd = ctx->async_fd, .events = POLLIN };
		int r = poll(&pfd, 1, 100);
		if (r > 0) {
			struct ibv_async_event ev;
			if (ibv_get_async_event(ctx, &ev) == 0) {
				fail("unexpected async event %s", ibv_event_type_str(ev.event_type));
				ibv_ack_async_event(&ev);
			} else {
				fail("async_fd readable, ibv_get_async_event: %s", strerror(errno));
			}
			break;
		}
	}
	return NULL;
}

static int setup(void)
{
	struct ibv_device **list;
	int n;
	list = ibv_get_device_list(&n);
	if (!list)
		return perror("ibv_get_device_list"), -1;
	for (int i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), "rxe_lo"))
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!ctx)
		return fprintf(stderr, "no rxe_lo\n"), -1;
	if (!(pd = ibv_alloc_pd(ctx)) || !(cch = ibv_create_comp_channel(ctx)))
		return perror("ibv_alloc_pd/ibv_create_comp_channel"), -1;
	if (ibv_query_gid(ctx, 1, 0, &gid0))
		return perror("ibv_query_gid"), -1;
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid0, .hop_limit = 1 } };
	if (!(ah = ibv_create_ah(pd, &aa)))
		return perror("ibv_create_ah"), -1;
	for (int i = 0; i < NQP; i++) {
		struct qpx *x = &q[i];
		x->i = i;
		x->rbuf = calloc(RQ, GRH + PAYLOAD);
		x->sbuf = calloc(2 * SQ, PAYLOAD);
		x->rmr = ibv_reg_mr(pd, x->rbuf, RQ * (GRH + PAYLOAD), IBV_ACCESS_LOCAL_WRITE);
		x->smr = ibv_reg_mr(pd, x->sbuf, 2 * SQ * PAYLOAD, 0);
		x->cq = ibv_create_cq(ctx, RQ + SQ, x, cch, 0);
		if (!x->rmr || !x->smr || !x->cq)
			return perror("ibv_reg_mr/ibv_create_cq"), -1;
		struct ibv_qp_init_attr ia = {
			.send_cq = x->cq, .recv_cq = x->cq, .qp_type = IBV_QPT_UD,
			.cap = { .max_send_wr = SQ, .max_recv_wr = RQ, .max_send_sge = 1, .max_recv_sge = 1 },
		};
		if (!(x->qp = ibv_create_qp(pd, &ia)))
			return perror("ibv_create_qp"), -1;
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qkey = QKEY };
		if (ibv_modify_qp(x->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
			return perror("ibv_modify_qp INIT"), -1;
		a.qp_state = IBV_QPS_RTR;
		if (ibv_modify_qp(x->qp, &a, IBV_QP_STATE))
			return perror("ibv_modify_qp RTR"), -1;
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = 0;
		if (ibv_modify_qp(x->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
			return perror("ibv_modify_qp RTS"), -1;
		for (int s = 0; s < RQ; s++)
			if (post_recv(x, s))
				return perror("ibv_post_recv"), -1;
		if (ibv_req_notify_cq(x->cq, 0))
			return perror("ibv_req_notify_cq"), -1;
	}
	return 0;
}

static int teardown(void)
{
	for (int i = 0; i < NQP; i++) {
		struct qpx *x = &q[i];
		if (ibv_destroy_qp(x->qp) || ibv_destroy_cq(x->cq) || ibv_dereg_mr(x->rmr) || ibv_dereg_mr(x->smr))
			return perror("destroying a QP, CQ or MR"), -1;
		free(x->rbuf);
		free(x->sbuf);
	}
	if (ibv_destroy_ah(ah) || ibv_destroy_comp_channel(cch) || ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		return perror("destroying the AH, channel or PD, or closing the device"), -1;
	return 0;
}

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

int main(int argc, char **argv)
{
	pthread_t ts[NTHREAD];
	void *(*fns[NTHREAD])(void *) = { sender, sender, poller, cm, objects, async_reader };
	int secs;
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 2 || (secs = atoi(argv[1])) <= 0) {
		fprintf(stderr, "usage: stress SECONDS\n");
		return 2;
	}
	alarm(secs + 60);
	if (setup())
		return 1;
	printf("running %d s\n", secs);
	for (int i = 0; i < NTHREAD; i++)
		if (pthread_create(&ts[i], NULL, fns[i], (void *)(intptr_t)i))
			return perror("pthread_create"), 1;
	for (long long end = now_ms() + secs * 1000LL; now_ms() < end && !atomic_load(&failed);)
		usleep(10000);
	atomic_store(&stop_send, 1);
	pthread_join(ts[0], NULL);
	pthread_join(ts[1], NULL);
	// Every send completes and arrives (UD on lo, the receive queues
	// never empty): wait for that, 10 s at most.
	for (long long end = now_ms() + 10000; !atomic_load(&failed); usleep(1000)) {
		int done = 1;
		for (int i = 0; i < NQP; i++) {
			unsigned long s = atomic_load(&q[i].sent);
			if (atomic_load(&q[i].sendcomp) != s || atomic_load(&q[(i + 1) % NQP].recvd) != s)
				done = 0;
		}
		if (done)
			break;
		if (now_ms() > end) {
			for (int i = 0; i < NQP; i++)
				fprintf(stderr, "QP %d: sent %lu, send completions %lu, QP %d received %lu\n", i,
					atomic_load(&q[i].sent), atomic_load(&q[i].sendcomp), (i + 1) % NQP,
					atomic_load(&q[(i + 1) % NQP].recvd));
			fail("sends did not all complete and arrive within 10 s");
		}
	}
	atomic_store(&stop_all, 1);
	for (int i = 2; i < NTHREAD; i++)
		pthread_join(ts[i], NULL);
	if (atomic_load(&failed))
		return 1;
	unsigned long total = 0;
	for (int i = 0; i < NQP; i++) {
		struct qpx *d = &q[(i + 1) % NQP];
		unsigned long s = atomic_load(&q[i].sent);
		// Each sequence number once: the sum of 0 … s-1.
		if (d->seqsum != s * (s - 1) / 2 || s == 0) {
			fprintf(stderr, "stress: QP %d: %lu sends, sequence sum %lu at QP %d, want %lu\n", i, s,
				d->seqsum, d->i, s * (s - 1) / 2);
			return 1;
		}
		total += s;
	}
	if (atomic_load(&joins) == 0 || atomic_load(&ahs) == 0 || atomic_load(&mrs) == 0) {
		fprintf(stderr, "stress: a thread did nothing: %lu joins, %lu AHs, %lu MRs\n", atomic_load(&joins),
			atomic_load(&ahs), atomic_load(&mrs));
		return 1;
	}
	if (teardown())
		return 1;
	printf("sent %lu received %lu cq_events %lu joins %lu ahs %lu mrs %lu queries %lu\n", total, total,
	       atomic_load(&cq_events), atomic_load(&joins), atomic_load(&ahs), atomic_load(&mrs),
	       atomic_load(&queries));
	printf("ok\n");
	return 0;
}
