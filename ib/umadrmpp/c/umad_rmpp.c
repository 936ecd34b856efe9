/*
 * softsm's RMPP layer for umad clients (OpenSM, saquery) that run under
 * ibsim's libumad2sim.so: the part of the kernel's MAD layer
 * (drivers/infiniband/core/mad_rmpp.c, user_mad.c) that umad2sim lacks.
 * Package ib/umadrmpp builds it; docs/opensm.md describes it.
 *
 * It goes AFTER libumad2sim.so:  LD_PRELOAD=libumad2sim.so:<this library>
 *
 * and interposes two layers:
 *
 *   - libibumad's umad_send, umad_recv and umad_poll (umad2sim does not
 *     define them, so the program's calls reach this library first).
 *     umad_send cuts an RMPP-active MAD of an RMPP class into RMPP DATA
 *     segments of 256 bytes framed as the kernel frames them (segment
 *     numbers from 1, First and Last flags, PayloadLength on the first and
 *     the last segment) and sends each through libibumad. umad_recv
 *     reassembles the DATA segments it receives, answers them with ACKs as
 *     the kernel's receiver does, and returns the whole MAD with the
 *     kernel's and libibumad's length rules (-ENOSPC and the length needed
 *     when the buffer is too small; the MAD stays queued for the next
 *     call). ACK, STOP and ABORT MADs are the MAD layer's business and
 *     never reach the program.
 *   - read(), as umad2sim's receiver thread calls it (its dlsym(RTLD_NEXT)
 *     finds this library): umad2sim 0.10 copies only 224 bytes of a
 *     received MAD to its reader (its buffer is a struct sim_request, 288
 *     bytes, less the 64-byte umad header) and the last 32 bytes the reader
 *     gets are not the MAD's. The full RMPP DATA segments read off the
 *     socket are kept in a small ring, and umad_recv puts a segment's last
 *     32 bytes back from there (matched by its first 224 bytes).
 *
 * Not emulated: the sender's window, its ACK wait and retransmission.
 * Every segment is written at once: the next hop is umad2sim's unix
 * datagram socket to softsm (a blocking local socket), and softsm runs the
 * RMPP protocol with the port (window, ACKs, retransmission) on the lossy
 * hop. ACKs that come back are dropped. A receiver holds segments in
 * order only (the sender here never loses one) and forgets a transfer
 * that got no segment for 40 s.
 *
 * Every other call, MAD and file descriptor passes through unchanged.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <infiniband/umad.h>

enum {
	MAD_LEN = 256,
	SIM_HDR_LEN = 32,		/* struct sim_request before its MAD (ibsim.h) */
	SIM_REQ_LEN = SIM_HDR_LEN + MAD_LEN,
	RMPP_HDR_END = 36,		/* common header and RMPP header */
	RMPP_DATA = MAD_LEN - RMPP_HDR_END,	/* what PayloadLength counts a segment */
	TYPE_DATA = 1,
	TYPE_ACK = 2,
	TYPE_ABORT = 4,
	FLAG_ACTIVE = 1,
	FLAG_FIRST = 2,
	FLAG_LAST = 4,
	METHOD_RESP = 0x80,
	WINDOW = 64,			/* the kernel's receive window */
	MAX_XFER_BYTES = 4 << 20,	/* one reassembled MAD at most */
	MAX_XFERS = 32,			/* transfers being reassembled */
	XFER_IDLE = 40,			/* s without a segment: forgotten */
	MAX_DONE = 16,			/* whole MADs waiting for umad_recv */
	RING = 256,			/* full segments kept for umad_recv */
};

/* MAD offsets: common header, RMPP header. */
enum { O_CLASS = 1, O_METHOD = 3, O_TID = 8, O_RVER = 24, O_RTYPE = 25,
	O_RFLAGS = 26, O_RSTATUS = 27, O_SEGNUM = 28, O_PAYLEN = 32 };

typedef ssize_t (*read_fn)(int, void *, size_t);
typedef int (*send_fn)(int, int, void *, int, int, int);
typedef int (*recv_fn)(int, void *, int *, int);
typedef int (*poll_fn)(int, int);
typedef size_t (*size_fn)(void);

static read_fn next_read;
static send_fn next_send;
static recv_fn next_recv;
static poll_fn next_poll;
static size_fn next_size;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

struct xfer {
	int used, fd, agent;
	uint8_t tid[8], mclass, method;
	uint16_t lid;			/* network order, as umad's addr */
	uint32_t qpn;			/* network order */
	uint32_t in_order, newwin;	/* segments held; window advertised */
	size_t hdr, len;		/* class header length; MAD bytes held */
	time_t touched;
	struct ib_user_mad uhdr;	/* of the first segment */
	uint8_t *mad;
};

struct done {
	struct done *next;
	int fd;
	size_t len;			/* the MAD's */
	uint8_t *umad;			/* umad header and MAD */
};

struct kept {
	int used;
	uint8_t mad[MAD_LEN];
};

static struct xfer xfers[MAX_XFERS];
static struct done *done_head;
static int done_n;
static struct kept ring[RING];
static unsigned ring_next;
static int warned;

static void resolve(void)
{
	if (!next_read)
		next_read = (read_fn)dlsym(RTLD_NEXT, "read");
	if (!next_send) {
		next_send = (send_fn)dlsym(RTLD_NEXT, "umad_send");
		next_recv = (recv_fn)dlsym(RTLD_NEXT, "umad_recv");
		next_poll = (poll_fn)dlsym(RTLD_NEXT, "umad_poll");
		next_size = (size_fn)dlsym(RTLD_NEXT, "umad_size");
	}
}

static void warn(const char *what)
{
	if (warned++ < 20)
		fprintf(stderr, "softsm umad RMPP layer: %s\n", what);
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return ntohl(v);
}

static void put32(uint8_t *p, uint32_t v)
{
	v = htonl(v);
	memcpy(p, &v, 4);
}

/* The classes the kernel runs RMPP for (ib_is_mad_class_rmpp). */
static int rmpp_class(uint8_t c)
{
	return c == 0x03 || c == 0x06 || c == 0x10 || c == 0x12 ||
	       (c >= 0x30 && c <= 0x4f);
}

/* Where a class's data starts (ib_get_mad_data_offset). */
static size_t data_offset(uint8_t c)
{
	if (c == 0x03)
		return 56;
	if (c == 0x06 || c == 0x10 || c == 0x12)
		return 64;
	if (c >= 0x30 && c <= 0x4f)
		return 40;
	return 24;
}

static int is_data(const uint8_t *m)
{
	return rmpp_class(m[O_CLASS]) && (m[O_RFLAGS] & FLAG_ACTIVE) &&
	       m[O_RTYPE] == TYPE_DATA;
}

/* Only the ABI whose umad header is struct ib_user_mad (umad2sim's). */
static int ours(void)
{
	resolve();
	return next_send && next_recv && next_size &&
	       next_size() == sizeof(struct ib_user_mad);
}

/*
 * read: umad2sim's receiver thread reads one struct sim_request a call
 * off its socket; keep the RMPP DATA segments whole (see the top).
 */
ssize_t read(int fd, void *buf, size_t count)
{
	ssize_t n;

	resolve();
	if (!next_read) {
		errno = ENOSYS;
		return -1;
	}
	n = next_read(fd, buf, count);
	if (n == SIM_REQ_LEN && count == SIM_REQ_LEN) {
		const uint8_t *m = (const uint8_t *)buf + SIM_HDR_LEN;
		if (is_data(m)) {
			pthread_mutex_lock(&mu);
			ring[ring_next].used = 1;
			memcpy(ring[ring_next].mad, m, MAD_LEN);
			ring_next = (ring_next + 1) % RING;
			pthread_mutex_unlock(&mu);
		}
	}
	return n;
}

/* Puts back what umad2sim cut off a received segment. Caller holds mu. */
static void restore(uint8_t *m)
{
	size_t keep = SIM_REQ_LEN - sizeof(struct ib_user_mad);
	unsigned i, j;

	if (keep >= MAD_LEN)
		return;
	for (i = 0; i < RING; i++) {
		j = (ring_next + i) % RING;	/* oldest first */
		if (ring[j].used && !memcmp(ring[j].mad, m, keep)) {
			memcpy(m, ring[j].mad, MAD_LEN);
			ring[j].used = 0;
			return;
		}
	}
	warn("a segment's last bytes were not found: it stays as umad2sim gave it");
}

int umad_send(int fd, int agentid, void *umad, int length, int timeout_ms,
	      int retries)
{
	uint8_t seg[sizeof(struct ib_user_mad) + MAD_LEN];
	uint8_t *m, *s = seg + sizeof(struct ib_user_mad);
	size_t hdr, segsz, data, pad, nseg, i, off, n;
	int r;

	if (!ours()) {
		if (!next_send) {
			errno = ENOSYS;
			return -EIO;
		}
		return next_send(fd, agentid, umad, length, timeout_ms, retries);
	}
	m = (uint8_t *)umad + sizeof(struct ib_user_mad);
	if (length < RMPP_HDR_END || !rmpp_class(m[O_CLASS]) ||
	    !(m[O_RFLAGS] & FLAG_ACTIVE))
		return next_send(fd, agentid, umad, length, timeout_ms, retries);
	hdr = data_offset(m[O_CLASS]);
	if ((size_t)length < hdr) {
		errno = EINVAL;
		return -EIO;
	}
	/* The kernel's framing: segments of hdr bytes of headers and
	 * 256 - hdr of data; pad fills the last; PayloadLength counts 220
	 * bytes a segment (ib_create_send_mad, send_next_seg). */
	segsz = MAD_LEN - hdr;
	data = (size_t)length - hdr;
	pad = data ? (segsz - data % segsz) % segsz : segsz;
	nseg = (data + pad) / segsz;
	for (i = 1; i <= nseg; i++) {
		uint32_t paylen = 0;
		uint8_t flags = FLAG_ACTIVE;

		memcpy(seg, umad, sizeof(struct ib_user_mad));
		memset(s, 0, MAD_LEN);
		memcpy(s, m, hdr);
		s[O_RVER] = 1;
		s[O_RTYPE] = TYPE_DATA;
		s[O_RSTATUS] = 0;
		if (i == 1) {
			flags |= FLAG_FIRST;
			paylen = nseg * RMPP_DATA - pad;
		}
		if (i == nseg) {
			flags |= FLAG_LAST;
			paylen = RMPP_DATA - pad;
		}
		s[O_RFLAGS] = flags;	/* RRespTime 0, as the kernel's */
		put32(s + O_SEGNUM, (uint32_t)i);
		put32(s + O_PAYLEN, paylen);
		off = (i - 1) * segsz;
		n = data - off < segsz ? data - off : segsz;
		memcpy(s + hdr, m + hdr + off, n);
		r = next_send(fd, agentid, seg, MAD_LEN, timeout_ms, retries);
		if (r < 0)
			return r;
	}
	return 0;
}

/* Forgets transfers idle for XFER_IDLE. Caller holds mu. */
static void expire(time_t now)
{
	int i;

	for (i = 0; i < MAX_XFERS; i++)
		if (xfers[i].used && now - xfers[i].touched > XFER_IDLE) {
			free(xfers[i].mad);
			memset(&xfers[i], 0, sizeof(xfers[i]));
			warn("a transfer got no segment for 40 s: forgotten");
		}
}

static struct xfer *find(int fd, const struct ib_user_mad *u, const uint8_t *m)
{
	int i;

	for (i = 0; i < MAX_XFERS; i++) {
		struct xfer *x = &xfers[i];
		if (x->used && x->fd == fd && x->mclass == m[O_CLASS] &&
		    x->method == m[O_METHOD] && !memcmp(x->tid, m + O_TID, 8) &&
		    x->lid == u->addr.lid && x->qpn == u->addr.qpn)
			return x;
	}
	return NULL;
}

static void drop(struct xfer *x)
{
	free(x->mad);
	memset(x, 0, sizeof(*x));
}

/* Queues x's whole MAD for umad_recv and forgets x. Caller holds mu. */
static void complete(struct xfer *x, uint32_t last_paylen)
{
	size_t segsz = MAD_LEN - x->hdr, len;
	long pad = (long)RMPP_DATA - (long)last_paylen;
	struct done *d, **p;

	/* get_mad_len: a PayloadLength out of range counts as no pad */
	if (pad < 0 || pad > (long)segsz)
		pad = 0;
	len = x->hdr + x->in_order * segsz - (size_t)pad;
	d = calloc(1, sizeof(*d));
	if (d)
		d->umad = malloc(sizeof(struct ib_user_mad) + len);
	if (!d || !d->umad) {
		free(d);
		warn("out of memory: a reassembled MAD is lost");
		drop(x);
		return;
	}
	d->fd = x->fd;
	d->len = len;
	x->uhdr.length = sizeof(struct ib_user_mad) + len;
	memcpy(d->umad, &x->uhdr, sizeof(struct ib_user_mad));
	memcpy(d->umad + sizeof(struct ib_user_mad), x->mad, len);
	if (done_n >= MAX_DONE) {
		struct done *old = done_head;
		done_head = old->next;
		free(old->umad);
		free(old);
		done_n--;
		warn("too many reassembled MADs unread: the oldest is dropped");
	}
	for (p = &done_head; *p; p = &(*p)->next)
		;
	*p = d;
	done_n++;
	drop(x);
}

/*
 * Takes a DATA segment (u: its umad header, m: the MAD) as the kernel's
 * receiver does (start_rmpp, continue_rmpp): fills ack (an umad header and
 * MAD) and returns 1 when an ACK is due. Caller holds mu.
 */
static int take_segment(int fd, struct ib_user_mad *u, uint8_t *m, uint8_t *ack)
{
	uint32_t num = get32(m + O_SEGNUM);
	uint8_t flags = m[O_RFLAGS];
	struct xfer *x = find(fd, u, m);
	size_t segsz;
	int i;

	if (m[O_RSTATUS] || num == 0)
		return 0;
	if (num == 1) {
		if (!(flags & FLAG_FIRST))
			return 0;
		if (x)
			drop(x);	/* the sender started over */
		for (i = 0; i < MAX_XFERS && xfers[i].used; i++)
			;
		if (i == MAX_XFERS) {
			warn("too many transfers at once: a segment is dropped");
			return 0;
		}
		x = &xfers[i];
		x->hdr = data_offset(m[O_CLASS]);
		x->mad = malloc(x->hdr);
		if (!x->mad)
			return 0;
		x->used = 1;
		x->fd = fd;
		x->agent = (int)u->agent_id;
		x->mclass = m[O_CLASS];
		x->method = m[O_METHOD];
		memcpy(x->tid, m + O_TID, 8);
		x->lid = u->addr.lid;
		x->qpn = u->addr.qpn;
		x->uhdr = *u;
		memcpy(x->mad, m, x->hdr);
		x->len = x->hdr;
		x->newwin = 1;
	} else if (!x || (flags & FLAG_FIRST)) {
		return 0;
	}
	x->touched = time(NULL);
	segsz = MAD_LEN - x->hdr;
	if (num == x->in_order + 1) {
		uint8_t *grown;

		if (x->len + segsz > MAX_XFER_BYTES ||
		    !(grown = realloc(x->mad, x->len + segsz))) {
			warn("a transfer over 4 MiB (or out of memory): dropped");
			drop(x);
			return 0;
		}
		x->mad = grown;
		memcpy(x->mad + x->len, m + x->hdr, segsz);
		x->len += segsz;
		x->in_order++;
		if (flags & FLAG_LAST) {
			/* complete: ACK the last segment, window as is */
		} else if (x->in_order == 1 || x->in_order >= x->newwin) {
			x->newwin = x->in_order + WINDOW;
		} else {
			return 0;
		}
	} else if (num > x->in_order) {
		return 0;	/* out of order: the sender sends it again */
	}
	/* the ACK: the segment's headers, the method's response bit
	 * flipped, type ACK, SegmentNumber the segments held in order,
	 * NewWindowLast the window (format_ack) */
	memset(ack, 0, sizeof(struct ib_user_mad) + MAD_LEN);
	memcpy(ack, u, sizeof(struct ib_user_mad));
	((struct ib_user_mad *)ack)->addr.qkey = htonl(0x80010000);
	{
		uint8_t *a = ack + sizeof(struct ib_user_mad);
		memcpy(a, m, x->hdr);
		a[O_METHOD] ^= METHOD_RESP;
		a[O_RTYPE] = TYPE_ACK;
		a[O_RFLAGS] = (a[O_RFLAGS] & 0xf8) | FLAG_ACTIVE;
		put32(a + O_SEGNUM, x->in_order);
		put32(a + O_PAYLEN, x->newwin);
	}
	if (num == x->in_order && (flags & FLAG_LAST))
		complete(x, get32(m + O_PAYLEN));
	return 1;
}

/*
 * Hands the program the oldest whole MAD of fd, with the kernel's rules
 * for a buffer too small (copy_recv_mad): room for less than a segment is
 * EINVAL, for less than the MAD ENOSPC with the first segment copied and
 * *length the MAD's; the MAD stays queued then. Returns 0 when none is
 * queued, else 1 with *ret set. Caller holds mu.
 */
static int take_done(int fd, void *umad, int *length, int *ret)
{
	struct done *d, **p;
	size_t room = *length > 0 ? (size_t)*length : 0;

	for (p = &done_head; *p && (*p)->fd != fd; p = &(*p)->next)
		;
	if (!(d = *p))
		return 0;
	if (room < d->len) {
		if (room < MAD_LEN) {
			errno = EINVAL;
			*ret = -EINVAL;
			return 1;
		}
		memcpy(umad, d->umad, sizeof(struct ib_user_mad) + MAD_LEN);
		*length = (int)d->len;
		errno = ENOSPC;
		*ret = -ENOSPC;
		return 1;
	}
	memcpy(umad, d->umad, sizeof(struct ib_user_mad) + d->len);
	*length = (int)d->len;
	*ret = (int)((struct ib_user_mad *)d->umad)->agent_id;
	*p = d->next;
	done_n--;
	free(d->umad);
	free(d);
	return 1;
}

static long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

int umad_recv(int fd, void *umad, int *length, int timeout_ms)
{
	uint8_t buf[sizeof(struct ib_user_mad) + MAD_LEN];
	uint8_t ack[sizeof(struct ib_user_mad) + MAD_LEN];
	struct ib_user_mad *u = (struct ib_user_mad *)buf;
	uint8_t *m = buf + sizeof(struct ib_user_mad);
	long deadline = timeout_ms > 0 ? now_ms() + timeout_ms : 0;

	if (!ours() || !umad || !length) {
		if (!next_recv) {
			errno = ENOSYS;
			return -ENOSYS;
		}
		return next_recv(fd, umad, length, timeout_ms);
	}
	for (;;) {
		int ret, len = MAD_LEN, wait = timeout_ms, due;

		pthread_mutex_lock(&mu);
		expire(time(NULL));
		if (take_done(fd, umad, length, &ret)) {
			pthread_mutex_unlock(&mu);
			return ret;
		}
		pthread_mutex_unlock(&mu);
		if (timeout_ms > 0) {
			wait = (int)(deadline - now_ms());
			if (wait <= 0) {
				errno = ETIMEDOUT;
				return -ETIMEDOUT;
			}
		}
		ret = next_recv(fd, buf, &len, wait);
		if (ret < 0)
			return ret;
		if (len < RMPP_HDR_END || !rmpp_class(m[O_CLASS]) ||
		    !(m[O_RFLAGS] & FLAG_ACTIVE) || m[O_RTYPE] < TYPE_DATA ||
		    m[O_RTYPE] > TYPE_ABORT) {
			/* not RMPP (or a sender's unframed MAD): as
			 * umad2sim gave it */
			int n = len < *length ? len : (*length > 0 ? *length : 0);
			memcpy(umad, buf, sizeof(struct ib_user_mad) + n);
			*length = n;
			return ret;
		}
		if (m[O_RTYPE] != TYPE_DATA)
			continue;	/* ACK, STOP, ABORT: the MAD layer's */
		if (u->status) {
			/* a segment that went nowhere: report the send's
			 * failure once, for its first segment */
			if (get32(m + O_SEGNUM) != 1)
				continue;
			int n = len < *length ? len : (*length > 0 ? *length : 0);
			memcpy(umad, buf, sizeof(struct ib_user_mad) + n);
			*length = n;
			return ret;
		}
		pthread_mutex_lock(&mu);
		restore(m);
		due = take_segment(fd, u, m, ack);
		pthread_mutex_unlock(&mu);
		if (due)
			next_send(fd, u->agent_id, ack, MAD_LEN, 0, 0);
	}
}

int umad_poll(int fd, int timeout_ms)
{
	struct done *d;

	resolve();
	if (!next_poll)
		return -EIO;
	pthread_mutex_lock(&mu);
	for (d = done_head; d && d->fd != fd; d = d->next)
		;
	pthread_mutex_unlock(&mu);
	if (d)
		return 0;
	return next_poll(fd, timeout_ms);
}
