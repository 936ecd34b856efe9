package rxe

import "github.com/softrdma/softrdma/provider/softverbs"

// Counters returns a snapshot of the device's counters (indexed by
// softverbs.Counter; see softverbs.Schema).
func (d *Device) Counters() softverbs.Snapshot { return d.core.Counters() }

// QPCounters returns a snapshot of the counters of the device's QP qpn;
// false when the device has no such QP (never created or destroyed).
func (d *Device) QPCounters(qpn uint32) (softverbs.Snapshot, bool) {
	c, ok := d.core.QPCounters(qpn)
	return c, ok
}

// RefreshCounters brings socket_drops up to date (softverbs.CounterRefresher):
// every receive socket is asked for the count of datagrams the kernel
// dropped for a full buffer (SO_MEMINFO), so that a lost datagram has its
// counter whenever the counters are read; a closing socket is asked last
// (closeSock).
func (d *Device) RefreshCounters() {
	d.mu.Lock()
	socks := make([]*recvSock, 0, len(d.rsocks)+len(d.usocks))
	socks = append(append(socks, d.rsocks...), d.usocks...)
	d.mu.Unlock()
	for _, s := range socks {
		if v, ok := sockDrops(s.conn); ok {
			d.noteSocketDrops(s, v)
		}
	}
}

// noteSocketDrops counts the drops of socket s up to v, the kernel's
// running count, once: a count at or below what was already counted
// changes nothing (two concurrent reads of the counters).
func (d *Device) noteSocketDrops(s *recvSock, v uint32) {
	for {
		c := s.drops.Load()
		if int32(v-c) <= 0 {
			return
		}
		if s.drops.CompareAndSwap(c, v) {
			d.core.Count(softverbs.SocketDrops, uint64(v-c))
			return
		}
	}
}

// closeSock closes receive socket s (its goroutine exits) after counting
// its last drops.
func (d *Device) closeSock(s *recvSock) {
	if v, ok := sockDrops(s.conn); ok {
		d.noteSocketDrops(s, v)
	}
	shutdownRead(s.conn)
	s.conn.Close()
}
