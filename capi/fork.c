//go:build capi

// fork.c: what a C program gets after fork().
//
// The child of fork() has one thread, the one that called fork: the Go
// runtime's threads, and with them the goroutines that run softrdma's
// devices, are not there, and any lock one of them held stays held. A
// call into Go in the child could hang or crash. So no call of the child
// reaches Go: a pthread_atfork child handler sets softrdma_forked, which
// the thin libraries' trampolines test before they jump (internal/capibuild).
// When it is set, the calls a child makes its own objects with and uses
// them by go to softrdma_child_<name> (forkchild.c), which sends them to
// the parent (forkserve.c: the prepare handler starts that service, once,
// with sr_fork_listen); the others go to softrdma_forked_<kind>
// instead, which prints one line on stderr (once per process), sets errno
// and returns the call's failure (NULL, -1, the errno, or nothing): EINVAL
// for a call on an object (one of the parent's), ENOSYS for the other
// calls that make objects from nothing. The child's own objects are
// known to forkchild.c; one of the parent's, given to a softrdma_child_
// call, gets EINVAL too. The inline functions of verbs.h do not go through the
// trampolines but through the context's ops (ibv_post_send, ibv_poll_cq,
// …) and the extended QP's wr_complete: the prepare handler (in the parent,
// where Go runs) notes every context and QP, and the child handler points
// their ops at functions that fail the same way (an extended CQ's polling
// ops, cqex.c, see that sr_fork_gen changed); the child's own contexts
// have ops of forkchild.c. Calls that never reach Go
// (the *_str texts, ibv_get_device_name, ibv_free_device_list,
// ibv_fork_init, ibv_is_fork_initialized …) work in the child. A child
// that execs a program starts afresh: the new program loads the libraries
// and gets a Go runtime of its own.
//
// The parent is not affected: softrdma reads and writes registered memory
// with the CPU, not by DMA, so copy-on-write after fork changes nothing
// for it. ibv_fork_init returns 0 and ibv_is_fork_initialized
// IBV_FORK_UNNEEDED, as rdma-core does on a kernel with copy-on-fork.

#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "capi.h"
#include "_cgo_export.h"

void sr_fork_listen(void);
void sr_forkchild_reset(void (*fail_ctx)(struct ibv_context *));

// softrdma_forked is set in the child of a fork() (the trampolines read it).
int softrdma_forked;
int sr_fork_gen;

static int sr_fork_said;

void sr_fork_say(const char *call)
{
	if (__atomic_exchange_n(&sr_fork_said, 1, __ATOMIC_RELAXED))
		return;
	fprintf(stderr, "softrdma: %s in a child of fork(): the parent's objects stay the parent's, and a child "
			"makes its own through the parent with the calls docs/c-programs.md lists (\"fork()\")\n", call);
}

// sr_fork_stub is the stub of call when softrdma does not implement it
// (stubs.c): it fails in a child as in the parent, "not supported".
static long (*sr_fork_stub(const char *call))(void)
{
	for (const struct sr_stub *s = sr_stubs; s->name; s++)
		if (!strcmp(s->name, call))
			return s->fn;
	return NULL;
}

void *softrdma_forked_ptr(const char *call, int err)
{
	long (*stub)(void) = sr_fork_stub(call);
	if (stub)
		return (void *)stub();
	sr_fork_say(call);
	errno = err;
	return NULL;
}

int softrdma_forked_neg(const char *call, int err)
{
	long (*stub)(void) = sr_fork_stub(call);
	if (stub)
		return stub();
	sr_fork_say(call);
	errno = err;
	return -1;
}

int softrdma_forked_errno(const char *call, int err)
{
	long (*stub)(void) = sr_fork_stub(call);
	if (stub)
		return stub();
	sr_fork_say(call);
	errno = err;
	return err;
}

long softrdma_forked_zero(const char *call, int err)
{
	long (*stub)(void) = sr_fork_stub(call);
	if (stub)
		return stub();
	sr_fork_say(call);
	errno = err;
	return 0;
}

void softrdma_forked_void(const char *call, int err)
{
	long (*stub)(void) = sr_fork_stub(call);
	(void)err;
	if (stub) {
		stub();
		return;
	}
	sr_fork_say(call);
}

// The contexts and QPs of the process, noted by the prepare handler.
static struct sr_context **sr_fork_ctxs;
static struct sr_qp **sr_fork_qps;
static int sr_fork_nctx, sr_fork_capctx, sr_fork_nqp, sr_fork_capqp;

void sr_fork_reset(void)
{
	sr_fork_nctx = sr_fork_nqp = 0;
}

void sr_fork_add_ctx(struct sr_context *c)
{
	if (sr_fork_nctx == sr_fork_capctx) {
		int cap = sr_fork_capctx ? 2 * sr_fork_capctx : 8;
		void *p = realloc(sr_fork_ctxs, cap * sizeof *sr_fork_ctxs);
		if (!p)
			return;
		sr_fork_ctxs = p;
		sr_fork_capctx = cap;
	}
	sr_fork_ctxs[sr_fork_nctx++] = c;
}

void sr_fork_add_qp(struct sr_qp *q)
{
	if (sr_fork_nqp == sr_fork_capqp) {
		int cap = sr_fork_capqp ? 2 * sr_fork_capqp : 16;
		void *p = realloc(sr_fork_qps, cap * sizeof *sr_fork_qps);
		if (!p)
			return;
		sr_fork_qps = p;
		sr_fork_capqp = cap;
	}
	sr_fork_qps[sr_fork_nqp++] = q;
}

// The ops of a context in the child.
static int sr_fork_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	(void)cq, (void)n, (void)wc;
	sr_fork_say("ibv_poll_cq");
	return -EINVAL;
}

static int sr_fork_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	(void)cq, (void)solicited_only;
	sr_fork_say("ibv_req_notify_cq");
	return EINVAL;
}

static int sr_fork_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	(void)qp;
	sr_fork_say("ibv_post_send");
	if (bad_wr)
		*bad_wr = wr;
	return EINVAL;
}

static int sr_fork_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	(void)qp;
	sr_fork_say("ibv_post_recv");
	if (bad_wr)
		*bad_wr = wr;
	return EINVAL;
}

static int sr_fork_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr, size_t len)
{
	(void)ctx, (void)port, (void)attr, (void)len;
	sr_fork_say("ibv_query_port");
	return EINVAL;
}

static struct ibv_qp *sr_fork_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr)
{
	(void)ctx, (void)attr;
	sr_fork_say("ibv_create_qp_ex");
	errno = EINVAL;
	return NULL;
}

static struct ibv_cq_ex *sr_fork_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr)
{
	(void)ctx, (void)attr;
	sr_fork_say("ibv_create_cq_ex");
	errno = EINVAL;
	return NULL;
}

static int sr_fork_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *input,
				   struct ibv_device_attr_ex *attr, size_t len)
{
	(void)ctx, (void)input, (void)attr, (void)len;
	sr_fork_say("ibv_query_device_ex");
	return EINVAL;
}

static int sr_fork_wr_complete(struct ibv_qp_ex *qpx)
{
	(void)qpx;
	sr_fork_say("ibv_wr_complete");
	return EINVAL;
}

static void sr_fork_prepare(void)
{
	// A child forking again has no Go to ask: it keeps the lists it
	// inherited, whose ops its child handler set already.
	if (!softrdma_forked) {
		srForkPrepare();
		sr_fork_listen();
	}
}

static void sr_fork_fail_ctx(struct ibv_context *ctx)
{
	ctx->ops.poll_cq = sr_fork_poll_cq;
	ctx->ops.req_notify_cq = sr_fork_req_notify_cq;
	ctx->ops.post_send = sr_fork_post_send;
	ctx->ops.post_recv = sr_fork_post_recv;
	verbs_get_ctx(ctx)->query_port = sr_fork_query_port;
	verbs_get_ctx(ctx)->query_device_ex = NULL;
	verbs_get_ctx(ctx)->create_cq_ex = sr_fork_create_cq_ex;
}

static void sr_fork_child(void)
{
	// A grandchild: the objects its parent (a child) made are not its own.
	if (softrdma_forked)
		sr_forkchild_reset(sr_fork_fail_ctx);
	softrdma_forked = 1;
	sr_fork_gen++;
	for (int i = 0; i < sr_fork_nctx; i++) {
		struct sr_context *c = sr_fork_ctxs[i];
		c->vc.context.ops.poll_cq = sr_fork_poll_cq;
		c->vc.context.ops.req_notify_cq = sr_fork_req_notify_cq;
		c->vc.context.ops.post_send = sr_fork_post_send;
		c->vc.context.ops.post_recv = sr_fork_post_recv;
		c->vc.query_port = sr_fork_query_port;
		c->vc.query_device_ex = sr_fork_query_device_ex;
		c->vc.create_qp_ex = sr_fork_create_qp_ex;
		c->vc.create_cq_ex = sr_fork_create_cq_ex;
	}
	for (int i = 0; i < sr_fork_nqp; i++)
		sr_fork_qps[i]->qpx.wr_complete = sr_fork_wr_complete;
}

__attribute__((constructor)) static void sr_fork_init(void)
{
	pthread_atfork(sr_fork_prepare, NULL, sr_fork_child);
}
