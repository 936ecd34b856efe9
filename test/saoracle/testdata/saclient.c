/*
 * saclient: a raw SA MAD client over libibumad, for the OpenSM oracle test
 * (test/saoracle). Run under ibsim with libumad2sim.so preloaded, it talks
 * to the simulated HCA chosen by SIM_HOST.
 *
 * It waits until its port is ACTIVE with an SM LID, prints
 *   ready <sm_lid> <port_lid> <port_guid hex>
 * and then serves commands on stdin, one a line:
 *   send <512 hex digits>   send one 256-byte MAD to the SM LID, QP1
 *   recv <ms>               wait up to ms for one MAD; print
 *                           "mad <status> <hex>" or "timeout"
 *   quit
 * Every answer ends with a line; errors are "error <text>".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <infiniband/umad.h>

#define MAD_LEN 256
#define MAX_RECV 65536

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static void now_ms(long *ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	*ms = ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int main(int argc, char **argv)
{
	umad_port_t port;
	long start, t;
	int fd, agent, timeout_ms = 30000;
	char line[4096];
	void *sbuf, *rbuf;
	unsigned sm_lid;

	if (argc > 1)
		timeout_ms = atoi(argv[1]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (umad_init() < 0) {
		printf("error umad_init\n");
		return 1;
	}
	/* Wait for the SM to bring the port up (a condition, polled). */
	now_ms(&start);
	for (;;) {
		if (umad_get_port(NULL, 0, &port) == 0) {
			if (port.state == 4 && port.sm_lid != 0 && port.base_lid != 0)
				break;
			umad_release_port(&port);
		}
		now_ms(&t);
		if (t - start > timeout_ms) {
			printf("error port not active after %d ms\n", timeout_ms);
			return 1;
		}
		usleep(20000);
	}
	sm_lid = port.sm_lid;
	fd = umad_open_port(port.ca_name, port.portnum);
	if (fd < 0) {
		printf("error umad_open_port %d\n", fd);
		return 1;
	}
	agent = umad_register(fd, 0x03, 2, 0, NULL);
	if (agent < 0) {
		printf("error umad_register %d\n", agent);
		return 1;
	}
	sbuf = calloc(1, umad_size() + MAD_LEN);
	rbuf = calloc(1, umad_size() + MAX_RECV);
	printf("ready %u %u %016llx\n", sm_lid, port.base_lid,
	       (unsigned long long)be64toh(port.port_guid));
	while (fgets(line, sizeof(line), stdin)) {
		line[strcspn(line, "\r\n")] = 0;
		if (strncmp(line, "send ", 5) == 0) {
			unsigned char *mad = umad_get_mad(sbuf);
			const char *h = line + 5;
			int i, ok = strlen(h) == 2 * MAD_LEN;
			for (i = 0; ok && i < MAD_LEN; i++) {
				int a = hexval(h[2 * i]), b = hexval(h[2 * i + 1]);
				if (a < 0 || b < 0)
					ok = 0;
				mad[i] = a << 4 | b;
			}
			if (!ok) {
				printf("error bad hex\n");
				continue;
			}
			umad_set_addr(sbuf, sm_lid, 1, 0, 0x80010000);
			if (umad_send(fd, agent, sbuf, MAD_LEN, 0, 0) < 0)
				printf("error umad_send %s\n", strerror(errno));
			else
				printf("sent\n");
		} else if (strncmp(line, "recv ", 5) == 0) {
			int len = MAX_RECV, n, i;
			unsigned char *mad;
			n = umad_recv(fd, rbuf, &len, atoi(line + 5));
			if (n < 0) {
				if (n == -ETIMEDOUT || errno == ETIMEDOUT)
					printf("timeout\n");
				else
					printf("error umad_recv %d %s\n", n, strerror(errno));
				continue;
			}
			mad = umad_get_mad(rbuf);
			printf("mad %d ", umad_status(rbuf));
			for (i = 0; i < len; i++)
				printf("%02x", mad[i]);
			printf("\n");
		} else if (strcmp(line, "quit") == 0) {
			break;
		} else {
			printf("error unknown command\n");
		}
	}
	umad_unregister(fd, agent);
	umad_close_port(fd);
	umad_done();
	return 0;
}
