package rdmacm

import (
	"context"
	"fmt"
	"sync"
	"syscall"

	"github.com/softrdma/softrdma/logging"
	"github.com/softrdma/softrdma/verbs"
)

// EventType is an RDMA CM event type (enum rdma_cm_event_type).
type EventType int

// Event types, with their C values.
const (
	EventAddrResolved     EventType = 0
	EventAddrError        EventType = 1
	EventRouteResolved    EventType = 2
	EventRouteError       EventType = 3
	EventConnectRequest   EventType = 4
	EventConnectResponse  EventType = 5
	EventConnectError     EventType = 6
	EventUnreachable      EventType = 7
	EventRejected         EventType = 8
	EventEstablished      EventType = 9
	EventDisconnected     EventType = 10
	EventDeviceRemoval    EventType = 11
	EventMulticastJoin    EventType = 12
	EventMulticastError   EventType = 13
	EventAddrChange       EventType = 14
	EventTimewaitExit     EventType = 15
	EventAddrinfoResolved EventType = 16
	EventAddrinfoError    EventType = 17
	EventUser             EventType = 18
	EventInternal         EventType = 19
)

var eventNames = [...]string{
	"RDMA_CM_EVENT_ADDR_RESOLVED",
	"RDMA_CM_EVENT_ADDR_ERROR",
	"RDMA_CM_EVENT_ROUTE_RESOLVED",
	"RDMA_CM_EVENT_ROUTE_ERROR",
	"RDMA_CM_EVENT_CONNECT_REQUEST",
	"RDMA_CM_EVENT_CONNECT_RESPONSE",
	"RDMA_CM_EVENT_CONNECT_ERROR",
	"RDMA_CM_EVENT_UNREACHABLE",
	"RDMA_CM_EVENT_REJECTED",
	"RDMA_CM_EVENT_ESTABLISHED",
	"RDMA_CM_EVENT_DISCONNECTED",
	"RDMA_CM_EVENT_DEVICE_REMOVAL",
	"RDMA_CM_EVENT_MULTICAST_JOIN",
	"RDMA_CM_EVENT_MULTICAST_ERROR",
	"RDMA_CM_EVENT_ADDR_CHANGE",
	"RDMA_CM_EVENT_TIMEWAIT_EXIT",
	"RDMA_CM_EVENT_ADDRINFO_RESOLVED",
	"RDMA_CM_EVENT_ADDRINFO_ERROR",
}

// String returns rdma_event_str's text: the C constant name for 0..17,
// "UNKNOWN EVENT" for anything else (USER and INTERNAL included).
func (t EventType) String() string {
	if t >= 0 && int(t) < len(eventNames) {
		return eventNames[t]
	}
	return "UNKNOWN EVENT"
}

// UDParam is the UD part of an event (struct rdma_ud_param).
type UDParam struct {
	// PrivateData is, for MULTICAST_JOIN and MULTICAST_ERROR, the context
	// given to the join (librdmacm puts the join context pointer there);
	// for CONNECT_REQUEST, ESTABLISHED and UNREACHABLE of a UD connection
	// the peer's private data as a []byte, of the SIDR message's fixed
	// size (UDConnectPrivateDataMax, UDAcceptPrivateDataMax), zero-padded,
	// as the kernel gives it.
	PrivateData any
	// PrivateDataLen is ud.private_data_len: 0 for multicast events, as
	// librdmacm gives it (their PrivateData is the join's context, not
	// data of a peer); the length of PrivateData's bytes for a UD
	// connection's events.
	PrivateDataLen uint8
	AHAttr         verbs.AHAttr
	QPNum          uint32
	QKey           uint32
}

// Event is an RDMA CM event (struct rdma_cm_event). Every event returned by
// GetEvent must be acknowledged exactly once with Ack.
type Event struct {
	ID     *ID
	Event  EventType
	Status int // 0, a negative errno, or -1 when a local verbs call failed
	// Err holds the error behind Status -1 (C: errno), e.g. the attach error
	// of a MULTICAST_JOIN turned into MULTICAST_ERROR.
	Err   error
	Param UDParam
	// ListenID is, for CONNECT_REQUEST, the listening id (listen_id);
	// ID is then the new id of the request. The event counts as the
	// listening id's, as librdmacm counts it.
	ListenID *ID

	mc       *mcJoin
	ch       *EventChannel
	reported bool
	acked    bool
	kack     func() error // acks the librdmacm event of a kernel id
}

// EventChannel is an event channel (struct rdma_event_channel).
type EventChannel struct {
	mu       sync.Mutex
	cond     *sync.Cond // signalled on every ack, for leave/destroy waits
	queue    []*Event
	ready    chan struct{} // closed and replaced when the queue goes non-empty
	nonblock bool
	closed   bool
	ids      int
	private  bool // the private channel of a synchronous id
	cm       *cmState
	backend  Backend

	// The channel's part on the kernel's stack (kernel.go): nil until its
	// first kernel id.
	k *kernelChannel
}

// CreateEventChannel opens an event channel (rdma_create_event_channel).
func CreateEventChannel() (_ *EventChannel, err error) {
	defer wrapErr(&err, "rdma_create_event_channel", nil)
	return newEventChannel(cmOf(verbs.DefaultHost()))
}

// newEventChannel makes a channel of the CM state cm, with the backend
// BackendEnv sets. The first one starts the logs SOFTRDMA_LOG asks for
// (logging.StartFromEnv); a value it cannot parse fails every channel
// (EINVAL, naming the variable).
func newEventChannel(cm *cmState) (*EventChannel, error) {
	b, err := envBackend()
	if err != nil {
		return nil, err
	}
	if err := logging.StartFromEnv(); err != nil {
		return nil, fmt.Errorf("%w: %w", err, syscall.EINVAL)
	}
	ch := &EventChannel{ready: make(chan struct{}), cm: cm, backend: b}
	ch.cond = sync.NewCond(&ch.mu)
	return ch, nil
}

// Close closes the channel (rdma_destroy_event_channel). Every id on it
// must be destroyed first: otherwise EBUSY.
func (ch *EventChannel) Close() (err error) {
	defer wrapErr(&err, "rdma_destroy_event_channel", nil)
	ch.mu.Lock()
	if ch.closed {
		ch.mu.Unlock()
		return syscall.EINVAL
	}
	if ch.ids > 0 {
		ch.mu.Unlock()
		return fmt.Errorf("%d ids left: %w", ch.ids, syscall.EBUSY)
	}
	ch.closed = true
	close(ch.ready)
	// The librdmacm channel stays open while kernel ids MigrateID moved
	// away live on it: the last one's Destroy closes it.
	var k *kernelChannel
	if ch.k != nil && ch.k.users == 0 {
		k, ch.k = ch.k, nil
	}
	ch.mu.Unlock()
	// Outside ch.mu: the reader takes it for an event it is delivering.
	k.close()
	return nil
}

// SetNonblocking makes GetEvent return EAGAIN instead of waiting when no
// event is queued (fcntl O_NONBLOCK on the channel fd).
func (ch *EventChannel) SetNonblocking(nb bool) {
	ch.mu.Lock()
	ch.nonblock = nb
	ch.mu.Unlock()
}

// Ready returns a channel that is closed once an event is queued (or the
// channel is closed), for use in select; call it again after each wake-up.
func (ch *EventChannel) Ready() <-chan struct{} {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if len(ch.queue) > 0 || ch.closed {
		c := make(chan struct{})
		close(c)
		return c
	}
	return ch.ready
}

// GetEvent returns the next event (rdma_get_cm_event). It blocks until an
// event is queued or ctx is done; on a non-blocking channel it returns
// EAGAIN at once when the queue is empty.
func (ch *EventChannel) GetEvent(ctx context.Context) (_ *Event, err error) {
	defer wrapErr(&err, "rdma_get_cm_event", nil)
	for {
		ch.mu.Lock()
		if ch.closed {
			ch.mu.Unlock()
			return nil, fmt.Errorf("channel closed: %w", syscall.EBADF)
		}
		if len(ch.queue) > 0 {
			ev := ch.queue[0]
			ch.queue[0] = nil
			ch.queue = ch.queue[1:]
			ev.reported = true
			ev.owner().ev.reported++
			if ev.mc != nil {
				ev.mc.eventsReported++
			}
			ch.mu.Unlock()
			ev.ID.processEvent(ev)
			return ev, nil
		}
		if ch.nonblock {
			ch.mu.Unlock()
			return nil, syscall.EAGAIN
		}
		ready := ch.ready
		ch.mu.Unlock()
		if ctx == nil {
			ctx = context.Background()
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// TryGetEvent is GetEvent on a non-blocking channel: EAGAIN when empty.
func (ch *EventChannel) TryGetEvent() (_ *Event, err error) {
	defer wrapErr(&err, "rdma_get_cm_event", nil)
	ch.mu.Lock()
	if len(ch.queue) == 0 {
		ch.mu.Unlock()
		return nil, syscall.EAGAIN
	}
	ch.mu.Unlock()
	return ch.GetEvent(context.Background())
}

// Len returns the number of queued, not yet retrieved events.
func (ch *EventChannel) Len() int {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return len(ch.queue)
}

// enqueueLocked appends an event (ch.mu is held).
func (ch *EventChannel) enqueueLocked(ev *Event) {
	ev.ch = ch
	ch.queue = append(ch.queue, ev)
	if len(ch.queue) == 1 {
		close(ch.ready)
		ch.ready = make(chan struct{})
	}
}

// purgeLocked drops queued events that match; the librdmacm event behind
// a kernel id's event is acked (the kernel would have dropped it unread).
func (ch *EventChannel) purgeLocked(match func(*Event) bool) {
	q := ch.queue[:0]
	for _, ev := range ch.queue {
		if !match(ev) {
			q = append(q, ev)
		} else if ev.kack != nil {
			ev.kack()
		}
	}
	for i := len(q); i < len(ch.queue); i++ {
		ch.queue[i] = nil
	}
	ch.queue = q
}

// Ack acknowledges and releases an event (rdma_ack_cm_event). A nil event
// or a second ack is EINVAL.
func (ev *Event) Ack() (err error) {
	defer wrapErr(&err, "rdma_ack_cm_event", nil)
	if ev == nil || ev.ch == nil {
		return syscall.EINVAL
	}
	ch := ev.ch
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ev.acked || !ev.reported {
		return syscall.EINVAL
	}
	ev.owner().ackLocked(ev)
	return nil
}

// owner returns the id whose event ev counts as: the listening id of a
// CONNECT_REQUEST, else ev.ID.
func (ev *Event) owner() *ID {
	if ev.ListenID != nil {
		return ev.ListenID
	}
	return ev.ID
}

// ackLocked acks a retrieved event of the id (id.ch().mu is held): the
// counts that leave and destroy wait on, and librdmacm's ack of a kernel
// id's event.
func (id *ID) ackLocked(ev *Event) {
	if ev.acked {
		return
	}
	ev.acked = true
	id.ev.completed++
	if ev.mc != nil {
		ev.mc.eventsCompleted++
	}
	if ev.kack != nil {
		ev.kack()
	}
	if ev.ch != nil {
		ev.ch.cond.Broadcast()
	}
}

// String describes the event like mckey's messages.
func (ev *Event) String() string {
	return fmt.Sprintf("%v, status: %d", ev.Event, ev.Status)
}
