// portevents.c: a RoCEv2 port's link going down and up through
// softrdma's libibverbs.
//
// portevents DEVICE: opens DEVICE and prints "opened"; then, twice, waits
// (30 s at most each, blocking in ibv_get_async_event) for
// IBV_EVENT_PORT_ERR and prints "port down N", then for
// IBV_EVENT_PORT_ACTIVE and prints "port active N" (N the round; the test sets the
// device's interface down and up in between). Other events (the GID
// table changes as the interface's link-local address comes and goes)
// are acked and skipped. After each event ibv_query_port must report the
// matching state. Exits 0 when all of that worked.
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <infiniband/verbs.h>

static struct ibv_context *ctx;

// wait_for reads events until one of type want, checks the port's state
// and prints line.
static int wait_for(enum ibv_event_type want, enum ibv_port_state state, const char *line, int round)
{
	for (;;) {
		struct pollfd pfd = { .fd = ctx->async_fd, .events = POLLIN };
		struct ibv_async_event ev;
		struct ibv_port_attr pa;
		int r = poll(&pfd, 1, 30000);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			fprintf(stderr, "no %s within 30 s\n", ibv_event_type_str(want));
			return 1;
		}
		// async_fd is blocking: ibv_get_async_event waits (it does not
		// here, poll said an event is queued).
		if (ibv_get_async_event(ctx, &ev)) {
			fprintf(stderr, "ibv_get_async_event: %s\n", strerror(errno));
			return 1;
		}
		printf("event: %s port %d\n", ibv_event_type_str(ev.event_type), ev.element.port_num);
		ibv_ack_async_event(&ev);
		if (ev.element.port_num != 1) {
			fprintf(stderr, "event of port %d, want 1\n", ev.element.port_num);
			return 1;
		}
		if (ev.event_type == IBV_EVENT_GID_CHANGE)
			continue;
		if (ev.event_type != want) {
			fprintf(stderr, "event %s, want %s\n", ibv_event_type_str(ev.event_type), ibv_event_type_str(want));
			return 1;
		}
		if (ibv_query_port(ctx, 1, &pa)) {
			perror("ibv_query_port");
			return 1;
		}
		if (pa.state != state) {
			fprintf(stderr, "after %s: port state %s, want %s\n", ibv_event_type_str(want),
				ibv_port_state_str(pa.state), ibv_port_state_str(state));
			return 1;
		}
		printf("%s %d\n", line, round);
		return 0;
	}
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	int n;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 2) {
		fprintf(stderr, "usage: portevents DEVICE\n");
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
	printf("opened\n");
	for (int round = 0; round < 2; round++) {
		if (wait_for(IBV_EVENT_PORT_ERR, IBV_PORT_DOWN, "port down", round + 1) ||
		    wait_for(IBV_EVENT_PORT_ACTIVE, IBV_PORT_ACTIVE, "port active", round + 1))
			return 1;
	}
	if (ibv_close_device(ctx)) {
		perror("ibv_close_device");
		return 1;
	}
	printf("closed\n");
	return 0;
}
