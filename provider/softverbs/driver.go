package softverbs

import (
	"github.com/softrdma/softrdma/verbs"
)

// This file is the transport seam: what a software provider (rxe's UDP
// sockets, ib's emulated fabric) gives the verbs core. The core owns every
// object and rule of verbs — the QP table, the multicast group table and
// its limits, the receive checks, the receive queues, the counters; a
// provider only moves packets: it allocates QPNs, transmits datagrams,
// starts receiving a group's traffic when the group gets its first QP,
// and hands each datagram it reads, after its own checks (parsing, ICRC),
// to Device.DeliverUnicast or Device.DeliverGroup.

// Driver is implemented by a provider for each device it creates.
type Driver interface {
	// Name is the device name, e.g. "rxe_lo".
	Name() string
	// Attr returns the device capabilities; the core enforces the limits.
	Attr() verbs.DeviceAttr
	// QueryPort returns a port's attributes; ports are numbered from 1.
	QueryPort(port uint8) (verbs.PortAttr, error)
	// GIDTable returns a port's GID table.
	GIDTable(port uint8) ([]verbs.GIDEntry, error)
	// CreateQP creates the transport side of a UD QP: its QPN (unique on
	// the host, never 0, 1 or 0xFFFFFF) and its send path.
	CreateQP(init DriverQPInit) (DriverQP, error)
	// GroupCreated is called when the first QP attaches to a group (the
	// core's lock is held): the transport starts receiving the group's
	// datagrams (rxe joins the IP group). An error fails the attach.
	GroupCreated(g *Group) error
	// GroupDestroyed is called when the last QP detached from a group.
	GroupDestroyed(g *Group)
}

// CounterRefresher is an optional Driver interface: RefreshCounters brings
// what the transport counts outside the core up to date (rxe: the kernel's
// count of datagrams a socket dropped) before the device's counters are
// read.
type CounterRefresher interface {
	RefreshCounters()
}

// DriverQPInit is what a provider needs to know about a new QP.
type DriverQPInit struct {
	Type        verbs.QPType
	CreateFlags verbs.CreateFlags
}

// DriverQP is the transport side of a QP.
type DriverQP interface {
	// QPN is the QP number.
	QPN() uint32
	// Send transmits one UD datagram; the payload is only valid during the
	// call. It sets s.Wire to the bytes put on the wire; a datagram larger
	// than the active MTU is not sent (Wire 0) and completes successfully,
	// as rxe does. An error fails the send's completion.
	Send(s *UDSend) error
	// Destroy releases the QPN and the send resources. The core has
	// detached the QP and stopped delivering to it.
	Destroy()
}

// BatchSender is an optional interface of a DriverQP that transmits several
// UD datagrams at once (e.g. with one sendmmsg). PostSend hands it the
// datagrams of a chain of send WRs, up to MaxSendBatch at a time.
type BatchSender interface {
	// SendBatch transmits s in order. errs has the length of s; SendBatch
	// sets errs[i] (and s[i].Wire) to what Send(&s[i]) would have.
	// Payloads are only valid during the call.
	SendBatch(s []UDSend, errs []error)
}

// MaxSendBatch is the largest number of datagrams PostSend hands to a
// BatchSender in one call.
const MaxSendBatch = 32

// UDSend is one UD datagram handed to a provider.
type UDSend struct {
	AH         *verbs.AHAttr
	RemoteQPN  uint32
	RemoteQKey uint32 // the DETH Q_Key, as posted (rxe sends it as is)
	PSN        uint32 // the BTH PSN
	Imm        uint32 // host order; valid when HasImm
	HasImm     bool
	Solicited  bool
	Payload    []byte
	// Wire is set by the provider: the bytes it sent, 0 when it dropped
	// an oversized datagram.
	Wire int
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

// Datagram is one received UD datagram that passed the transport's checks,
// as the core needs it for the per-QP checks and the completion. The core
// never retains it or its slices.
type Datagram struct {
	GRH    *[verbs.GRHLen]byte // the GRH area of the receive buffer
	PKey   uint16              // BTH P_Key
	QKey   uint32              // DETH Q_Key
	SrcQP  uint32              // DETH source QP
	Imm    uint32              // host order; valid when HasImm
	HasImm bool
	// Solicited is the BTH's Solicited Event bit: the receive completion
	// raises the event of a CQ armed for solicited completions only.
	Solicited bool
	Payload   []byte
	// Self is set when this device sent the datagram: a QP created with
	// CreateBlockSelfMcastLB does not get its own multicast.
	Self bool
	// IB is set by InfiniBand providers; nil on RoCE.
	IB *IBRecvInfo
}

// Burst defers the wake-ups of goroutines blocked in CQ.Wait while a
// provider delivers a batch of datagrams: a completion queued during the
// batch wakes its CQ's waiter at Flush, once per CQ, instead of at once.
// The receiving goroutine then runs on instead of waking the consumer
// (often on another core) for every datagram. The delivered counters of
// the device and the QPs are added at Flush too, once per QP, before the
// wake-ups. A Burst is used by one goroutine at a time; its zero value is
// ready. The provider must call Flush after each batch.
//
// With HoldLocks, the Burst also keeps the receive-queue lock of the QP it
// last delivered to and the lock of that QP's receive CQ from one delivery
// to the next, until a delivery to another QP, Release or Flush: a run of
// datagrams for one QP takes each lock once. Only a provider that does
// nothing between the deliveries of a batch that could block or wait for
// those locks sets it, and it calls Release before anything that could (a
// tap, a system call). It pays where no consumer could run meanwhile
// (GOMAXPROCS=1); with more Ps a consumer polling on another core would
// wait for the batch's end, and repost late.
type Burst struct {
	// HoldLocks keeps a QP's locks held from one delivery to the next.
	HoldLocks bool
	// Src is the source of the datagrams delivered (nil: none a consumer
	// can read itself); the CQs that get completions remember it.
	Src *Source

	cqs []*cqObj
	qps []burstQP
	rq  *qpObj // whose rmu the Burst holds
	cq  *cqObj // whose mu the Burst holds (rq's receive CQ)
}

// burstQP counts the datagrams delivered to a QP during a burst.
type burstQP struct {
	q *qpObj
	n uint64
}

// Flush releases the locks the Burst holds, counts the datagrams
// delivered since the last Flush and wakes the waiters of the CQs that got
// completions.
func (b *Burst) Flush() {
	b.Release()
	for i, e := range b.qps {
		e.q.ctr[Delivered].Add(e.n)
		e.q.dev.ctr[Delivered].Add(e.n)
		b.qps[i] = burstQP{}
	}
	b.qps = b.qps[:0]
	for i, cq := range b.cqs {
		cq.mu.Lock()
		cq.wake()
		cq.mu.Unlock()
		b.cqs[i] = nil
	}
	b.cqs = b.cqs[:0]
}

// Release releases the locks a Burst with HoldLocks holds (the CQ's, then
// the receive queue's).
func (b *Burst) Release() {
	if b.cq != nil {
		b.cq.mu.Unlock()
		b.cq = nil
	}
	if b.rq != nil {
		b.rq.rmu.Unlock()
		b.rq = nil
	}
}

// lockRQ holds q's receive-queue lock, releasing another QP's locks first:
// the Burst never holds two QPs', so two of them never wait for each other.
func (b *Burst) lockRQ(q *qpObj) {
	if b.rq == q {
		return
	}
	b.Release()
	q.rmu.Lock()
	b.rq = q
}

// lockCQ holds cq's lock, the receive CQ of the QP whose receive-queue
// lock the Burst holds (locks are taken in that order everywhere).
func (b *Burst) lockCQ(cq *cqObj) {
	if b.cq == cq {
		return
	}
	if b.cq != nil {
		b.cq.mu.Unlock()
	}
	cq.mu.Lock()
	b.cq = cq
}

// delivered records a datagram delivered to q, counted at Flush.
func (b *Burst) delivered(q *qpObj) {
	for i := range b.qps {
		if b.qps[i].q == q {
			b.qps[i].n++
			return
		}
	}
	b.qps = append(b.qps, burstQP{q: q, n: 1})
}

// add records that cq got a completion to announce, and its source.
func (b *Burst) add(cq *cqObj) {
	for _, c := range b.cqs {
		if c == cq {
			return
		}
	}
	b.cqs = append(b.cqs, cq)
	if b.Src != nil && cq.src.Load() != b.Src {
		cq.src.Store(b.Src)
		if cq.hint.Load() != nil {
			// The hint is written under the CQ's lock (SetPollHint).
			if b.cq == cq {
				cq.writeHintLocked()
			} else {
				cq.mu.Lock()
				cq.writeHintLocked()
				cq.mu.Unlock()
			}
		}
	}
}
