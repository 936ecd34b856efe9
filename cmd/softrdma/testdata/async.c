// async.c: asynchronous events through softrdma's libibverbs.
//
// async DEVICE: opens DEVICE, checks that ibv_get_async_event fails with
// EAGAIN on a quiet device once async_fd is O_NONBLOCK, prints "opened",
// then polls async_fd (30 s at most) until ibv_get_async_event returns
// IBV_EVENT_GID_CHANGE of port 1 (the test adds an address to the
// device's interface), acks it, prints "event: <type>" and closes the
// device. Exits 0 when all of that worked.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	struct ibv_async_event ev;
	int n, flags, got = 0;
	long long deadline;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 2) {
		fprintf(stderr, "usage: async DEVICE\n");
		return 2;
	}
	list = ibv_get_device_list(&n);
	if (!list) {
		perror("ibv_get_device_list");
		return 1;
	}
	for (int i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!ctx) {
		fprintf(stderr, "no device %s or ibv_open_device failed: %s\n", argv[1], strerror(errno));
		return 1;
	}
	flags = fcntl(ctx->async_fd, F_GETFL);
	if (flags < 0 || fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
		perror("fcntl async_fd");
		return 1;
	}
	errno = 0;
	if (ibv_get_async_event(ctx, &ev) == 0 || errno != EAGAIN) {
		fprintf(stderr, "ibv_get_async_event on a quiet device: want EAGAIN, got %s\n", strerror(errno));
		return 1;
	}
	printf("opened\n");

	deadline = now_ms() + 30000;
	while (!got) {
		struct pollfd pfd = { .fd = ctx->async_fd, .events = POLLIN };
		long long left = deadline - now_ms();
		int r;
		if (left <= 0) {
			fprintf(stderr, "no IBV_EVENT_GID_CHANGE within 30 s\n");
			return 1;
		}
		r = poll(&pfd, 1, (int)left);
		if (r < 0 && errno != EINTR) {
			perror("poll");
			return 1;
		}
		if (r <= 0)
			continue;
		if (ibv_get_async_event(ctx, &ev)) {
			fprintf(stderr, "ibv_get_async_event after poll: %s\n", strerror(errno));
			return 1;
		}
		printf("event: %s port %d\n", ibv_event_type_str(ev.event_type), ev.element.port_num);
		if (ev.event_type == IBV_EVENT_GID_CHANGE) {
			if (ev.element.port_num != 1) {
				fprintf(stderr, "GID change of port %d, want 1\n", ev.element.port_num);
				return 1;
			}
			got = 1;
		}
		ibv_ack_async_event(&ev);
	}
	if (ibv_close_device(ctx)) {
		perror("ibv_close_device");
		return 1;
	}
	printf("closed\n");
	return 0;
}
