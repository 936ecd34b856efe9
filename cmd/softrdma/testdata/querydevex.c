// querydevex.c: ibv_query_device_ex through softrdma's libibverbs.
//
// querydevex: for every device, ibv_query_device_ex must succeed, give in
// orig_attr what ibv_query_device gives, and give phys_port_cnt_ex equal
// to phys_port_cnt (as rdma-core's providers do, through
// ibv_cmd_query_device_any), and device_cap_flags_ex's low 32 bits equal
// to device_cap_flags. Prints "DEVICE phys_port_cnt=N phys_port_cnt_ex=M"
// for each and "ok" at the end; exits 0 when every check held.
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <infiniband/verbs.h>

int main(void)
{
	struct ibv_device **list;
	int n, bad = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	list = ibv_get_device_list(&n);
	if (!list) {
		perror("ibv_get_device_list");
		return 1;
	}
	if (n == 0) {
		fprintf(stderr, "no devices\n");
		return 1;
	}
	for (int i = 0; i < n; i++) {
		const char *name = ibv_get_device_name(list[i]);
		struct ibv_context *ctx = ibv_open_device(list[i]);
		struct ibv_device_attr a;
		struct ibv_device_attr_ex ax;
		int r;
		if (!ctx) {
			fprintf(stderr, "%s: ibv_open_device: %s\n", name, strerror(errno));
			return 1;
		}
		if (ibv_query_device(ctx, &a)) {
			fprintf(stderr, "%s: ibv_query_device: %s\n", name, strerror(errno));
			return 1;
		}
		memset(&ax, 0xa5, sizeof ax);
		if ((r = ibv_query_device_ex(ctx, NULL, &ax))) {
			fprintf(stderr, "%s: ibv_query_device_ex: %s\n", name, strerror(r));
			return 1;
		}
		printf("%s phys_port_cnt=%u phys_port_cnt_ex=%u\n", name, a.phys_port_cnt, ax.phys_port_cnt_ex);
		if (a.phys_port_cnt == 0 || ax.phys_port_cnt_ex != a.phys_port_cnt) {
			fprintf(stderr, "%s: phys_port_cnt_ex %u, phys_port_cnt %u\n", name, ax.phys_port_cnt_ex,
				a.phys_port_cnt);
			bad = 1;
		}
		if (memcmp(&ax.orig_attr, &a, sizeof a)) {
			fprintf(stderr, "%s: orig_attr differs from ibv_query_device's attributes\n", name);
			bad = 1;
		}
		if ((uint32_t)ax.device_cap_flags_ex != (uint32_t)a.device_cap_flags) {
			fprintf(stderr, "%s: device_cap_flags_ex %#llx, device_cap_flags %#x\n", name,
				(unsigned long long)ax.device_cap_flags_ex, a.device_cap_flags);
			bad = 1;
		}
		{
			// A comp_mask the library does not know: EINVAL.
			struct ibv_query_device_ex_input in = { .comp_mask = 1 };
			if ((r = ibv_query_device_ex(ctx, &in, &ax)) != EINVAL) {
				fprintf(stderr, "%s: ibv_query_device_ex with comp_mask 1: %s, want EINVAL\n", name,
					strerror(r));
				bad = 1;
			}
		}
		ibv_close_device(ctx);
	}
	ibv_free_device_list(list);
	if (bad)
		return 1;
	printf("ok\n");
	return 0;
}
