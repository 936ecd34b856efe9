package ib

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
)

// qp is the provider side of a UD QP on an InfiniBand port.
type qp struct {
	dev       *Device
	qpn       uint32
	rx        softverbs.IBReceiver
	blockSelf bool

	state atomic.Uint32
	qkey  atomic.Uint32
	psn   atomic.Uint32

	smu sync.Mutex // serializes sends; owns buf
	buf []byte

	dead     atomic.Bool
	inflight atomic.Int32 // deliveries running on the receive path
}

// mgroup is a multicast group of the port: the QPs attached to an MGID,
// each with the MLID it attached with.
type mgroup struct {
	mgid   verbs.GID
	member atomic.Pointer[[]attach] // immutable, in attach order
}

type attach struct {
	q   *qp
	lid uint16
}

// CreateQP implements softverbs.Driver.
func (d *Device) CreateQP(rx softverbs.Receiver, init softverbs.DriverQPInit) (softverbs.DriverQP, error) {
	if init.Type != verbs.QPTypeUD {
		return nil, fmt.Errorf("ib: %v QPs: %w", init.Type, syscall.EOPNOTSUPP)
	}
	irx, ok := rx.(softverbs.IBReceiver)
	if !ok {
		return nil, fmt.Errorf("ib: receiver without IB completions: %w", syscall.EINVAL)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("ib: create qp: %w", syscall.ENODEV)
	}
	for d.qpByNum[d.nextQPN] != nil || d.nextQPN < 2 {
		d.nextQPN = (d.nextQPN + 1) & 0xffffff
	}
	q := &qp{dev: d, qpn: d.nextQPN, rx: irx, blockSelf: init.CreateFlags&verbs.CreateBlockSelfMcastLB != 0}
	d.nextQPN = (d.nextQPN + 1) & 0xfffffe
	d.qpByNum[q.qpn] = q
	d.publishQPsLocked()
	return q, nil
}

func (d *Device) publishQPsLocked() {
	m := make(map[uint32]*qp, len(d.qpByNum))
	for k, v := range d.qpByNum {
		m[k] = v
	}
	d.qps.Store(&m)
}

// QPN implements softverbs.DriverQP.
func (q *qp) QPN() uint32 { return q.qpn }

// Modify implements softverbs.DriverQP.
func (q *qp) Modify(attr *verbs.QPAttr, mask verbs.QPAttrMask) error {
	q.state.Store(uint32(attr.State))
	q.qkey.Store(attr.QKey)
	if mask&verbs.QPAttrSQPSN != 0 {
		q.psn.Store(attr.SQPSN)
	}
	return nil
}

func (q *qp) receives() bool {
	s := verbs.QPState(q.state.Load())
	return s == verbs.QPSRTR || s == verbs.QPSRTS
}

// AttachMcast implements softverbs.DriverQP: attaching twice is a no-op; the
// device's group limits give ENOMEM.
func (q *qp) AttachMcast(gid verbs.GID, lid uint16) error {
	d := q.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	a := d.Attr()
	g := d.groups[gid]
	if g == nil {
		if len(d.groups) >= a.MaxMcastGrp {
			return syscall.ENOMEM
		}
		g = &mgroup{mgid: gid}
		g.member.Store(&[]attach{})
		d.groups[gid] = g
	}
	cur := *g.member.Load()
	for _, m := range cur {
		if m.q == q && m.lid == lid {
			return nil
		}
	}
	if len(cur) >= a.MaxMcastQPAttach {
		return syscall.ENOMEM
	}
	next := append(slices.Clip(cur), attach{q, lid})
	g.member.Store(&next)
	return nil
}

// DetachMcast implements softverbs.DriverQP.
func (q *qp) DetachMcast(gid verbs.GID, lid uint16) error {
	d := q.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	g := d.groups[gid]
	if g == nil {
		return syscall.EINVAL
	}
	cur := *g.member.Load()
	for i, m := range cur {
		if m.q == q && m.lid == lid {
			next := append(slices.Clip(cur[:i]), cur[i+1:]...)
			g.member.Store(&next)
			if len(next) == 0 {
				delete(d.groups, gid)
			}
			return nil
		}
	}
	return syscall.EINVAL
}

// Destroy implements softverbs.DriverQP.
func (q *qp) Destroy() error {
	d := q.dev
	d.mu.Lock()
	for gid, g := range d.groups {
		cur := *g.member.Load()
		next := slices.DeleteFunc(slices.Clone(cur), func(m attach) bool { return m.q == q })
		if len(next) != len(cur) {
			g.member.Store(&next)
			if len(next) == 0 {
				delete(d.groups, gid)
			}
		}
	}
	delete(d.qpByNum, q.qpn)
	d.publishQPsLocked()
	d.mu.Unlock()
	q.dead.Store(true)
	q.waitIdle()
	return nil
}
