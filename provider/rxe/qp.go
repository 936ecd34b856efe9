package rxe

import (
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// maxQP is the device's max_qp.
const maxQP = 65536

// qpsPerBlock is how many QPNs one send socket provides: (port << 8) | 1..255.
const qpsPerBlock = 255

// sendBlock is a pair of send sockets (IPv4, IPv6) and the QPNs derived
// from the IPv4 socket's port.
type sendBlock struct {
	conn4 *net.UDPConn
	raw4  syscall.RawConn
	port4 uint16
	conn6 *net.UDPConn // nil when IPv6 is unavailable
	raw6  syscall.RawConn
	port6 uint16
	used  [qpsPerBlock + 1]bool // by index 1..255 (Device.mu)
	n     int
	next  int
}

// capacity is the number of usable indexes; QPN 0xFFFFFF (multicast) is
// never handed out.
func (b *sendBlock) capacity() int {
	if b.port4 == 0xFFFF {
		return qpsPerBlock - 1
	}
	return qpsPerBlock
}

// alloc returns a free index, cycling so that a destroyed QP's number is
// not reused at once.
func (b *sendBlock) alloc() int {
	for k := 0; k < qpsPerBlock; k++ {
		i := (b.next+k)%qpsPerBlock + 1
		if b.used[i] || uint32(b.port4)<<8|uint32(i) == wire.MulticastQPN {
			continue
		}
		b.used[i] = true
		b.n++
		b.next = i % qpsPerBlock
		return i
	}
	return 0
}

func (b *sendBlock) close() {
	b.conn4.Close()
	if b.conn6 != nil {
		b.conn6.Close()
	}
}

// qp is the provider side of a UD QP (softverbs.DriverQP).
type qp struct {
	dev       *Device
	qpn       uint32
	rx        softverbs.Receiver
	brx       softverbs.BurstReceiver // rx, when it can defer CQ wake-ups
	blockSelf bool
	blk       *sendBlock
	idx       int

	state atomic.Uint32 // verbs.QPState
	qkey  atomic.Uint32
	port  atomic.Uint32

	// inflight counts receive goroutines inside a delivery to this QP;
	// once dead is set none starts, and Destroy waits for the rest.
	inflight atomic.Int32
	dead     atomic.Bool

	groups []*group // attach order (Device.mu)

	smu sync.Mutex // send side: below
	psn uint32

	ctr counterSet
}

// CreateQP creates the provider side of a UD QP (softverbs.Driver). Other QP
// types fail with EOPNOTSUPP, as do create flags other than
// CreateBlockSelfMcastLB (which, unlike rxe, this device supports).
func (d *Device) CreateQP(rx softverbs.Receiver, init softverbs.DriverQPInit) (softverbs.DriverQP, error) {
	if init.Type != verbs.QPTypeUD {
		return nil, d.errf(syscall.EOPNOTSUPP, "create qp: type %v", init.Type)
	}
	if init.CreateFlags&^verbs.CreateBlockSelfMcastLB != 0 {
		return nil, d.errf(syscall.EOPNOTSUPP, "create qp: create flags %#x", uint32(init.CreateFlags))
	}
	if rx == nil {
		return nil, d.errf(syscall.EINVAL, "create qp: nil receiver")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, d.errf(syscall.ENODEV, "create qp: device closed")
	}
	if len(d.qps) >= maxQP {
		return nil, d.errf(syscall.ENOMEM, "create qp: %d QPs", len(d.qps))
	}
	var blk *sendBlock
	for _, b := range d.blocks {
		if b.n < b.capacity() {
			blk = b
			break
		}
	}
	if blk == nil {
		var err error
		if blk, err = d.openBlockLocked(); err != nil {
			return nil, err
		}
	}
	idx := blk.alloc()
	brx, _ := rx.(softverbs.BurstReceiver)
	q := &qp{
		dev:       d,
		qpn:       uint32(blk.port4)<<8 | uint32(idx),
		rx:        rx,
		brx:       brx,
		blockSelf: init.CreateFlags&verbs.CreateBlockSelfMcastLB != 0,
		blk:       blk,
		idx:       idx,
	}
	q.port.Store(1)
	d.qps[q.qpn] = q
	d.publishQPsLocked()
	return q, nil
}

// openBlockLocked opens a new pair of send sockets.
func (d *Device) openBlockLocked() (*sendBlock, error) {
	src4, _ := d.info.Load().firstIPv4()
	c4, p4, err := openSendConn(false, d.ifindex, src4)
	if err != nil {
		return nil, d.errf(errnoOf(err, syscall.ENOMEM), "send socket: %v", err)
	}
	b := &sendBlock{conn4: c4, port4: p4}
	if b.raw4, err = c4.SyscallConn(); err != nil {
		c4.Close()
		return nil, d.errf(syscall.ENOMEM, "send socket: %v", err)
	}
	if c6, p6, err := openSendConn(true, d.ifindex, src4); err == nil {
		if b.raw6, err = c6.SyscallConn(); err == nil {
			b.conn6, b.port6 = c6, p6
		} else {
			c6.Close()
		}
	}
	d.blocks = append(d.blocks, b)
	d.publishPortsLocked()
	return b, nil
}

func (d *Device) publishQPsLocked() {
	t := maps.Clone(d.qps)
	d.qpTable.Store(&t)
}

func (d *Device) publishPortsLocked() {
	var ports []uint16
	for _, b := range d.blocks {
		ports = append(ports, b.port4)
		if b.conn6 != nil {
			ports = append(ports, b.port6)
		}
	}
	d.ownPorts.Store(&ports)
}

// QPN returns the QP number (softverbs.DriverQP): the device's send socket
// port << 8 | index, unique on the host while the device lives.
func (q *qp) QPN() uint32 { return q.qpn }

// Modify records the state, Q_Key, port and send PSN (softverbs.DriverQP);
// verbs has validated the transition.
func (q *qp) Modify(attr *verbs.QPAttr, mask verbs.QPAttrMask) error {
	if q.dead.Load() {
		return q.dev.errf(syscall.EINVAL, "modify qp %#x: destroyed", q.qpn)
	}
	if mask&verbs.QPAttrPort != 0 && attr.PortNum != 1 {
		return q.dev.errf(syscall.EINVAL, "modify qp %#x: port %d", q.qpn, attr.PortNum)
	}
	if mask&verbs.QPAttrQKey != 0 {
		q.qkey.Store(attr.QKey)
	}
	if mask&verbs.QPAttrPort != 0 {
		q.port.Store(uint32(attr.PortNum))
	}
	if mask&verbs.QPAttrSQPSN != 0 {
		q.smu.Lock()
		q.psn = attr.SQPSN & 0xFFFFFF
		q.smu.Unlock()
	}
	if mask&verbs.QPAttrState != 0 {
		q.state.Store(uint32(attr.State))
	}
	return nil
}

// Destroy detaches the QP from every group, waits until no receive
// goroutine is delivering to it and frees its QPN (softverbs.DriverQP). It must
// not be called from inside the QP's Receiver.Deliver.
func (q *qp) Destroy() error {
	d := q.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if q.dead.Load() {
		return nil
	}
	d.destroyQPLocked(q)
	return nil
}

func (d *Device) destroyQPLocked(q *qp) {
	q.smu.Lock()
	q.dead.Store(true)
	q.smu.Unlock()
	for len(q.groups) > 0 {
		d.detachLocked(q, q.groups[len(q.groups)-1])
	}
	waitZero(&q.inflight)
	delete(d.qps, q.qpn)
	d.publishQPsLocked()
	b := q.blk
	b.used[q.idx] = false
	b.n--
	if b.n == 0 {
		b.close()
		d.blocks = slices.DeleteFunc(d.blocks, func(x *sendBlock) bool { return x == b })
		d.publishPortsLocked()
	}
}

// enter starts a delivery to q; false when q is being destroyed.
func (q *qp) enter() bool {
	q.inflight.Add(1)
	if q.dead.Load() {
		q.inflight.Add(-1)
		return false
	}
	return true
}

func (q *qp) exit() { q.inflight.Add(-1) }

// receives reports whether the QP's state accepts datagrams (RTR to SQE;
// not RESET, INIT or ERR), like rxe's check_type_state.
func (q *qp) receives() bool {
	s := verbs.QPState(q.state.Load())
	return s >= verbs.QPSRTR && s <= verbs.QPSSQE
}
