package sa

import (
	"container/heap"

	"github.com/softrdma/softrdma/wire"
)

// mlids allocates multicast LIDs in [0xC000, max]: a requested free MLID,
// else the lowest free one, in O(log n). Every free MLID below next has an
// entry in freed (entries of MLIDs taken again are skipped lazily); every
// MLID from next up is free unless marked used.
type mlids struct {
	max   uint16
	used  []bool // index mlid - 0xC000
	next  uint32 // lowest MLID never handed out by the cursor
	freed lidHeap
}

func newMLIDs(max uint16) *mlids {
	return &mlids{max: max, used: make([]bool, int(max)-wire.MulticastLIDBase+1), next: wire.MulticastLIDBase}
}

func (a *mlids) isUsed(mlid uint16) bool { return a.used[mlid-wire.MulticastLIDBase] }

// take marks a specific MLID used; false if it is out of range or taken.
func (a *mlids) take(mlid uint16) bool {
	if mlid < wire.MulticastLIDBase || mlid > a.max || a.isUsed(mlid) {
		return false
	}
	a.used[mlid-wire.MulticastLIDBase] = true
	return true
}

// alloc returns the requested MLID when it is free, else the lowest free
// one, or 0 when every MLID is in use.
func (a *mlids) alloc(requested uint16) uint16 {
	if a.take(requested) {
		return requested
	}
	for a.freed.Len() > 0 {
		m := heap.Pop(&a.freed).(uint16)
		if a.take(m) {
			return m
		}
	}
	for a.next <= uint32(a.max) {
		m := uint16(a.next)
		a.next++
		if a.take(m) {
			return m
		}
	}
	return 0
}

// release frees an MLID.
func (a *mlids) release(mlid uint16) {
	if mlid < wire.MulticastLIDBase || mlid > a.max || !a.isUsed(mlid) {
		return
	}
	a.used[mlid-wire.MulticastLIDBase] = false
	if uint32(mlid) < a.next {
		heap.Push(&a.freed, mlid)
	}
}

// lidHeap is a min-heap of LIDs.
type lidHeap []uint16

func (h lidHeap) Len() int           { return len(h) }
func (h lidHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h lidHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *lidHeap) Push(x any)        { *h = append(*h, x.(uint16)) }
func (h *lidHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
