// C helpers of package rdmacore (built only with -tags rdmacore and cgo).
//
// libibverbs makes several calls static inline functions or macros
// (ibv_poll_cq, ibv_post_send, ibv_post_recv, ibv_req_notify_cq,
// ibv_query_port, ibv_reg_mr), and some of its structs hold anonymous
// unions that cgo cannot name. The helpers here are the C side of the Go
// code: one cgo call per verb, plain structs in and out — or, on the data
// path, one cgo call per round of verbs (sr_poll_cq_spin, sr_cq_wait_poll):
// every call into C costs the Go runtime a transition. Every helper is
// static inline, so any file of the package may include this header.
#ifndef SOFTRDMA_RDMACORE_SHIM_H
#define SOFTRDMA_RDMACORE_SHIM_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE // ppoll
#endif
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

// sr_errno turns a libibverbs result into an errno: 0 for success; a
// positive result is the errno itself (the post and modify calls); -1 means
// "see errno"; another negative result is a negated errno.
static inline int sr_errno(int rc) {
	if (rc == 0)
		return 0;
	if (rc > 0)
		return rc;
	if (rc == -1)
		return errno ? errno : EIO;
	return -rc;
}

static inline int sr_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr) {
	errno = 0;
	return sr_errno(ibv_query_port(ctx, port, attr));
}

static inline struct ibv_mr *sr_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
	return ibv_reg_mr(pd, addr, len, access);
}

static inline int sr_req_notify_cq(struct ibv_cq *cq) {
	errno = 0;
	return sr_errno(ibv_req_notify_cq(cq, 0));
}

static inline int sr_req_notify_cq_sol(struct ibv_cq *cq, int solicited_only) {
	errno = 0;
	return sr_errno(ibv_req_notify_cq(cq, solicited_only));
}

// sr_get_cq_event_of reads one event of a (non-blocking) completion
// channel and returns its CQ in *out: 0, EAGAIN when there is none, or
// another errno.
static inline int sr_get_cq_event_of(struct ibv_comp_channel *ch, struct ibv_cq **out) {
	void *cq_ctx;
	errno = 0;
	if (ibv_get_cq_event(ch, out, &cq_ctx) == 0)
		return 0;
	return errno ? errno : EIO;
}

// sr_get_cq_event reads one event of a (non-blocking) completion channel:
// 0, EAGAIN when there is none, or another errno.
static inline int sr_get_cq_event(struct ibv_comp_channel *ch) {
	struct ibv_cq *cq;
	void *cq_ctx;
	errno = 0;
	if (ibv_get_cq_event(ch, &cq, &cq_ctx) == 0)
		return 0;
	return errno ? errno : EIO;
}

// sr_wc is struct ibv_wc without its anonymous union; imm is in host order.
struct sr_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm;
	uint32_t qp_num;
	uint32_t src_qp;
	uint32_t wc_flags;
	uint16_t pkey_index;
	uint16_t slid;
	uint8_t sl;
	uint8_t dlid_path_bits;
};

// sr_poll_cq polls up to n completions through tmp into out: the number
// polled, or a negated errno.
static inline int sr_poll_cq(struct ibv_cq *cq, struct ibv_wc *tmp, struct sr_wc *out, int n) {
	errno = 0;
	int r = ibv_poll_cq(cq, n, tmp);
	if (r < 0)
		return -sr_errno(r);
	for (int i = 0; i < r; i++) {
		struct ibv_wc *w = &tmp[i];
		struct sr_wc *o = &out[i];
		o->wr_id = w->wr_id;
		o->status = w->status;
		o->opcode = w->opcode;
		o->vendor_err = w->vendor_err;
		o->byte_len = w->byte_len;
		o->imm = (w->wc_flags & IBV_WC_WITH_IMM) ? be32toh(w->imm_data) : 0;
		o->qp_num = w->qp_num;
		o->src_qp = w->src_qp;
		o->wc_flags = w->wc_flags;
		o->pkey_index = w->pkey_index;
		o->slid = w->slid;
		o->sl = w->sl;
		o->dlid_path_bits = w->dlid_path_bits;
	}
	return r;
}

// sr_now_ns is CLOCK_MONOTONIC in ns (the vDSO: no system call).
static inline int64_t sr_now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// sr_poll_cq_spin is sr_poll_cq repeated while the CQ is empty, for up to
// spin_ns: a busy poll that crosses from Go into C once instead of once per
// empty poll. spin_ns 0 polls once.
static inline int sr_poll_cq_spin(struct ibv_cq *cq, struct ibv_wc *tmp, struct sr_wc *out, int n, int64_t spin_ns) {
	int r = sr_poll_cq(cq, tmp, out, n);
	if (r != 0 || spin_ns <= 0)
		return r;
	int64_t end = sr_now_ns() + spin_ns;
	do {
		r = sr_poll_cq(cq, tmp, out, n);
	} while (r == 0 && sr_now_ns() < end);
	return r;
}

// Outcomes of sr_cq_wait_poll that return no completion (sr_wait.why).
enum {
	SR_WAIT_AGAIN = 1,  // nothing queued, no event pending (kick < 0: the caller waits)
	SR_WAIT_KICKED,     // the kick fd was written (and is drained)
	SR_WAIT_TIMEOUT,    // timeout_ns passed, or a signal interrupted ppoll
	SR_WAIT_OTHER,      // the channel's next event was for another CQ: in other
	SR_ERR_POLL,        // errors: which call failed (the result is its -errno)
	SR_ERR_NOTIFY,
	SR_ERR_EVENT,
	SR_ERR_PPOLL,
};

// sr_wait is the state of one waiter of sr_cq_wait_poll, kept between
// calls: armed says that the CQ was armed (ibv_req_notify_cq) and its event
// not taken since, so an empty poll goes on to the channel.
struct sr_wait {
	int armed;
	int why;
	struct ibv_cq *other;
};

// sr_cq_wait_poll is the loop of rdma_get_recv_comp on a CQ whose channel
// ch serves it (the Go side checks that it serves it alone; an event for
// another CQ is handed back in st->other): poll up to n completions; while
// none is queued arm the CQ, poll again, take the channel's event and
// acknowledge it. ch->fd is non-blocking: with no event pending and kick
// < 0 it returns (SR_WAIT_AGAIN) for the caller to wait for the fd; with a
// kick fd it sleeps in ppoll on both, at most timeout_ns. The result is the
// number of completions, 0 with st->why, or -errno with st->why the call
// that failed.
static inline int sr_cq_wait_poll(struct ibv_cq *cq, struct ibv_comp_channel *ch, int kick, int64_t timeout_ns,
				  struct ibv_wc *tmp, struct sr_wc *out, int n, struct sr_wait *st) {
	for (;;) {
		int r = sr_poll_cq(cq, tmp, out, n);
		if (r < 0)
			st->why = SR_ERR_POLL;
		if (r != 0)
			return r;
		if (!st->armed) {
			int rc = sr_req_notify_cq(cq);
			if (rc != 0) {
				st->why = SR_ERR_NOTIFY;
				return -rc;
			}
			st->armed = 1;
			continue; // armed, then checked: a completion after the check raises an event
		}
		struct ibv_cq *ev;
		void *ev_ctx;
		errno = 0;
		if (ibv_get_cq_event(ch, &ev, &ev_ctx) == 0) {
			if (ev != cq) {
				st->other = ev;
				st->why = SR_WAIT_OTHER;
				return 0;
			}
			ibv_ack_cq_events(cq, 1);
			st->armed = 0;
			continue;
		}
		if (errno != EAGAIN && errno != EWOULDBLOCK) {
			st->why = SR_ERR_EVENT;
			return -(errno ? errno : EIO);
		}
		if (kick < 0) {
			st->why = SR_WAIT_AGAIN;
			return 0;
		}
		struct pollfd p[2] = {{.fd = ch->fd, .events = POLLIN}, {.fd = kick, .events = POLLIN}};
		struct timespec ts = {.tv_sec = timeout_ns / 1000000000, .tv_nsec = timeout_ns % 1000000000};
		int pr = ppoll(p, 2, &ts, NULL);
		if (pr < 0 && errno != EINTR) {
			st->why = SR_ERR_PPOLL;
			return -errno;
		}
		if (pr <= 0) {
			st->why = SR_WAIT_TIMEOUT;
			return 0;
		}
		if (p[1].revents) {
			uint64_t v;
			if (read(kick, &v, sizeof v) < 0) {
				// EAGAIN: another reader drained it; either way, kicked
			}
			st->why = SR_WAIT_KICKED;
			return 0;
		}
	}
}

// sr_send is a UD send work request without unions; imm in host order.
// Its scatter/gather list is sge[i*max_sge .. i*max_sge+num_sge) of the
// array given to sr_post_send.
struct sr_send {
	uint64_t wr_id;
	struct ibv_ah *ah;
	uint32_t remote_qpn;
	uint32_t remote_qkey;
	uint32_t opcode;
	uint32_t send_flags;
	uint32_t imm;
	uint32_t num_sge;
};

// sr_post_send posts in[0..n) as one chain built in wr: 0, or the errno in
// the low 32 bits and the index of the failed request in the high ones.
static inline int64_t sr_post_send(struct ibv_qp *qp, const struct sr_send *in, struct ibv_send_wr *wr,
				   struct ibv_sge *sge, int n, int max_sge) {
	for (int i = 0; i < n; i++) {
		struct ibv_send_wr *w = &wr[i];
		memset(w, 0, sizeof(*w));
		w->wr_id = in[i].wr_id;
		w->next = i + 1 < n ? &wr[i + 1] : NULL;
		w->sg_list = &sge[i * max_sge];
		w->num_sge = (int)in[i].num_sge;
		w->opcode = (enum ibv_wr_opcode)in[i].opcode;
		w->send_flags = in[i].send_flags;
		w->imm_data = htobe32(in[i].imm);
		w->wr.ud.ah = in[i].ah;
		w->wr.ud.remote_qpn = in[i].remote_qpn;
		w->wr.ud.remote_qkey = in[i].remote_qkey;
	}
	struct ibv_send_wr *bad = NULL;
	errno = 0;
	int rc = sr_errno(ibv_post_send(qp, wr, &bad));
	if (rc == 0)
		return 0;
	int64_t idx = bad ? (int64_t)(bad - wr) : 0;
	if (idx < 0 || idx >= n)
		idx = 0;
	return (idx << 32) | (int64_t)(uint32_t)rc;
}

// sr_post_recv posts the chain wr[0..n) (its next pointers set here); the
// result is encoded as sr_post_send's.
static inline int64_t sr_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, int n) {
	for (int i = 0; i < n; i++)
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	struct ibv_recv_wr *bad = NULL;
	errno = 0;
	int rc = sr_errno(ibv_post_recv(qp, wr, &bad));
	if (rc == 0)
		return 0;
	int64_t idx = bad ? (int64_t)(bad - wr) : 0;
	if (idx < 0 || idx >= n)
		idx = 0;
	return (idx << 32) | (int64_t)(uint32_t)rc;
}

// sr_get_async_event reads one asynchronous event of a context whose
// async_fd is non-blocking, acknowledges it at once (the Go side keeps no
// reference to its element) and returns its type and, for a port event,
// its port: 0, EAGAIN when there is none, or another errno.
static inline int sr_get_async_event(struct ibv_context *ctx, int *type, int *port) {
	struct ibv_async_event ev;
	errno = 0;
	if (ibv_get_async_event(ctx, &ev) != 0)
		return errno ? errno : EIO;
	*type = ev.event_type;
	*port = 0;
	switch (ev.event_type) {
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		*port = ev.element.port_num;
		break;
	default:
		break;
	}
	ibv_ack_async_event(&ev);
	return 0;
}

// The data path's calls with their pointers as integers (sr_*_u). Every
// pointer they take is C memory (ibv objects, calloc'd scratch); passed as
// a pointer type that may hold pointers, each would cost a cgo pointer check
// per call (cgocheck=1, Go's default: a heap lookup for each argument), which
// was 14% of a busy poll's CPU in the interop guests.
static inline int sr_poll_cq_spin_u(uintptr_t cq, uintptr_t tmp, uintptr_t out, int n, int64_t spin_ns) {
	return sr_poll_cq_spin((struct ibv_cq *)cq, (struct ibv_wc *)tmp, (struct sr_wc *)out, n, spin_ns);
}

static inline int sr_cq_wait_poll_u(uintptr_t cq, uintptr_t ch, int kick, int64_t timeout_ns, uintptr_t tmp, uintptr_t out,
				    int n, uintptr_t st) {
	return sr_cq_wait_poll((struct ibv_cq *)cq, (struct ibv_comp_channel *)ch, kick, timeout_ns, (struct ibv_wc *)tmp,
			       (struct sr_wc *)out, n, (struct sr_wait *)st);
}

static inline int64_t sr_post_send_u(uintptr_t qp, uintptr_t in, uintptr_t wr, uintptr_t sge, int n, int max_sge) {
	return sr_post_send((struct ibv_qp *)qp, (const struct sr_send *)in, (struct ibv_send_wr *)wr, (struct ibv_sge *)sge, n,
			    max_sge);
}

static inline int64_t sr_post_recv_u(uintptr_t qp, uintptr_t wr, int n) {
	return sr_post_recv((struct ibv_qp *)qp, (struct ibv_recv_wr *)wr, n);
}

#endif
