// forkworkers.c: workers forked after their parent opened a device, each
// with channels, ids, contexts and QPs of its own (see docs/c-programs.md,
// "fork()").
//
// forkworkers [N]: the parent opens the first device, then forks two
// workers. Each creates its own event channel and UDP id, resolves
// 127.0.0.1 to a multicast group, makes its PD, CQ and UD QP on the id's
// context (rdma_create_qp), registers its memory and joins the group
// (the join's event brings back the context it was given, the AH
// attributes, QPN and Q_Key). The receiver posts N receives before it
// joins, tells the sender (a pipe) once it joined, and waits for N
// messages through a completion channel (ibv_req_notify_cq,
// ibv_get_cq_event); the sender sends N messages, each after the one
// before completed. Every message is checked ("msg <i>" in order). Each
// worker also checks that the parent's context, used in the child, gives
// EINVAL; sets options on its id before it resolves (rdma_set_option:
// RDMA_OPTION_ID_TOS and REUSEADDR; a TOS of the wrong size gives EINVAL);
// and queries its QP (ibv_query_qp: RTS, the group's Q_Key, its CQs,
// context and capacities as the child's own). The receiver also makes a
// second UD QP with ibv_create_qp, attaches it to the group
// (ibv_attach_mcast with the join's MGID and MLID), and checks that it
// received the N messages too; then it detaches it (ibv_detach_mcast),
// the sender sends one more message, and only the id's QP gets it. The
// parent waits for both, checks they exited 0, uses its own context
// again, and prints "ok".
//
// forkworkers lat [N]: the time per call of ibv_query_port and of an
// ibv_poll_cq that finds nothing, N calls each, in the parent and in a
// child of fork().
//
// forkworkers family: a child makes an id and resolves it; the
// grandchild it forks gets EINVAL on the child's id, makes and resolves an
// id of its own, and exits 0; then the parent exits without waiting, and
// the child's next calls fail with EIO (its parent served them), never
// hang: it prints "orphan: EIO after the parent exited".
//
// forkworkers exits: ten children one after the other make an id, a UD QP
// with a posted receive and a registered buffer, join one group and exit
// without cleaning up and without acknowledging the join's event (every
// other one destroys its id first, acknowledged, QP still on it): the
// parent destroys what each left (it acknowledges first), so the next
// joins the group too, and the parent itself joins it after them; prints
// "exits: ok".
//
// An alarm kills a hung run after 60 s.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define GRH 40
#define LEN 64
#define GROUP "239.23.3.1"

#define CHECK(cond, ...)                                                                                             \
	do {                                                                                                         \
		if (!(cond)) {                                                                                       \
			fprintf(stderr, "%s: ", role);                                                               \
			fprintf(stderr, __VA_ARGS__);                                                                \
			fprintf(stderr, "\n");                                                                       \
			exit(1);                                                                                     \
		}                                                                                                    \
	} while (0)

static const char *role = "parent";
static struct ibv_context *pctx; // the parent's
static int nmsg = 50;

static struct rdma_cm_event *wait_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;
	CHECK(rdma_get_cm_event(ch, &ev) == 0, "rdma_get_cm_event: %s", strerror(errno));
	CHECK(ev->event == want, "event %s (status %d), want %s", rdma_event_str(ev->event), ev->status,
	      rdma_event_str(want));
	return ev;
}

static double now(void);

// poll_for polls cq for one completion for up to secs seconds: 1 or 0.
static int poll_for(struct ibv_cq *cq, struct ibv_wc *wc, double secs)
{
	double end = now() + secs;
	do {
		int n = ibv_poll_cq(cq, 1, wc);
		CHECK(n >= 0, "ibv_poll_cq: %d", n);
		if (n == 1)
			return 1;
		usleep(1000);
	} while (now() < end);
	return 0;
}

static void worker(int sender, int ready[2])
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct rdma_cm_event *ev;
	struct sockaddr_in src = { .sin_family = AF_INET }, dst = { .sin_family = AF_INET };
	struct ibv_comp_channel *cc = NULL;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	struct ibv_ah *ah;
	struct ibv_qp_init_attr qa, qinit;
	struct ibv_qp_attr qattr;
	struct ibv_wc wc;
	struct ibv_ah_attr group;
	uint32_t rqpn, rqkey;
	size_t slot = GRH + LEN;
	char *buf;
	int joinctx, got = 0, one = 1;
	uint8_t tos = 32;
	struct ibv_cq *cq2 = NULL;
	struct ibv_qp *qp2 = NULL;
	char *buf2 = NULL;
	struct ibv_mr *mr2 = NULL;

	role = sender ? "sender" : "receiver";
	close(ready[sender ? 1 : 0]);
	CHECK(!ibv_alloc_pd(pctx) && errno == EINVAL, "ibv_alloc_pd on the parent's context: errno %d, want EINVAL",
	      errno);
	CHECK(ch = rdma_create_event_channel(), "rdma_create_event_channel: %s", strerror(errno));
	CHECK(rdma_create_id(ch, &id, &joinctx, RDMA_PS_UDP) == 0, "rdma_create_id: %s", strerror(errno));
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos) == 0,
	      "rdma_set_option TOS: %s", strerror(errno));
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &one, sizeof one) == -1 && errno == EINVAL,
	      "rdma_set_option TOS of 4 bytes: errno %d, want EINVAL", errno);
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one) == 0,
	      "rdma_set_option REUSEADDR: %s", strerror(errno));
	inet_pton(AF_INET, "127.0.0.1", &src.sin_addr);
	inet_pton(AF_INET, GROUP, &dst.sin_addr);
	dst.sin_port = htons(5999);
	CHECK(rdma_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000) == 0,
	      "rdma_resolve_addr: %s", strerror(errno));
	ev = wait_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(ev->id == id, "the event's id is not the worker's");
	rdma_ack_cm_event(ev);
	CHECK(id->verbs, "no context on the resolved id");
	CHECK(rdma_get_dst_port(id) == htons(5999), "rdma_get_dst_port: %u, want 5999", ntohs(rdma_get_dst_port(id)));
	CHECK(rdma_get_src_port(id) == ((struct sockaddr_in *)rdma_get_local_addr(id))->sin_port,
	      "rdma_get_src_port: %u, the local address's %u", ntohs(rdma_get_src_port(id)),
	      ntohs(((struct sockaddr_in *)rdma_get_local_addr(id))->sin_port));
	__be16 pkey;
	CHECK(ibv_query_pkey(id->verbs, 1, 0, &pkey) == 0 && pkey == htobe16(0xffff), "ibv_query_pkey: %s, %#x",
	      strerror(errno), be16toh(pkey));
	// The CM's contexts (through the parent) hold the id's.
	int nd = 0, found = 0;
	struct ibv_context **dl = rdma_get_devices(&nd);
	CHECK(dl && nd >= 1, "rdma_get_devices: %s, %d", strerror(errno), nd);
	for (int i = 0; i < nd; i++)
		found |= dl[i] == id->verbs;
	CHECK(found && !dl[nd], "rdma_get_devices: the id's context is not among the %d", nd);
	rdma_free_devices(dl);
	// The device's GUID (through the parent) is the one ibv_query_device gives.
	struct ibv_device_attr da;
	CHECK(ibv_query_device(id->verbs, &da) == 0, "ibv_query_device: %s", strerror(errno));
	CHECK(ibv_get_device_guid(id->verbs->device) == da.node_guid && ibv_get_device_index(id->verbs->device) >= 0,
	      "ibv_get_device_guid %#llx (node_guid %#llx), index %d", (unsigned long long)ibv_get_device_guid(id->verbs->device),
	      (unsigned long long)da.node_guid, ibv_get_device_index(id->verbs->device));
	// The GID entry calls (through the parent too) agree with ibv_query_gid.
	union ibv_gid g0;
	struct ibv_gid_entry ge, tbl[64];
	CHECK(ibv_query_gid(id->verbs, 1, 0, &g0) == 0, "ibv_query_gid: %s", strerror(errno));
	int ge_err = ibv_query_gid_ex(id->verbs, 1, 0, &ge, 0);
	CHECK(ge_err == 0 && ge.gid_index == 0 && ge.port_num == 1 && !memcmp(&ge.gid, &g0, sizeof g0),
	      "ibv_query_gid_ex: %s, index %u port %u", strerror(ge_err), ge.gid_index, ge.port_num);
	ssize_t ng = ibv_query_gid_table(id->verbs, tbl, 64, 0);
	CHECK(ng >= 1 && !memcmp(&tbl[0], &ge, sizeof ge), "ibv_query_gid_table: %zd entries", ng);
	CHECK(pd = ibv_alloc_pd(id->verbs), "ibv_alloc_pd: %s", strerror(errno));
	if (!sender)
		CHECK(cc = ibv_create_comp_channel(id->verbs), "ibv_create_comp_channel: %s", strerror(errno));
	CHECK(cq = ibv_create_cq(id->verbs, 2 * nmsg, &joinctx, cc, 0), "ibv_create_cq: %s", strerror(errno));
	memset(&qa, 0, sizeof qa);
	qa.qp_type = IBV_QPT_UD;
	qa.send_cq = qa.recv_cq = cq;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = nmsg + 1;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.qp_context = &joinctx;
	CHECK(rdma_create_qp(id, pd, &qa) == 0, "rdma_create_qp: %s", strerror(errno));
	CHECK(id->qp && id->qp->qp_num, "no QP on the id");
	CHECK(buf = calloc(nmsg + 1, slot), "calloc");
	CHECK(mr = ibv_reg_mr(pd, buf, (nmsg + 1) * slot, IBV_ACCESS_LOCAL_WRITE), "ibv_reg_mr: %s", strerror(errno));
	if (!sender)
		for (int i = 0; i <= nmsg; i++) {
			struct ibv_sge sge = { (uintptr_t)(buf + i * slot), slot, mr->lkey };
			struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;
			CHECK(ibv_post_recv(id->qp, &wr, &bad) == 0, "ibv_post_recv: %s", strerror(errno));
		}
	CHECK(rdma_join_multicast(id, (struct sockaddr *)&dst, &joinctx) == 0, "rdma_join_multicast: %s",
	      strerror(errno));
	ev = wait_event(ch, RDMA_CM_EVENT_MULTICAST_JOIN);
	CHECK(ev->param.ud.private_data == &joinctx, "the join's event lacks the join's context");
	CHECK(ah = ibv_create_ah(pd, &ev->param.ud.ah_attr), "ibv_create_ah: %s", strerror(errno));
	rqpn = ev->param.ud.qp_num;
	rqkey = ev->param.ud.qkey;
	group = ev->param.ud.ah_attr;
	rdma_ack_cm_event(ev);

	memset(&qattr, 0, sizeof qattr);
	memset(&qinit, 0, sizeof qinit);
	CHECK(ibv_query_qp(id->qp, &qattr, IBV_QP_STATE | IBV_QP_QKEY | IBV_QP_CAP, &qinit) == 0, "ibv_query_qp: %s",
	      strerror(errno));
	CHECK(qattr.qp_state == IBV_QPS_RTS && qattr.qkey == rqkey && qinit.send_cq == cq && qinit.recv_cq == cq &&
		      qinit.qp_context == &joinctx && qinit.qp_type == IBV_QPT_UD && !qinit.srq &&
		      qattr.cap.max_recv_wr >= (uint32_t)nmsg + 1 && qinit.cap.max_send_wr >= (uint32_t)nmsg + 1,
	      "ibv_query_qp: state %d qkey %#x (want %#x) send_cq %p recv_cq %p (want %p) qp_context %p max_recv_wr %u",
	      qattr.qp_state, qattr.qkey, rqkey, (void *)qinit.send_cq, (void *)qinit.recv_cq, (void *)cq,
	      qinit.qp_context, qattr.cap.max_recv_wr);
	CHECK(id->qp->state == IBV_QPS_RTS, "the QP's state after ibv_query_qp: %d", id->qp->state);

	if (!sender) {
		// A second QP of the child's, attached to the group with the verbs.
		struct ibv_qp_init_attr qa2 = { .qp_type = IBV_QPT_UD, .cap = { 1, nmsg + 1, 1, 1 } };
		struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = id->port_num, .qkey = rqkey };
		CHECK(cq2 = ibv_create_cq(id->verbs, nmsg + 2, NULL, NULL, 0), "ibv_create_cq: %s", strerror(errno));
		qa2.send_cq = qa2.recv_cq = cq2;
		CHECK(qp2 = ibv_create_qp(pd, &qa2), "ibv_create_qp: %s", strerror(errno));
		CHECK(ibv_modify_qp(qp2, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0, "INIT");
		m.qp_state = IBV_QPS_RTR;
		CHECK(ibv_modify_qp(qp2, &m, IBV_QP_STATE) == 0, "RTR");
		m.qp_state = IBV_QPS_RTS;
		CHECK(ibv_modify_qp(qp2, &m, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "RTS");
		CHECK(buf2 = calloc(nmsg + 1, slot), "calloc");
		CHECK(mr2 = ibv_reg_mr(pd, buf2, (nmsg + 1) * slot, IBV_ACCESS_LOCAL_WRITE), "ibv_reg_mr: %s",
		      strerror(errno));
		for (int i = 0; i <= nmsg; i++) {
			struct ibv_sge sge = { (uintptr_t)(buf2 + i * slot), slot, mr2->lkey };
			struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;
			CHECK(ibv_post_recv(qp2, &wr, &bad) == 0, "ibv_post_recv: %s", strerror(errno));
		}
		CHECK(ibv_attach_mcast(qp2, &group.grh.dgid, group.dlid) == 0, "ibv_attach_mcast: %s", strerror(errno));
	}

	if (sender) {
		char c;
		CHECK(read(ready[0], &c, 1) == 1, "the receiver did not get ready");
		for (int i = 0; i < nmsg; i++) {
			char *m = buf + i * slot;
			struct ibv_sge sge = { (uintptr_t)m, LEN, mr->lkey };
			struct ibv_send_wr wr = { .wr_id = 1000 + i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
						  .send_flags = IBV_SEND_SIGNALED }, *bad;
			int n;
			snprintf(m, LEN, "msg %d", i);
			wr.wr.ud.ah = ah;
			wr.wr.ud.remote_qpn = rqpn;
			wr.wr.ud.remote_qkey = rqkey;
			CHECK(ibv_post_send(id->qp, &wr, &bad) == 0, "ibv_post_send: %s", strerror(errno));
			while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
				;
			CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)(1000 + i),
			      "send %d: poll %d status %s wr_id %llu", i, n, ibv_wc_status_str(wc.status),
			      (unsigned long long)wc.wr_id);
		}
		printf("sender: sent %d\n", nmsg);
		// One more once the receiver detached its second QP.
		CHECK(read(ready[0], &c, 1) == 1 && c == 'd', "the receiver did not detach");
		{
			char *m = buf + nmsg * slot;
			struct ibv_sge sge = { (uintptr_t)m, LEN, mr->lkey };
			struct ibv_send_wr wr = { .wr_id = 1000 + nmsg, .sg_list = &sge, .num_sge = 1,
						  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
			int n;
			snprintf(m, LEN, "msg %d", nmsg);
			wr.wr.ud.ah = ah;
			wr.wr.ud.remote_qpn = rqpn;
			wr.wr.ud.remote_qkey = rqkey;
			CHECK(ibv_post_send(id->qp, &wr, &bad) == 0, "ibv_post_send: %s", strerror(errno));
			while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
				;
			CHECK(n == 1 && wc.status == IBV_WC_SUCCESS, "the last send: %s", ibv_wc_status_str(wc.status));
		}
	} else {
		CHECK(write(ready[1], "r", 1) == 1, "write");
		while (got < nmsg) {
			struct ibv_cq *ecq;
			void *ectx;
			int n;
			CHECK(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq");
			while ((n = ibv_poll_cq(cq, 1, &wc)) == 1) {
				char want[LEN];
				CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV, "receive: %s",
				      ibv_wc_status_str(wc.status));
				CHECK(wc.wr_id == (uint64_t)got, "receive %d has wr_id %llu", got, (unsigned long long)wc.wr_id);
				CHECK(wc.byte_len == GRH + LEN, "receive %d: %u bytes", got, wc.byte_len);
				snprintf(want, sizeof want, "msg %d", got);
				CHECK(!strcmp(buf + got * slot + GRH, want), "receive %d: %.20s, want %s", got,
				      buf + got * slot + GRH, want);
				got++;
			}
			CHECK(n == 0, "ibv_poll_cq: %d", n);
			if (got == nmsg)
				break;
			CHECK(ibv_get_cq_event(cc, &ecq, &ectx) == 0 && ecq == cq && ectx == &joinctx,
			      "ibv_get_cq_event: %s", strerror(errno));
			ibv_ack_cq_events(cq, 1);
		}
		printf("receiver: received %d in order\n", got);
		// The attached QP got them all too.
		for (int i = 0; i < nmsg;) {
			char want[LEN];
			int n = poll_for(cq2, &wc, 5);
			CHECK(n == 1, "the attached QP received %d of %d", i, nmsg);
			CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)i && wc.byte_len == GRH + LEN,
			      "attached QP: receive %d: %s wr_id %llu", i, ibv_wc_status_str(wc.status),
			      (unsigned long long)wc.wr_id);
			snprintf(want, sizeof want, "msg %d", i);
			CHECK(!strcmp(buf2 + i * slot + GRH, want), "attached QP: receive %d: %.20s", i, buf2 + i * slot + GRH);
			i++;
		}
		printf("receiver: the attached QP received %d\n", nmsg);
		CHECK(ibv_detach_mcast(qp2, &group.grh.dgid, group.dlid) == 0, "ibv_detach_mcast: %s", strerror(errno));
		CHECK(write(ready[1], "d", 1) == 1, "write");
		CHECK(poll_for(cq, &wc, 5) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)nmsg,
		      "the message after the detach did not reach the id's QP");
		CHECK(poll_for(cq2, &wc, 0.3) == 0, "the detached QP received a message (wr_id %llu)",
		      (unsigned long long)wc.wr_id);
		printf("receiver: the detached QP received nothing more\n");
		CHECK(ibv_destroy_qp(qp2) == 0, "ibv_destroy_qp: %s", strerror(errno));
		CHECK(ibv_dereg_mr(mr2) == 0 && ibv_destroy_cq(cq2) == 0, "ibv_dereg_mr, ibv_destroy_cq");
		free(buf2);
	}
	fflush(stdout);
	CHECK(rdma_leave_multicast(id, (struct sockaddr *)&dst) == 0, "rdma_leave_multicast: %s", strerror(errno));
	CHECK(ibv_destroy_ah(ah) == 0, "ibv_destroy_ah");
	rdma_destroy_qp(id);
	CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
	if (cc)
		CHECK(ibv_destroy_comp_channel(cc) == 0, "ibv_destroy_comp_channel");
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd: %s", strerror(errno));
	CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id: %s", strerror(errno));
	rdma_destroy_event_channel(ch);
	exit(0);
}

// resolved makes an id on a channel of its own and resolves 127.0.0.1 to
// GROUP; it returns the id.
static struct rdma_cm_id *resolved(struct rdma_event_channel **chp)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct sockaddr_in src = { .sin_family = AF_INET }, dst = { .sin_family = AF_INET };
	CHECK(ch = rdma_create_event_channel(), "rdma_create_event_channel: %s", strerror(errno));
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_UDP) == 0, "rdma_create_id: %s", strerror(errno));
	inet_pton(AF_INET, "127.0.0.1", &src.sin_addr);
	inet_pton(AF_INET, GROUP, &dst.sin_addr);
	CHECK(rdma_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000) == 0,
	      "rdma_resolve_addr: %s", strerror(errno));
	rdma_ack_cm_event(wait_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(id->verbs, "no context on the resolved id");
	*chp = ch;
	return id;
}

static int family(void)
{
	int up[2], gone[2], st;
	pid_t pid;
	CHECK(pipe(up) == 0 && pipe(gone) == 0, "pipe");
	pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		struct rdma_event_channel *ch, *gch;
		struct rdma_cm_id *id, *gid;
		char c;
		role = "child";
		close(up[0]);
		close(gone[1]);
		id = resolved(&ch);
		pid = fork();
		CHECK(pid >= 0, "fork: %s", strerror(errno));
		if (pid == 0) {
			role = "grandchild";
			CHECK(rdma_resolve_route(id, 1000) == -1 && errno == EINVAL,
			      "rdma_resolve_route on the child's id: errno %d, want EINVAL", errno);
			gid = resolved(&gch);
			CHECK(rdma_destroy_id(gid) == 0, "rdma_destroy_id: %s", strerror(errno));
			rdma_destroy_event_channel(gch);
			printf("grandchild: an id of its own resolved\n");
			exit(0);
		}
		CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the grandchild: status %#x",
		      st);
		CHECK(write(up[1], "u", 1) == 1, "write");
		CHECK(read(gone[0], &c, 1) == 0, "the parent did not exit");
		errno = 0;
		CHECK(rdma_destroy_id(id) == -1 && errno == EIO, "rdma_destroy_id after the parent exited: errno %d, want EIO",
		      errno);
		errno = 0;
		CHECK(!rdma_create_event_channel() && errno == EIO,
		      "rdma_create_event_channel after the parent exited: errno %d, want EIO", errno);
		printf("orphan: EIO after the parent exited\n");
		exit(0);
	}
	close(up[1]);
	close(gone[0]);
	char c;
	CHECK(read(up[0], &c, 1) == 1, "the child failed");
	printf("parent: exits before its child\n");
	return 0;
}

static void exits_child(int k)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id = resolved(&ch);
	struct rdma_cm_event *ev;
	struct sockaddr_in dst = { .sin_family = AF_INET };
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	struct ibv_qp_init_attr qa = { .qp_type = IBV_QPT_UD, .cap = { 4, 4, 1, 1 } };
	static char buf[4096];
	role = "exits child";
	inet_pton(AF_INET, GROUP, &dst.sin_addr);
	CHECK(pd = ibv_alloc_pd(id->verbs), "ibv_alloc_pd: %s", strerror(errno));
	CHECK(cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0), "ibv_create_cq: %s", strerror(errno));
	qa.send_cq = qa.recv_cq = cq;
	CHECK(rdma_create_qp(id, pd, &qa) == 0, "rdma_create_qp: %s", strerror(errno));
	CHECK(mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE), "ibv_reg_mr: %s", strerror(errno));
	struct ibv_sge sge = { (uintptr_t)buf, sizeof buf, mr->lkey };
	struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(id->qp, &wr, &bad) == 0, "ibv_post_recv: %s", strerror(errno));
	CHECK(rdma_join_multicast(id, (struct sockaddr *)&dst, NULL) == 0, "rdma_join_multicast: %s", strerror(errno));
	ev = wait_event(ch, RDMA_CM_EVENT_MULTICAST_JOIN);
	if (k % 2) {
		rdma_ack_cm_event(ev);
		CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id: %s", strerror(errno));
	}
	_exit(0);
}

static int exits(void)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct sockaddr_in dst = { .sin_family = AF_INET };
	struct ibv_qp_init_attr qa = { .qp_type = IBV_QPT_UD, .cap = { 4, 4, 1, 1 } };
	struct ibv_cq *cq;
	int st;
	for (int k = 0; k < 10; k++) {
		pid_t pid = fork();
		CHECK(pid >= 0, "fork: %s", strerror(errno));
		if (pid == 0)
			exits_child(k);
		CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d: status %#x", k, st);
	}
	id = resolved(&ch);
	inet_pton(AF_INET, GROUP, &dst.sin_addr);
	CHECK(cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0), "ibv_create_cq: %s", strerror(errno));
	qa.send_cq = qa.recv_cq = cq;
	CHECK(rdma_create_qp(id, NULL, &qa) == 0, "rdma_create_qp: %s", strerror(errno));
	CHECK(rdma_join_multicast(id, (struct sockaddr *)&dst, NULL) == 0, "rdma_join_multicast: %s", strerror(errno));
	rdma_ack_cm_event(wait_event(ch, RDMA_CM_EVENT_MULTICAST_JOIN));
	printf("exits: ok\n");
	return 0;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

// measure prints the time per call of ibv_query_port and of an empty
// ibv_poll_cq on ctx, n each.
static void measure(struct ibv_context *ctx, int n)
{
	struct ibv_port_attr pa;
	struct ibv_wc wc;
	struct ibv_cq *cq;
	double t;
	CHECK(cq = ibv_create_cq(ctx, 16, NULL, NULL, 0), "ibv_create_cq: %s", strerror(errno));
	t = now();
	for (int i = 0; i < n; i++)
		CHECK(ibv_query_port(ctx, 1, &pa) == 0, "ibv_query_port: %s", strerror(errno));
	printf("%s: ibv_query_port %.1f us/call\n", role, (now() - t) / n * 1e6);
	t = now();
	for (int i = 0; i < n; i++)
		CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "ibv_poll_cq");
	printf("%s: empty ibv_poll_cq %.2f us/call\n", role, (now() - t) / n * 1e6);
	fflush(stdout);
	ibv_destroy_cq(cq);
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_device_attr da;
	int n, ready[2], st, lat = argc > 1 && !strcmp(argv[1], "lat");
	pid_t pids[2];

	alarm(60);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc > 1 + lat)
		nmsg = atoi(argv[1 + lat]);
	CHECK(list = ibv_get_device_list(&n), "ibv_get_device_list: %s", strerror(errno));
	CHECK(n > 0, "no devices");
	CHECK(pctx = ibv_open_device(list[0]), "ibv_open_device: %s", strerror(errno));
	if (argc > 1 && !strcmp(argv[1], "family"))
		return family();
	if (argc > 1 && !strcmp(argv[1], "exits"))
		return exits();
	if (lat) {
		pid_t pid;
		measure(pctx, nmsg);
		pid = fork();
		CHECK(pid >= 0, "fork: %s", strerror(errno));
		if (pid == 0) {
			struct ibv_context *c;
			role = "child";
			CHECK(c = ibv_open_device(list[0]), "child: ibv_open_device: %s", strerror(errno));
			measure(c, nmsg);
			ibv_close_device(c);
			exit(0);
		}
		CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed: %#x", st);
		ibv_close_device(pctx);
		printf("ok\n");
		return 0;
	}
	CHECK(pipe(ready) == 0, "pipe");
	for (int i = 0; i < 2; i++) {
		pids[i] = fork();
		CHECK(pids[i] >= 0, "fork: %s", strerror(errno));
		if (pids[i] == 0)
			worker(i == 1, ready);
	}
	close(ready[0]);
	close(ready[1]);
	for (int i = 0; i < 2; i++) {
		CHECK(waitpid(pids[i], &st, 0) == pids[i], "waitpid: %s", strerror(errno));
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the %s exited with status %#x", i ? "sender" : "receiver",
		      st);
	}
	CHECK(ibv_query_device(pctx, &da) == 0, "ibv_query_device after the workers: %s", strerror(errno));
	CHECK(ibv_close_device(pctx) == 0, "ibv_close_device");
	ibv_free_device_list(list);
	printf("ok\n");
	return 0;
}
