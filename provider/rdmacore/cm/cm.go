//go:build rdmacore && cgo

package cm

/*
#cgo LDFLAGS: -lrdmacm -libverbs
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>
#include <infiniband/ib.h>

// sr_cm_event is what Go reads of a struct rdma_cm_event: the event, its
// status, the tokens Go gave the id and the join, and the UD parameters.
struct sr_cm_event {
	int type;
	int status;
	uint64_t id_token;
	uint64_t mc_token;
	uint32_t qp_num;
	uint32_t qkey;
	uint8_t private_data_len;
	struct ibv_ah_attr ah;
};

// sr_sa copies a socket address given as bytes into storage; NULL for none.
static struct sockaddr *sr_sa(struct sockaddr_storage *ss, const void *sa, int len) {
	if (len <= 0)
		return NULL;
	memset(ss, 0, sizeof *ss);
	memcpy(ss, sa, len > (int)sizeof *ss ? (int)sizeof *ss : len);
	return (struct sockaddr *)ss;
}

static int sr_create_channel(struct rdma_event_channel **out, int *dupfd) {
	struct rdma_event_channel *ch = rdma_create_event_channel();
	int fl;
	if (!ch)
		return errno ? errno : ENODEV;
	// Non-blocking: rdma_get_cm_event returns EAGAIN instead of waiting;
	// Go waits for readiness on a duplicate of the fd in its netpoller.
	fl = fcntl(ch->fd, F_GETFL);
	if (fl < 0 || fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) < 0 || (*dupfd = fcntl(ch->fd, F_DUPFD_CLOEXEC, 0)) < 0) {
		int e = errno;
		rdma_destroy_event_channel(ch);
		return e;
	}
	*out = ch;
	return 0;
}

static int sr_get_event(struct rdma_event_channel *ch, struct rdma_cm_event **out, struct sr_cm_event *e) {
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev))
		return errno;
	memset(e, 0, sizeof *e);
	e->type = ev->event;
	e->status = ev->status;
	e->id_token = (uint64_t)(uintptr_t)ev->id->context;
	if (ev->event == RDMA_CM_EVENT_MULTICAST_JOIN || ev->event == RDMA_CM_EVENT_MULTICAST_ERROR) {
		e->mc_token = (uint64_t)(uintptr_t)ev->param.ud.private_data;
		e->qp_num = ev->param.ud.qp_num;
		e->qkey = ev->param.ud.qkey;
		e->private_data_len = ev->param.ud.private_data_len;
		e->ah = ev->param.ud.ah_attr;
	}
	*out = ev;
	return 0;
}

static int sr_ack(struct rdma_cm_event *ev) {
	return rdma_ack_cm_event(ev) ? errno : 0;
}

static int sr_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id, uint64_t tok, int ps) {
	return rdma_create_id(ch, id, (void *)(uintptr_t)tok, (enum rdma_port_space)ps) ? errno : 0;
}

static int sr_destroy_id(struct rdma_cm_id *id) {
	return rdma_destroy_id(id) ? errno : 0;
}

static int sr_bind(struct rdma_cm_id *id, const void *sa, int len) {
	struct sockaddr_storage ss;
	return rdma_bind_addr(id, sr_sa(&ss, sa, len)) ? errno : 0;
}

static int sr_resolve_addr(struct rdma_cm_id *id, const void *src, int srclen, const void *dst, int dstlen, int ms) {
	struct sockaddr_storage s, d;
	return rdma_resolve_addr(id, sr_sa(&s, src, srclen), sr_sa(&d, dst, dstlen), ms) ? errno : 0;
}

static int sr_join(struct rdma_cm_id *id, const void *sa, int len, uint64_t tok) {
	struct sockaddr_storage ss;
	return rdma_join_multicast(id, sr_sa(&ss, sa, len), (void *)(uintptr_t)tok) ? errno : 0;
}

static int sr_join_ex(struct rdma_cm_id *id, uint32_t comp_mask, uint32_t flags, const void *sa, int len, uint64_t tok) {
	struct sockaddr_storage ss;
	struct rdma_cm_join_mc_attr_ex a;
	memset(&a, 0, sizeof a);
	a.comp_mask = comp_mask;
	a.join_flags = flags;
	a.addr = sr_sa(&ss, sa, len);
	return rdma_join_multicast_ex(id, &a, (void *)(uintptr_t)tok) ? errno : 0;
}

static int sr_leave(struct rdma_cm_id *id, const void *sa, int len) {
	struct sockaddr_storage ss;
	return rdma_leave_multicast(id, sr_sa(&ss, sa, len)) ? errno : 0;
}

static int sr_init_qp_attr(struct rdma_cm_id *id, int state, uint32_t *qkey, uint16_t *pkey_index, uint8_t *port, int *mask) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = (enum ibv_qp_state)state;
	if (rdma_init_qp_attr(id, &a, mask))
		return errno;
	*qkey = a.qkey;
	*pkey_index = a.pkey_index;
	*port = a.port_num;
	return 0;
}

// sr_addr copies the id's local (which 0) or peer (1) address into buf
// (sizeof(struct sockaddr_storage) bytes) and returns its length.
static int sr_addr(struct rdma_cm_id *id, int which, void *buf) {
	struct sockaddr *sa = which ? rdma_get_peer_addr(id) : rdma_get_local_addr(id);
	int len;
	switch (sa->sa_family) {
	case AF_INET: len = sizeof(struct sockaddr_in); break;
	case AF_INET6: len = sizeof(struct sockaddr_in6); break;
	case AF_IB: len = sizeof(struct sockaddr_ib); break;
	default: return 0;
	}
	memcpy(buf, sa, len);
	return len;
}

static const char *sr_dev_name(struct rdma_cm_id *id) {
	return id->verbs ? ibv_get_device_name(id->verbs->device) : NULL;
}
*/
import "C"

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/softrdma/softrdma/verbs"
)

// errnoOf turns a helper's result (0 or an errno) into an error.
func errnoOf(r C.int) error {
	if r == 0 {
		return nil
	}
	return syscall.Errno(r)
}

// saArg returns the C view of a socket address given as bytes.
func saArg(sa []byte) (unsafe.Pointer, C.int) {
	if len(sa) == 0 {
		return nil, 0
	}
	return unsafe.Pointer(&sa[0]), C.int(len(sa))
}

// CMChannel is a librdmacm event channel (struct rdma_event_channel). Its
// fd is non-blocking; Next waits for events in Go's netpoller, so no
// thread blocks in rdma_get_cm_event.
type CMChannel struct {
	ch *C.struct_rdma_event_channel
	f  *os.File // a duplicate of the channel's fd, in the netpoller
	rc syscall.RawConn

	closeOnce sync.Once
	closeErr  error
}

// NewCMChannel creates an event channel (rdma_create_event_channel). It
// fails with ENODEV when the machine has no RDMA device.
func NewCMChannel() (*CMChannel, error) {
	var ch *C.struct_rdma_event_channel
	var dup C.int
	if err := errnoOf(C.sr_create_channel(&ch, &dup)); err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "rdma_cm")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		C.rdma_destroy_event_channel(ch)
		return nil, err
	}
	return &CMChannel{ch: ch, f: f, rc: rc}, nil
}

// ErrChannelClosed is what Next returns once the channel is closed.
var ErrChannelClosed = errors.New("rdmacore: event channel closed")

// Next returns the next event of the channel (rdma_get_cm_event), waiting
// until one arrives or the channel is closed (ErrChannelClosed). Every
// event must be acked with Ack.
func (c *CMChannel) Next() (*CMEvent, error) {
	ev := &CMEvent{}
	var cerr error
	err := c.rc.Read(func(uintptr) bool {
		var raw C.struct_sr_cm_event
		r := C.sr_get_event(c.ch, &ev.ev, &raw)
		if r == C.EAGAIN {
			return false
		}
		if cerr = errnoOf(r); cerr == nil {
			ev.fill(&raw)
		}
		return true
	})
	switch {
	case err != nil:
		return nil, ErrChannelClosed
	case cerr != nil:
		return nil, cerr
	}
	return ev, nil
}

// Close stops Next (an event it is reading is still returned) and
// destroys the channel (rdma_destroy_event_channel). Every id of the
// channel must be destroyed and every event acked first.
func (c *CMChannel) Close() error {
	c.closeOnce.Do(func() {
		// Closing the duplicate waits for a Read callback in progress.
		c.closeErr = c.f.Close()
		C.rdma_destroy_event_channel(c.ch)
	})
	return c.closeErr
}

// CMEvent is an event of a CMChannel (struct rdma_cm_event), copied out.
type CMEvent struct {
	// Type is the event (enum rdma_cm_event_type) and Status its status.
	Type, Status int
	// IDToken is the token the id was created with; MCToken, for
	// MULTICAST_JOIN and MULTICAST_ERROR, the token of the join.
	IDToken, MCToken uint64
	// QPNum, QKey and AHAttr are the UD parameters of a multicast event.
	QPNum, QKey uint32
	AHAttr      verbs.AHAttr
	// PrivateDataLen is the event's ud.private_data_len (0 for multicast
	// events: their private_data is the join's context).
	PrivateDataLen uint8

	ev    *C.struct_rdma_cm_event
	acked atomic.Bool
}

func (e *CMEvent) fill(r *C.struct_sr_cm_event) {
	e.Type, e.Status = int(r._type), int(r.status)
	e.IDToken, e.MCToken = uint64(r.id_token), uint64(r.mc_token)
	e.QPNum, e.QKey = uint32(r.qp_num), uint32(r.qkey)
	e.AHAttr = ahAttrFromC(&r.ah)
	e.PrivateDataLen = uint8(r.private_data_len)
}

// ahAttrFromC converts a struct ibv_ah_attr.
func ahAttrFromC(a *C.struct_ibv_ah_attr) verbs.AHAttr {
	var dgid verbs.GID
	copy(dgid[:], C.GoBytes(unsafe.Pointer(&a.grh.dgid), 16))
	return verbs.AHAttr{
		GRH: verbs.GlobalRoute{
			DGID: dgid, FlowLabel: uint32(a.grh.flow_label), SGIDIndex: uint8(a.grh.sgid_index),
			HopLimit: uint8(a.grh.hop_limit), TrafficClass: uint8(a.grh.traffic_class),
		},
		DLID: uint16(a.dlid), SL: uint8(a.sl), SrcPathBits: uint8(a.src_path_bits),
		StaticRate: uint8(a.static_rate), IsGlobal: a.is_global != 0, PortNum: uint8(a.port_num),
	}
}

// Ack acknowledges and frees the event (rdma_ack_cm_event); a second Ack
// is EINVAL.
func (e *CMEvent) Ack() error {
	if e == nil || e.ev == nil || !e.acked.CompareAndSwap(false, true) {
		return syscall.EINVAL
	}
	return errnoOf(C.sr_ack(e.ev))
}

// CMID is a librdmacm id (struct rdma_cm_id) on a CMChannel. Its methods
// are safe for concurrent use; after Destroy they fail with EINVAL (or
// return nothing) and never touch the freed C id.
type CMID struct {
	life sync.RWMutex         // id (write); calls on id (read)
	id   *C.struct_rdma_cm_id // nil once destroyed
}

// use read-locks the id for a call on its C object and returns it, nil
// once destroyed; the caller runs id.life.RUnlock.
func (id *CMID) use() *C.struct_rdma_cm_id {
	id.life.RLock()
	return id.id
}

// CreateID creates an id of port space ps (rdma_create_id); token comes
// back in the IDToken of its events.
func (c *CMChannel) CreateID(token uint64, ps uint16) (*CMID, error) {
	var id *C.struct_rdma_cm_id
	if err := errnoOf(C.sr_create_id(c.ch, &id, C.uint64_t(token), C.int(ps))); err != nil {
		return nil, err
	}
	return &CMID{id: id}, nil
}

// Destroy destroys the id (rdma_destroy_id): it waits until every event
// of the id that Next returned is acked; EINVAL when destroyed already.
// The id is marked gone before the wait (the calls in progress end
// first, later ones fail), so a call made while it waits, by the code
// that would ack the event it waits for, does not wait for it in turn.
func (id *CMID) Destroy() error {
	id.life.Lock()
	c := id.id
	id.id = nil
	id.life.Unlock()
	if c == nil {
		return syscall.EINVAL
	}
	return errnoOf(C.sr_destroy_id(c))
}

// Bind binds the id to a local address (rdma_bind_addr).
func (id *CMID) Bind(sa []byte) error {
	c := id.use()
	defer id.life.RUnlock()
	if c == nil {
		return syscall.EINVAL
	}
	p, n := saArg(sa)
	return errnoOf(C.sr_bind(c, p, n))
}

// ResolveAddr starts the resolution of dst (rdma_resolve_addr); src may
// be nil.
func (id *CMID) ResolveAddr(src, dst []byte, timeoutMS int) error {
	c := id.use()
	defer id.life.RUnlock()
	if c == nil {
		return syscall.EINVAL
	}
	sp, sn := saArg(src)
	dp, dn := saArg(dst)
	return errnoOf(C.sr_resolve_addr(c, sp, sn, dp, dn, C.int(timeoutMS)))
}

// Join joins a group as a full member (rdma_join_multicast); token comes
// back in the MCToken of the join's events.
func (id *CMID) Join(addr []byte, token uint64) error {
	c := id.use()
	defer id.life.RUnlock()
	if c == nil {
		return syscall.EINVAL
	}
	p, n := saArg(addr)
	return errnoOf(C.sr_join(c, p, n, C.uint64_t(token)))
}

// JoinEx joins a group (rdma_join_multicast_ex) with the attributes as
// given: librdmacm and the kernel check them.
func (id *CMID) JoinEx(compMask, flags uint32, addr []byte, token uint64) error {
	c := id.use()
	defer id.life.RUnlock()
	if c == nil {
		return syscall.EINVAL
	}
	p, n := saArg(addr)
	return errnoOf(C.sr_join_ex(c, C.uint32_t(compMask), C.uint32_t(flags), p, n, C.uint64_t(token)))
}

// Leave leaves a group (rdma_leave_multicast): it waits until every event
// of the join that Next returned is acked. The id has no QP in librdmacm's
// view, so nothing is detached here.
func (id *CMID) Leave(addr []byte) error {
	c := id.use()
	defer id.life.RUnlock()
	if c == nil {
		return syscall.EINVAL
	}
	p, n := saArg(addr)
	return errnoOf(C.sr_leave(c, p, n))
}

// InitQPAttr returns the QP attributes the kernel's CM gives a QP of the
// id for state (rdma_init_qp_attr): for INIT the P_Key index, port and
// Q_Key of a UD QP.
func (id *CMID) InitQPAttr(state verbs.QPState) (verbs.QPAttr, verbs.QPAttrMask, error) {
	var qkey C.uint32_t
	var pkey C.uint16_t
	var port C.uint8_t
	var mask C.int
	c := id.use()
	defer id.life.RUnlock()
	if c == nil {
		return verbs.QPAttr{}, 0, syscall.EINVAL
	}
	if err := errnoOf(C.sr_init_qp_attr(c, C.int(state), &qkey, &pkey, &port, &mask)); err != nil {
		return verbs.QPAttr{}, 0, err
	}
	return verbs.QPAttr{State: state, QKey: uint32(qkey), PKeyIdx: uint16(pkey), PortNum: uint8(port)}, verbs.QPAttrMask(mask), nil
}

// LocalAddr returns the id's local address (rdma_get_local_addr) as bytes
// of a struct sockaddr; empty when it has none.
func (id *CMID) LocalAddr() []byte { return id.addr(0) }

// PeerAddr returns the id's destination address (rdma_get_peer_addr).
func (id *CMID) PeerAddr() []byte { return id.addr(1) }

func (id *CMID) addr(which C.int) []byte {
	var buf [C.sizeof_struct_sockaddr_storage]byte
	c := id.use()
	defer id.life.RUnlock()
	if c == nil {
		return nil
	}
	n := C.sr_addr(c, which, unsafe.Pointer(&buf[0]))
	return append([]byte(nil), buf[:n]...)
}

// DeviceName returns the name of the kernel device the id is bound to
// (id->verbs), or "".
func (id *CMID) DeviceName() string {
	c := id.use()
	defer id.life.RUnlock()
	if c == nil {
		return ""
	}
	if s := C.sr_dev_name(c); s != nil {
		return C.GoString(s)
	}
	return ""
}

// PortNum returns the device port the id is bound to (id->port_num).
func (id *CMID) PortNum() uint8 {
	c := id.use()
	defer id.life.RUnlock()
	if c == nil {
		return 0
	}
	return uint8(c.port_num)
}

// OwnerOf returns the name of the kernel device that owns the local
// address sa, or "": it binds a probe id to the address on channel c, as
// rdma_bind_addr picks the device whose netdev has the address (the
// kernel's cma_acquire_dev_by_src_ip).
func (c *CMChannel) OwnerOf(sa []byte) string {
	id, err := c.CreateID(0, psUDP)
	if err != nil {
		return ""
	}
	defer id.Destroy()
	if id.Bind(sa) != nil {
		return ""
	}
	return id.DeviceName()
}

// psUDP is RDMA_PS_UDP.
const psUDP = C.RDMA_PS_UDP
