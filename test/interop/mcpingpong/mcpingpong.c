// mcpingpong: the latency part's multicast ping-pong in C on librdmacm
// and libibverbs, the baseline of the rdma-core backend's (Go) in the
// interop suite. One UD QP, a full-member join of the group it receives
// on and a send-only full-member join of the group it sends to; the
// pinger sends a sequence number and waits for it back, the ponger answers
// every ping. Waits by busy-polling the CQ, or with -e by CQ events
// (ibv_req_notify_cq, ibv_get_cq_event) as rdma_get_recv_comp does; a
// send CQ and a receive CQ on one completion channel, as rdma_create_qp
// makes them.
//
//   mcpingpong -b ADDR -r GROUP -s GROUP [-e] [-n COUNT] [-w WARMUP] [-p]
//
// -p: pong (answers until the pinger's stop message); else ping, which
// prints "LATENCY n=… p50_ns=… p99_ns=… lost=0". Both end with "CPU role=…
// rounds=… cpu_us_per_round=…" (getrusage, from the joins on).
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

#define SLOTS 16
#define SIZE 64
#define GRH 40
#define STOP UINT64_MAX

static struct rdma_cm_id *id;
static struct ibv_cq *scq, *rcq;
static struct ibv_comp_channel *cch;
static struct ibv_mr *mr;
static char *buf;
static struct ibv_ah *ah;
static uint32_t rqpn, rqkey;
static int events;

static void die(const char *what) {
	fprintf(stderr, "mcpingpong: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void addr(const char *s, struct sockaddr_in *sa) {
	memset(sa, 0, sizeof *sa);
	sa->sin_family = AF_INET;
	if (inet_pton(AF_INET, s, &sa->sin_addr) != 1) {
		fprintf(stderr, "mcpingpong: bad address %s\n", s);
		exit(2);
	}
}

static void post_recv(int slot) {
	struct ibv_sge sge = {.addr = (uintptr_t)(buf + slot * (GRH + SIZE)), .length = GRH + SIZE, .lkey = mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1}, *bad;
	if (ibv_post_recv(id->qp, &wr, &bad))
		die("ibv_post_recv");
}

static struct rdma_cm_event *expect(enum rdma_cm_event_type type) {
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(id->channel, &ev))
		die("rdma_get_cm_event");
	if (ev->event != type || ev->status) {
		fprintf(stderr, "mcpingpong: event %s (status %d), want %s\n", rdma_event_str(ev->event), ev->status, rdma_event_str(type));
		exit(1);
	}
	return ev;
}

static int64_t now(void);

// poll1 waits up to timeout_ms for the next completion of cq,
// busy-polling or by CQ events, and reports whether one came.
static int poll1(struct ibv_cq *cq, struct ibv_wc *wc, int timeout_ms) {
	int64_t deadline = now() + (int64_t)timeout_ms * 1000000;
	for (long i = 0;; i++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n < 0)
			die("ibv_poll_cq");
		if (n == 1)
			break;
		if (!events) {
			if ((i & 1023) == 1023 && now() > deadline)
				return 0;
			continue;
		}
		if (ibv_req_notify_cq(cq, 0))
			die("ibv_req_notify_cq");
		if ((n = ibv_poll_cq(cq, 1, wc)) == 1)
			break;
		int left = (int)((deadline - now()) / 1000000);
		struct pollfd pfd = {.fd = cch->fd, .events = POLLIN};
		if (left <= 0 || poll(&pfd, 1, left) == 0)
			return 0;
		struct ibv_cq *ecq;
		void *ectx;
		if (ibv_get_cq_event(cch, &ecq, &ectx))
			die("ibv_get_cq_event");
		ibv_ack_cq_events(ecq, 1);
	}
	if (wc->status != IBV_WC_SUCCESS) {
		fprintf(stderr, "mcpingpong: completion %s\n", ibv_wc_status_str(wc->status));
		exit(1);
	}
	return 1;
}

// ping_send sends seq and reaps its completion.
static void ping_send(uint64_t seq) {
	memcpy(buf + SLOTS * (GRH + SIZE), &seq, 8);
	struct ibv_sge sge = {.addr = (uintptr_t)(buf + SLOTS * (GRH + SIZE)), .length = SIZE, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.wr_id = SLOTS, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED}, *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = rqpn;
	wr.wr.ud.remote_qkey = rqkey;
	if (ibv_post_send(id->qp, &wr, &bad))
		die("ibv_post_send");
	struct ibv_wc wc;
	if (!poll1(scq, &wc, 10000)) {
		fprintf(stderr, "mcpingpong: no send completion in 10 s\n");
		exit(1);
	}
}

// ping_recv waits up to timeout_ms for a message and puts its sequence
// number in seq; 0: none came.
static int ping_recv(uint64_t *seq, int timeout_ms) {
	struct ibv_wc wc;
	if (!poll1(rcq, &wc, timeout_ms))
		return 0;
	if (wc.opcode != IBV_WC_RECV) {
		fprintf(stderr, "mcpingpong: completion opcode %d, want a receive\n", wc.opcode);
		exit(1);
	}
	memcpy(seq, buf + wc.wr_id * (GRH + SIZE) + GRH, 8);
	post_recv(wc.wr_id);
	return 1;
}

static int cmp(const void *a, const void *b) {
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

static int64_t now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// cpu_ns is the process's CPU time (user and system) in ns.
static int64_t cpu_ns(void) {
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ((int64_t)ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000 + ((int64_t)ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000;
}

int main(int argc, char **argv) {
	const char *bind = NULL, *rg = NULL, *sg = NULL;
	int pong = 0, count = 2000, warmup = 200, c;
	while ((c = getopt(argc, argv, "b:r:s:en:w:p")) != -1) {
		switch (c) {
		case 'b': bind = optarg; break;
		case 'r': rg = optarg; break;
		case 's': sg = optarg; break;
		case 'e': events = 1; break;
		case 'n': count = atoi(optarg); break;
		case 'w': warmup = atoi(optarg); break;
		case 'p': pong = 1; break;
		default: return 2;
		}
	}
	if (!bind || !rg || !sg || count <= 0) {
		fprintf(stderr, "usage: mcpingpong -b ADDR -r GROUP -s GROUP [-e] [-n COUNT] [-w WARMUP] [-p]\n");
		return 2;
	}
	struct sockaddr_in b, r, s;
	addr(bind, &b);
	addr(rg, &r);
	addr(sg, &s);
	struct rdma_event_channel *ech = rdma_create_event_channel();
	if (!ech)
		die("rdma_create_event_channel");
	if (rdma_create_id(ech, &id, NULL, RDMA_PS_UDP))
		die("rdma_create_id");
	if (rdma_bind_addr(id, (struct sockaddr *)&b))
		die("rdma_bind_addr");
	struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
	if (!pd)
		die("ibv_alloc_pd");
	if (events && !(cch = ibv_create_comp_channel(id->verbs)))
		die("ibv_create_comp_channel");
	if (!(scq = ibv_create_cq(id->verbs, 8, NULL, cch, 0)) || !(rcq = ibv_create_cq(id->verbs, 2 * SLOTS, NULL, cch, 0)))
		die("ibv_create_cq");
	struct ibv_qp_init_attr qa = {.send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_UD,
		.cap = {.max_send_wr = 4, .max_recv_wr = SLOTS, .max_send_sge = 1, .max_recv_sge = 1}};
	if (rdma_create_qp(id, pd, &qa))
		die("rdma_create_qp");
	buf = calloc(SLOTS + 1, GRH + SIZE);
	if (!(mr = ibv_reg_mr(pd, buf, (SLOTS + 1) * (GRH + SIZE), IBV_ACCESS_LOCAL_WRITE)))
		die("ibv_reg_mr");
	for (int i = 0; i < SLOTS; i++)
		post_recv(i);
	if (rdma_join_multicast(id, (struct sockaddr *)&r, NULL))
		die("rdma_join_multicast");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_MULTICAST_JOIN));
	struct rdma_cm_join_mc_attr_ex mc = {.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
		.join_flags = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, .addr = (struct sockaddr *)&s};
	if (rdma_join_multicast_ex(id, &mc, NULL))
		die("rdma_join_multicast_ex");
	struct rdma_cm_event *ev = expect(RDMA_CM_EVENT_MULTICAST_JOIN);
	if (!(ah = ibv_create_ah(pd, &ev->param.ud.ah_attr)))
		die("ibv_create_ah");
	rqpn = ev->param.ud.qp_num;
	rqkey = ev->param.ud.qkey;
	rdma_ack_cm_event(ev);
	int64_t cpu0 = cpu_ns();
	if (pong) {
		printf("PONG READY\n");
		fflush(stdout);
		long n = 0;
		for (;;) {
			uint64_t seq;
			if (!ping_recv(&seq, 1000))
				continue;
			if (seq == STOP)
				break;
			ping_send(seq);
			n++;
		}
		printf("PONGS n=%ld\n", n);
		printf("CPU role=pong rounds=%ld cpu_us_per_round=%.1f\n", n, (cpu_ns() - cpu0) / 1e3 / (n ? n : 1));
		return 0;
	}
	// As the Go pinger: a reply not back in 500 ms is lost (a late one
	// is skipped), the next ping goes out.
	int64_t *rtt = calloc(count, sizeof *rtt);
	int n = 0, lost = 0;
	for (int i = 0; i < warmup + count; i++) {
		int64_t t0 = now();
		ping_send(i + 1);
		for (;;) {
			uint64_t got;
			if (!ping_recv(&got, 500)) {
				lost++;
				break;
			}
			if (got != (uint64_t)(i + 1))
				continue;
			if (i >= warmup)
				rtt[n++] = now() - t0;
			break;
		}
		if (lost > count / 10 + 3) {
			fprintf(stderr, "mcpingpong: %d replies lost\n", lost);
			return 1;
		}
	}
	ping_send(STOP);
	if (n == 0) {
		fprintf(stderr, "mcpingpong: no round trip\n");
		return 1;
	}
	qsort(rtt, n, sizeof *rtt, cmp);
	printf("LATENCY n=%d p50_ns=%lld p99_ns=%lld lost=%d\n", n, (long long)rtt[n / 2], (long long)rtt[n * 99 / 100], lost);
	printf("CPU role=ping rounds=%d cpu_us_per_round=%.1f\n", warmup + count, (cpu_ns() - cpu0) / 1e3 / (warmup + count));
	return 0;
}
