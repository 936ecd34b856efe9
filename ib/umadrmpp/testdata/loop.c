/* umadrmpp's test program: sends an RMPP-active SA GetTableResp of
 * argv[1] bytes of data (byte i is i % 251) through umad_send, then reads
 * it back with umad_recv as saquery does (a 256-byte buffer first, then
 * one of the length ENOSPC gives) and prints what it got. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/umad.h>

int main(int argc, char **argv)
{
	int data = argc > 1 ? atoi(argv[1]) : 0, len = 56 + data, i, r;
	struct ib_user_mad *u = calloc(1, sizeof(*u) + len);
	unsigned char *m = u->data;

	m[0] = 1; m[1] = 3; m[2] = 2; m[3] = 0x92;	/* SA GetTableResp */
	m[8] = 0xab; m[15] = 7;				/* TID */
	m[16] = 0; m[17] = 0x38;			/* MCMemberRecord */
	m[26] = 1;					/* RMPP Active */
	m[44] = 0; m[45] = 7;				/* AttributeOffset */
	for (i = 0; i < data; i++)
		m[56 + i] = (unsigned char)(i % 251);
	u->addr.lid = htons(5);
	u->addr.qpn = htonl(1);
	if (umad_send(3, 2, u, len, 0, 0) < 0)
		return 1;
	len = 256;
	r = umad_recv(3, u, &len, 100);
	printf("recv %d %d %d\n", r, r < 0 ? errno : 0, len);
	if (r == -ENOSPC) {
		u = realloc(u, sizeof(*u) + len);
		r = umad_recv(3, u, &len, 100);
		printf("recv %d %d %d\n", r, r < 0 ? errno : 0, len);
	}
	if (r >= 0) {
		printf("mad ");
		for (i = 0; i < len; i++)
			printf("%02x", u->data[i]);
		printf("\n");
	}
	r = umad_recv(3, u, &len, 100);	/* the ACKs: never the program's */
	printf("recv %d %d\n", r, r < 0 ? errno : 0);
	return 0;
}
