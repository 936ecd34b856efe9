//go:build capi

// sidr.c: librdmacm's UD connection calls (rdma_listen, rdma_connect,
// rdma_accept, rdma_reject) over rdmacm's SIDR (sidr.go). A connected
// port space (RDMA_PS_TCP) fails with EOPNOTSUPP, as the stubs did.

#include <errno.h>
#include "capi.h"
#include "_cgo_export.h"

#define SR_CHECK(name) \
	_Static_assert(__builtin_types_compatible_p(__typeof__(name), __typeof__(softrdma_##name)), #name " differs from the header")
#define SR_RET(e) do { if (e) { errno = (e); return -1; } return 0; } while (0)

int softrdma_rdma_listen(struct rdma_cm_id *id, int backlog)
{
	int e = id ? srListen(id, backlog) : EINVAL;
	SR_RET(e);
}
SR_CHECK(rdma_listen);

int softrdma_rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	int e = id ? srConnect(id, conn_param) : EINVAL;
	SR_RET(e);
}
SR_CHECK(rdma_connect);

int softrdma_rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	int e = id ? srAccept(id, conn_param) : EINVAL;
	SR_RET(e);
}
SR_CHECK(rdma_accept);

int softrdma_rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	int e = id ? srReject(id, (void *)private_data, private_data_len) : EINVAL;
	SR_RET(e);
}
SR_CHECK(rdma_reject);
