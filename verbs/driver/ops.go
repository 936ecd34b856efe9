package driver

import "context"

// This file is the device seam: what a backend gives verbs for each of its
// devices. verbs' objects (Device, Context, PD, MR, CQ, QP, AH) are thin
// handles over these interfaces; verbs itself never knows which backend
// it talks to.
//
// A backend checks that the objects handed to it (the CQs of a new QP,
// the AH of a send) are its own, and fails with EINVAL otherwise.

// DeviceOps is a device as a backend implements it (struct ibv_device).
type DeviceOps interface {
	// Name is the device name, e.g. "rxe_lo".
	Name() string
	// Attr returns the device capabilities.
	Attr() DeviceAttr
	// Open opens the device (ibv_open_device).
	Open() (ContextOps, error)
}

// ContextOps is an open device (struct ibv_context).
type ContextOps interface {
	// QueryPort returns a port's attributes; the port number is checked.
	QueryPort(port uint8) (PortAttr, error)
	// QueryGIDTable returns a port's GID table; the port number is checked.
	QueryGIDTable(port uint8) ([]GIDEntry, error)
	// AllocPD allocates a protection domain.
	AllocPD() (PDOps, error)
	// CreateCQ creates a completion queue of at least cqe entries whose
	// events go to ch (nil: none) on completion vector vector (checked
	// by verbs against NumCompVectors).
	CreateCQ(cqe int, ch CompChannelOps, vector int) (CQOps, error)
	// CreateCompChannel creates a completion event channel.
	CreateCompChannel() (CompChannelOps, error)
	// NumCompVectors returns the number of completion vectors
	// (context->num_comp_vectors).
	NumCompVectors() int
	// Close closes the context; EBUSY while PDs or CQs exist.
	Close() error
}

// PDOps is a protection domain (struct ibv_pd).
type PDOps interface {
	// RegMR registers buf.
	RegMR(buf []byte, access Access) (MROps, error)
	// CreateAH creates an address handle.
	CreateAH(attr *AHAttr) (AHOps, error)
	// CreateQP creates a queue pair; the backend checks that init's CQs
	// are its own.
	CreateQP(init *QPInitAttr) (QPOps, error)
	// Dealloc frees the PD; EBUSY while MRs, QPs or AHs exist.
	Dealloc() error
}

// MROps is a registered memory region (struct ibv_mr).
type MROps interface {
	// LKey returns the local key.
	LKey() uint32
	// RKey returns the remote key.
	RKey() uint32
	// Dereg deregisters the region.
	Dereg() error
}

// AHOps is an address handle (struct ibv_ah).
type AHOps interface {
	// Destroy destroys the address handle.
	Destroy() error
}

// AH is an address handle as a send request names it (UDWR.AH): a
// *verbs.AH. Its Ops are a backend's AHOps, nil for a nil *verbs.AH.
type AH interface {
	// Ops returns the backend's side of the address handle.
	Ops() AHOps
}

// CQOps is a completion queue (struct ibv_cq).
type CQOps interface {
	// Poll moves up to len(wc) completions into wc.
	Poll(wc []WC) (int, error)
	// Len returns the number of completions queued.
	Len() int
	// Wait blocks until a completion is queued or ctx ends. verbs calls
	// it only for CQs without a completion channel.
	Wait(ctx context.Context) error
	// ReqNotify arms the CQ (ibv_req_notify_cq): the next completion
	// (with solicitedOnly, the next solicited receive or error
	// completion) puts one event for the CQ on its channel.
	ReqNotify(solicitedOnly bool) error
	// AckEvents acknowledges n events of the CQ got from its channel
	// (ibv_ack_cq_events); verbs counts them itself.
	AckEvents(n int)
	// Destroy destroys the CQ; EBUSY while QPs use it.
	Destroy() error
}

// CQPollWaiter is an optional interface of a CQOps: PollWait is the loop
// of rdma_get_recv_comp — poll; while nothing is queued, arm the CQ, poll
// again, take the channel's event for the CQ and acknowledge it — done in
// the backend in as few steps as it can (the kernel backend: one call into
// C when a completion is queued), until up to len(wc) completions are
// polled or ctx ends. The events it takes are acknowledged by the backend
// (verbs does not count them). ok false, with nothing done: not for this
// CQ (no completion channel that serves it alone); the caller uses Poll,
// ReqNotify and the channel's GetEvent.
type CQPollWaiter interface {
	PollWait(ctx context.Context, wc []WC) (n int, ok bool, err error)
}

// QPOps is a queue pair (struct ibv_qp).
type QPOps interface {
	// Num returns the QP number.
	Num() uint32
	// State returns the current state.
	State() QPState
	// Query returns the QP's attributes.
	Query() QPAttr
	// Modify changes attributes and state.
	Modify(attr *QPAttr, mask QPAttrMask) error
	// PostSend posts a chain of send work requests; the AHs are verbs'
	// handles (AH) whose Ops the backend checks are its own.
	PostSend(wr *SendWR) error
	// PostRecv posts a chain of receive work requests.
	PostRecv(wr *RecvWR) error
	// AttachMcast attaches the QP to a multicast group.
	AttachMcast(gid GID, lid uint16) error
	// DetachMcast detaches the QP from a multicast group.
	DetachMcast(gid GID, lid uint16) error
	// Destroy destroys the QP.
	Destroy() error
}

// CompChannelOps is a completion event channel (struct ibv_comp_channel).
type CompChannelOps interface {
	// Fd returns a file descriptor that is readable while an event is
	// pending (for poll/epoll); it belongs to the channel.
	Fd() int
	// GetEvent returns the CQ of the next event (ibv_get_cq_event): it
	// waits until one is pending or ctx ends, or with nonblock fails at
	// once with EAGAIN.
	GetEvent(ctx context.Context, nonblock bool) (CQOps, error)
	// Destroy destroys the channel; verbs has checked that no CQ uses it.
	Destroy() error
}
