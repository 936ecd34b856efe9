package rdmacm

import (
	"fmt"
	"syscall"
)

// MigrateID moves the id to event channel ch (rdma_migrate_id): the id's
// events not yet retrieved move with it and its later events arrive on
// ch. A nil ch makes the id synchronous (a private channel; calls wait for
// their events). A synchronous id's parked event is acked and its private
// channel closed. As librdmacm, the call waits until every event of the id
// already retrieved is acked (events retrieved from the old channel must
// be acked there), so an unacked event of the id blocks it.
//
// Errors: nil ch for an id that is already synchronous → EINVAL; a closed
// ch → EBADF; a channel of another host (CreateEventChannelOn) → EINVAL.
// Migrating an id to its own channel only waits for the acks.
//
// A kernel id's librdmacm id stays on the librdmacm channel of the channel
// it was made on (its events are delivered to the id's channel of the
// moment; that librdmacm channel is closed with the last such id), so the
// kernel's rdma_migrate_id is not called: what the program sees is the
// same.
func (id *ID) MigrateID(ch *EventChannel) (err error) {
	defer wrapErr(&err, "rdma_migrate_id", nil)
	old := id.ch()
	if ch == nil && id.isSync() {
		return fmt.Errorf("synchronous id: %w", syscall.EINVAL)
	}
	if ch != nil && ch.cm != old.cm {
		return fmt.Errorf("channel of another host: %w", syscall.EINVAL)
	}
	sync := ch == nil
	if sync {
		if ch, err = newEventChannel(old.cm); err != nil {
			return err
		}
		ch.private = true
	}
	cm := old.cm
	cm.migrateMu.Lock()
	defer cm.migrateMu.Unlock()
	old = id.lockCh()
	if ch != old {
		ch.mu.Lock()
		closed := ch.closed
		ch.mu.Unlock()
		if closed {
			old.mu.Unlock()
			return fmt.Errorf("channel closed: %w", syscall.EBADF)
		}
	}
	wasSync := id.isSync()
	if p := id.ev.parked; wasSync && p != nil && ch != old {
		id.ackLocked(p)
		id.ev.parked = nil
	}
	// Events retrieved on the old channel are acked there first.
	for id.ev.completed < id.ev.reported {
		old.cond.Wait()
	}
	if ch == old {
		old.mu.Unlock()
		return nil
	}
	var moved []*Event
	q := old.queue[:0]
	for _, ev := range old.queue {
		if ev.ID == id {
			moved = append(moved, ev)
		} else {
			q = append(q, ev)
		}
	}
	clear(old.queue[len(q):])
	old.queue = q
	old.ids--
	// Two channel locks at once only here, under cm.migrateMu.
	ch.mu.Lock()
	for _, ev := range moved {
		ch.enqueueLocked(ev)
	}
	ch.ids++
	id.chp.Store(ch)
	id.syncp.Store(sync)
	ch.mu.Unlock()
	old.mu.Unlock()
	if wasSync {
		old.Close()
	}
	return nil
}
