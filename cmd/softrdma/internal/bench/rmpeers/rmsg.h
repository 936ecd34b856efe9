/*
 * rmsg.h: the message format, command line and output shared by the
 * reliable-multicast bench's peers (udp.c, pgm.c, and norm.cpp, C++
 * because libnorm's normApi.h is). The Go side of
 * the same format is cmd/softrdma/internal/bench/rmsg.go; keep the two in step.
 *
 * A message of -size bytes (at least 16) starts with its sequence number
 * (uint64 little-endian, 0..count-1) and the time the sender handed it to
 * the transport (int64 ns, CLOCK_MONOTONIC, little-endian); byte i >= 16 is
 * (uint8)(seq*7 + i), which the receiver checks.
 *
 * Command line (both roles):
 *   PEER send|recv -group 239.x.y.z -port P -iface IF -addr LOCALIP
 *                  -size BYTES -count N [-rate MSGS_PER_S] [-receivers A,B]
 *                  [-timeout S] [-idle S] [peer flags]
 * A receiver prints READY once it listens, then at its end one JSON line.
 * The sender reads one line from stdin (the go), sends, prints one JSON
 * line, and stays (serving repairs) until its stdin closes.
 */
#ifndef RMSG_H
#define RMSG_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RM_HDR 16

struct rm_args {
	int send;               /* 1: sender, 0: receiver */
	const char *group;      /* IPv4 multicast group */
	int port;               /* UDP port */
	const char *iface;      /* interface name */
	const char *addr;       /* local IPv4 address on iface */
	long size;              /* message size in bytes */
	long count;             /* messages the sender sends */
	double rate;            /* messages/s, 0: as fast as the transport allows */
	double timeout;         /* receiver: give up after this many s */
	double idle;            /* receiver: end after this many s without a delivery */
	int nrecv;              /* sender: the receivers' addresses */
	uint32_t recv[64];      /* (host byte order) */
	unsigned ifindex;
};

static inline int64_t rm_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void rm_put64(unsigned char *b, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)(v >> (8 * i));
}

static inline uint64_t rm_get64(const unsigned char *b)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v |= (uint64_t)b[i] << (8 * i);
	return v;
}

/* rm_fill writes message seq (header and pattern) into b. */
static inline void rm_fill(unsigned char *b, long size, uint64_t seq, int64_t t)
{
	rm_put64(b, seq);
	rm_put64(b + 8, (uint64_t)t);
	unsigned char x = (unsigned char)(seq * 7 + RM_HDR);
	for (long i = RM_HDR; i < size; i++)
		b[i] = x++;
}

/* rm_stamp rewrites the send time of a filled message. */
static inline void rm_stamp(unsigned char *b, int64_t t) { rm_put64(b + 8, (uint64_t)t); }

/* rm_check returns 1 when b (len bytes) is a well-formed message of size bytes. */
static inline int rm_check(const unsigned char *b, long len, long size)
{
	if (len != size || len < RM_HDR)
		return 0;
	uint64_t seq = rm_get64(b);
	unsigned char x = (unsigned char)(seq * 7 + RM_HDR);
	for (long i = RM_HDR; i < len; i++, x++)
		if (b[i] != x)
			return 0;
	return 1;
}

static void rm_usage(const char *prog)
{
	fprintf(stderr, "usage: %s send|recv -group G -port P -iface IF -addr A -size B -count N [-rate R] [-receivers A,B] [-timeout S] [-idle S]\n", prog);
	exit(2);
}

/*
 * rm_parse parses the common flags; a flag it does not know goes to
 * extra(name, value) (each flag takes one value), which returns 0 when it
 * does not know it either.
 */
static void rm_parse(int argc, char **argv, struct rm_args *a, int (*extra)(const char *, const char *))
{
	memset(a, 0, sizeof *a);
	a->timeout = 120;
	a->idle = 2;
	if (argc < 2)
		rm_usage(argv[0]);
	if (!strcmp(argv[1], "send"))
		a->send = 1;
	else if (strcmp(argv[1], "recv"))
		rm_usage(argv[0]);
	for (int i = 2; i < argc; i += 2) {
		const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!v || k[0] != '-')
			rm_usage(argv[0]);
		k += 1 + (k[1] == '-');
		if (!strcmp(k, "group")) a->group = v;
		else if (!strcmp(k, "port")) a->port = atoi(v);
		else if (!strcmp(k, "iface")) a->iface = v;
		else if (!strcmp(k, "addr")) a->addr = v;
		else if (!strcmp(k, "size")) a->size = atol(v);
		else if (!strcmp(k, "count")) a->count = atol(v);
		else if (!strcmp(k, "rate")) a->rate = atof(v);
		else if (!strcmp(k, "timeout")) a->timeout = atof(v);
		else if (!strcmp(k, "idle")) a->idle = atof(v);
		else if (!strcmp(k, "receivers")) {
			char *s = strdup(v), *save = NULL;
			for (char *t = strtok_r(s, ",", &save); t && a->nrecv < 64; t = strtok_r(NULL, ",", &save)) {
				struct in_addr in;
				if (inet_pton(AF_INET, t, &in) != 1)
					rm_usage(argv[0]);
				a->recv[a->nrecv++] = ntohl(in.s_addr);
			}
			free(s);
		} else if (!extra || !extra(k, v)) {
			fprintf(stderr, "%s: unknown flag -%s\n", argv[0], k);
			rm_usage(argv[0]);
		}
	}
	if (!a->group || !a->port || !a->iface || !a->addr || a->size < RM_HDR || a->size > (1 << 20) || a->count < 1)
		rm_usage(argv[0]);
	a->ifindex = if_nametoindex(a->iface);
	if (!a->ifindex) {
		fprintf(stderr, "%s: no interface %s\n", argv[0], a->iface);
		exit(1);
	}
}

/* rm_ready tells the harness the receiver listens. */
static inline void rm_ready(void)
{
	fputs("READY\n", stdout);
	fflush(stdout);
}

/* rm_wait_go waits for the harness's go (a line on stdin). */
static inline void rm_wait_go(void)
{
	char line[64];
	if (!fgets(line, sizeof line, stdin)) {
		fprintf(stderr, "no go on stdin\n");
		exit(1);
	}
}

/* rm_wait_eof blocks until stdin closes. */
static inline void rm_wait_eof(void)
{
	char buf[256];
	while (read(0, buf, sizeof buf) > 0)
		;
}

/* rm_pace sleeps until message i is due at rate msgs/s from t0. */
static inline void rm_pace(const struct rm_args *a, int64_t t0, long i)
{
	if (a->rate <= 0)
		return;
	int64_t due = t0 + (int64_t)((double)i * 1e9 / a->rate);
	int64_t now = rm_now();
	if (due > now + 20000) {
		struct timespec ts = {(time_t)((due - now) / 1000000000), (long)((due - now) % 1000000000)};
		nanosleep(&ts, NULL);
	}
}

/* The sender's output. */
static void rm_send_report(const char *peer, const struct rm_args *a, long sent, int64_t first, int64_t last, const char *info)
{
	printf("{\"role\":\"send\",\"peer\":\"%s\",\"count\":%ld,\"size\":%ld,\"sent\":%ld,\"first_ns\":%lld,\"last_ns\":%lld,\"info\":\"%s\"}\n",
	       peer, a->count, a->size, sent, (long long)first, (long long)last, info ? info : "");
	fflush(stdout);
}

/* A receiver's accounting. */
struct rm_rx {
	long count, size;
	unsigned char *seen;
	int64_t *lat;
	uint64_t delivered, distinct, duplicated, reordered, corrupted;
	int64_t maxseq;
	int64_t first, last;
};

static void rm_rx_init(struct rm_rx *r, const struct rm_args *a)
{
	memset(r, 0, sizeof *r);
	r->count = a->count;
	r->size = a->size;
	r->seen = (unsigned char *)calloc((size_t)a->count, 1);
	r->lat = (int64_t *)calloc((size_t)a->count, sizeof(int64_t));
	r->maxseq = -1;
	if (!r->seen || !r->lat) {
		fprintf(stderr, "out of memory\n");
		exit(1);
	}
}

/* rm_rx_deliver accounts for one message handed over by the transport at now. */
static void rm_rx_deliver(struct rm_rx *r, const unsigned char *b, long len, int64_t now)
{
	r->delivered++;
	if (!rm_check(b, len, r->size)) {
		r->corrupted++;
		return;
	}
	uint64_t seq = rm_get64(b);
	if (seq >= (uint64_t)r->count) {
		r->corrupted++;
		return;
	}
	if (!r->first)
		r->first = now;
	r->last = now;
	if (r->seen[seq]) {
		r->duplicated++;
		return;
	}
	r->seen[seq] = 1;
	r->distinct++;
	r->lat[r->distinct - 1] = now - (int64_t)rm_get64(b + 8);
	if ((int64_t)seq < r->maxseq)
		r->reordered++;
	else
		r->maxseq = (int64_t)seq;
}

static int rm_cmp64(const void *x, const void *y)
{
	int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
	return (a > b) - (a < b);
}

/* rm_pct is the nearest-rank percentile p (0..100) of n sorted values. */
static int64_t rm_pct(const int64_t *v, uint64_t n, int p)
{
	if (!n)
		return 0;
	uint64_t k = (n * (uint64_t)p + 99) / 100;
	if (k < 1)
		k = 1;
	return v[k - 1];
}

static void rm_rx_report(struct rm_rx *r, const char *peer, const char *info)
{
	qsort(r->lat, r->distinct, sizeof(int64_t), rm_cmp64);
	printf("{\"role\":\"recv\",\"peer\":\"%s\",\"count\":%ld,\"size\":%ld,\"delivered\":%llu,\"distinct\":%llu,"
	       "\"duplicated\":%llu,\"reordered\":%llu,\"corrupted\":%llu,\"lost\":%llu,"
	       "\"first_ns\":%lld,\"last_ns\":%lld,\"p50_ns\":%lld,\"p99_ns\":%lld,\"max_ns\":%lld,\"info\":\"%s\"}\n",
	       peer, r->count, r->size, (unsigned long long)r->delivered, (unsigned long long)r->distinct,
	       (unsigned long long)r->duplicated, (unsigned long long)r->reordered, (unsigned long long)r->corrupted,
	       (unsigned long long)(r->count - (long)r->distinct), (long long)r->first, (long long)r->last,
	       (long long)rm_pct(r->lat, r->distinct, 50), (long long)rm_pct(r->lat, r->distinct, 99),
	       (long long)(r->distinct ? r->lat[r->distinct - 1] : 0), info ? info : "");
	fflush(stdout);
}

/* rm_rx_done reports whether every message was delivered. */
static inline int rm_rx_done(const struct rm_rx *r) { return r->distinct == (uint64_t)r->count; }

#endif
