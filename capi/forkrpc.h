// forkrpc.h: the protocol between a child of fork() (forkchild.c) and the
// process that forked it (forkserve.c). See fork.c.
#ifndef SOFTRDMA_FORKRPC_H
#define SOFTRDMA_FORKRPC_H

#include <stdint.h>
#include <sys/socket.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

// Every message is one SOCK_SEQPACKET datagram: the header, then len
// bytes; a reply may carry one descriptor (SCM_RIGHTS).
struct fk_hdr {
	uint32_t op;
	int32_t ret;	// the reply's result (the call's convention)
	int32_t err;	// the reply's errno
	uint32_t len;	// payload bytes after the header
	uint64_t a[6];
};

#define FK_MAX 65536 // the largest payload

enum {
	FK_HELLO = 1,
	FK_GET_DEVICES, FK_OPEN_DEVICE, FK_CTX_INFO, FK_CLOSE_DEVICE, FK_QUERY_DEVICE, FK_QUERY_PORT, FK_QUERY_GID,
	FK_ALLOC_PD, FK_DEALLOC_PD, FK_REG_MR, FK_DEREG_MR,
	FK_CREATE_COMP_CHANNEL, FK_DESTROY_COMP_CHANNEL, FK_CREATE_CQ, FK_DESTROY_CQ,
	FK_GET_CQ_EVENT, FK_ACK_CQ_EVENTS, FK_REQ_NOTIFY, FK_POLL_CQ,
	FK_POST_SEND, FK_POST_RECV, FK_CREATE_AH, FK_DESTROY_AH,
	FK_CREATE_QP, FK_DESTROY_QP, FK_MODIFY_QP,
	FK_CREATE_EVENT_CHANNEL, FK_DESTROY_EVENT_CHANNEL, FK_CREATE_ID, FK_DESTROY_ID,
	FK_BIND_ADDR, FK_RESOLVE_ADDR, FK_RESOLVE_ROUTE, FK_CM_CREATE_QP, FK_CM_DESTROY_QP,
	FK_GET_CM_EVENT, FK_ACK_CM_EVENT, FK_JOIN, FK_LEAVE, FK_GETADDRINFO, FK_ID_INFO,
	FK_CHAN_INFO, FK_NOP,
	FK_LISTEN, FK_CONNECT, FK_ACCEPT, FK_REJECT, FK_INIT_AH_FROM_WC,
};

// fk_connp is a struct rdma_conn_param without its pointer: the private
// data's bytes follow it.
struct fk_connp {
	uint32_t has, qp_num;
	uint8_t private_data_len, responder_resources, initiator_depth, flow_control;
	uint8_t retry_count, rnr_retry_count, srq, pad;
};

// fk_qpinfo is what the child's struct ibv_qp mirrors of the parent's.
struct fk_qpinfo {
	uint64_t qp, pd, send_cq, recv_cq;
	uint32_t qp_num, state, qp_type, pad;
	struct ibv_qp_cap cap;
};

// The verbs of a forked multicast worker, numbered apart from the list
// above (which grows at its end).
enum { FK_ATTACH_MCAST = 64, FK_DETACH_MCAST, FK_QUERY_QP, FK_SET_OPTION, FK_QUERY_PKEY, FK_QUERY_GID_EX, FK_DEVICE_INFO, FK_CM_DEVICES };

// fk_qpattr is FK_QUERY_QP's answer (init's pointers are the parent's).
struct fk_qpattr {
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
};

// fk_idinfo is what the child's struct rdma_cm_id mirrors of the parent's.
struct fk_idinfo {
	uint64_t id, verbs, pd;
	struct fk_qpinfo qp; // qp.qp == 0: no QP
	uint64_t scq_ch, rcq_ch; // the channels of the CQs rdma_create_qp made
	uint32_t ps, qp_type, port_num, pad;
	struct rdma_addr addr;
};

// fk_cqinfo describes a CQ the child has not made itself (rdma_create_qp's).
struct fk_wr_sge { uint64_t addr; uint32_t length, lkey; };
struct fk_swr {
	uint64_t wr_id, ah;
	uint32_t opcode, flags, imm, rqpn, rqkey;
	int32_t num_sge;
	// num_sge struct fk_wr_sge follow
};
struct fk_rwr {
	uint64_t wr_id;
	int32_t num_sge, pad;
};

struct fk_event {
	uint64_t ev, id, listen_id;
	int32_t event, status;
	struct rdma_ud_param ud; // private_data: the bytes follow the fk_idinfo
	struct fk_idinfo info;
};

struct fk_ai {
	int32_t flags, family, qp_type, port_space;
	uint32_t src_len, dst_len, src_canon_len, dst_canon_len;
	// src, dst addresses, canonical names (with their NULs) follow
};

#endif
