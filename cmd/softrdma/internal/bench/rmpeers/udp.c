/*
 * udp.c: plain UDP multicast, the unreliable ceiling of the reliable-
 * multicast bench. No repair, no flow control: the sender sends as fast as
 * sendmmsg goes (or at -rate). A message larger than one datagram is cut
 * into chunks (a 12-byte chunk header: seq uint64, index uint16, count
 * uint16, then up to UDP_CHUNK bytes of the message); the receiver delivers
 * a message when all its chunks arrived.
 */
#include "rmsg.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#define UDP_CHUNK_HDR 12
#define UDP_DGRAM 1472 /* MTU 1500 - IPv4 20 - UDP 8 */
#define UDP_CHUNK (UDP_DGRAM - UDP_CHUNK_HDR)
#define UDP_BATCH 64
#define UDP_SLOTS 32

static int sock_open(const struct rm_args *a, int rx)
{
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	if (s < 0) {
		perror("socket");
		exit(1);
	}
	int one = 1, buf = 16 << 20, zero = 0, ttl = 1;
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (setsockopt(s, SOL_SOCKET, SO_BINDTODEVICE, a->iface, (socklen_t)strlen(a->iface)) < 0) {
		perror("SO_BINDTODEVICE");
		exit(1);
	}
	/* As root the buffers may pass net.core.[rw]mem_max. */
	if (setsockopt(s, SOL_SOCKET, rx ? SO_RCVBUFFORCE : SO_SNDBUFFORCE, &buf, sizeof buf) < 0)
		setsockopt(s, SOL_SOCKET, rx ? SO_RCVBUF : SO_SNDBUF, &buf, sizeof buf);
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(rx ? a->port : 0)};
	inet_pton(AF_INET, rx ? a->group : a->addr, &sin.sin_addr);
	if (bind(s, (struct sockaddr *)&sin, sizeof sin) < 0) {
		perror("bind");
		exit(1);
	}
	struct ip_mreqn mr = {.imr_ifindex = (int)a->ifindex};
	inet_pton(AF_INET, a->addr, &mr.imr_address);
	if (rx) {
		inet_pton(AF_INET, a->group, &mr.imr_multiaddr);
		if (setsockopt(s, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mr, sizeof mr) < 0) {
			perror("IP_ADD_MEMBERSHIP");
			exit(1);
		}
	} else {
		setsockopt(s, IPPROTO_IP, IP_MULTICAST_IF, &mr, sizeof mr);
		setsockopt(s, IPPROTO_IP, IP_MULTICAST_LOOP, &zero, sizeof zero);
		setsockopt(s, IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof ttl);
	}
	return s;
}

static int sender(const struct rm_args *a)
{
	int s = sock_open(a, 0);
	struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(a->port)};
	inet_pton(AF_INET, a->group, &dst.sin_addr);
	long chunks = (a->size + UDP_CHUNK - 1) / UDP_CHUNK;
	unsigned char *msg = malloc((size_t)a->size);
	static unsigned char hdr[UDP_BATCH][UDP_CHUNK_HDR];
	static unsigned char small[UDP_BATCH][UDP_DGRAM];
	struct mmsghdr mm[UDP_BATCH];
	struct iovec iov[UDP_BATCH][2];
	memset(mm, 0, sizeof mm);
	rm_wait_go();
	int64_t t0 = rm_now(), first = 0, last = 0;
	long sent = 0;
	int n = 0;
	/* Small messages: one datagram each, a batch of messages per sendmmsg. */
	for (long i = 0; i < a->count; i++) {
		rm_pace(a, t0, i);
		int64_t now = rm_now();
		if (!first)
			first = now;
		if (chunks == 1) {
			unsigned char *d = small[n];
			rm_put64(d, (uint64_t)i);
			d[8] = 0, d[9] = 0, d[10] = 1, d[11] = 0;
			rm_fill(d + UDP_CHUNK_HDR, a->size, (uint64_t)i, now);
			iov[n][0] = (struct iovec){d, (size_t)(UDP_CHUNK_HDR + a->size)};
			mm[n].msg_hdr = (struct msghdr){.msg_name = &dst, .msg_namelen = sizeof dst, .msg_iov = iov[n], .msg_iovlen = 1};
			n++;
		} else {
			rm_fill(msg, a->size, (uint64_t)i, now);
			for (long c = 0; c < chunks; c++) {
				long off = c * UDP_CHUNK, len = a->size - off < UDP_CHUNK ? a->size - off : UDP_CHUNK;
				unsigned char *h = hdr[n];
				rm_put64(h, (uint64_t)i);
				h[8] = (unsigned char)c, h[9] = (unsigned char)(c >> 8);
				h[10] = (unsigned char)chunks, h[11] = (unsigned char)(chunks >> 8);
				iov[n][0] = (struct iovec){h, UDP_CHUNK_HDR};
				iov[n][1] = (struct iovec){msg + off, (size_t)len};
				mm[n].msg_hdr = (struct msghdr){.msg_name = &dst, .msg_namelen = sizeof dst, .msg_iov = iov[n], .msg_iovlen = 2};
				if (++n == UDP_BATCH || c == chunks - 1) {
					for (int k = 0; k < n;) {
						int r = sendmmsg(s, mm + k, (unsigned)(n - k), 0);
						if (r < 0 && errno != EINTR && errno != ENOBUFS && errno != EAGAIN) {
							perror("sendmmsg");
							exit(1);
						}
						if (r > 0)
							k += r;
					}
					n = 0;
				}
			}
			sent++;
			last = rm_now();
			continue;
		}
		if (n == UDP_BATCH || i == a->count - 1 || a->rate > 0) {
			for (int k = 0; k < n;) {
				int r = sendmmsg(s, mm + k, (unsigned)(n - k), 0);
				if (r < 0 && errno != EINTR && errno != ENOBUFS && errno != EAGAIN) {
					perror("sendmmsg");
					exit(1);
				}
				if (r > 0)
					k += r;
			}
			sent += n;
			n = 0;
			last = rm_now();
		}
	}
	char info[64];
	snprintf(info, sizeof info, "chunks/msg %ld, batch %d", chunks, UDP_BATCH);
	rm_send_report("udp", a, sent, first, last, info);
	rm_wait_eof();
	return 0;
}

struct slot {
	int64_t seq;
	int got, need;
	uint64_t bits;
	unsigned char *buf;
};

static int receiver(const struct rm_args *a)
{
	int s = sock_open(a, 1);
	struct rm_rx r;
	rm_rx_init(&r, a);
	long chunks = (a->size + UDP_CHUNK - 1) / UDP_CHUNK;
	if (chunks > 64) {
		fprintf(stderr, "udp: at most 64 chunks a message\n");
		return 1;
	}
	struct slot slots[UDP_SLOTS];
	for (int i = 0; i < UDP_SLOTS; i++)
		slots[i] = (struct slot){.seq = -1, .buf = malloc((size_t)a->size)};
	static unsigned char bufs[UDP_BATCH][UDP_DGRAM + 64];
	struct mmsghdr mm[UDP_BATCH];
	struct iovec iov[UDP_BATCH];
	uint64_t incomplete = 0;
	rm_ready();
	int64_t start = rm_now(), lastrx = 0;
	while (!rm_rx_done(&r)) {
		int64_t now = rm_now();
		if (now - start > (int64_t)(a->timeout * 1e9) || (lastrx && now - lastrx > (int64_t)(a->idle * 1e9)))
			break;
		struct pollfd p = {.fd = s, .events = POLLIN};
		if (poll(&p, 1, 50) <= 0)
			continue;
		for (int i = 0; i < UDP_BATCH; i++) {
			iov[i] = (struct iovec){bufs[i], sizeof bufs[i]};
			mm[i].msg_hdr = (struct msghdr){.msg_iov = &iov[i], .msg_iovlen = 1};
		}
		int n = recvmmsg(s, mm, UDP_BATCH, MSG_DONTWAIT, NULL);
		if (n <= 0)
			continue;
		now = rm_now();
		lastrx = now;
		for (int i = 0; i < n; i++) {
			unsigned char *d = bufs[i];
			long len = (long)mm[i].msg_len;
			if (len < UDP_CHUNK_HDR) {
				r.corrupted++;
				continue;
			}
			int64_t seq = (int64_t)rm_get64(d);
			int c = d[8] | d[9] << 8, cnt = d[10] | d[11] << 8;
			if (cnt == 1) {
				rm_rx_deliver(&r, d + UDP_CHUNK_HDR, len - UDP_CHUNK_HDR, now);
				continue;
			}
			if (cnt != chunks || c >= cnt) {
				r.corrupted++;
				continue;
			}
			struct slot *sl = &slots[seq % UDP_SLOTS];
			if (sl->seq != seq) {
				if (sl->seq >= 0 && sl->got < sl->need)
					incomplete++;
				*sl = (struct slot){.seq = seq, .need = cnt, .buf = sl->buf};
			}
			if (sl->bits & (1ull << c))
				continue;
			long off = (long)c * UDP_CHUNK, want = a->size - off < UDP_CHUNK ? a->size - off : UDP_CHUNK;
			if (len - UDP_CHUNK_HDR != want) {
				r.corrupted++;
				continue;
			}
			memcpy(sl->buf + off, d + UDP_CHUNK_HDR, (size_t)want);
			sl->bits |= 1ull << c;
			if (++sl->got == sl->need)
				rm_rx_deliver(&r, sl->buf, a->size, now);
		}
	}
	char info[64];
	snprintf(info, sizeof info, "messages with missing chunks %llu", (unsigned long long)incomplete);
	rm_rx_report(&r, "udp", info);
	return 0;
}

int main(int argc, char **argv)
{
	struct rm_args a;
	rm_parse(argc, argv, &a, NULL);
	return a.send ? sender(&a) : receiver(&a);
}
