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
	rx, bs, batch := newGroupBurst(t, d, 1024)
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

// TestReceivedCountedFirst: a batch's rcvd_pkts are counted before any of
// its datagrams is handled, so that no outcome counter is ever ahead of
// them. A reader that reads the outcomes and then rcvd_pkts, while
// datagrams flow, must never find more outcomes than datagrams received.
// (A regression shows only when a read falls between the two counts, so
// the test reads as often as it can during 2,048 datagrams.)
func TestReceivedCountedFirst(t *testing.T) {
	d := loDev(t)
	rx, bs, batch := newGroupBurst(t, d, 64)
	errs := make([]error, len(batch))
	outcomes := func(c softverbs.Snapshot) uint64 {
		return c.Get(softverbs.Delivered) + c.Get(softverbs.NoRecvWRDrops) + c.Get(softverbs.CQFullDrops) +
			c.Get(softverbs.ICRCErrors) + c.Get(softverbs.NoGroupDrops)
	}
	before := d.Counters()
	const n = 2048
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sent := 0; sent < n; sent += len(batch) {
			bs.SendBatch(batch, errs)
		}
	}()
	// Until every datagram sent is accounted for: received and handled,
	// or dropped by the kernel for a full socket buffer.
	checks := 0
	deadline := time.Now().Add(20 * time.Second)
	for {
		for drained := false; !drained; {
			select {
			case <-rx.ch:
			default:
				drained = true
			}
		}
		out := outcomes(d.Counters()) - outcomes(before)
		c := d.Counters()
		rcvd := c.Get(softverbs.RcvdPkts) - before.Get(softverbs.RcvdPkts)
		if out > rcvd {
			t.Fatalf("outcomes %d ahead of rcvd_pkts %d", out, rcvd)
		}
		checks++
		sockDrops := c.Get(softverbs.SocketDrops) - before.Get(softverbs.SocketDrops)
		if rcvd+sockDrops >= n && out == rcvd {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20 s: rcvd_pkts %d, socket_drops %d, outcomes %d of %d sent", rcvd, sockDrops, out, n)
		}
	}
	<-done
	t.Logf("%d reads of the counters while %d datagrams arrived", checks, n)
}

// newGroupBurst sets up a multicast fan-in on d: a receiving QP (Q_Key 5,
// 64 receive WRs reposted by its consumer rx) attached to a new group, and
// a sending QP's batch sender with a full batch of size-byte datagrams to
// that group.
func newGroupBurst(t *testing.T, d *Device, size int) (*fakeRx, softverbs.BatchSender, []softverbs.UDSend) {
	t.Helper()
	g := randGroup()
	rx := newFakeRx()
	q := newQP(t, d, rx, 0, 5)
	if err := q.AttachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	tx := newQP(t, d, &fakeRx{ch: make(chan delivery, 1), noWR: true}, 0, 5)
	batch := make([]softverbs.UDSend, softverbs.MaxSendBatch)
	for i := range batch {
		batch[i] = softverbs.UDSend{AH: mcastAH(g), RemoteQPN: verbs.MulticastQPN, RemoteQKey: 5, Payload: make([]byte, size)}
	}
	return rx, tx.drv.(softverbs.BatchSender), batch
}
