package sm

import (
	"errors"
	"slices"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/wire"
)

// ErrNoLID reports that every unicast LID is bound to a port that is
// still registered: the attach is refused.
var ErrNoLID = errors.New("sm: no free unicast LID")

// lidAlloc binds GUIDs to unicast LIDs in [FirstLID, max]: never 0, never
// the SM's LID, never a multicast or the permissive LID. A GUID keeps its
// LID while the SM runs (and across restarts with a state file); once
// every LID was handed out, the LIDs of forgotten ports are reused, the
// longest forgotten first. Every operation is O(1) amortized.
type lidAlloc struct {
	max    uint16
	byGUID map[uint64]uint16
	owner  map[uint16]uint64
	next   uint32          // lowest LID never handed out by the cursor
	idle   map[uint64]bool // GUIDs whose port is forgotten: their LID may be reused
	idleQ  []uint64        // idle GUIDs, oldest first (stale entries skipped)
}

func newLIDAlloc(max uint16) *lidAlloc {
	if max == 0 || max >= wire.MulticastLIDBase {
		max = wire.MulticastLIDBase - 1
	}
	return &lidAlloc{max: max, byGUID: map[uint64]uint16{}, owner: map[uint16]uint64{}, next: fabric.FirstLID, idle: map[uint64]bool{}}
}

// validUnicast reports whether lid may be a port's LID.
func validUnicast(lid uint16) bool { return lid >= fabric.FirstLID && lid < wire.MulticastLIDBase }

// bind records a binding loaded from a state file (LIDs already checked);
// the port is idle until it registers.
func (a *lidAlloc) bind(guid uint64, lid uint16) {
	if _, taken := a.owner[lid]; taken {
		return
	}
	a.byGUID[guid] = lid
	a.owner[lid] = guid
}

// idleAll marks every bound GUID not in busy idle, lowest LID first (after
// loading a state file).
func (a *lidAlloc) idleAll(busy func(uint64) bool) {
	lids := make([]uint16, 0, len(a.owner))
	for l := range a.owner {
		lids = append(lids, l)
	}
	slices.Sort(lids)
	for _, l := range lids {
		if g := a.owner[l]; !busy(g) {
			a.forget(g)
		}
	}
}

// lidFor returns the GUID's LID, binding one if it has none.
func (a *lidAlloc) lidFor(guid uint64) (uint16, error) {
	if lid, ok := a.byGUID[guid]; ok {
		delete(a.idle, guid)
		return lid, nil
	}
	for a.next <= uint32(a.max) {
		lid := uint16(a.next)
		a.next++
		if _, taken := a.owner[lid]; !taken {
			a.byGUID[guid], a.owner[lid] = lid, guid
			return lid, nil
		}
	}
	for len(a.idleQ) > 0 {
		old := a.idleQ[0]
		a.idleQ = a.idleQ[1:]
		if !a.idle[old] {
			continue
		}
		delete(a.idle, old)
		lid := a.byGUID[old]
		delete(a.byGUID, old)
		a.byGUID[guid], a.owner[lid] = lid, guid
		return lid, nil
	}
	return 0, ErrNoLID
}

// forget makes a GUID's LID reusable (its port was forgotten).
func (a *lidAlloc) forget(guid uint64) {
	if _, ok := a.byGUID[guid]; !ok || a.idle[guid] {
		return
	}
	a.idle[guid] = true
	a.idleQ = append(a.idleQ, guid)
	if len(a.idleQ) > 2*len(a.idle)+64 { // drop stale and repeated entries
		q := make([]uint64, 0, len(a.idle))
		seen := make(map[uint64]bool, len(a.idle))
		for _, g := range a.idleQ {
			if a.idle[g] && !seen[g] {
				seen[g] = true
				q = append(q, g)
			}
		}
		a.idleQ = q
	}
}
