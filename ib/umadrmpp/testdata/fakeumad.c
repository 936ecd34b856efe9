/* A stand-in for libibumad in umadrmpp's test: umad_send loops every MAD
 * back to umad_recv (and prints it), so that the RMPP layer receives what
 * it sent, ACKs included. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <infiniband/umad.h>

enum { QLEN = 64, MAX = 256 };
static unsigned char q[QLEN][sizeof(struct ib_user_mad) + MAX];
static int qlen[QLEN], head, tail;

size_t umad_size(void) { return sizeof(struct ib_user_mad); }

int umad_send(int fd, int agentid, void *umad, int length, int timeout_ms, int retries)
{
	struct ib_user_mad *u = umad;
	int i;

	(void)fd; (void)timeout_ms; (void)retries;
	if (length > MAX || tail == QLEN)
		return -EIO;
	u->agent_id = agentid;
	printf("send %d ", length);
	for (i = 0; i < length; i++)
		printf("%02x", u->data[i]);
	printf("\n");
	memcpy(q[tail], umad, sizeof(*u) + length);
	qlen[tail++] = length;
	return 0;
}

int umad_recv(int fd, void *umad, int *length, int timeout_ms)
{
	int n;

	(void)fd; (void)timeout_ms;
	if (head == tail) {
		errno = ETIMEDOUT;
		return -ETIMEDOUT;
	}
	n = qlen[head] < *length ? qlen[head] : *length;
	memcpy(umad, q[head], sizeof(struct ib_user_mad) + n);
	*length = n;
	return ((struct ib_user_mad *)q[head++])->agent_id;
}

int umad_poll(int fd, int timeout_ms)
{
	(void)fd; (void)timeout_ms;
	return head == tail ? -ETIMEDOUT : 0;
}
