/*
 * pgm.c: PGM (RFC 3208) through OpenPGM's libpgm, encapsulated in UDP
 * (PGM_UDP_ENCAP_UCAST_PORT and _MCAST_PORT = -port, so that the bench's
 * nftables loss rule sees it), one pgm_send per message (OpenPGM fragments
 * an APDU larger than a TPDU itself, but Debian's libpgm 5.3.128 crashes
 * in pgm_send — SIGSEGV in pgm_compat_csum_partial_copy — on any APDU
 * larger than one TPDU; and an APDU holds at most 16 TPDUs anyway). So a
 * message larger than one TPDU's payload (PGM_MSS, less 4) goes as
 * several APDUs of one TPDU each, each with a 4-byte part header (index,
 * count: uint16 little-endian), which the receiver joins in order.
 *
 * Tuning, after OpenPGM's examples (pgmsend, pgmrecv, daytime) and its
 * socket options (all flags of this program, the bench's defaults in
 * reliable.go):
 *   - the sender's rate limit PGM_TXW_MAX_RTE (-txrate bytes/s; the
 *     examples use 400 kB/s) raised to what the receivers keep up with;
 *   - transmit and receive windows of -window sequence numbers (TPDUs),
 *     PGM_MTU 1500;
 *   - NAKs for a LAN: back-off PGM_NAK_BO_IVL -nakbo µs, repeat
 *     PGM_NAK_RPT_IVL and RDATA wait PGM_NAK_RDATA_IVL -nakrpt µs, 50 data
 *     and NCF retries, SPMR expiry 25 ms;
 *   - heartbeat SPMs from 1 ms up, so that a receiver learns of a lost
 *     tail at once; the sender runs a thread in pgm_recv to answer NAKs
 *     (as OpenPGM's daytime example does);
 *   - socket buffers: the transport's sockets get SO_RCVBUF/SO_SNDBUF of
 *     -sockbuf bytes (SO_*BUFFORCE as root).
 */
#include "rmsg.h"

#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <pgm/pgm.h>

static long pgm_part; /* payload bytes of one part: PGM_MSS - 4 */

static int txrate = 100 * 1000 * 1000;
static int window = 65536, nakbo = 2000, nakrpt = 50000, sockbuf = 8 << 20;

static int extra(const char *k, const char *v)
{
	if (!strcmp(k, "txrate")) txrate = atoi(v);
	else if (!strcmp(k, "window")) window = atoi(v);
	else if (!strcmp(k, "nakbo")) nakbo = atoi(v);
	else if (!strcmp(k, "nakrpt")) nakrpt = atoi(v);
	else if (!strcmp(k, "sockbuf")) sockbuf = atoi(v);
	else return 0;
	return 1;
}

static void die(const char *what, pgm_error_t *err)
{
	fprintf(stderr, "pgm: %s: %s\n", what, err && err->message ? err->message : "failed");
	exit(1);
}

static void setbuf_force(pgm_sock_t *s, int opt, int so)
{
	int fd = -1;
	socklen_t l = sizeof fd;
	if (!pgm_getsockopt(s, IPPROTO_PGM, opt, &fd, &l) || fd < 0)
		return;
	if (setsockopt(fd, SOL_SOCKET, so == SO_RCVBUF ? SO_RCVBUFFORCE : SO_SNDBUFFORCE, &sockbuf, sizeof sockbuf) < 0)
		setsockopt(fd, SOL_SOCKET, so, &sockbuf, sizeof sockbuf);
}

/* opt sets a socket option or ends the program. */
static void opt(pgm_sock_t *s, int name, const char *what, const void *v, socklen_t len)
{
	if (!pgm_setsockopt(s, IPPROTO_PGM, name, v, len)) {
		fprintf(stderr, "pgm: setting %s failed\n", what);
		exit(1);
	}
}

static pgm_sock_t *open_sock(const struct rm_args *a)
{
	pgm_error_t *err = NULL;
	if (!pgm_init(&err))
		die("pgm_init", err);
	char net[128];
	/* The interface by its address: a name makes pgm_getaddrinfo ask DNS. */
	snprintf(net, sizeof net, "%s;%s", a->addr, a->group);
	struct pgm_addrinfo_t *res = NULL;
	if (!pgm_getaddrinfo(net, NULL, &res, &err))
		die("pgm_getaddrinfo", err);
	pgm_sock_t *s = NULL;
	if (!pgm_socket(&s, AF_INET, SOCK_SEQPACKET, IPPROTO_UDP, &err))
		die("pgm_socket", err);
	int port = a->port, zero = 0, one = 1, mtu = 1500, hops = 1;
	opt(s, PGM_UDP_ENCAP_UCAST_PORT, "PGM_UDP_ENCAP_UCAST_PORT", &port, sizeof port);
	opt(s, PGM_UDP_ENCAP_MCAST_PORT, "PGM_UDP_ENCAP_MCAST_PORT", &port, sizeof port);
	opt(s, PGM_IP_ROUTER_ALERT, "PGM_IP_ROUTER_ALERT", &zero, sizeof zero);
	opt(s, PGM_MTU, "PGM_MTU", &mtu, sizeof mtu);
	if (a->send) {
		const int spm_ambient = (int)pgm_secs(1);
		const int heartbeat[] = {(int)pgm_msecs(1), (int)pgm_msecs(2), (int)pgm_msecs(5), (int)pgm_msecs(10), (int)pgm_msecs(50),
					 (int)pgm_msecs(100), (int)pgm_msecs(500), (int)pgm_secs(1)};
		opt(s, PGM_SEND_ONLY, "PGM_SEND_ONLY", &one, sizeof one);
		opt(s, PGM_TXW_SQNS, "PGM_TXW_SQNS", &window, sizeof window);
		opt(s, PGM_TXW_MAX_RTE, "PGM_TXW_MAX_RTE", &txrate, sizeof txrate);
		opt(s, PGM_AMBIENT_SPM, "PGM_AMBIENT_SPM", &spm_ambient, sizeof spm_ambient);
		opt(s, PGM_HEARTBEAT_SPM, "PGM_HEARTBEAT_SPM", heartbeat, sizeof heartbeat);
	} else {
		const int peer_expiry = (int)pgm_secs(300), spmr_expiry = (int)pgm_msecs(25), retries = 50;
		opt(s, PGM_RECV_ONLY, "PGM_RECV_ONLY", &one, sizeof one);
		opt(s, PGM_PASSIVE, "PGM_PASSIVE", &zero, sizeof zero);
		opt(s, PGM_RXW_SQNS, "PGM_RXW_SQNS", &window, sizeof window);
		opt(s, PGM_PEER_EXPIRY, "PGM_PEER_EXPIRY", &peer_expiry, sizeof peer_expiry);
		opt(s, PGM_SPMR_EXPIRY, "PGM_SPMR_EXPIRY", &spmr_expiry, sizeof spmr_expiry);
		opt(s, PGM_NAK_BO_IVL, "PGM_NAK_BO_IVL", &nakbo, sizeof nakbo);
		opt(s, PGM_NAK_RPT_IVL, "PGM_NAK_RPT_IVL", &nakrpt, sizeof nakrpt);
		opt(s, PGM_NAK_RDATA_IVL, "PGM_NAK_RDATA_IVL", &nakrpt, sizeof nakrpt);
		opt(s, PGM_NAK_DATA_RETRIES, "PGM_NAK_DATA_RETRIES", &retries, sizeof retries);
		opt(s, PGM_NAK_NCF_RETRIES, "PGM_NAK_NCF_RETRIES", &retries, sizeof retries);
		opt(s, PGM_ABORT_ON_RESET, "PGM_ABORT_ON_RESET", &zero, sizeof zero);
	}
	/* The GSI from the local address: every namespace has the same host name. */
	struct pgm_sockaddr_t sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_port = (uint16_t)a->port;
	sa.sa_addr.sport = DEFAULT_DATA_SOURCE_PORT;
	if (!pgm_gsi_create_from_string(&sa.sa_addr.gsi, a->addr, -1))
		die("pgm_gsi_create_from_string", NULL);
	struct pgm_interface_req_t ifr;
	memset(&ifr, 0, sizeof ifr);
	ifr.ir_interface = a->ifindex;
	memcpy(&ifr.ir_address, &res->ai_send_addrs[0].gsr_addr, sizeof ifr.ir_address);
	if (!pgm_bind3(s, &sa, sizeof sa, &ifr, sizeof ifr, &ifr, sizeof ifr, &err))
		die("pgm_bind3", err);
	for (unsigned i = 0; i < res->ai_recv_addrs_len; i++)
		opt(s, PGM_JOIN_GROUP, "PGM_JOIN_GROUP", &res->ai_recv_addrs[i], sizeof(struct group_req));
	opt(s, PGM_SEND_GROUP, "PGM_SEND_GROUP", &res->ai_send_addrs[0], sizeof(struct group_req));
	pgm_freeaddrinfo(res);
	opt(s, PGM_MULTICAST_LOOP, "PGM_MULTICAST_LOOP", &zero, sizeof zero);
	opt(s, PGM_MULTICAST_HOPS, "PGM_MULTICAST_HOPS", &hops, sizeof hops);
	int noblock = a->send ? 0 : 1;
	opt(s, PGM_NOBLOCK, "PGM_NOBLOCK", &noblock, sizeof noblock);
	if (!pgm_connect(s, &err))
		die("pgm_connect", err);
	int mss = 0;
	socklen_t ml = sizeof mss;
	if (!pgm_getsockopt(s, IPPROTO_PGM, PGM_MSS, &mss, &ml) || mss < 512)
		mss = 1400;
	pgm_part = mss - 4;
	if (a->send)
		setbuf_force(s, PGM_SEND_SOCK, SO_SNDBUF);
	setbuf_force(s, PGM_RECV_SOCK, SO_RCVBUF);
	return s;
}

static volatile int stop;

/* nak_loop runs the sender's side of the protocol: NAKs, SPMs, timers. */
static void *nak_loop(void *arg)
{
	pgm_sock_t *s = arg;
	char buf[4096];
	while (!stop) {
		struct timeval tv = {0, 10000};
		socklen_t tl = sizeof tv;
		size_t n = 0;
		pgm_error_t *err = NULL;
		int st = pgm_recv(s, buf, sizeof buf, MSG_DONTWAIT, &n, &err);
		if (err)
			pgm_error_free(err);
		switch (st) {
		case PGM_IO_STATUS_TIMER_PENDING:
			pgm_getsockopt(s, IPPROTO_PGM, PGM_TIME_REMAIN, &tv, &tl);
			break;
		case PGM_IO_STATUS_RATE_LIMITED:
			pgm_getsockopt(s, IPPROTO_PGM, PGM_RATE_REMAIN, &tv, &tl);
			break;
		case PGM_IO_STATUS_WOULD_BLOCK:
			break;
		default:
			continue;
		}
		struct pollfd fds[8];
		int nfds = 8;
		memset(fds, 0, sizeof fds);
		pgm_poll_info(s, fds, &nfds, POLLIN);
		int ms = (int)(tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000);
		poll(fds, (nfds_t)nfds, ms > 10 ? 10 : ms);
	}
	return NULL;
}

static int sender(const struct rm_args *a)
{
	pgm_sock_t *s = open_sock(a);
	pthread_t th;
	pthread_create(&th, NULL, nak_loop, s);
	unsigned char *msg = malloc((size_t)a->size);
	unsigned char *part = malloc((size_t)pgm_part + 4);
	long parts = (a->size + pgm_part - 1) / pgm_part, sent = 0;
	unsigned long retries = 0;
	rm_wait_go();
	int64_t t0 = rm_now(), first = 0, last = 0;
	for (long i = 0; i < a->count; i++) {
		rm_pace(a, t0, i);
		int64_t now = rm_now();
		if (!first)
			first = now;
		rm_fill(msg, a->size, (uint64_t)i, now);
		for (long k = 0; k < parts; k++) {
			const unsigned char *b = msg;
			size_t len = (size_t)a->size;
			if (parts > 1) {
				long off = k * pgm_part;
				len = (size_t)(a->size - off < pgm_part ? a->size - off : pgm_part);
				part[0] = (unsigned char)k, part[1] = (unsigned char)(k >> 8);
				part[2] = (unsigned char)parts, part[3] = (unsigned char)(parts >> 8);
				memcpy(part + 4, msg + off, len);
				b = part, len += 4;
			}
			for (;;) {
				size_t n = 0;
				int st = pgm_send(s, b, len, &n);
				if (st == PGM_IO_STATUS_NORMAL)
					break;
				if (st == PGM_IO_STATUS_ERROR) {
					fprintf(stderr, "pgm: pgm_send failed\n");
					return 1;
				}
				retries++;
				struct timespec ts = {0, 50000};
				nanosleep(&ts, NULL);
			}
		}
		sent++;
		last = rm_now();
	}
	char info[128];
	snprintf(info, sizeof info, "PGM_TXW_MAX_RTE %d B/s, window %d, NAK backoff %d us, repeat %d us, %ld APDUs/msg, send retries %lu",
		 txrate, window, nakbo, nakrpt, parts, retries);
	rm_send_report("pgm", a, sent, first, last, info);
	rm_wait_eof();
	stop = 1;
	pthread_join(th, NULL);
	pgm_close(s, true);
	return 0;
}

static int receiver(const struct rm_args *a)
{
	pgm_sock_t *s = open_sock(a);
	struct rm_rx r;
	rm_rx_init(&r, a);
	size_t cap = (size_t)a->size + 65536;
	unsigned char *buf = malloc(cap), *msg = malloc((size_t)a->size);
	long parts = (a->size + pgm_part - 1) / pgm_part, next = 0;
	unsigned long resets = 0, partbad = 0;
	rm_ready();
	int64_t start = rm_now(), lastrx = 0;
	while (!rm_rx_done(&r)) {
		int64_t now = rm_now();
		if (now - start > (int64_t)(a->timeout * 1e9) || (lastrx && now - lastrx > (int64_t)(a->idle * 1e9)))
			break;
		struct timeval tv = {0, 50000};
		socklen_t tl = sizeof tv;
		size_t n = 0;
		pgm_error_t *err = NULL;
		int st = pgm_recv(s, buf, cap, 0, &n, &err);
		if (err)
			pgm_error_free(err);
		switch (st) {
		case PGM_IO_STATUS_NORMAL:
			now = rm_now();
			lastrx = now;
			if (parts == 1) {
				rm_rx_deliver(&r, buf, (long)n, now);
				continue;
			}
			/* One part of a message: join them in order. */
			if (n < 4 || (buf[0] | buf[1] << 8) != next || (buf[2] | buf[3] << 8) != parts) {
				partbad++;
				next = 0;
				if (n >= 4 && (buf[0] | buf[1] << 8) != 0)
					continue;
			}
			{
				long off = next * pgm_part, want = a->size - off < pgm_part ? a->size - off : pgm_part;
				if ((long)n - 4 != want) {
					partbad++, next = 0;
					continue;
				}
				memcpy(msg + off, buf + 4, (size_t)want);
				if (++next == parts) {
					rm_rx_deliver(&r, msg, a->size, now);
					next = 0;
				}
			}
			continue;
		case PGM_IO_STATUS_RESET:
			resets++;
			continue;
		case PGM_IO_STATUS_TIMER_PENDING:
			pgm_getsockopt(s, IPPROTO_PGM, PGM_TIME_REMAIN, &tv, &tl);
			break;
		case PGM_IO_STATUS_RATE_LIMITED:
			pgm_getsockopt(s, IPPROTO_PGM, PGM_RATE_REMAIN, &tv, &tl);
			break;
		case PGM_IO_STATUS_WOULD_BLOCK:
			break;
		default:
			continue;
		}
		struct pollfd fds[8];
		int nfds = 8;
		memset(fds, 0, sizeof fds);
		pgm_poll_info(s, fds, &nfds, POLLIN);
		int ms = (int)(tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000);
		poll(fds, (nfds_t)nfds, ms > 50 ? 50 : ms);
	}
	char info[96];
	snprintf(info, sizeof info, "unrecoverable resets %lu, parts out of order %lu", resets, partbad);
	rm_rx_report(&r, "pgm", info);
	rm_wait_eof();
	pgm_close(s, false);
	return 0;
}

int main(int argc, char **argv)
{
	struct rm_args a;
	rm_parse(argc, argv, &a, extra);
	return a.send ? sender(&a) : receiver(&a);
}
