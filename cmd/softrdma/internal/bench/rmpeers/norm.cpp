/*
 * norm.cpp: NORM (RFC 5740) through NRL's libnorm, one NORM_OBJECT_STREAM
 * from the sender to the group with a message boundary
 * (NormStreamMarkEom) after each message: the receivers read whole
 * messages off the stream in order.
 *
 * Compiled as C++ (normApi.h is C++). Tuning, after NORM's developer guide and its normStreamer example (all
 * flags of this program, the bench's defaults in reliable.go):
 *   - a fixed transmit rate (-txrate bits/s; NORM's default is 64 kbit/s)
 *     or NORM-CC (-cc 1, with -txrate as the upper bound);
 *   - ACK-based flow control (-acking 1; with 0, NORM's timer-based flow
 *     control, which is faster at 0 loss here but breaks the stream, i.e.
 *     loses messages, at 5 % loss): the receivers are the sender's acking nodes
 *     (their node ids are their IPv4 addresses, passed as -receivers), the
 *     timer-based flow control is off (NormSetFlowControl 0), and the
 *     sender sets a watermark each time an eighth of the stream buffer was
 *     written, writing no more than the buffer until the receivers acked;
 *   - GRTT estimate 1 ms and at most -grttmax s (1 ms: the default 10 s
 *     bound lets queueing inflate the GRTT, and with it every NACK and
 *     ACK timer, until a lossy run crawls), backoff factor 0 (no NACK
 *     backoff: a LAN with few receivers), tx robust factor 20;
 *   - segments of -segment bytes (1400: a NORM DATA message fits MTU 1500
 *     unfragmented), FEC blocks of -block data segments with up to -parity
 *     parity segments sent as repair on NACK (no proactive parity);
 *   - sender buffer and stream buffer -buffer bytes (2 MB, normStreamer's
 *     default; more only adds queueing latency), UDP socket buffers
 *     -sockbuf bytes (the kernel caps them at net.core.[rw]mem_max).
 */
#include "rmsg.h"

#include <normApi.h>
#include <poll.h>

static double txrate = 6e8, grttmax = 0.001;
static int cc = 0, acking_fc = 1, segment = 1400, block = 64, parity = 16, flushmode = 0;
static unsigned buffer = 2 << 20, sockbuf = 4 << 20;

static int extra(const char *k, const char *v)
{
	if (!strcmp(k, "txrate")) txrate = atof(v);
	else if (!strcmp(k, "cc")) cc = atoi(v);
	else if (!strcmp(k, "acking")) acking_fc = atoi(v);
	else if (!strcmp(k, "grttmax")) grttmax = atof(v);
	else if (!strcmp(k, "segment")) segment = atoi(v);
	else if (!strcmp(k, "block")) block = atoi(v);
	else if (!strcmp(k, "parity")) parity = atoi(v);
	else if (!strcmp(k, "buffer")) buffer = (unsigned)atol(v);
	else if (!strcmp(k, "sockbuf")) sockbuf = (unsigned)atol(v);
	else if (!strcmp(k, "flush")) flushmode = !strcmp(v, "passive") ? 1 : !strcmp(v, "active") ? 2 : 0;
	else return 0;
	return 1;
}

static NormNodeId node_id(const char *addr)
{
	struct in_addr in;
	inet_pton(AF_INET, addr, &in);
	return (NormNodeId)ntohl(in.s_addr);
}

static NormSessionHandle open_session(NormInstanceHandle inst, const struct rm_args *a)
{
	NormSessionHandle s = NormCreateSession(inst, a->group, (UINT16)a->port, node_id(a->addr));
	if (s == NORM_SESSION_INVALID) {
		fprintf(stderr, "norm: NormCreateSession failed\n");
		exit(1);
	}
	NormSetRxPortReuse(s, true, NULL, NULL, 0);
	NormSetMulticastInterface(s, a->iface);
	NormSetMulticastLoopback(s, false);
	NormSetTTL(s, 1);
	NormSetFragmentation(s, false);
	NormSetDefaultSyncPolicy(s, NORM_SYNC_STREAM);
	NormSetTxRobustFactor(s, 20);
	return s;
}

static int sender(const struct rm_args *a)
{
	NormInstanceHandle inst = NormCreateInstance(false);
	NormSessionHandle s = open_session(inst, a);
	NormSetGrttEstimate(s, 0.001);
	NormSetBackoffFactor(s, 0);
	if (grttmax > 0)
		NormSetGrttMax(s, grttmax);
	if (cc) {
		NormSetCongestionControl(s, true, true);
		NormSetTxRateBounds(s, 1e6, txrate);
	} else
		NormSetTxRate(s, txrate);
	int acking = acking_fc && a->nrecv > 0;
	if (acking) {
		NormSetFlowControl(s, 0);
		for (int i = 0; i < a->nrecv; i++)
			NormAddAckingNode(s, (NormNodeId)a->recv[i]);
	}
	if (!NormStartSender(s, (NormSessionId)(rm_now() & 0xffff), buffer, (UINT16)segment, (UINT16)block, (UINT16)parity, 0)) {
		fprintf(stderr, "norm: NormStartSender failed\n");
		return 1;
	}
	NormSetTxSocketBuffer(s, sockbuf);
	NormObjectHandle st = NormStreamOpen(s, buffer, NULL, 0);
	if (st == NORM_OBJECT_INVALID) {
		fprintf(stderr, "norm: NormStreamOpen failed\n");
		return 1;
	}
	unsigned bufmax = NormGetStreamBufferSegmentCount(buffer, (UINT16)segment, (UINT16)block) - (unsigned)block;
	unsigned threshold = bufmax / 8, bufcount = 0, remain = 0;
	int wm_pending = 0, final = 0, done = 0, tx_ready = 1;
	unsigned long wm_resets = 0;
	unsigned char *msg = (unsigned char *)malloc((size_t)a->size);
	long i = 0, off = 0, sent = 0;
	rm_wait_go();
	int64_t t0 = rm_now(), first = 0, last = 0;
	while (!done) {
		while (tx_ready && i < a->count && (!acking || bufcount < bufmax)) {
			if (off == 0) {
				rm_pace(a, t0, i);
				int64_t now = rm_now();
				if (!first)
					first = now;
				rm_fill(msg, a->size, (uint64_t)i, now);
			}
			unsigned want = (unsigned)(a->size - off);
			if (acking) {
				unsigned avail = (unsigned)segment * (bufmax - bufcount) - remain;
				if (avail < want)
					want = avail;
			}
			unsigned n = NormStreamWrite(st, (const char *)msg + off, want);
			off += n;
			if (acking) {
				unsigned total = n + remain;
				bufcount += total / (unsigned)segment;
				remain = total % (unsigned)segment;
				if (!wm_pending && bufcount >= threshold) {
					NormSetWatermark(s, st, false);
					wm_pending = 1;
				}
			}
			if (off == a->size) {
				if (flushmode)
					NormStreamFlush(st, true, flushmode == 2 ? NORM_FLUSH_ACTIVE : NORM_FLUSH_PASSIVE);
				else
					NormStreamMarkEom(st);
				i++, sent++, off = 0;
				last = rm_now();
			} else if (n < want || n == 0)
				tx_ready = 0;
			else if (acking && bufcount >= bufmax)
				break;
		}
		if (i == a->count && !final) {
			/* The end: flush and wait until every receiver acked it all. */
			NormStreamFlush(st, true, NORM_FLUSH_ACTIVE);
			if (acking)
				NormSetWatermark(s, st, true);
			else
				done = 1;
			final = 1;
		}
		if (done)
			break;
		NormEvent ev;
		if (!NormGetNextEvent(inst, &ev, true))
			continue;
		switch (ev.type) {
		case NORM_TX_QUEUE_VACANCY:
		case NORM_TX_QUEUE_EMPTY:
			tx_ready = 1;
			break;
		case NORM_TX_WATERMARK_COMPLETED:
			if (NormGetAckingStatus(s, NORM_NODE_ANY) == NORM_ACK_SUCCESS) {
				if (final)
					done = 1;
				else if (wm_pending) {
					wm_pending = 0;
					bufcount -= threshold < bufcount ? threshold : bufcount;
				}
			} else {
				wm_resets++;
				NormResetWatermark(s);
			}
			break;
		default:
			break;
		}
	}
	char info[160];
	snprintf(info, sizeof info, "txrate %.0f bit/s%s, segment %d, block %d+%d, buffer %u, acking %d, watermark retries %lu",
		 NormGetTxRate(s), cc ? " (CC bound)" : "", segment, block, parity, buffer, a->nrecv, wm_resets);
	rm_send_report("norm", a, sent, first, last, info);
	rm_wait_eof();
	NormStreamClose(st, false);
	NormStopSender(s);
	NormDestroySession(s);
	NormDestroyInstance(inst);
	return 0;
}

static int receiver(const struct rm_args *a)
{
	NormInstanceHandle inst = NormCreateInstance(false);
	NormSessionHandle s = open_session(inst, a);
	NormSetDefaultUnicastNack(s, false);
	if (!NormStartReceiver(s, buffer)) {
		fprintf(stderr, "norm: NormStartReceiver failed\n");
		return 1;
	}
	NormSetRxSocketBuffer(s, sockbuf);
	struct rm_rx r;
	rm_rx_init(&r, a);
	unsigned char *msg = (unsigned char *)malloc((size_t)a->size);
	long have = 0;
	int synced = 0;
	unsigned long broken = 0;
	NormObjectHandle st = NORM_OBJECT_INVALID;
	rm_ready();
	int64_t start = rm_now(), lastrx = 0;
	struct pollfd p = {.fd = NormGetDescriptor(inst), .events = POLLIN, .revents = 0};
	while (!rm_rx_done(&r)) {
		int64_t now = rm_now();
		if (now - start > (int64_t)(a->timeout * 1e9) || (lastrx && now - lastrx > (int64_t)(a->idle * 1e9)))
			break;
		if (poll(&p, 1, 50) <= 0)
			continue;
		NormEvent ev;
		if (!NormGetNextEvent(inst, &ev, false))
			continue;
		if (ev.type == NORM_RX_OBJECT_NEW && NormObjectGetType(ev.object) == NORM_OBJECT_STREAM)
			st = ev.object, synced = 0, have = 0;
		if (ev.type != NORM_RX_OBJECT_UPDATED || ev.object != st)
			continue;
		for (;;) {
			if (!synced) {
				if (!(synced = NormStreamSeekMsgStart(st)))
					break;
				have = 0;
			}
			unsigned n = (unsigned)(a->size - have);
			if (!NormStreamRead(st, (char *)msg + have, &n)) {
				broken++;
				synced = 0;
				continue;
			}
			if (n == 0)
				break;
			have += n;
			if (have == a->size) {
				now = rm_now();
				lastrx = now;
				rm_rx_deliver(&r, msg, a->size, now);
				have = 0;
			}
		}
	}
	char info[64];
	snprintf(info, sizeof info, "stream breaks %lu", broken);
	rm_rx_report(&r, "norm", info);
	/* Answer the sender's last ACK request, until the harness ends the case. */
	struct pollfd pp[2] = {{.fd = 0, .events = POLLIN, .revents = 0}, {.fd = NormGetDescriptor(inst), .events = POLLIN, .revents = 0}};
	for (;;) {
		if (poll(pp, 2, 100) < 0 && errno != EINTR)
			break;
		if (pp[0].revents) {
			char b[64];
			if (read(0, b, sizeof b) <= 0)
				break;
		}
		NormEvent ev;
		while (NormGetNextEvent(inst, &ev, false))
			;
	}
	NormStopReceiver(s);
	NormDestroySession(s);
	NormDestroyInstance(inst);
	return 0;
}

int main(int argc, char **argv)
{
	struct rm_args a;
	rm_parse(argc, argv, &a, extra);
	return a.send ? sender(&a) : receiver(&a);
}
