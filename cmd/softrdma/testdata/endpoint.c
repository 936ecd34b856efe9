// endpoint: rdma_create_ep/rdma_destroy_ep, rdma_init_qp_attr and the
// port of the id's device, as a C program sees them (TestExecEndpoint runs
// it through softrdma exec on RoCEv2 over lo and on the emulated IB
// subnet). Usage: endpoint roce|ib ADDR. Prints "ok NAME" per check,
// "FAIL NAME: ..." for a wrong one, "PASSED" at the end if none failed.
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

static int failed;

static void check(const char *name, int cond, int err)
{
	if (cond) {
		printf("ok %s\n", name);
	} else {
		printf("FAIL %s: errno %d (%s)\n", name, err, strerror(err));
		failed = 1;
	}
	fflush(stdout);
}

#define UD_MASK (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	int ib = strcmp(argv[1], "ib") == 0;
	const char *addr = argv[2];
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_UDP }, *res = NULL;
	int r = rdma_getaddrinfo(addr, NULL, &hints, &res);
	check("rdma_getaddrinfo passive", r == 0 && res && res->ai_qp_type == IBV_QPT_UD, errno);
	if (r)
		return 1;

	errno = 0;
	check("rdma_create_ep NULL res", rdma_create_ep(&(struct rdma_cm_id *){0}, NULL, NULL, NULL) == -1 && errno == EINVAL, errno);

	// A passive endpoint: bound to ADDR, its device and port known.
	struct rdma_cm_id *id = NULL;
	r = rdma_create_ep(&id, res, NULL, NULL);
	check("rdma_create_ep passive", r == 0 && id && id->verbs && id->port_num == 1 && !id->qp && !id->channel, errno);
	if (r)
		return 1;
	struct ibv_port_attr pa;
	r = ibv_query_port(id->verbs, id->port_num, &pa);
	check("ibv_query_port", r == 0 && pa.state == IBV_PORT_ACTIVE, r);
	if (ib) {
		check("IB port: link layer, LID, SM LID, P_Key table",
		      pa.link_layer == IBV_LINK_LAYER_INFINIBAND && pa.lid != 0 && pa.lid < 0xc000 && pa.sm_lid != 0 &&
			      pa.pkey_tbl_len >= 1 && !(pa.port_cap_flags & IBV_PORT_IP_BASED_GIDS), 0);
		printf("lid 0x%x sm_lid 0x%x\n", pa.lid, pa.sm_lid);
	} else {
		check("RoCE port: link layer, no LID", pa.link_layer == IBV_LINK_LAYER_ETHERNET && pa.lid == 0, 0);
	}
	union ibv_gid gid;
	r = ibv_query_gid(id->verbs, id->port_num, 0, &gid);
	if (ib) // the port GID: the subnet prefix fe80::/64 and the port GUID
		check("ibv_query_gid 0: fe80::GUID", r == 0 && gid.raw[0] == 0xfe && gid.raw[1] == 0x80 && gid.global.interface_id != 0, r);
	else
		check("ibv_query_gid 0: ::ffff:ADDR", r == 0 && gid.raw[10] == 0xff && gid.raw[11] == 0xff, r);
	__be16 pkey = 0;
	r = ibv_query_pkey(id->verbs, id->port_num, 0, &pkey);
	check("ibv_query_pkey 0", r == 0 && pkey == htons(0xffff), r);

	struct ibv_qp_attr qa;
	int mask = 0;
	memset(&qa, 0xa5, sizeof qa);
	qa.qp_state = IBV_QPS_INIT;
	r = rdma_init_qp_attr(id, &qa, &mask);
	check("rdma_init_qp_attr INIT", r == 0 && mask == UD_MASK && qa.qp_state == IBV_QPS_INIT && qa.pkey_index == 0 &&
					      qa.port_num == id->port_num && qa.qkey == RDMA_UDP_QKEY && qa.sq_psn == 0,
	      errno);
	qa.qp_state = IBV_QPS_RTR;
	r = rdma_init_qp_attr(id, &qa, &mask);
	check("rdma_init_qp_attr RTR", r == 0 && mask == UD_MASK && qa.qp_state == IBV_QPS_RTR, errno);
	errno = 0;
	check("rdma_init_qp_attr NULL mask", rdma_init_qp_attr(id, &qa, NULL) == -1 && errno == EINVAL, errno);

	// A QP made with the id's attributes, as a program that does not use
	// rdma_create_qp does.
	struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
	struct ibv_cq *cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = pd && cq ? ibv_create_qp(pd, &ia) : NULL;
	check("ibv_create_qp", qp != NULL, errno);
	if (qp) {
		qa.qp_state = IBV_QPS_INIT;
		r = rdma_init_qp_attr(id, &qa, &mask);
		r = r ? errno : ibv_modify_qp(qp, &qa, mask);
		check("ibv_modify_qp INIT with rdma_init_qp_attr's", r == 0 && qp->state == IBV_QPS_INIT, r);
		struct ibv_qp_init_attr qi;
		r = ibv_query_qp(qp, &qa, IBV_QP_QKEY | IBV_QP_PORT, &qi);
		check("ibv_query_qp: its Q_Key and port", r == 0 && qa.qkey == RDMA_UDP_QKEY && qa.port_num == id->port_num, r);
		ibv_destroy_qp(qp);
	}
	if (cq)
		ibv_destroy_cq(cq);
	if (pd)
		ibv_dealloc_pd(pd);

	// rdma_create_qp on the passive endpoint: the id's PD, the QP in RTS.
	struct ibv_qp_init_attr qia = { .qp_type = IBV_QPT_UD,
					.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	r = rdma_create_qp(id, NULL, &qia);
	check("rdma_create_qp on the endpoint", r == 0 && id->qp && id->qp->state == IBV_QPS_RTS && id->send_cq && id->recv_cq, errno);
	rdma_destroy_ep(id); // its QP, then the id
	check("rdma_destroy_ep", 1, 0);

	// An active endpoint to ADDR itself: address and route resolved, the
	// QP made (qp_type set from res), in RTS.
	struct rdma_addrinfo ahints = { .ai_port_space = RDMA_PS_UDP }, *ares = NULL;
	r = rdma_getaddrinfo(addr, "7471", &ahints, &ares);
	check("rdma_getaddrinfo active", r == 0 && ares && ares->ai_dst_addr, errno);
	if (r == 0) {
		struct ibv_qp_init_attr aia = { .qp_type = IBV_QPT_RC, // rdma_create_ep sets res's
						.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 } };
		struct rdma_cm_id *aid = NULL;
		r = rdma_create_ep(&aid, ares, NULL, &aia);
		check("rdma_create_ep active with a QP", r == 0 && aid && aid->verbs && aid->qp && aid->qp->qp_type == IBV_QPT_UD &&
								 aia.qp_type == IBV_QPT_UD && aid->qp->state == IBV_QPS_RTS,
		      errno);
		if (r == 0) {
			struct sockaddr_in *dst = (struct sockaddr_in *)rdma_get_peer_addr(aid);
			check("the endpoint's destination", dst->sin_family == AF_INET && ntohs(dst->sin_port) == 7471, 0);
			rdma_destroy_ep(aid);
		}
		rdma_freeaddrinfo(ares);
	}

	// RDMA_PS_IPOIB: the Q_Key of the port's IPoIB broadcast group, which
	// only an IB port has (an RDMA_PS_IPOIB id cannot bind a RoCE address).
	struct rdma_cm_id *pid = NULL;
	r = rdma_create_id(NULL, &pid, NULL, RDMA_PS_IPOIB);
	check("rdma_create_id RDMA_PS_IPOIB", r == 0, errno);
	if (r == 0) {
		errno = 0;
		check("rdma_init_qp_attr unbound", rdma_init_qp_attr(pid, &qa, &mask) == -1 && errno == EINVAL, errno);
		errno = 0;
		r = rdma_bind_addr(pid, res->ai_src_addr);
		if (ib) {
			check("rdma_bind_addr RDMA_PS_IPOIB", r == 0, errno);
			qa.qp_state = IBV_QPS_INIT;
			r = rdma_init_qp_attr(pid, &qa, &mask);
			check("rdma_init_qp_attr RDMA_PS_IPOIB: the broadcast group's Q_Key",
			      r == 0 && mask == UD_MASK && qa.qkey != 0 && qa.qkey != RDMA_UDP_QKEY, errno);
			printf("ipoib qkey 0x%x\n", qa.qkey);
		} else {
			check("rdma_bind_addr RDMA_PS_IPOIB on RoCE", r == -1 && errno == EINVAL, errno);
		}
		rdma_destroy_id(pid);
	}
	rdma_freeaddrinfo(res);
	if (failed)
		return 1;
	printf("PASSED\n");
	return 0;
}
