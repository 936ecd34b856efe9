package softverbs

import (
	"maps"
	"sync/atomic"
)

// cowShards is the number of shards of a cowMap.
const cowShards = 64

// cowMap is a map read without locks or allocations on the receive path
// and written copy-on-write under the device's lock. It is sharded, so a
// write copies one shard: creating n entries costs O(n²/64), not O(n²).
type cowMap[K comparable, V any] struct {
	shard  func(K) int
	shards [cowShards]atomic.Pointer[map[K]V]
}

func newCOWMap[K comparable, V any](shard func(K) int) *cowMap[K, V] {
	return &cowMap[K, V]{shard: shard}
}

// load returns the value of k.
func (m *cowMap[K, V]) load(k K) (V, bool) {
	p := m.shards[m.shard(k)%cowShards].Load()
	if p == nil {
		var zero V
		return zero, false
	}
	v, ok := (*p)[k]
	return v, ok
}

// store sets k; the caller serializes writes.
func (m *cowMap[K, V]) store(k K, v V) {
	s := &m.shards[m.shard(k)%cowShards]
	next := map[K]V{}
	if p := s.Load(); p != nil {
		next = maps.Clone(*p)
	}
	next[k] = v
	s.Store(&next)
}

// delete removes k; the caller serializes writes.
func (m *cowMap[K, V]) delete(k K) {
	s := &m.shards[m.shard(k)%cowShards]
	p := s.Load()
	if p == nil {
		return
	}
	next := maps.Clone(*p)
	delete(next, k)
	s.Store(&next)
}
