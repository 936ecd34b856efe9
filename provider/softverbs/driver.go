package softverbs

import "github.com/softrdma/softrdma/verbs"

// This file is the provider seam: what a device implementation (a
// "provider", as in rdma-core's providers/) gives to verbs, and what verbs
// gives back to it. Providers register their devices with RegisterDevice;
// verbs owns the generic objects (PD, MR, CQ, the QP state machine and work
// queues) and calls the provider only for what touches the network.

// Driver is implemented by a provider for each device it creates.
type Driver interface {
	// Name is the device name, e.g. "rxe_lo".
	Name() string
	// Attr returns the device capabilities.
	Attr() verbs.DeviceAttr
	// QueryPort returns a port's attributes; ports are numbered from 1.
	QueryPort(port uint8) (verbs.PortAttr, error)
	// GIDTable returns a port's GID table.
	GIDTable(port uint8) ([]verbs.GIDEntry, error)
	// CreateQP creates the provider side of a QP. rx is how the provider
	// delivers received datagrams into the QP's receive queue.
	CreateQP(rx Receiver, init DriverQPInit) (DriverQP, error)
}

// DriverQPInit is what a provider needs to know about a new QP.
type DriverQPInit struct {
	Type        verbs.QPType
	CreateFlags verbs.CreateFlags
}

// DriverQP is the provider side of a QP.
type DriverQP interface {
	// QPN is the QP number; it must be unique on the host.
	QPN() uint32
	// Modify is called after verbs validated and applied a transition; the
	// provider keeps what it needs for its receive checks (state, Q_Key, port).
	Modify(attr *verbs.QPAttr, mask verbs.QPAttrMask) error
	// Send transmits one UD datagram. The payload is only valid during the
	// call. A nil error means the send completed successfully (an oversized
	// datagram that the provider silently drops also returns nil, as rxe).
	Send(s *UDSend) error
	// AttachMcast attaches the QP to a multicast group. verbs has already
	// checked the QP type, the GID and the LID.
	AttachMcast(gid verbs.GID, lid uint16) error
	// DetachMcast detaches the QP from a multicast group.
	DetachMcast(gid verbs.GID, lid uint16) error
	// Destroy releases the QP; it must detach it from every group and stop
	// calling its Receiver before returning.
	Destroy() error
}

// BatchSender is an optional interface of a DriverQP that transmits several
// UD datagrams at once (e.g. with one sendmmsg). PostSend hands it the
// datagrams of a chain of send WRs, up to MaxSendBatch at a time.
type BatchSender interface {
	// SendBatch transmits s in order. errs has the length of s; SendBatch
	// sets errs[i] to what Send(&s[i]) would have returned. Payloads are
	// only valid during the call.
	SendBatch(s []UDSend, errs []error)
}

// MaxSendBatch is the largest number of datagrams PostSend hands to a
// BatchSender in one call.
const MaxSendBatch = 32

// UDSend is one UD datagram handed to a provider.
type UDSend struct {
	AH         *verbs.AHAttr
	RemoteQPN  uint32
	RemoteQKey uint32
	Imm        uint32 // host order; valid when HasImm
	HasImm     bool
	Solicited  bool
	Payload    []byte
}

// DeliverResult says what happened to a datagram handed to a Receiver.
type DeliverResult uint8

// Delivery outcomes.
const (
	// Delivered means a receive WR was consumed and a completion queued.
	Delivered DeliverResult = iota
	// NoRecvWR means no receive WR was posted; the datagram is dropped.
	NoRecvWR
	// TooLong means the next receive WR is smaller than 40 bytes + payload;
	// the datagram is dropped and the WR is not consumed.
	TooLong
	// CQFull means the receive CQ had no room; the datagram is dropped and
	// the WR is not consumed.
	CQFull
	// NotReady means the QP is not in a state that receives (below RTR).
	NotReady
)

// Receiver is a QP's receive side as seen by its provider.
type Receiver interface {
	// Deliver writes grh (the 40-byte GRH area) and payload into the next
	// posted receive WR and queues a completion with the given source QPN
	// and immediate data. It never retains grh or payload.
	Deliver(grh *[verbs.GRHLen]byte, payload []byte, srcQP uint32, imm uint32, hasImm bool) DeliverResult
}

// Burst defers the wake-ups of goroutines blocked in CQ.Wait while a
// provider hands a batch of datagrams to Receivers: a completion queued
// through DeliverBurst wakes its CQ's waiter at Flush, once per CQ, instead
// of at once. The receiving goroutine then runs on instead of waking the
// consumer (often on another core) for every datagram. A Burst is used by
// one goroutine at a time; its zero value is ready. The provider must call
// Flush after each batch.
type Burst struct {
	cqs []*CQ
}

// Flush wakes the waiters of the CQs that got completions since the last
// Flush.
func (b *Burst) Flush() {
	for i, cq := range b.cqs {
		cq.mu.Lock()
		cq.wake()
		cq.mu.Unlock()
		b.cqs[i] = nil
	}
	b.cqs = b.cqs[:0]
}

// add records that cq got a completion to announce.
func (b *Burst) add(cq *CQ) {
	for _, c := range b.cqs {
		if c == cq {
			return
		}
	}
	b.cqs = append(b.cqs, cq)
}

// BurstReceiver is implemented by every Receiver verbs hands out:
// DeliverBurst is Deliver with the wake-up of the CQ's waiter deferred to
// b.Flush.
type BurstReceiver interface {
	Receiver
	DeliverBurst(b *Burst, grh *[verbs.GRHLen]byte, payload []byte, srcQP uint32, imm uint32, hasImm bool) DeliverResult
}

// IBRecvInfo is what an InfiniBand provider knows about a received packet
// beyond what a RoCE provider does: the LRH fields of the completion, and
// whether a GRH came with it (without one the GRH area is undefined and
// the completion has no IBV_WC_GRH flag).
type IBRecvInfo struct {
	SLID         uint16
	SL           uint8
	DLIDPathBits uint8
	GRH          bool
}

// IBReceiver is implemented by every Receiver verbs hands out; InfiniBand
// providers use it to fill the completion's SLID and SL.
type IBReceiver interface {
	Receiver
	DeliverIB(grh *[verbs.GRHLen]byte, payload []byte, srcQP uint32, imm uint32, hasImm bool, info *IBRecvInfo) DeliverResult
}
