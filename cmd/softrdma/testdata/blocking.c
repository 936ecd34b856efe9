// blocking.c: the calls that wait in rdma-core wait in softrdma's
// libraries too, until their event comes, unless the program set
// O_NONBLOCK on the fd (then EAGAIN when there is none), and the fd is
// readable once an event is there (poll, then the call).
//
// blocking DEVICE IFNAME: on loopback (127.0.0.1, groups 239.34.0.x routed
// to lo), for rdma_get_cm_event, ibv_get_cq_event (a channel of the
// program's), rdma_get_recv_comp and rdma_get_send_comp (the CQs
// rdma_create_qp made), and on DEVICE, the RoCE device of interface
// IFNAME, for ibv_get_async_event (its event: an address added to IFNAME
// with ip(8)), it checks that
//
//   - the call, made before its event exists, waits, and returns the event
//     once a helper thread made it: the helper makes it only after this
//     thread sleeps in the call (its state in /proc is S), and the call
//     must return after that (a call that returned before the event was
//     made, or with an error, fails);
//   - with O_NONBLOCK set on the fd by the program (fcntl), the call
//     fails with EAGAIN when there is no event, and poll() on the fd
//     waits until the helper makes one, after which the call returns it.
//
// Prints "ok <call>" for each and "ok" at the end; exits 0 when every
// check held, else prints "FAIL <call>: <why>" and exits 1.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

extern char **environ;

static const char *ifname;

static void fail(const char *call, const char *fmt, ...)
{
	va_list ap;
	printf("FAIL %s: ", call);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	exit(1);
}

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

// ---- The helper thread, which makes each event once this thread waits ----

typedef void (*trigger_fn)(void);

static pid_t main_tid;
static int go_pipe[2], done_pipe[2];
static trigger_fn next_trigger;
static int fired, returned, never_slept;

// asleep tells whether thread tid sleeps (state S in /proc).
static int asleep(pid_t tid)
{
	char path[64], buf[512], *p;
	int fd, n;
	snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] == 'S';
}

static void *helper(void *arg)
{
	(void)arg;
	for (;;) {
		char c;
		trigger_fn fn;
		long long deadline;
		int seen = 0;
		if (read(go_pipe[0], &c, 1) != 1)
			return NULL;
		fn = __atomic_load_n(&next_trigger, __ATOMIC_SEQ_CST);
		// The main thread sleeps in its call: seen asleep three times
		// in a row (a thread entering the library may sleep a moment
		// on a lock before it waits for the event).
		deadline = now_ms() + 20000;
		while (seen < 3 && !__atomic_load_n(&returned, __ATOMIC_SEQ_CST)) {
			if (now_ms() > deadline) {
				__atomic_store_n(&never_slept, 1, __ATOMIC_SEQ_CST);
				break;
			}
			seen = asleep(main_tid) ? seen + 1 : 0;
			sleep_ms(2);
		}
		if (!__atomic_load_n(&returned, __ATOMIC_SEQ_CST) && !never_slept) {
			__atomic_store_n(&fired, 1, __ATOMIC_SEQ_CST);
			fn();
		}
		if (write(done_pipe[1], "x", 1) != 1)
			return NULL;
	}
}

// arm hands the helper fn, which it runs once this thread sleeps in the
// call that follows.
static void arm(trigger_fn fn)
{
	__atomic_store_n(&fired, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&returned, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&never_slept, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&next_trigger, fn, __ATOMIC_SEQ_CST);
	if (write(go_pipe[1], "x", 1) != 1) {
		perror("write");
		exit(1);
	}
}

// waited is called as soon as the armed call returned: it waits for the
// helper to finish and fails the call unless the call returned after the
// helper made its event.
static void waited(const char *call)
{
	char c;
	__atomic_store_n(&returned, 1, __ATOMIC_SEQ_CST);
	if (read(done_pipe[0], &c, 1) != 1) {
		perror("read");
		exit(1);
	}
	if (never_slept)
		fail(call, "the thread never slept in the call (20 s)");
	if (!fired)
		fail(call, "returned before its event was made");
}

static void set_nonblock(const char *call, int fd, int on)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK) < 0)
		fail(call, "fcntl: %s", strerror(errno));
}

// readable polls fd for up to ms milliseconds.
static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int r;
	while ((r = poll(&p, 1, ms)) < 0 && errno == EINTR)
		;
	return r > 0 && (p.revents & POLLIN);
}

// ---- Multicast on loopback: the events of the CQ cases are messages ----

#define SLOT (40 + 64)
#define NRECV 16

struct ep {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	uint8_t buf[NRECV * SLOT + 64];
};

static struct rdma_event_channel *setup_ch;
static struct ep rx, rx2, tx;
static struct ibv_comp_channel *cq_ch; // the program's own channel (rx2's CQ)
static struct ibv_cq *cq2;
static int cq2_marker;
static struct rdma_ud_param to_a, to_b; // tx's way to groups A (rx2) and B (rx)

static struct sockaddr_in sin4(const char *ip)
{
	struct sockaddr_in s = { .sin_family = AF_INET };
	inet_pton(AF_INET, ip, &s.sin_addr);
	return s;
}

static struct rdma_cm_event *get_event(struct rdma_event_channel *ch, const char *what)
{
	struct rdma_cm_event *ev;
	if (!readable(ch->fd, 20000))
		fail("setup", "%s: no event in 20 s", what);
	if (rdma_get_cm_event(ch, &ev))
		fail("setup", "%s: rdma_get_cm_event: %s", what, strerror(errno));
	return ev;
}

static void join(struct ep *e, const char *group, int flags, struct rdma_ud_param *p)
{
	struct sockaddr_in g = sin4(group);
	struct rdma_cm_join_mc_attr_ex a = {
		.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
		.join_flags = flags,
		.addr = (struct sockaddr *)&g,
	};
	struct rdma_cm_event *ev;
	if (rdma_join_multicast_ex(e->id, &a, NULL))
		fail("setup", "join %s: %s", group, strerror(errno));
	ev = get_event(setup_ch, "join");
	if (ev->event != RDMA_CM_EVENT_MULTICAST_JOIN)
		fail("setup", "join %s: %s", group, rdma_event_str(ev->event));
	if (p)
		*p = ev->param.ud;
	rdma_ack_cm_event(ev);
}

static void post_recvs(struct ep *e)
{
	for (int i = 0; i < NRECV; i++) {
		struct ibv_sge sge = { (uintptr_t)e->buf + i * SLOT, SLOT, e->mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;
		if (ibv_post_recv(e->id->qp, &wr, &bad))
			fail("setup", "ibv_post_recv");
	}
}

// endpoint makes e a UD id bound to 127.0.0.1 with a QP: its CQs made by
// rdma_create_qp, or both cq when cq is not NULL.
static void endpoint(struct ep *e, struct ibv_cq *cq)
{
	struct sockaddr_in local = sin4("127.0.0.1");
	struct ibv_qp_init_attr a = {
		.qp_type = IBV_QPT_UD,
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = NRECV, .max_recv_wr = NRECV, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	if (rdma_create_id(setup_ch, &e->id, NULL, RDMA_PS_UDP))
		fail("setup", "rdma_create_id: %s", strerror(errno));
	if (rdma_bind_addr(e->id, (struct sockaddr *)&local))
		fail("setup", "rdma_bind_addr: %s", strerror(errno));
	if (cq) {
		if (!(e->pd = ibv_alloc_pd(e->id->verbs)))
			fail("setup", "ibv_alloc_pd: %s", strerror(errno));
	}
	if (rdma_create_qp(e->id, e->pd, &a))
		fail("setup", "rdma_create_qp: %s", strerror(errno));
	if (!(e->mr = ibv_reg_mr(e->id->qp->pd, e->buf, sizeof e->buf, IBV_ACCESS_LOCAL_WRITE)))
		fail("setup", "ibv_reg_mr: %s", strerror(errno));
	post_recvs(e);
}

static void post_send(struct rdma_ud_param *to)
{
	static struct ibv_ah *ahs[2];
	struct ibv_ah **ah = &ahs[to == &to_b];
	struct ibv_sge sge = { (uintptr_t)tx.buf + NRECV * SLOT, 16, tx.mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	if (!*ah && !(*ah = ibv_create_ah(tx.id->qp->pd, &to->ah_attr)))
		fail("helper", "ibv_create_ah: %s", strerror(errno));
	wr.wr.ud.ah = *ah;
	wr.wr.ud.remote_qpn = to->qp_num;
	wr.wr.ud.remote_qkey = to->qkey;
	if (ibv_post_send(tx.id->qp, &wr, &bad))
		fail("helper", "ibv_post_send");
}

// send posts a message to group to and takes its send completion (so
// that tx's send CQ stays empty for rdma_get_send_comp).
static void send_to(struct rdma_ud_param *to)
{
	struct ibv_wc wc;
	long long deadline = now_ms() + 20000;
	int n;
	post_send(to);
	while ((n = ibv_poll_cq(tx.id->send_cq, 1, &wc)) == 0) {
		if (now_ms() > deadline)
			fail("helper", "no send completion in 20 s");
		sleep_ms(1);
	}
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		fail("helper", "send completion: %d %s", n, n > 0 ? ibv_wc_status_str(wc.status) : "");
}

static void send_a(void) { send_to(&to_a); }
static void send_b(void) { send_to(&to_b); }
static void post_b(void) { post_send(&to_b); }

// ---- rdma_get_cm_event ----

static struct rdma_event_channel *cm_ch;
static struct rdma_cm_id *cm_id;
static const char *cm_groups[] = { "239.34.0.10", "239.34.0.11", "239.34.0.12" };
static int cm_next;

static void join_next(void)
{
	struct sockaddr_in g = sin4(cm_groups[cm_next++]);
	if (rdma_join_multicast(cm_id, (struct sockaddr *)&g, NULL))
		fail("helper", "rdma_join_multicast: %s", strerror(errno));
}

static void check_join(const char *call, struct rdma_cm_event *ev)
{
	if (ev->event != RDMA_CM_EVENT_MULTICAST_JOIN || ev->id != cm_id)
		fail(call, "got %s, want RDMA_CM_EVENT_MULTICAST_JOIN of the id", rdma_event_str(ev->event));
	rdma_ack_cm_event(ev);
}

static void cm_event(void)
{
	const char *call = "rdma_get_cm_event";
	struct sockaddr_in local = sin4("127.0.0.1");
	struct rdma_cm_event *ev;
	int r;
	if (!(cm_ch = rdma_create_event_channel()) || rdma_create_id(cm_ch, &cm_id, NULL, RDMA_PS_UDP) ||
	    rdma_bind_addr(cm_id, (struct sockaddr *)&local))
		fail(call, "setup: %s", strerror(errno));

	arm(join_next);
	r = rdma_get_cm_event(cm_ch, &ev);
	waited(call);
	if (r)
		fail(call, "blocking: %s", strerror(errno));
	check_join(call, ev);

	set_nonblock(call, cm_ch->fd, 1);
	errno = 0;
	if (rdma_get_cm_event(cm_ch, &ev) == 0 || errno != EAGAIN)
		fail(call, "O_NONBLOCK, no event: %s, want EAGAIN", errno ? strerror(errno) : "an event");
	if (readable(cm_ch->fd, 0))
		fail(call, "the fd is readable with no event");
	arm(join_next);
	r = readable(cm_ch->fd, 30000);
	waited(call);
	if (!r)
		fail(call, "O_NONBLOCK: the fd did not become readable when the event came");
	if (rdma_get_cm_event(cm_ch, &ev))
		fail(call, "O_NONBLOCK, after poll: %s", strerror(errno));
	check_join(call, ev);

	// The flag is read at each call: cleared, the call waits again.
	set_nonblock(call, cm_ch->fd, 0);
	arm(join_next);
	r = rdma_get_cm_event(cm_ch, &ev);
	waited(call);
	if (r)
		fail(call, "blocking again: %s", strerror(errno));
	check_join(call, ev);
	printf("ok %s\n", call);
}

// ---- ibv_get_cq_event on the program's channel ----

static void take_recv(const char *call, struct ep *e, struct ibv_cq *cq)
{
	struct ibv_wc wc;
	struct ibv_sge sge;
	struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_poll_cq(cq, 1, &wc) != 1)
		fail(call, "an event but no completion");
	if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV)
		fail(call, "completion: %s opcode %d", ibv_wc_status_str(wc.status), wc.opcode);
	sge = (struct ibv_sge){ (uintptr_t)e->buf + wc.wr_id * SLOT, SLOT, e->mr->lkey };
	wr.wr_id = wc.wr_id;
	if (ibv_post_recv(e->id->qp, &wr, &bad))
		fail(call, "ibv_post_recv");
}

static void check_cq_event(const char *call, int r, struct ibv_cq *cq, void *ctx)
{
	if (r)
		fail(call, "%s", strerror(errno));
	if (cq != cq2 || ctx != &cq2_marker)
		fail(call, "the event's CQ or cq_context is not the CQ's");
	ibv_ack_cq_events(cq, 1);
	take_recv(call, &rx2, cq2);
}

static void cq_event(void)
{
	const char *call = "ibv_get_cq_event";
	struct ibv_cq *cq;
	void *ctx;
	int r;

	if (ibv_req_notify_cq(cq2, 0))
		fail(call, "ibv_req_notify_cq");
	arm(send_a);
	r = ibv_get_cq_event(cq_ch, &cq, &ctx);
	waited(call);
	check_cq_event(call, r, cq, ctx);

	set_nonblock(call, cq_ch->fd, 1);
	if (ibv_req_notify_cq(cq2, 0))
		fail(call, "ibv_req_notify_cq");
	errno = 0;
	if (ibv_get_cq_event(cq_ch, &cq, &ctx) == 0 || errno != EAGAIN)
		fail(call, "O_NONBLOCK, no event: %s, want EAGAIN", errno ? strerror(errno) : "an event");
	if (readable(cq_ch->fd, 0))
		fail(call, "the fd is readable with no event");
	arm(send_a);
	r = readable(cq_ch->fd, 30000);
	waited(call);
	if (!r)
		fail(call, "O_NONBLOCK: the fd did not become readable when the event came");
	r = ibv_get_cq_event(cq_ch, &cq, &ctx);
	check_cq_event(call, r, cq, ctx);
	if (readable(cq_ch->fd, 0))
		fail(call, "the fd is readable after its only event was taken");

	set_nonblock(call, cq_ch->fd, 0);
	if (ibv_req_notify_cq(cq2, 0))
		fail(call, "ibv_req_notify_cq");
	arm(send_a);
	r = ibv_get_cq_event(cq_ch, &cq, &ctx);
	waited(call);
	check_cq_event(call, r, cq, ctx);
	printf("ok %s\n", call);
}

// ---- rdma_get_recv_comp and rdma_get_send_comp (the CQs of rdma_create_qp) ----

static void recv_comp(void)
{
	const char *call = "rdma_get_recv_comp";
	struct ibv_wc wc;
	int r;
	if (!rx.id->recv_cq_channel)
		fail(call, "rdma_create_qp made a receive CQ without a completion channel");
	arm(send_b);
	r = rdma_get_recv_comp(rx.id, &wc);
	waited(call);
	if (r != 1)
		fail(call, "returned %d: %s", r, strerror(errno));
	if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV)
		fail(call, "completion: %s opcode %d", ibv_wc_status_str(wc.status), wc.opcode);

	set_nonblock(call, rx.id->recv_cq_channel->fd, 1);
	errno = 0;
	if ((r = rdma_get_recv_comp(rx.id, &wc)) >= 0 || errno != EAGAIN)
		fail(call, "O_NONBLOCK, no completion: %d %s, want -1 EAGAIN", r, strerror(errno));
	printf("ok %s\n", call);
}

static void send_comp(void)
{
	const char *call = "rdma_get_send_comp";
	struct ibv_wc wc;
	int r;
	if (!tx.id->send_cq_channel)
		fail(call, "rdma_create_qp made a send CQ without a completion channel");
	arm(post_b);
	r = rdma_get_send_comp(tx.id, &wc);
	waited(call);
	if (r != 1)
		fail(call, "returned %d: %s", r, strerror(errno));
	if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_SEND)
		fail(call, "completion: %s opcode %d", ibv_wc_status_str(wc.status), wc.opcode);

	set_nonblock(call, tx.id->send_cq_channel->fd, 1);
	errno = 0;
	if ((r = rdma_get_send_comp(tx.id, &wc)) >= 0 || errno != EAGAIN)
		fail(call, "O_NONBLOCK, no completion: %d %s, want -1 EAGAIN", r, strerror(errno));
	printf("ok %s\n", call);
}

// ---- ibv_get_async_event ----

static int addr_next = 1;

static void add_address(void)
{
	char addr[32];
	char *argv[] = { "ip", "addr", "add", addr, "dev", (char *)ifname, NULL };
	pid_t pid;
	int st;
	snprintf(addr, sizeof addr, "10.34.0.%d/24", addr_next++);
	if (posix_spawnp(&pid, "ip", NULL, NULL, argv, environ))
		fail("helper", "posix_spawnp ip");
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
		fail("helper", "ip addr add %s dev %s failed", addr, ifname);
}

static void check_gid_change(const char *call, int r, struct ibv_async_event *ev)
{
	if (r)
		fail(call, "%s", strerror(errno));
	if (ev->event_type != IBV_EVENT_GID_CHANGE)
		fail(call, "got %s, want IBV_EVENT_GID_CHANGE", ibv_event_type_str(ev->event_type));
	ibv_ack_async_event(ev);
}

// drain takes the events already queued (O_NONBLOCK set): it must end in
// EAGAIN.
static void drain(const char *call, struct ibv_context *ctx)
{
	struct ibv_async_event ev;
	for (;;) {
		errno = 0;
		if (ibv_get_async_event(ctx, &ev)) {
			if (errno != EAGAIN)
				fail(call, "O_NONBLOCK: %s, want EAGAIN", strerror(errno));
			return;
		}
		ibv_ack_async_event(&ev);
	}
}

static void async_event(const char *device)
{
	const char *call = "ibv_get_async_event";
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	struct ibv_async_event ev;
	struct ibv_port_attr pa;
	long long deadline = now_ms() + 20000;
	int n, r;

	list = ibv_get_device_list(&n);
	for (int i = 0; list && i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), device))
			ctx = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	if (!ctx)
		fail(call, "no device %s, or ibv_open_device failed: %s", device, strerror(errno));
	// The port comes up with its interface (the test waited for that);
	// what was queued before is taken first.
	while (ibv_query_port(ctx, 1, &pa) == 0 && pa.state != IBV_PORT_ACTIVE) {
		if (now_ms() > deadline)
			fail(call, "port 1 of %s not active in 20 s", device);
		if (readable(ctx->async_fd, 100) && ibv_get_async_event(ctx, &ev) == 0)
			ibv_ack_async_event(&ev);
	}
	set_nonblock(call, ctx->async_fd, 1);
	drain(call, ctx);
	if (readable(ctx->async_fd, 0))
		fail(call, "async_fd is readable with no event");
	set_nonblock(call, ctx->async_fd, 0);

	arm(add_address);
	r = ibv_get_async_event(ctx, &ev);
	waited(call);
	check_gid_change(call, r, &ev);

	set_nonblock(call, ctx->async_fd, 1);
	drain(call, ctx); // and another of the same change, if any
	arm(add_address);
	r = readable(ctx->async_fd, 30000);
	waited(call);
	if (!r)
		fail(call, "O_NONBLOCK: async_fd did not become readable when the event came");
	r = ibv_get_async_event(ctx, &ev);
	check_gid_change(call, r, &ev);
	drain(call, ctx);
	ibv_close_device(ctx);
	printf("ok %s\n", call);
}

int main(int argc, char **argv)
{
	pthread_t th;
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 3) {
		fprintf(stderr, "usage: blocking DEVICE IFNAME\n");
		return 2;
	}
	ifname = argv[2];
	main_tid = (pid_t)syscall(SYS_gettid);
	if (pipe(go_pipe) || pipe(done_pipe) || pthread_create(&th, NULL, helper, NULL)) {
		perror("setup");
		return 1;
	}

	if (!(setup_ch = rdma_create_event_channel()))
		fail("setup", "rdma_create_event_channel: %s", strerror(errno));
	endpoint(&rx, NULL);
	endpoint(&tx, NULL);
	// rx2: a CQ of the program's, on a channel of the program's, with a
	// context of its own.
	rx2.pd = NULL;
	if (rdma_create_id(setup_ch, &rx2.id, NULL, RDMA_PS_UDP))
		fail("setup", "rdma_create_id");
	{
		struct sockaddr_in local = sin4("127.0.0.1");
		if (rdma_bind_addr(rx2.id, (struct sockaddr *)&local))
			fail("setup", "rdma_bind_addr: %s", strerror(errno));
	}
	if (!(cq_ch = ibv_create_comp_channel(rx2.id->verbs)))
		fail("setup", "ibv_create_comp_channel: %s", strerror(errno));
	if (!(cq2 = ibv_create_cq(rx2.id->verbs, 2 * NRECV, &cq2_marker, cq_ch, 0)))
		fail("setup", "ibv_create_cq: %s", strerror(errno));
	{
		struct ibv_qp_init_attr a = {
			.qp_type = IBV_QPT_UD, .send_cq = cq2, .recv_cq = cq2,
			.cap = { .max_send_wr = NRECV, .max_recv_wr = NRECV, .max_send_sge = 1, .max_recv_sge = 1 },
		};
		if (!(rx2.pd = ibv_alloc_pd(rx2.id->verbs)))
			fail("setup", "ibv_alloc_pd: %s", strerror(errno));
		if (rdma_create_qp(rx2.id, rx2.pd, &a))
			fail("setup", "rdma_create_qp: %s", strerror(errno));
		if (!(rx2.mr = ibv_reg_mr(rx2.pd, rx2.buf, sizeof rx2.buf, IBV_ACCESS_LOCAL_WRITE)))
			fail("setup", "ibv_reg_mr: %s", strerror(errno));
		post_recvs(&rx2);
	}
	join(&rx2, "239.34.0.1", RDMA_MC_JOIN_FLAG_FULLMEMBER, NULL);
	join(&rx, "239.34.0.2", RDMA_MC_JOIN_FLAG_FULLMEMBER, NULL);
	join(&tx, "239.34.0.1", RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, &to_a);
	join(&tx, "239.34.0.2", RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, &to_b);
	printf("ready\n");

	cm_event();
	cq_event();
	recv_comp();
	send_comp();
	async_event(argv[1]);
	printf("ok\n");
	return 0;
}
