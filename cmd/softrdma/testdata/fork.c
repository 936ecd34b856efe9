// fork.c: fork() in a program on softrdma's libraries.
//
// fork: on rxe_lo, two UD QPs (A sends to B) with their CQ, MR and AH;
// one message A→B before anything else. Then:
//   1. a child of fork() calls on the objects it inherited: each call
//      fails with EINVAL, never hangs (ibv_get_device_list and
//      rdma_create_event_channel make objects of its own); calls that do not reach
//      softrdma's runtime (ibv_wc_status_str, ibv_is_fork_initialized)
//      work; a grandchild it forks gets EINVAL too; the child exits 0
//      when all of that held;
//   2. a child of fork() execs this program with "exec-child": it opens
//      rxe_lo afresh, its port is active, and it sends a message from a
//      QP of its own to the parent's QP B (whose number and the GID come
//      in its arguments);
//   3. the parent, after both children exited 0, receives that message
//      and sends and receives one more A→B.
// Prints "ok" and exits 0 when everything held, else says what failed
// and exits 1. An alarm kills a hung run after 60 s.
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define QKEY 0x22222222u
#define GRH 40
#define LEN 32

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_mr *mr;
static struct ibv_ah *ah;
static struct ibv_qp *qa, *qb;
static char buf[4096];
static union ibv_gid gid0;

#define CHECK(cond, ...) do { if (!(cond)) { fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } } while (0)

static struct ibv_context *open_lo(void)
{
	struct ibv_device **list;
	struct ibv_context *c = NULL;
	int n;
	list = ibv_get_device_list(&n);
	CHECK(list, "ibv_get_device_list: %s", strerror(errno));
	for (int i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), "rxe_lo"))
			c = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	CHECK(c, "no rxe_lo");
	return c;
}

static struct ibv_qp *ud_qp(struct ibv_pd *p, struct ibv_cq *c)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = c, .recv_cq = c, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *q = ibv_create_qp(p, &ia);
	CHECK(q, "ibv_create_qp: %s", strerror(errno));
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	CHECK(!ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), "INIT");
	a.qp_state = IBV_QPS_RTR;
	CHECK(!ibv_modify_qp(q, &a, IBV_QP_STATE), "RTR");
	a.qp_state = IBV_QPS_RTS;
	CHECK(!ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), "RTS");
	return q;
}

static int post_send(struct ibv_qp *q, struct ibv_ah *a, struct ibv_mr *m, char *msg, uint32_t dqpn)
{
	struct ibv_sge sge = { .addr = (uintptr_t)msg, .length = LEN, .lkey = m->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
		.wr.ud = { .ah = a, .remote_qpn = dqpn, .remote_qkey = QKEY },
	}, *bad;
	return ibv_post_send(q, &wr, &bad);
}

static int post_recv(void)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf + 1024, .length = GRH + LEN, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 }, *bad;
	return ibv_post_recv(qb, &wr, &bad);
}

// wait_wc polls c until it had sends completions of sends and recvs of
// receives (5 s at most).
static void wait_wc(struct ibv_cq *c, int sends, int recvs)
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (sends > 0 || recvs > 0) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(c, 1, &wc);
		CHECK(n >= 0, "ibv_poll_cq: %d", n);
		if (n == 1) {
			CHECK(wc.status == IBV_WC_SUCCESS, "completion: %s", ibv_wc_status_str(wc.status));
			if (wc.opcode == IBV_WC_SEND)
				sends--;
			else if (wc.opcode == IBV_WC_RECV)
				recvs--;
			continue;
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		CHECK(t.tv_sec - t0.tv_sec < 5, "completions missing after 5 s: %d sends, %d receives", sends, recvs);
	}
	CHECK(sends == 0 && recvs == 0, "more completions than work requests");
}

// transfer sends msg A→B and checks that B received it.
static void transfer(const char *msg)
{
	CHECK(!post_recv(), "ibv_post_recv");
	strncpy(buf, msg, LEN);
	CHECK(!post_send(qa, ah, mr, buf, qb->qp_num), "ibv_post_send");
	wait_wc(cq, 1, 1);
	CHECK(!strncmp(buf + 1024 + GRH, msg, LEN), "received %.32s, want %s", buf + 1024 + GRH, msg);
}

// child_inherited is the first child: every call on an inherited object
// fails with an errno.
static void child_inherited(void)
{
	struct ibv_wc wc;
	struct ibv_port_attr pa;
	union ibv_gid g;
	int e;

	errno = 0;
	e = post_send(qa, ah, mr, buf, qb->qp_num);
	CHECK(e == EINVAL, "child: ibv_post_send gave %d, want EINVAL", e);
	e = ibv_poll_cq(cq, 1, &wc);
	CHECK(e == -EINVAL, "child: ibv_poll_cq gave %d, want -EINVAL", e);
	e = ibv_req_notify_cq(cq, 0);
	CHECK(e == EINVAL, "child: ibv_req_notify_cq gave %d, want EINVAL", e);
	e = ibv_query_port(ctx, 1, &pa);
	CHECK(e == EINVAL, "child: ibv_query_port gave %d, want EINVAL", e);
	errno = 0;
	CHECK(ibv_query_gid(ctx, 1, 0, &g) == -1 && errno == EINVAL, "child: ibv_query_gid: errno %d, want EINVAL", errno);
	__be16 pk;
	errno = 0;
	CHECK(ibv_query_pkey(ctx, 1, 0, &pk) == -1 && errno == EINVAL, "child: ibv_query_pkey: errno %d, want EINVAL", errno);
	errno = 0;
	CHECK(!ibv_alloc_pd(ctx) && errno == EINVAL, "child: ibv_alloc_pd: errno %d, want EINVAL", errno);
	struct ibv_device_attr_ex dax;
	e = ibv_query_device_ex(ctx, NULL, &dax);
	CHECK(e == EINVAL, "child: ibv_query_device_ex gave %d, want EINVAL", e);
	e = ibv_dereg_mr(mr);
	CHECK(e == EINVAL, "child: ibv_dereg_mr gave %d, want EINVAL", e);
	e = ibv_destroy_qp(qa);
	CHECK(e == EINVAL, "child: ibv_destroy_qp gave %d, want EINVAL", e);
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	e = ibv_query_qp(qa, &qattr, IBV_QP_STATE, &qinit);
	CHECK(e == EINVAL, "child: ibv_query_qp gave %d, want EINVAL", e);
	e = ibv_attach_mcast(qa, &gid0, 0);
	CHECK(e == EINVAL, "child: ibv_attach_mcast gave %d, want EINVAL", e);
	e = ibv_detach_mcast(qa, &gid0, 0);
	CHECK(e == EINVAL, "child: ibv_detach_mcast gave %d, want EINVAL", e);
	// Objects of its own the child makes through its parent (see
	// forkworkers.c); the inherited ones stay the parent's.
	struct ibv_device **l = ibv_get_device_list(NULL);
	CHECK(l && l[0], "child: ibv_get_device_list: %s", strerror(errno));
	ibv_free_device_list(l);
	struct rdma_event_channel *ech = rdma_create_event_channel();
	CHECK(ech, "child: rdma_create_event_channel: %s", strerror(errno));
	rdma_destroy_event_channel(ech);
	ibv_ack_cq_events(cq, 1); // void: does nothing
	pid_t gp = fork(); // a grandchild: forking again does not hang either
	CHECK(gp >= 0, "child: fork: %s", strerror(errno));
	if (gp == 0) {
		struct ibv_wc gwc;
		_exit(ibv_poll_cq(cq, 1, &gwc) == -EINVAL ? 0 : 1);
	}
	int st;
	CHECK(waitpid(gp, &st, 0) == gp && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: the grandchild: status %#x", st);
	CHECK(!strcmp(ibv_wc_status_str(IBV_WC_SUCCESS), "success"), "child: ibv_wc_status_str");
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED, "child: ibv_is_fork_initialized");
	printf("child: every call on inherited objects failed\n");
	exit(0); // exit, not _exit: nothing of softrdma runs at exit
}

// exec_child runs in a program the second child exec'd: softrdma works
// afresh, and it sends to the parent's QP B.
static int exec_child(const char *dqpn_s, const char *go_s)
{
	struct ibv_context *c = open_lo();
	struct ibv_port_attr pa;
	CHECK(!ibv_query_port(c, 1, &pa) && pa.state == IBV_PORT_ACTIVE, "exec child: port not active");
	struct ibv_pd *p = ibv_alloc_pd(c);
	struct ibv_cq *q = ibv_create_cq(c, 16, NULL, NULL, 0);
	static char m[64] = "from the exec'd child";
	struct ibv_mr *r = ibv_reg_mr(p, m, sizeof m, 0);
	CHECK(p && q && r, "exec child: objects");
	union ibv_gid g;
	CHECK(!ibv_query_gid(c, 1, 0, &g), "exec child: ibv_query_gid");
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .dgid = g, .hop_limit = 1 } };
	struct ibv_ah *a = ibv_create_ah(p, &aa);
	struct ibv_qp *qp = ud_qp(p, q);
	CHECK(a, "exec child: ibv_create_ah");
	CHECK(!post_send(qp, a, r, m, strtoul(dqpn_s, NULL, 0)), "exec child: ibv_post_send");
	wait_wc(q, 1, 0);
	// The datagram may sit in this process's UDP 4791 socket, on its way
	// to the parent's device (the kernel picks one socket of the port's
	// reuseport group by hash): closing the device before it was handed
	// over would lose it. The parent says when it has it.
	char go;
	CHECK(read(atoi(go_s), &go, 1) == 1, "exec child: waiting for the parent: %s", strerror(errno));
	CHECK(!ibv_destroy_qp(qp) && !ibv_destroy_ah(a) && !ibv_dereg_mr(r) && !ibv_destroy_cq(q) &&
	      !ibv_dealloc_pd(p) && !ibv_close_device(c), "exec child: cleanup");
	printf("exec child: sent\n");
	return 0;
}

static void wait_child(pid_t pid, const char *what)
{
	int st;
	CHECK(waitpid(pid, &st, 0) == pid, "waitpid %s: %s", what, strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: status %#x", what, st);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(60);
	if (argc == 4 && !strcmp(argv[1], "exec-child"))
		return exec_child(argv[2], argv[3]);
	CHECK(ibv_fork_init() == 0, "ibv_fork_init");
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED, "ibv_is_fork_initialized");
	ctx = open_lo();
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	CHECK(pd && cq && mr, "objects: %s", strerror(errno));
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid0), "ibv_query_gid");
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid0, .hop_limit = 1 } };
	ah = ibv_create_ah(pd, &aa);
	CHECK(ah, "ibv_create_ah");
	qa = ud_qp(pd, cq);
	qb = ud_qp(pd, cq);
	transfer("before fork");
	printf("parent: sent and received before fork\n");

	pid_t pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0)
		child_inherited();
	wait_child(pid, "the child using inherited objects");

	CHECK(!post_recv(), "ibv_post_recv");
	int gofd[2];
	CHECK(!pipe(gofd), "pipe: %s", strerror(errno));
	pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		char qpn[16], fd[16];
		snprintf(qpn, sizeof qpn, "%u", qb->qp_num);
		snprintf(fd, sizeof fd, "%d", gofd[0]);
		close(gofd[1]);
		execl("/proc/self/exe", argv[0], "exec-child", qpn, fd, (char *)NULL);
		fprintf(stderr, "execl: %s\n", strerror(errno));
		_exit(127);
	}
	close(gofd[0]);
	wait_wc(cq, 0, 1);
	CHECK(write(gofd[1], "x", 1) == 1, "write: %s", strerror(errno));
	close(gofd[1]);
	wait_child(pid, "the child that execs");
	CHECK(!strcmp(buf + 1024 + GRH, "from the exec'd child"), "received %.32s from the exec'd child", buf + 1024 + GRH);
	printf("parent: received from the exec'd child\n");

	transfer("after fork");
	printf("parent: sent and received after fork\n");
	CHECK(!ibv_destroy_qp(qa) && !ibv_destroy_qp(qb) && !ibv_destroy_ah(ah) && !ibv_dereg_mr(mr) &&
	      !ibv_destroy_cq(cq) && !ibv_dealloc_pd(pd) && !ibv_close_device(ctx), "cleanup");
	printf("ok\n");
	return 0;
}
