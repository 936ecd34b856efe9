package bench

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"
)

// AllocsResult is the steady-state allocation count of the data path: a
// chain of Batch sends from one QP and their receipt by another QP of the
// same process (post send, send completion, receive, receive completion,
// repost), per datagram, by testing.AllocsPerRun.
type AllocsResult struct {
	Kind         string  `json:"kind"` // "allocs"
	Size         int     `json:"size"`
	Batch        int     `json:"batch"`
	AllocsPerMsg float64 `json:"allocs_per_msg"`
	// Ratio is the baseline's allocations (0 for plain sockets) over ours:
	// reported as 1 when both are 0, else 0.
	Ratio float64 `json:"ratio"`
}

// loopback is an in-process sender QP and receiver QP on one group: a
// round sends a chain and waits until the receiver has all of it.
type loopback struct {
	tx, rx *endpoint
	group  netip.Addr
	chain  *sendChain
	ring   *recvRing
	batch  int
	lost   int
}

func newLoopback(bind netip.Addr, size, batch int) (*loopback, error) {
	const slots = 1024
	l := &loopback{group: randGroup(), batch: batch}
	var err error
	if l.rx, err = newEndpoint(bind, 1, slots, slots*(40+size)); err != nil {
		return nil, err
	}
	if l.ring, err = newRecvRing(l.rx, slots, 40+size); err != nil {
		l.close()
		return nil, err
	}
	if err = l.rx.joinRecv(l.group); err != nil {
		l.close()
		return nil, err
	}
	if l.tx, err = newEndpoint(bind, batch, 1, batch*size); err != nil {
		l.close()
		return nil, err
	}
	ah, qkey, err := l.tx.join(l.group, true)
	if err != nil {
		l.close()
		return nil, err
	}
	l.chain = newSendChain(l.tx, ah, qkey, 0, batch, size)
	return l, nil
}

// round sends one chain and waits for it at the receiver (for at most a
// second: a datagram the kernel dropped is counted in lost).
func (l *loopback) round() error {
	if _, err := l.chain.post(l.tx.qp); err != nil {
		return err
	}
	got := 0
	var spins int
	var deadline time.Time
	for got < l.batch {
		m, _, n, err := l.ring.poll()
		if err != nil {
			return err
		}
		got += int(m)
		if n > 0 {
			continue
		}
		spins++
		if spins < 64 {
			runtime.Gosched()
			continue
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(time.Second)
		} else if time.Now().After(deadline) {
			l.lost += l.batch - got
			return nil
		}
		time.Sleep(20 * time.Microsecond)
	}
	return nil
}

func (l *loopback) close() {
	if l.tx != nil {
		l.tx.close()
	}
	if l.rx != nil {
		l.rx.leave(l.group)
		l.rx.close()
	}
}

func measureAllocs(bind netip.Addr, size, batch, runs int) (AllocsResult, error) {
	r := AllocsResult{Kind: "allocs", Size: size, Batch: batch}
	l, err := newLoopback(bind, size, batch)
	if err != nil {
		return r, err
	}
	defer l.close()
	var rerr error
	round := func() {
		if err := l.round(); err != nil && rerr == nil {
			rerr = err
		}
	}
	for range 20 {
		round()
	}
	a := testing.AllocsPerRun(runs, round)
	if rerr != nil {
		return r, fmt.Errorf("allocs: %w", rerr)
	}
	r.AllocsPerMsg = a / float64(batch)
	if r.AllocsPerMsg == 0 {
		r.Ratio = 1
	}
	return r, nil
}
