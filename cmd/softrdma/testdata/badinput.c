// badinput: calls libibverbs and librdmacm with NULL, freed or wrong
// objects, sizes and attributes and checks the errno rdma-core gives
// (TestExecBadInput runs it through softrdma exec). Prints "ok NAME" per
// check, "FAIL NAME: ..." for a wrong one, and exits 1 if any failed.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
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

int main(void)
{
	int n = 0, r;
	struct ibv_device **devs = ibv_get_device_list(&n);
	check("ibv_get_device_list", devs && n > 0, errno);
	if (!devs || n == 0)
		return 1;
	struct ibv_context *ctx = ibv_open_device(devs[0]);
	check("ibv_open_device", ctx != NULL, errno);
	if (!ctx)
		return 1;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	check("setup", pd && cq, errno);

	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	errno = 0;
	check("ibv_create_qp NULL pd", ibv_create_qp(NULL, &ia) == NULL && errno == EINVAL, errno);
	errno = 0;
	check("ibv_create_qp NULL attr", ibv_create_qp(pd, NULL) == NULL && errno == EINVAL, errno);
	ia.qp_type = IBV_QPT_RC;
	errno = 0;
	check("ibv_create_qp RC", ibv_create_qp(pd, &ia) == NULL && errno == EOPNOTSUPP, errno);
	ia.qp_type = IBV_QPT_UD;
	ia.cap.max_send_wr = 1u << 31;
	errno = 0;
	check("ibv_create_qp huge cap", ibv_create_qp(pd, &ia) == NULL && errno == EINVAL, errno);
	ia.cap.max_send_wr = 4;
	struct ibv_qp_init_attr_ex iax = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD, .cap = ia.cap,
					   .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_MAX_TSO_HEADER, .pd = pd };
	errno = 0;
	check("ibv_create_qp_ex unsupported comp_mask", ibv_create_qp_ex(ctx, &iax) == NULL && errno == EOPNOTSUPP, errno);

	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	check("ibv_create_qp UD", qp != NULL && qp->qp_type == IBV_QPT_UD && qp->state == IBV_QPS_RESET, errno);
	if (!qp)
		return 1;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111 };
	r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY | IBV_QP_AV);
	check("ibv_modify_qp unsupported attribute (AV on UD)", r == EINVAL, r);
	r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_QKEY);
	check("ibv_modify_qp missing PKEY_INDEX", r == EINVAL, r);
	a.qp_state = IBV_QPS_RTS;
	r = ibv_modify_qp(qp, &a, IBV_QP_STATE);
	check("ibv_modify_qp RESET->RTS", r == EINVAL, r);
	a.qp_state = IBV_QPS_INIT;
	r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
	check("ibv_modify_qp RESET->INIT", r == 0 && qp->state == IBV_QPS_INIT, r);
	r = ibv_modify_qp(qp, NULL, IBV_QP_STATE);
	check("ibv_modify_qp NULL attr", r == EINVAL, r);
	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	r = ibv_query_qp(qp, &q, IBV_QP_STATE, &qi);
	check("ibv_query_qp", r == 0 && q.qp_state == IBV_QPS_INIT && q.qkey == 0x11111111 && qi.send_cq == cq, r);

	struct ibv_wc wc = { .wc_flags = IBV_WC_GRH };
	struct ibv_ah_attr aha;
	errno = 0;
	r = ibv_init_ah_from_wc(ctx, 1, &wc, NULL, &aha);
	check("ibv_init_ah_from_wc GRH flag without grh", r == -1 && errno == EINVAL, errno);
	errno = 0;
	check("ibv_create_ah_from_wc NULL wc", ibv_create_ah_from_wc(pd, NULL, NULL, 1) == NULL && errno == EINVAL, errno);

	r = ibv_destroy_qp(qp);
	check("ibv_destroy_qp", r == 0, r);
	r = ibv_destroy_qp(qp); // freed: a stale handle, not a crash
	check("ibv_destroy_qp freed", r == EINVAL, r);
	r = ibv_destroy_qp(NULL);
	check("ibv_destroy_qp NULL", r == EINVAL, r);
	r = ibv_dealloc_pd(NULL);
	check("ibv_dealloc_pd NULL", r == EINVAL, r);

	struct ibv_async_event ev;
	fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK);
	errno = 0;
	r = ibv_get_async_event(ctx, &ev);
	check("ibv_get_async_event O_NONBLOCK, no event", r == -1 && errno == EAGAIN, errno);

	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = NULL;
	check("rdma_create_id", ch && rdma_create_id(ch, &id, NULL, RDMA_PS_UDP) == 0, errno);
	if (!id)
		return 1;
	uint8_t tos = 8;
	int big = 8;
	errno = 0;
	check("rdma_set_option wrong size", rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &big, sizeof big) == -1 && errno == EINVAL, errno);
	errno = 0;
	check("rdma_set_option unknown level", rdma_set_option(id, 99, 0, &tos, 1) == -1 && errno == ENOSYS, errno);
	check("rdma_set_option TOS", rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1) == 0, errno);
	errno = 0;
	check("rdma_migrate_id NULL id", rdma_migrate_id(NULL, ch) == -1 && errno == EINVAL, errno);
	struct rdma_event_channel *ch2 = rdma_create_event_channel();
	check("rdma_migrate_id", rdma_migrate_id(id, ch2) == 0 && id->channel == ch2, errno);
	int nd = 0;
	struct ibv_context **list = rdma_get_devices(&nd);
	check("rdma_get_devices", list && nd > 0 && list[nd] == NULL, errno);
	rdma_free_devices(list);
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001) };
	check("rdma_bind_addr", rdma_bind_addr(id, (struct sockaddr *)&sin) == 0, errno);
	check("rdma_get_local_addr", rdma_get_local_addr(id)->sa_family == AF_INET &&
	      ((struct sockaddr_in *)rdma_get_local_addr(id))->sin_addr.s_addr == htonl(0x7f000001), errno);
	check("rdma_destroy_id", rdma_destroy_id(id) == 0, errno);
	rdma_destroy_event_channel(ch);
	rdma_destroy_event_channel(ch2);

	check("ibv_destroy_cq", ibv_destroy_cq(cq) == 0, errno);
	check("ibv_dealloc_pd", ibv_dealloc_pd(pd) == 0, errno);
	check("ibv_close_device", ibv_close_device(ctx) == 0, errno);
	ibv_free_device_list(devs);
	printf("%s\n", failed ? "FAILED" : "PASSED");
	return failed;
}
