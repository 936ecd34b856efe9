// signals.c: a C program's signal handlers on softrdma's libraries (issue
// 23, item 5).
//
// signals handlers: installs handlers for SIGALRM and SIGINT with
// signal() (no SA_ONSTACK, as most C programs), opens rxe_lo and makes a
// CQ, then spins in ibv_poll_cq (so that the signals come while the thread
// is inside softrdma) until alarm(1)'s SIGALRM was handled, prints
// "SIGALRM handled" and "waiting for SIGINT", spins again until the
// SIGINT the test sends was handled, prints "SIGINT handled" and exits
// with status 3.
// signals die: opens rxe_lo, makes a CQ, prints "ready" and spins in
// ibv_poll_cq until a signal (the test's SIGTERM, default action) ends it.
// Either mode gives up after 30 s with status 1.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

static volatile sig_atomic_t alarmed, interrupted;
static struct ibv_cq *cq;

static void on_alarm(int s) { (void)s; alarmed = 1; }
static void on_int(int s) { (void)s; interrupted = 1; }

// spin polls the CQ until *flag is set (30 s at most).
static int spin(volatile sig_atomic_t *flag, const char *what)
{
	time_t end = time(NULL) + 30;
	while (!*flag) {
		struct ibv_wc wc;
		if (ibv_poll_cq(cq, 1, &wc) < 0) {
			fprintf(stderr, "ibv_poll_cq failed\n");
			return 1;
		}
		if (time(NULL) > end) {
			fprintf(stderr, "no %s within 30 s\n", what);
			return 1;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	static volatile sig_atomic_t never;
	int n;

	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc != 2 || (strcmp(argv[1], "handlers") && strcmp(argv[1], "die"))) {
		fprintf(stderr, "usage: signals handlers|die\n");
		return 2;
	}
	if (!strcmp(argv[1], "handlers")) {
		signal(SIGALRM, on_alarm);
		signal(SIGINT, on_int);
	}
	list = ibv_get_device_list(&n);
	for (int i = 0; list && i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), "rxe_lo"))
			ctx = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	if (!ctx || !(cq = ibv_create_cq(ctx, 16, NULL, NULL, 0))) {
		fprintf(stderr, "no rxe_lo or no CQ\n");
		return 1;
	}
	if (!strcmp(argv[1], "die")) {
		printf("ready\n");
		spin(&never, "signal");
		return 1;
	}
	alarm(1);
	if (spin(&alarmed, "SIGALRM"))
		return 1;
	printf("SIGALRM handled\n");
	printf("waiting for SIGINT\n");
	if (spin(&interrupted, "SIGINT"))
		return 1;
	printf("SIGINT handled\n");
	ibv_destroy_cq(cq);
	ibv_close_device(ctx);
	return 3;
}
