package rxe

import (
	"runtime"
	"testing"
	"time"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
)

// TestBacklogOnOneP: on a single P, the receive goroutine draining a
// backlog of full batches lets the consumer it wakes run between batches,
// so a QP whose consumer keeps 64 receive WRs posted takes a burst of
// 1,024 datagrams without a no_recv_wr drop (without that, the backlog
// used up the posted WRs before the consumer ran: the bench lost 8–41 %
// at 4096 B).
func TestBacklogOnOneP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	d := loDev(t)
	g := randGroup()
	rx := newFakeRx()
	q := newQP(t, d, rx, 0, 5) // 64 receive WRs, reposted by its consumer
	if err := q.AttachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	tx := newQP(t, d, &fakeRx{ch: make(chan delivery, 1), noWR: true}, 0, 5)
	bs := tx.drv.(softverbs.BatchSender)
	ah := mcastAH(g)
	batch := make([]softverbs.UDSend, softverbs.MaxSendBatch)
	for i := range batch {
		batch[i] = softverbs.UDSend{AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: 5, Payload: make([]byte, 1024)}
	}
	errs := make([]error, len(batch))
	before := d.Counters()
	const n = 1024
	// One tight loop of sendmmsg calls: the receive goroutine, on the one
	// P, finds a backlog of full batches.
	for sent := 0; sent < n; sent += len(batch) {
		bs.SendBatch(batch, errs)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("datagram %d: %v", sent+i, err)
			}
		}
	}
	got := 0
	deadline := time.After(10 * time.Second)
	for got < n {
		select {
		case <-rx.ch:
			got++
		case <-deadline:
			c := d.Counters()
			t.Fatalf("%d of %d delivered; no_recv_wr_drops %d, socket_drops %d", got, n,
				c.Get(softverbs.NoRecvWRDrops)-before.Get(softverbs.NoRecvWRDrops),
				c.Get(softverbs.SocketDrops)-before.Get(softverbs.SocketDrops))
		}
	}
	c := d.Counters()
	if drops := c.Get(softverbs.NoRecvWRDrops) - before.Get(softverbs.NoRecvWRDrops); drops != 0 {
		t.Errorf("no_recv_wr_drops %d", drops)
	}
}
