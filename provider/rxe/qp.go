package rxe

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/softrdma/softrdma/internal/sys/rawudp"
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
	conn4 *rawudp.Conn
	raw4  syscall.RawConn
	port4 uint16
	// mcSrc4 is conn4's multicast source address (IP_MULTICAST_IF): the
	// device's first IPv4 address when the block was opened, if any.
	mcSrc4 netip.Addr
	conn6  *rawudp.Conn // nil when IPv6 is unavailable
	raw6   syscall.RawConn
	port6  uint16
	ho     *handoverListener     // its hand-over socket
	used   [qpsPerBlock + 1]bool // by index 1..255 (Device.mu)
	n      int
	next   int
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
	if b.ho != nil {
		b.ho.close()
	}
	b.conn4.Close()
	if b.conn6 != nil {
		b.conn6.Close()
	}
}

// qp is the transport side of a UD QP (softverbs.DriverQP): its QPN and
// its send sockets. The verbs core owns everything else.
type qp struct {
	dev       *Device
	qpn       uint32
	blk       *sendBlock
	idx       int
	blockSelf bool
	gsi       bool // QP1's sender (gsi.go): DETH SrcQP 1

	dead atomic.Bool
	smu  sync.Mutex // send side

	// flow is the IP and UDP headers of the last datagram built and their
	// ICRC prefix (q.smu): the next datagram of the same flow copies them.
	flow sendFlow
}

// CreateQP creates the transport side of a UD QP (softverbs.Driver). Other
// QP types fail with EOPNOTSUPP, as do create flags other than
// CreateBlockSelfMcastLB (which, unlike rxe, this device supports).
func (d *Device) CreateQP(init softverbs.DriverQPInit) (softverbs.DriverQP, error) {
	if init.Type != verbs.QPTypeUD {
		return nil, d.errf(syscall.EOPNOTSUPP, "create qp: type %v", init.Type)
	}
	if init.CreateFlags&^verbs.CreateBlockSelfMcastLB != 0 {
		return nil, d.errf(syscall.EOPNOTSUPP, "create qp: create flags %#x", uint32(init.CreateFlags))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, d.errf(syscall.ENODEV, "create qp: device closed")
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
	q := &qp{
		dev:       d,
		qpn:       uint32(blk.port4)<<8 | uint32(idx),
		blockSelf: init.CreateFlags&verbs.CreateBlockSelfMcastLB != 0,
		blk:       blk,
		idx:       idx,
	}
	return q, nil
}

// openBlockLocked opens a new pair of send sockets.
func (d *Device) openBlockLocked() (*sendBlock, error) {
	src4, _ := d.info.Load().firstIPv4()
	c4, p4, err := openSendConn(false, d.ifindex, src4)
	if err != nil {
		return nil, d.errf(verbs.ErrnoOf(err), "send socket: %v", err)
	}
	b := &sendBlock{conn4: c4, port4: p4, mcSrc4: src4}
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
	if len(d.blocks) == 0 {
		if err := d.openUnicastLocked(b.conn6 != nil); err != nil {
			b.close()
			return nil, err
		}
	}
	// The unicast datagrams other devices of this user read for the
	// block's QPNs come over its hand-over socket. Without it (another
	// user holds its name, a security module forbids it) those are lost,
	// counted and logged; the block serves its QPs otherwise.
	if err := d.listenHandoverLocked(b); err != nil {
		d.handoverFailed("listen", fmt.Errorf("hand-over socket for port %d: %w", b.port4, err))
	}
	ownersGen.Add(1) // the port may be remembered without an owner (noowner.go)
	d.blocks = append(d.blocks, b)
	d.publishPortsLocked()
	return b, nil
}

func (d *Device) publishPortsLocked() {
	var ports4, ports6 []uint16
	for _, b := range d.blocks {
		ports4 = append(ports4, b.port4)
		if b.conn6 != nil {
			ports6 = append(ports6, b.port6)
		}
	}
	d.ownPorts4.Store(&ports4)
	d.ownPorts6.Store(&ports6)
}

// QPN returns the QP number (softverbs.DriverQP): the device's send socket
// port << 8 | index, unique on the host while the device lives.
func (q *qp) QPN() uint32 { return q.qpn }

// SrcPort returns the UDP source port of the QP's IPv4 datagrams.
func (q *qp) SrcPort() uint16 { return q.blk.port4 }

// Destroy frees the QPN and, with the block's last QP, its send sockets
// (softverbs.DriverQP). The core has detached the QP already.
func (q *qp) Destroy() {
	d := q.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if q.dead.Swap(true) {
		return
	}
	b := q.blk
	b.used[q.idx] = false
	b.n--
	if b.n == 0 && !d.closed {
		b.close()
		d.blocks = slices.DeleteFunc(d.blocks, func(x *sendBlock) bool { return x == b })
		d.publishPortsLocked()
		if len(d.blocks) == 0 {
			d.closeUnicastLocked()
		}
	}
}
