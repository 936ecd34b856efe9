// conformance: the cases of softrdma's conformance suite (test/conformance)
// written in C against librdmacm and libibverbs, so that one binary runs
// on softrdma through `softrdma exec` and on the kernel's rxe with
// rdma-core's own libraries, and the two outputs can be compared line by
// line. Every check prints one line:
//
//	<case> <check> <outcome>
//
// where the outcome is OK, an errno name, an event name or what was seen,
// never an address, port or pointer, so that two runs on different hosts
// print the same lines. A step a case needs that fails prints
// "<case> setup-<step> FAILED <errno>" and ends the case.
//
// Usage: conformance -a ADDR [-u UNREACH] [-s SRC] [-g N]
//
//	-a  the local IPv4 address ids bind to (its device's RoCE v2 GID)
//	-u  an IPv4 address without a route (the resolve-unreachable cases;
//	    without it they print SKIP)
//	-s  the source for resolve-unreachable-from-src: an address on a link
//	    where nothing answers ARP (default ADDR)
//	-g  the second byte of the run's groups, 239.N.x.y (default random),
//	    so that two runs on one network use groups of their own
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/capability.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

static struct in_addr local, unreach, unreach_src;
static int have_unreach;
static unsigned group_base, group_seq;

// Output.

static void out(const char *cs, const char *check, const char *fmt, ...)
{
	va_list ap;
	printf("%s %s ", cs, check);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

static const char *errname(int e)
{
	static char buf[32];
	switch (e) {
	case 0: return "OK";
	case EINVAL: return "EINVAL";
	case EOPNOTSUPP: return "EOPNOTSUPP";
	case EADDRNOTAVAIL: return "EADDRNOTAVAIL";
	case ENODEV: return "ENODEV";
	case ENOMEM: return "ENOMEM";
	case ENETUNREACH: return "ENETUNREACH";
	case ETIMEDOUT: return "ETIMEDOUT";
	case EAGAIN: return "EAGAIN";
	case EBUSY: return "EBUSY";
	case EADDRINUSE: return "EADDRINUSE";
	case ENOSYS: return "ENOSYS";
	case EPERM: return "EPERM";
	case EHOSTUNREACH: return "EHOSTUNREACH";
	case ENOENT: return "ENOENT";
	case 524: return "ENOTSUPP(524)";
	case EAFNOSUPPORT: return "EAFNOSUPPORT";
	case EPROTONOSUPPORT: return "EPROTONOSUPPORT";
	case EACCES: return "EACCES";
	case EBADF: return "EBADF";
	case ENOSPC: return "ENOSPC";
	}
	snprintf(buf, sizeof buf, "errno%d", e);
	return buf;
}

// cm names a librdmacm call's outcome (0, or -1 and errno).
static const char *cm(int rc) { return rc == 0 ? "OK" : errname(errno); }

// vb names a verbs call's outcome (0 or an errno value).
static const char *vb(int rc) { return errname(rc); }

#define SETUP_FAILED(cs, step, e)                                         \
	do {                                                               \
		out(cs, "setup-" step, "FAILED %s", errname(e));         \
		return;                                                    \
	} while (0)

// Addresses.

static struct sockaddr_in sin4(struct in_addr a, uint16_t port)
{
	struct sockaddr_in s = { .sin_family = AF_INET, .sin_port = htons(port), .sin_addr = a };
	return s;
}

// group returns a multicast group no other case of the run uses.
static struct sockaddr_in group(void)
{
	unsigned n = group_seq++;
	struct in_addr a = { htonl(0xef000000u | (group_base << 16) | ((n / 250) << 8) | (n % 250 + 1)) };
	return sin4(a, 0);
}

static int is_v4_gid(const union ibv_gid *g, struct in_addr a)
{
	static const uint8_t prefix[12] = { [10] = 0xff, [11] = 0xff };
	return memcmp(g->raw, prefix, 12) == 0 && memcmp(g->raw + 12, &a, 4) == 0;
}

static int elapsed_ms(const struct timespec *since)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (now.tv_sec - since->tv_sec) * 1000 + (now.tv_nsec - since->tv_nsec) / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

// The RDMA CM.

// readable tells whether the channel has an event queued (waiting up to ms).
static int readable(struct rdma_event_channel *ch, int ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	return poll(&p, 1, ms) == 1;
}

// event waits up to 20 s for the channel's next event (NULL: none).
static struct rdma_cm_event *event(struct rdma_event_channel *ch)
{
	struct rdma_cm_event *ev = NULL;
	if (!readable(ch, 20000) || rdma_get_cm_event(ch, &ev))
		return NULL;
	return ev;
}

static struct rdma_cm_id *new_id(struct rdma_event_channel *ch, enum rdma_port_space ps)
{
	struct rdma_cm_id *id = NULL;
	if (rdma_create_id(ch, &id, NULL, ps))
		return NULL;
	return id;
}

static int bind_to(struct rdma_cm_id *id, struct in_addr a, uint16_t port)
{
	struct sockaddr_in s = sin4(a, port);
	return rdma_bind_addr(id, (struct sockaddr *)&s);
}

// bound returns a UD id bound to the local address (NULL: failed).
static struct rdma_cm_id *bound(struct rdma_event_channel *ch)
{
	struct rdma_cm_id *id = new_id(ch, RDMA_PS_UDP);
	if (id && bind_to(id, local, 0)) {
		int e = errno;
		rdma_destroy_id(id);
		errno = e;
		return NULL;
	}
	return id;
}

static int join_ex(struct rdma_cm_id *id, void *addr, uint32_t flags, void *ctx)
{
	struct rdma_cm_join_mc_attr_ex a = {
		.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
		.join_flags = flags,
		.addr = addr,
	};
	return rdma_join_multicast_ex(id, &a, ctx);
}

// joined joins g and returns the JOIN event's UD parameters (its AH);
// 0 on success.
static int joined(struct rdma_event_channel *ch, struct rdma_cm_id *id, struct sockaddr_in *g, uint32_t flags,
		  struct rdma_ud_param *p)
{
	if (join_ex(id, g, flags, g))
		return errno;
	struct rdma_cm_event *ev = event(ch);
	if (!ev)
		return ETIMEDOUT;
	int ok = ev->event == RDMA_CM_EVENT_MULTICAST_JOIN && ev->id == id;
	if (p)
		*p = ev->param.ud;
	rdma_ack_cm_event(ev);
	return ok ? 0 : EPROTO;
}

// Endpoints: an id's UD QP with a ring of receives and a send buffer.

#define GRH 40
#define SLOT (GRH + 256)

struct ep {
	struct rdma_cm_id *id;
	struct ibv_mr *rmr, *smr;
	uint8_t *rbuf, sbuf[256];
	int n;
};

static int endpoint(struct ep *e, struct rdma_cm_id *id, int n)
{
	memset(e, 0, sizeof *e);
	e->id = id;
	e->n = n;
	struct ibv_qp_init_attr a = {
		.qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = n, .max_recv_wr = n, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	if (rdma_create_qp(id, NULL, &a))
		return errno;
	e->rbuf = calloc(n, SLOT);
	e->rmr = ibv_reg_mr(id->pd, e->rbuf, n * SLOT, IBV_ACCESS_LOCAL_WRITE);
	e->smr = ibv_reg_mr(id->pd, e->sbuf, sizeof e->sbuf, IBV_ACCESS_LOCAL_WRITE);
	if (!e->rmr || !e->smr)
		return errno;
	for (int i = 0; i < n; i++) {
		struct ibv_sge sge = { (uintptr_t)e->rbuf + i * SLOT, SLOT, e->rmr->lkey };
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;
		int r = ibv_post_recv(id->qp, &wr, &bad);
		if (r)
			return r;
	}
	return 0;
}

static void ep_close(struct ep *e)
{
	if (e->id && e->id->qp)
		rdma_destroy_qp(e->id);
	if (e->rmr)
		ibv_dereg_mr(e->rmr);
	if (e->smr)
		ibv_dereg_mr(e->smr);
	free(e->rbuf);
	if (e->id)
		rdma_destroy_id(e->id);
	memset(e, 0, sizeof *e);
}

// poll_one waits up to 10 s for a completion of cq.
static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	struct timespec start;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n < 0 ? EIO : 0;
		if (elapsed_ms(&start) > 10000)
			return ETIMEDOUT;
		sleep_ms(1);
	}
}

// send sends n messages "<tag> i" to the group of p through a new AH.
static int ep_send(struct ep *e, struct rdma_ud_param *p, const char *tag, int n)
{
	struct ibv_ah *ah = ibv_create_ah(e->id->pd, &p->ah_attr);
	if (!ah)
		return errno;
	int err = 0;
	for (int i = 0; i < n && !err; i++) {
		int len = snprintf((char *)e->sbuf, sizeof e->sbuf, "%s %d", tag, i);
		struct ibv_sge sge = { (uintptr_t)e->sbuf, len, e->smr->lkey };
		struct ibv_send_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = p->qp_num;
		wr.wr.ud.remote_qkey = p->qkey;
		if ((err = ibv_post_send(e->id->qp, &wr, &bad)))
			break;
		struct ibv_wc wc;
		if ((err = poll_one(e->id->send_cq, &wc)))
			break;
		if (wc.status != IBV_WC_SUCCESS)
			err = EIO;
	}
	ibv_destroy_ah(ah);
	return err;
}

// recv waits for n messages and appends "<payload>;" for each to got.
static int ep_recv(struct ep *e, int n, char *got, size_t size)
{
	for (int i = 0; i < n; i++) {
		struct ibv_wc wc;
		int err = poll_one(e->id->recv_cq, &wc);
		if (err)
			return err;
		if (wc.status != IBV_WC_SUCCESS)
			return EIO;
		uint8_t *slot = e->rbuf + wc.wr_id * SLOT;
		size_t len = strlen(got);
		snprintf(got + len, size - len, "%.*s;", (int)(wc.byte_len - GRH), (char *)slot + GRH);
		struct ibv_sge sge = { (uintptr_t)slot, SLOT, e->rmr->lkey };
		struct ibv_recv_wr wr = { .wr_id = wc.wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
		if ((err = ibv_post_recv(e->id->qp, &wr, &bad)))
			return err;
	}
	return 0;
}

// pending counts the completions queued on the endpoint's receive CQ.
static int pending(struct ep *e)
{
	struct ibv_wc wc[16];
	int n = 0, k;
	while ((k = ibv_poll_cq(e->id->recv_cq, 16, wc)) > 0)
		n += k;
	return n;
}

// The cases.

static void join_validation(void)
{
	const char *cs = "join-validation";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = bound(ch), *unbound = new_id(ch, RDMA_PS_UDP), *tcp = new_id(ch, RDMA_PS_TCP);
	if (!id || !unbound || !tcp)
		SETUP_FAILED(cs, "ids", errno);
	if (bind_to(tcp, local, 0))
		SETUP_FAILED(cs, "bind-tcp", errno);
	struct sockaddr_in g = group(), any = sin4((struct in_addr){ 0 }, 0);
	struct sockaddr_un un = { .sun_family = AF_UNIX, .sun_path = "/x" };
	uint32_t both = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
	struct {
		const char *name;
		struct rdma_cm_id *id;
		struct rdma_cm_join_mc_attr_ex a;
	} cases[] = {
		{ "reserved-comp-mask", id, { .comp_mask = both | RDMA_CM_JOIN_MC_ATTR_RESERVED, .addr = (void *)&g } },
		{ "no-address-bit", id, { .comp_mask = RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS, .addr = (void *)&g } },
		{ "no-join-flags-bit", id, { .comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS, .addr = (void *)&g } },
		{ "flags-2", id, { .comp_mask = both, .join_flags = 2, .addr = (void *)&g } },
		{ "nil-address", id, { .comp_mask = both } },
		{ "unix-address", id, { .comp_mask = both, .addr = (void *)&un } },
		{ "unbound-id", unbound, { .comp_mask = both, .addr = (void *)&g } },
		{ "ps-tcp-id", tcp, { .comp_mask = both, .addr = (void *)&g } },
		{ "wildcard-group", id, { .comp_mask = both, .addr = (void *)&any } },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		out(cs, cases[i].name, "%s", cm(rdma_join_multicast_ex(cases[i].id, &cases[i].a, NULL)));
	out(cs, "events-queued", "%d", readable(ch, 0));
	rdma_destroy_id(id);
	rdma_destroy_id(unbound);
	rdma_destroy_id(tcp);
	rdma_destroy_event_channel(ch);
}

static void join_event(void)
{
	const char *cs = "join-event";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = bound(ch);
	if (!id)
		SETUP_FAILED(cs, "bind", errno);
	struct sockaddr_in g = group();
	static int ctx;
	if (join_ex(id, &g, RDMA_MC_JOIN_FLAG_FULLMEMBER, &ctx))
		SETUP_FAILED(cs, "join", errno);
	struct rdma_cm_event *ev = event(ch);
	if (!ev)
		SETUP_FAILED(cs, "event", ETIMEDOUT);
	struct rdma_ud_param p = ev->param.ud;
	out(cs, "event", "%s/%d id=%s", rdma_event_str(ev->event), ev->status, ev->id == id ? "same" : "other");
	out(cs, "context", "%s", p.private_data == &ctx ? "the-join's" : "other");
	out(cs, "qpn-qkey", "%#x/%#x", p.qp_num, p.qkey);
	struct ibv_ah_attr *a = &p.ah_attr;
	out(cs, "dgid-is-group", "%s", is_v4_gid(&a->grh.dgid, g.sin_addr) ? "true" : "false");
	out(cs, "is-global-port", "%d/%d", a->is_global, a->port_num);
	union ibv_gid sgid;
	struct ibv_gid_entry ge;
	int r = ibv_query_gid(id->verbs, a->port_num, a->grh.sgid_index, &sgid);
	int r2 = ibv_query_gid_ex(id->verbs, a->port_num, a->grh.sgid_index, &ge, 0);
	out(cs, "sgid", "%s/%s is-addr=%s type=%s", vb(r ? errno : 0), vb(r2), is_v4_gid(&sgid, local) ? "true" : "false",
	    r2 ? "-" : ge.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCEv2" : ge.gid_type == IBV_GID_TYPE_IB ? "IB" : "RoCEv1");
	out(cs, "ah", "hop_limit=%d traffic_class=%d flow_label=%u sl=%d dlid=%#x static_rate=%d", a->grh.hop_limit,
	    a->grh.traffic_class, a->grh.flow_label, a->sl, a->dlid, a->static_rate);
	rdma_ack_cm_event(ev);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

static void full_member_receives(void)
{
	const char *cs = "full-member-receives";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct sockaddr_in g = group();
	struct ep rx, tx;
	struct rdma_ud_param p;
	int e;
	if ((e = endpoint(&rx, bound(ch), 8)) || (e = joined(ch, rx.id, &g, RDMA_MC_JOIN_FLAG_FULLMEMBER, NULL)))
		SETUP_FAILED(cs, "receiver", e);
	if ((e = endpoint(&tx, bound(ch), 8)) || (e = joined(ch, tx.id, &g, RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, &p)))
		SETUP_FAILED(cs, "sender", e);
	if ((e = ep_send(&tx, &p, "full", 5)))
		SETUP_FAILED(cs, "send", e);
	char got[256] = "";
	e = ep_recv(&rx, 5, got, sizeof got);
	out(cs, "received", "%s %s", vb(e), got);
	ep_close(&tx);
	ep_close(&rx);
	rdma_destroy_event_channel(ch);
}

static void send_only(void)
{
	const char *cs = "send-only-never-receives";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct sockaddr_in g = group();
	struct ep full, so, other;
	struct rdma_ud_param p, op;
	int e;
	if ((e = endpoint(&full, bound(ch), 16)) || (e = joined(ch, full.id, &g, RDMA_MC_JOIN_FLAG_FULLMEMBER, NULL)))
		SETUP_FAILED(cs, "full", e);
	if ((e = endpoint(&so, bound(ch), 16)) || (e = joined(ch, so.id, &g, RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, &p)))
		SETUP_FAILED(cs, "send-only", e);
	if ((e = endpoint(&other, bound(ch), 16)) ||
	    (e = joined(ch, other.id, &g, RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, &op)))
		SETUP_FAILED(cs, "other", e);
	if ((e = ep_send(&so, &p, "so", 3)) || (e = ep_send(&other, &op, "other", 3)))
		SETUP_FAILED(cs, "send", e);
	char got[256] = "";
	e = ep_recv(&full, 6, got, sizeof got);
	out(cs, "full-member", "%s %s", vb(e), got);
	// Delivery to every attached QP happens together: once the full
	// member has all six, a send-only QP would have them too.
	out(cs, "send-only-received", "%d", pending(&so) + pending(&other));
	ep_close(&other);
	ep_close(&so);
	ep_close(&full);
	rdma_destroy_event_channel(ch);
}

static void manual_attach(void)
{
	const char *cs = "manual-attach-without-qp";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct sockaddr_in g = group();
	struct rdma_cm_id *id = bound(ch);
	struct rdma_ud_param p, tp;
	int e;
	if (!id)
		SETUP_FAILED(cs, "bind", errno);
	if ((e = joined(ch, id, &g, RDMA_MC_JOIN_FLAG_FULLMEMBER, &p)))
		SETUP_FAILED(cs, "join", e);
	struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
	struct ibv_cq *cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
	if (!pd || !cq)
		SETUP_FAILED(cs, "pd-cq", errno);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { .max_send_wr = 1, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		SETUP_FAILED(cs, "create-qp", errno);
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = p.qkey };
	int r = ibv_modify_qp(qp, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
	out(cs, "modify-init", "%s", vb(r));
	qa = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR };
	out(cs, "modify-rtr", "%s", vb(ibv_modify_qp(qp, &qa, IBV_QP_STATE)));
	qa = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS };
	out(cs, "modify-rts", "%s", vb(ibv_modify_qp(qp, &qa, IBV_QP_STATE | IBV_QP_SQ_PSN)));
	out(cs, "attach", "%s", vb(ibv_attach_mcast(qp, &p.ah_attr.grh.dgid, p.ah_attr.dlid)));
	uint8_t *buf = calloc(4, SLOT);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4 * SLOT, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		SETUP_FAILED(cs, "reg-mr", errno);
	for (int i = 0; i < 4; i++) {
		struct ibv_sge sge = { (uintptr_t)buf + i * SLOT, SLOT, mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;
		if ((e = ibv_post_recv(qp, &wr, &bad)))
			SETUP_FAILED(cs, "post-recv", e);
	}
	struct ep tx;
	if ((e = endpoint(&tx, bound(ch), 4)) || (e = joined(ch, tx.id, &g, RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, &tp)))
		SETUP_FAILED(cs, "sender", e);
	if ((e = ep_send(&tx, &tp, "manual", 3)))
		SETUP_FAILED(cs, "send", e);
	char got[256] = "";
	for (int i = 0; i < 3 && !e; i++) {
		struct ibv_wc wc;
		if ((e = poll_one(cq, &wc)))
			break;
		size_t len = strlen(got);
		snprintf(got + len, sizeof got - len, "%.*s;", (int)(wc.byte_len - GRH), (char *)buf + wc.wr_id * SLOT + GRH);
	}
	out(cs, "received", "%s %s", vb(e), got);
	out(cs, "detach", "%s", vb(ibv_detach_mcast(qp, &p.ah_attr.grh.dgid, p.ah_attr.dlid)));
	ep_close(&tx);
	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	free(buf);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

static void several_ids(void)
{
	const char *cs = "several-ids-one-group";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct sockaddr_in g = group();
	struct ep rx[3], tx;
	struct rdma_ud_param p;
	int e;
	for (int i = 0; i < 3; i++)
		if ((e = endpoint(&rx[i], bound(ch), 8)) || (e = joined(ch, rx[i].id, &g, RDMA_MC_JOIN_FLAG_FULLMEMBER, NULL)))
			SETUP_FAILED(cs, "receiver", e);
	if ((e = endpoint(&tx, bound(ch), 8)) || (e = joined(ch, tx.id, &g, RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, &p)))
		SETUP_FAILED(cs, "sender", e);
	if ((e = ep_send(&tx, &p, "many", 4)))
		SETUP_FAILED(cs, "send", e);
	for (int i = 0; i < 3; i++) {
		char got[256] = "", name[8];
		e = ep_recv(&rx[i], 4, got, sizeof got);
		snprintf(name, sizeof name, "id%d", i);
		out(cs, name, "%s %s", vb(e), got);
	}
	ep_close(&tx);
	for (int i = 0; i < 3; i++)
		ep_close(&rx[i]);
	rdma_destroy_event_channel(ch);
}

// A call on a thread of its own, to see whether it waits.
struct waiter {
	pthread_t th;
	struct rdma_cm_id *id;
	struct sockaddr_in g; // leave g; destroy the id if g.sin_family is 0
	volatile int done;
	int rc, err;
};

static void *waiter_run(void *arg)
{
	struct waiter *w = arg;
	if (w->g.sin_family)
		w->rc = rdma_leave_multicast(w->id, (struct sockaddr *)&w->g);
	else
		w->rc = rdma_destroy_id(w->id);
	w->err = errno;
	__atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

// waits starts w, tells whether it is still running after 300 ms, then
// acks ev and returns the call's outcome in w.
static int waits(struct waiter *w, struct rdma_cm_event *ev)
{
	pthread_create(&w->th, NULL, waiter_run, w);
	sleep_ms(300);
	int waiting = !__atomic_load_n(&w->done, __ATOMIC_SEQ_CST);
	rdma_ack_cm_event(ev);
	pthread_join(w->th, NULL);
	errno = w->err;
	return waiting;
}

static void leave_rules(void)
{
	const char *cs = "leave-rules";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = bound(ch);
	if (!id)
		SETUP_FAILED(cs, "bind", errno);
	struct sockaddr_in g1 = group(), g2 = group(), g3 = group();
	out(cs, "unknown-group", "%s", cm(rdma_leave_multicast(id, (struct sockaddr *)&g1)));
	// Unread: g1's JOIN event is never retrieved once g1 is left.
	if (join_ex(id, &g1, RDMA_MC_JOIN_FLAG_FULLMEMBER, &g1))
		SETUP_FAILED(cs, "join-g1", errno);
	out(cs, "leave-unread", "%s", cm(rdma_leave_multicast(id, (struct sockaddr *)&g1)));
	if (join_ex(id, &g2, RDMA_MC_JOIN_FLAG_FULLMEMBER, &g2))
		SETUP_FAILED(cs, "join-g2", errno);
	struct rdma_cm_event *ev = event(ch);
	if (!ev)
		SETUP_FAILED(cs, "event-g2", ETIMEDOUT);
	out(cs, "next-event-after-leave", "%s/%s", rdma_event_str(ev->event), ev->param.ud.private_data == &g2 ? "g2" : "other");
	rdma_ack_cm_event(ev);
	// Retrieved, not acked: the leave waits for the ack.
	if (join_ex(id, &g3, RDMA_MC_JOIN_FLAG_FULLMEMBER, &g3))
		SETUP_FAILED(cs, "join-g3", errno);
	if (!(ev = event(ch)))
		SETUP_FAILED(cs, "event-g3", ETIMEDOUT);
	struct waiter w = { .id = id, .g = g3 };
	out(cs, "waits-for-ack", "%s", waits(&w, ev) ? "true" : "false");
	out(cs, "leave-after-ack", "%s", cm(w.rc));
	out(cs, "leave-g2", "%s", cm(rdma_leave_multicast(id, (struct sockaddr *)&g2)));
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

static void destroy_with_joins(void)
{
	const char *cs = "destroy-with-joins";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = bound(ch);
	if (!id)
		SETUP_FAILED(cs, "bind", errno);
	struct sockaddr_in g1 = group(), g2 = group(), g3 = group();
	int e;
	if ((e = joined(ch, id, &g1, RDMA_MC_JOIN_FLAG_FULLMEMBER, NULL)))
		SETUP_FAILED(cs, "join-g1", e);
	if (join_ex(id, &g2, RDMA_MC_JOIN_FLAG_FULLMEMBER, &g2))
		SETUP_FAILED(cs, "join-g2", errno);
	struct rdma_cm_event *ev = event(ch); // retrieved, not acked
	if (!ev)
		SETUP_FAILED(cs, "event-g2", ETIMEDOUT);
	if (join_ex(id, &g3, RDMA_MC_JOIN_FLAG_FULLMEMBER, NULL))
		SETUP_FAILED(cs, "join-g3", errno);
	struct waiter w = { .id = id };
	out(cs, "waits-for-ack", "%s", waits(&w, ev) ? "true" : "false");
	out(cs, "destroy", "%s", cm(w.rc));
	out(cs, "events-left", "%d", readable(ch, 0));
	rdma_destroy_event_channel(ch);
}

static void resolve_unreachable_from(const char *cs, int from_src)
{
	if (!have_unreach) {
		out(cs, "resolve", "SKIP no address without a route (-u)");
		return;
	}
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = new_id(ch, RDMA_PS_UDP);
	struct sockaddr_in src = sin4(unreach_src, 0), dst = sin4(unreach, 0);
	struct timespec start;
	clock_gettime(CLOCK_MONOTONIC, &start);
	int rc = rdma_resolve_addr(id, from_src ? (struct sockaddr *)&src : NULL, (struct sockaddr *)&dst, 2000);
	if (rc) {
		out(cs, "resolve", "call=%s", cm(rc));
	} else {
		struct rdma_cm_event *ev = event(ch);
		if (!ev) {
			out(cs, "resolve", "call=OK event=none");
		} else {
			out(cs, "resolve", "call=OK event=%s status=%d", rdma_event_str(ev->event), ev->status);
			rdma_ack_cm_event(ev);
			out(cs, "after-timeout", "%s", elapsed_ms(&start) >= 1900 ? "true" : "false");
		}
	}
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

static void ipv6_group(void)
{
	const char *cs = "ipv6-group-on-ipv4-id";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = bound(ch);
	if (!id)
		SETUP_FAILED(cs, "bind", errno);
	struct sockaddr_in6 g6 = { .sin6_family = AF_INET6 };
	inet_pton(AF_INET6, "ff0e::db8:1234", &g6.sin6_addr);
	int rc = join_ex(id, &g6, RDMA_MC_JOIN_FLAG_FULLMEMBER, NULL);
	if (rc) {
		out(cs, "join", "call=%s", cm(rc));
	} else {
		struct rdma_cm_event *ev = event(ch);
		if (!ev) {
			out(cs, "join", "call=OK event=none");
		} else {
			out(cs, "join", "call=OK event=%s status=%d", rdma_event_str(ev->event), ev->status);
			rdma_ack_cm_event(ev);
		}
	}
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

static void block_self_lb(void)
{
	const char *cs = "block-self-mcast-lb";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = bound(ch);
	if (!id)
		SETUP_FAILED(cs, "bind", errno);
	struct ibv_qp_init_attr_ex a = {
		.qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS,
		.pd = id->pd,
		.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB,
	};
	out(cs, "create-qp", "%s", cm(rdma_create_qp_ex(id, &a)));
	if (id->qp)
		rdma_destroy_qp(id);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

static void attach_failure(void)
{
	const char *cs = "attach-failure";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct ep e;
	int err;
	if ((err = endpoint(&e, bound(ch), 1)))
		SETUP_FAILED(cs, "endpoint", err);
	struct sockaddr_in g = sin4((struct in_addr){ htonl(0x0ac80102) }, 0); // 10.200.1.2
	static int ctx;
	int rc = join_ex(e.id, &g, RDMA_MC_JOIN_FLAG_FULLMEMBER, &ctx);
	if (rc) {
		out(cs, "join", "call=%s", cm(rc));
	} else {
		struct rdma_cm_event *ev = event(ch);
		if (!ev) {
			out(cs, "join", "call=OK event=none");
		} else {
			struct rdma_ud_param *p = &ev->param.ud;
			char dgid[INET6_ADDRSTRLEN];
			inet_ntop(AF_INET6, p->ah_attr.grh.dgid.raw, dgid, sizeof dgid);
			out(cs, "join", "call=OK event=%s status=%d ctx=%s qpn=%#x qkey=%#x dgid=%s", rdma_event_str(ev->event),
			    ev->status, p->private_data == &ctx ? "the-join's" : "other", p->qp_num, p->qkey, dgid);
			rdma_ack_cm_event(ev);
			out(cs, "leave", "%s", cm(rdma_leave_multicast(e.id, (struct sockaddr *)&g)));
		}
	}
	ep_close(&e);
	rdma_destroy_event_channel(ch);
}

struct racer {
	pthread_t th;
	struct sockaddr_in g;
	int worker;
	char err[128];
};

static void *racer_run(void *arg)
{
	struct racer *r = arg;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = ch ? bound(ch) : NULL;
	if (!id) {
		snprintf(r->err, sizeof r->err, "worker %d: bind: %s", r->worker, errname(errno));
		return NULL;
	}
	for (int round = 0; round < 10 && !r->err[0]; round++) {
		if (join_ex(id, &r->g, round % 2, r)) {
			snprintf(r->err, sizeof r->err, "worker %d round %d: join: %s", r->worker, round, errname(errno));
			break;
		}
		struct rdma_cm_event *ev = event(ch);
		if (!ev) {
			snprintf(r->err, sizeof r->err, "worker %d round %d: no event", r->worker, round);
			break;
		}
		enum rdma_cm_event_type typ = ev->event;
		rdma_ack_cm_event(ev);
		if (typ != RDMA_CM_EVENT_MULTICAST_JOIN)
			snprintf(r->err, sizeof r->err, "worker %d round %d: event %s", r->worker, round, rdma_event_str(typ));
		else if (rdma_leave_multicast(id, (struct sockaddr *)&r->g))
			snprintf(r->err, sizeof r->err, "worker %d round %d: leave: %s", r->worker, round, errname(errno));
	}
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	return NULL;
}

static void join_leave_race(void)
{
	const char *cs = "join-leave-race";
	struct racer r[4];
	struct sockaddr_in g = group();
	for (int i = 0; i < 4; i++) {
		memset(&r[i], 0, sizeof r[i]);
		r[i].g = g;
		r[i].worker = i;
		pthread_create(&r[i].th, NULL, racer_run, &r[i]);
	}
	int clean = 0;
	for (int i = 0; i < 4; i++) {
		pthread_join(r[i].th, NULL);
		if (r[i].err[0])
			fprintf(stderr, "%s: %s\n", cs, r[i].err);
		else
			clean++;
	}
	out(cs, "workers-clean", "%d", clean);
}

static void set_option(void)
{
	const char *cs = "set-option";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = bound(ch);
	if (!id)
		SETUP_FAILED(cs, "bind", errno);
	uint8_t u8_0 = 0, tos8 = 0xb8, u8_1 = 1, u8_14 = 14, path[10] = { 0 };
	int i1 = 1, i0 = 0, tos = 0xb8;
	struct {
		const char *name;
		int level, opt;
		void *val;
		size_t len;
	} cases[] = {
		{ "unknown-level", 7, 0, &u8_0, 1 },
		{ "unknown-id-option", RDMA_OPTION_ID, 9, &i1, sizeof i1 },
		{ "unknown-ib-option", RDMA_OPTION_IB, 0, NULL, 0 },
		{ "tos-uint8", RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos8, 1 },
		{ "tos-int", RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos },
		{ "reuseaddr-on-bound", RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &i1, sizeof i1 },
		{ "reuseaddr-off-bound", RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &i0, sizeof i0 },
		{ "reuseaddr-byte", RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &u8_1, 1 },
		{ "afonly-bound", RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &i1, sizeof i1 },
		{ "ack-timeout-ud", RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &u8_14, 1 },
		{ "ib-path-10-bytes", RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, path, sizeof path },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		out(cs, cases[i].name, "%s", cm(rdma_set_option(id, cases[i].level, cases[i].opt, cases[i].val, cases[i].len)));
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

static void tos_join(void)
{
	const char *cs = "tos-join";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct sockaddr_in g = group();
	struct ep rx, tx;
	struct rdma_ud_param p;
	uint8_t tos = 0xb8;
	int e;
	if ((e = endpoint(&rx, bound(ch), 1)) || (e = joined(ch, rx.id, &g, RDMA_MC_JOIN_FLAG_FULLMEMBER, NULL)))
		SETUP_FAILED(cs, "receiver", e);
	if ((e = endpoint(&tx, bound(ch), 1)))
		SETUP_FAILED(cs, "sender", e);
	if (rdma_set_option(tx.id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1))
		SETUP_FAILED(cs, "tos", errno);
	if ((e = joined(ch, tx.id, &g, RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, &p)))
		SETUP_FAILED(cs, "join", e);
	out(cs, "join-traffic-class", "%d", p.ah_attr.grh.traffic_class);
	p.ah_attr.grh.traffic_class = tos;
	if ((e = ep_send(&tx, &p, "tos", 1)))
		SETUP_FAILED(cs, "send", e);
	char got[64] = "";
	e = ep_recv(&rx, 1, got, sizeof got);
	// The GRH area of a RoCEv2 IPv4 datagram ends with its IPv4 header,
	// whose second byte is the TOS.
	out(cs, "received-tos", "%s %#x", vb(e), rx.rbuf[20 + 1]);
	ep_close(&tx);
	ep_close(&rx);
	rdma_destroy_event_channel(ch);
}

// bind_new binds a new id of port space ps to addr:port, with REUSEADDR
// first when reuse; the id is kept in ids for the case's end.
static const char *bind_new(struct rdma_event_channel *ch, struct rdma_cm_id **ids, int *n, enum rdma_port_space ps,
			    struct in_addr a, uint16_t port, int reuse)
{
	struct rdma_cm_id *id = new_id(ch, ps);
	if (!id)
		return errname(errno);
	ids[(*n)++] = id;
	int one = 1;
	if (reuse && rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one))
		return "setup-reuseaddr-failed";
	return cm(bind_to(id, a, port));
}

static void port_rules(void)
{
	const char *cs = "port-rules";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *first = bound(ch), *ids[8];
	int n = 0, one = 1;
	if (!first)
		SETUP_FAILED(cs, "bind", errno);
	uint16_t port = ntohs(rdma_get_src_port(first));
	out(cs, "same-address", "%s", bind_new(ch, ids, &n, RDMA_PS_UDP, local, port, 0));
	out(cs, "wildcard", "%s", bind_new(ch, ids, &n, RDMA_PS_UDP, (struct in_addr){ 0 }, port, 0));
	out(cs, "one-reuses", "%s", bind_new(ch, ids, &n, RDMA_PS_UDP, local, port, 1));
	if (rdma_set_option(first, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one))
		SETUP_FAILED(cs, "reuseaddr", errno);
	out(cs, "both-reuse", "%s", bind_new(ch, ids, &n, RDMA_PS_UDP, local, port, 1));
	out(cs, "src-port", "%s", ntohs(rdma_get_src_port(first)) == port && port != 0 ? "true" : "false");
	while (n > 0)
		rdma_destroy_id(ids[--n]);
	rdma_destroy_id(first);
	rdma_destroy_event_channel(ch);
}

#define CAP_BIND 10 // CAP_NET_BIND_SERVICE

static int has_cap(int bit)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];
	return syscall(SYS_capget, &h, d) == 0 && (d[0].effective & (1u << bit));
}

struct nocap {
	struct in_addr a;
	uint16_t port;
	const char *out;
	char err[64];
};

// nocap_run binds a new UDP id on a thread whose effective set lacks
// CAP_NET_BIND_SERVICE (capabilities are per thread; the channel and the
// id are made on that thread too: the kernel refuses a command on the
// RDMA CM's file from other credentials than the opener's).
static void *nocap_run(void *arg)
{
	struct nocap *c = arg;
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &h, d)) {
		snprintf(c->err, sizeof c->err, "capget %s", errname(errno));
		return NULL;
	}
	d[0].effective &= ~(1u << CAP_BIND);
	if (syscall(SYS_capset, &h, d)) {
		snprintf(c->err, sizeof c->err, "capset %s", errname(errno));
		return NULL;
	}
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = ch ? new_id(ch, RDMA_PS_UDP) : NULL;
	if (!id) {
		snprintf(c->err, sizeof c->err, "id %s", errname(errno));
		return NULL;
	}
	c->out = cm(bind_to(id, c->a, c->port));
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	return NULL;
}

static void port_spaces(void)
{
	const char *cs = "port-spaces";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *first = bound(ch), *ids[16];
	int n = 0;
	if (!first)
		SETUP_FAILED(cs, "bind", errno);
	uint16_t port = ntohs(rdma_get_src_port(first));
	out(cs, "udp-same-port", "%s", bind_new(ch, ids, &n, RDMA_PS_UDP, local, port, 0));
	out(cs, "tcp-same-port", "%s", bind_new(ch, ids, &n, RDMA_PS_TCP, local, port, 0));
	out(cs, "ib-same-port", "%s", bind_new(ch, ids, &n, RDMA_PS_IB, local, port, 0));
	out(cs, "ipoib-same-port", "%s", bind_new(ch, ids, &n, RDMA_PS_IPOIB, local, port, 0));
	uint16_t low = 900 + (getpid() + group_base) % 124;
	struct nocap c = { .a = local, .port = low };
	pthread_t th;
	pthread_create(&th, NULL, nocap_run, &c);
	pthread_join(th, NULL);
	out(cs, "privileged-without-cap", "%s", c.err[0] ? c.err : c.out);
	if (has_cap(CAP_BIND))
		out(cs, "privileged-with-cap", "%s", bind_new(ch, ids, &n, RDMA_PS_UDP, local, low, 0));
	enum rdma_port_space ps[] = { RDMA_PS_TCP, RDMA_PS_IB };
	const char *names[] = { "RDMA_PS_TCP-join", "RDMA_PS_IB-join" };
	for (int i = 0; i < 2; i++) {
		struct rdma_cm_id *id = new_id(ch, ps[i]);
		if (!id || bind_to(id, local, 0))
			SETUP_FAILED(cs, "bind-ps", errno);
		ids[n++] = id;
		struct sockaddr_in g = group();
		out(cs, names[i], "%s", cm(join_ex(id, &g, RDMA_MC_JOIN_FLAG_FULLMEMBER, NULL)));
	}
	out(cs, "events-queued", "%d", readable(ch, 0));
	while (n > 0)
		rdma_destroy_id(ids[--n]);
	rdma_destroy_id(first);
	rdma_destroy_event_channel(ch);
}

static void ipoib_join(void)
{
	const char *cs = "ipoib-join";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *wild = new_id(ch, RDMA_PS_IPOIB), *id = new_id(ch, RDMA_PS_IPOIB);
	if (!wild || !id || bind_to(wild, (struct in_addr){ 0 }, 0))
		SETUP_FAILED(cs, "bind-wildcard", errno);
	struct sockaddr_in g = group();
	out(cs, "wildcard-bound-join", "%s", cm(join_ex(wild, &g, RDMA_MC_JOIN_FLAG_FULLMEMBER, NULL)));
	out(cs, "bind", "%s", cm(bind_to(id, local, 0)));
	rdma_destroy_id(id);
	rdma_destroy_id(wild);
	rdma_destroy_event_channel(ch);
}

static void route_then_join(void)
{
	const char *cs = "route-then-join";
	struct rdma_event_channel *ch = rdma_create_event_channel();
	// other is bound, not resolved: librdmacm's rdma_resolve_route reads
	// the id's device (an unbound id crashes it).
	struct rdma_cm_id *id = new_id(ch, RDMA_PS_UDP), *other = bound(ch);
	struct sockaddr_in g = group(), src = sin4(local, 0);
	if (!id || !other)
		SETUP_FAILED(cs, "ids", errno);
	if (rdma_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&g, 2000))
		SETUP_FAILED(cs, "resolve-addr", errno);
	struct rdma_cm_event *ev = event(ch);
	if (!ev)
		SETUP_FAILED(cs, "addr-event", ETIMEDOUT);
	out(cs, "addr-event", "%s/%d", rdma_event_str(ev->event), ev->status);
	rdma_ack_cm_event(ev);
	out(cs, "route-before-resolved", "%s", cm(rdma_resolve_route(other, 1000)));
	out(cs, "resolve-route", "%s", cm(rdma_resolve_route(id, 2000)));
	if (!(ev = event(ch)))
		SETUP_FAILED(cs, "route-event", ETIMEDOUT);
	out(cs, "event", "%s/%d", rdma_event_str(ev->event), ev->status);
	rdma_ack_cm_event(ev);
	// The route's path (id->route.path_rec), its LIDs left out: on the
	// kernel's RoCE path librdmacm's copy holds bytes of the destination
	// MAC there.
	struct rdma_route *rt = &id->route;
	if (rt->num_paths > 0 && rt->path_rec) {
		struct ibv_sa_path_rec *p = rt->path_rec;
		struct ibv_port_attr pa;
		int active = ibv_query_port(id->verbs, id->port_num, &pa) == 0 && p->mtu == pa.active_mtu;
		out(cs, "route",
		    "paths=%d sgid-is-src=%s dgid-is-group=%s hop=%d tclass=%d rev=%s pkey=%#x sl=%d mtu-sel=%d "
		    "mtu-active=%s rate-sel=%d plt=%d/%d",
		    rt->num_paths, is_v4_gid(&p->sgid, local) ? "true" : "false",
		    is_v4_gid(&p->dgid, g.sin_addr) ? "true" : "false", p->hop_limit, p->traffic_class,
		    p->reversible ? "true" : "false", ntohs(p->pkey), p->sl, p->mtu_selector, active ? "true" : "false",
		    p->rate_selector, p->packet_life_time_selector, p->packet_life_time);
	} else {
		out(cs, "route", "paths=%d", rt->num_paths);
	}
	out(cs, "join", "%s", cm(rdma_join_multicast(id, (struct sockaddr *)&g, NULL)));
	rdma_destroy_id(other);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

static void migrate_id(void)
{
	const char *cs = "migrate-id";
	struct rdma_event_channel *ch1 = rdma_create_event_channel(), *ch2 = rdma_create_event_channel();
	struct rdma_cm_id *id = bound(ch1);
	if (!id)
		SETUP_FAILED(cs, "bind", errno);
	struct sockaddr_in g = group(), g2 = group();
	static int moved;
	if (join_ex(id, &g, RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, &moved))
		SETUP_FAILED(cs, "join", errno);
	// Wait until the JOIN event is queued on ch1, then move the id.
	if (!readable(ch1, 20000))
		SETUP_FAILED(cs, "queued", ETIMEDOUT);
	out(cs, "migrate", "%s", cm(rdma_migrate_id(id, ch2)));
	out(cs, "queued-old-new", "%d/%d", readable(ch1, 0), readable(ch2, 0));
	struct rdma_cm_event *ev = event(ch2);
	if (!ev)
		SETUP_FAILED(cs, "event", ETIMEDOUT);
	out(cs, "event", "%s/%s", rdma_event_str(ev->event), ev->param.ud.private_data == &moved ? "moved" : "other");
	rdma_ack_cm_event(ev);
	int e;
	if ((e = joined(ch2, id, &g2, RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, NULL)))
		SETUP_FAILED(cs, "join-g2", e);
	out(cs, "to-sync", "%s", cm(rdma_migrate_id(id, NULL)));
	out(cs, "sync-again", "%s", cm(rdma_migrate_id(id, NULL)));
	out(cs, "back", "%s", cm(rdma_migrate_id(id, ch1)));
	out(cs, "leave", "%s", cm(rdma_leave_multicast(id, (struct sockaddr *)&g)));
	out(cs, "leave-g2", "%s", cm(rdma_leave_multicast(id, (struct sockaddr *)&g2)));
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch2);
	rdma_destroy_event_channel(ch1);
}

static void passive_ep(void)
{
	const char *cs = "passive-ep";
	char host[INET_ADDRSTRLEN];
	inet_ntop(AF_INET, &local, host, sizeof host);
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE | RAI_NUMERICHOST, .ai_qp_type = IBV_QPT_UD,
				       .ai_port_space = RDMA_PS_UDP },
			     *res = NULL;
	if (rdma_getaddrinfo(host, NULL, &hints, &res))
		SETUP_FAILED(cs, "getaddrinfo", errno);
	struct rdma_cm_id *ep = NULL;
	if (rdma_create_ep(&ep, res, NULL, NULL))
		SETUP_FAILED(cs, "create-ep", errno);
	rdma_freeaddrinfo(res);
	out(cs, "qp", "%s", ep->qp ? "true" : "false");
	struct ibv_qp_init_attr a = { .qp_type = IBV_QPT_UD, .cap = { .max_send_wr = 1, .max_recv_wr = 1 } };
	if (rdma_create_qp(ep, NULL, &a))
		SETUP_FAILED(cs, "create-qp", errno);
	struct sockaddr_in g = group();
	static int ctx;
	out(cs, "join", "%s", cm(rdma_join_multicast(ep, (struct sockaddr *)&g, &ctx)));
	struct rdma_cm_event *ev = ep->event;
	if (ev)
		out(cs, "event", "%s/%s/%d", rdma_event_str(ev->event), ev->param.ud.private_data == &ctx ? "the-join's" : "other",
		    ev->param.ud.private_data_len);
	else
		out(cs, "event", "none");
	// librdmacm's leave waits until every event of the join is acked, and
	// a synchronous id's JOIN event stays parked in ep->event, unacked,
	// until the id's next call: the leave waits for good unless the event
	// is acked. softrdma acks it in the leave (docs/interop.md, "differences from Linux").
	// A leave that has not returned after 2 s waits for the ack.
	struct waiter w = { .id = ep, .g = g };
	pthread_create(&w.th, NULL, waiter_run, &w);
	for (int i = 0; i < 200 && !__atomic_load_n(&w.done, __ATOMIC_SEQ_CST); i++)
		sleep_ms(10);
	out(cs, "leave-waits-for-parked-event", "%s", __atomic_load_n(&w.done, __ATOMIC_SEQ_CST) ? "false" : "true");
	if (!__atomic_load_n(&w.done, __ATOMIC_SEQ_CST) && ep->event) {
		struct rdma_cm_event *parked = ep->event;
		ep->event = NULL; // so that rdma_destroy_ep does not ack it again
		rdma_ack_cm_event(parked);
	}
	pthread_join(w.th, NULL);
	errno = w.err;
	out(cs, "leave", "%s", cm(w.rc));
	out(cs, "event-after-leave", "%s", ep->event ? "parked" : "none");
	rdma_destroy_ep(ep);
}

int main(int argc, char **argv)
{
	int opt;
	unreach_src.s_addr = INADDR_NONE;
	while ((opt = getopt(argc, argv, "a:u:s:g:")) != -1) {
		switch (opt) {
		case 'a':
			if (inet_pton(AF_INET, optarg, &local) != 1)
				goto usage;
			break;
		case 'u':
			if (inet_pton(AF_INET, optarg, &unreach) != 1)
				goto usage;
			have_unreach = 1;
			break;
		case 's':
			if (inet_pton(AF_INET, optarg, &unreach_src) != 1)
				goto usage;
			break;
		case 'g':
			group_base = atoi(optarg);
			if (group_base < 1 || group_base > 254)
				goto usage;
			break;
		default:
			goto usage;
		}
	}
	if (optind != argc || local.s_addr == 0)
		goto usage;
	if (unreach_src.s_addr == INADDR_NONE)
		unreach_src = local;
	if (!group_base) {
		struct timespec now;
		clock_gettime(CLOCK_REALTIME, &now);
		group_base = 1 + (unsigned)(now.tv_nsec ^ getpid()) % 250;
	}

	join_validation();
	join_event();
	full_member_receives();
	send_only();
	manual_attach();
	several_ids();
	leave_rules();
	destroy_with_joins();
	resolve_unreachable_from("resolve-unreachable", 0);
	resolve_unreachable_from("resolve-unreachable-from-src", 1);
	ipv6_group();
	block_self_lb();
	attach_failure();
	join_leave_race();
	set_option();
	tos_join();
	port_rules();
	port_spaces();
	ipoib_join();
	route_then_join();
	migrate_id();
	passive_ep();
	out("end", "done", "OK");
	return 0;
usage:
	fprintf(stderr, "usage: conformance -a ADDR [-u UNREACH] [-s SRC] [-g N]\n");
	return 2;
}
