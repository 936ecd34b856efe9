package ib

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
)

// qp is the transport side of a UD QP on an InfiniBand port
// (softverbs.DriverQP): its QPN and its send path. The verbs core owns the
// rest (state, Q_Key, attachments, receive checks).
type qp struct {
	dev       *Device
	qpn       uint32
	blockSelf bool
	dead      atomic.Bool

	smu   sync.Mutex // serializes sends; owns bufs, batch and lrx
	bufs  [][]byte   // packet buffers, one per datagram of a batch
	batch *sendBatch
	lrx   receiveScratch // the local copy of a multicast send
}

// CreateQP implements softverbs.Driver: QPNs run from 2 to 0xFFFFFE and
// wrap, skipping QPNs in use; 0, 1 (the special QPs) and 0xFFFFFF (the
// multicast QPN) are never handed out.
func (d *Device) CreateQP(init softverbs.DriverQPInit) (softverbs.DriverQP, error) {
	if init.Type != verbs.QPTypeUD {
		return nil, fmt.Errorf("ib: %v QPs: %w", init.Type, syscall.EOPNOTSUPP)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("ib: create qp: %w", syscall.ENODEV)
	}
	for n := 0; ; n++ {
		if n > maxQPN {
			return nil, fmt.Errorf("ib: create qp: no free QPN: %w", syscall.ENOMEM)
		}
		if d.nextQPN < 2 || d.nextQPN > maxQPN {
			d.nextQPN = 2
		}
		if !d.qpns[d.nextQPN] {
			break
		}
		d.nextQPN++
	}
	q := &qp{dev: d, qpn: d.nextQPN, blockSelf: init.CreateFlags&verbs.CreateBlockSelfMcastLB != 0}
	d.nextQPN++
	d.qpns[q.qpn] = true
	return q, nil
}

// maxQPN is the largest QPN a QP gets (0xFFFFFF is the multicast QPN).
const maxQPN = 0xFFFFFE

// QPN implements softverbs.DriverQP.
func (q *qp) QPN() uint32 { return q.qpn }

// Destroy implements softverbs.DriverQP: the QPN is free again.
func (q *qp) Destroy() {
	d := q.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if !q.dead.Swap(true) {
		delete(d.qpns, q.qpn)
	}
}

// GroupCreated implements softverbs.Driver: the switch forwards a group to
// the port because of the port's SA membership, not its attachments, so
// there is nothing to start.
func (d *Device) GroupCreated(*softverbs.Group) error { return nil }

// GroupDestroyed implements softverbs.Driver.
func (d *Device) GroupDestroyed(*softverbs.Group) {}
