package ib

import (
	"slices"

	"github.com/softrdma/softrdma/verbs"
)

// QPInfo is a read-only view of one QP of the port, for operator tools.
type QPInfo struct {
	QPN              uint32
	State            verbs.QPState
	QKey             uint32
	BlockSelfMcastLB bool
	// Groups are the (MGID, MLID) pairs the QP is attached to.
	Groups []Attachment
}

// Attachment is one multicast attachment of a QP.
type Attachment struct {
	MGID verbs.GID
	MLID uint16
}

// Membership is a read-only view of the port's SA membership of a group.
type Membership struct {
	MGID      verbs.GID
	MLID      uint16
	JoinState uint8  // the join-state bits the port holds at the SA
	Members   [4]int // local members per JoinState bit (Full, Non, SendOnlyNon, SendOnlyFull)
}

// QPs returns the port's QPs, by QPN.
func (d *Device) QPs() []QPInfo {
	var out []QPInfo
	for _, q := range d.core.QPs() {
		qi := QPInfo{QPN: q.QPN, State: q.State, QKey: q.QKey, BlockSelfMcastLB: q.BlockSelfMcastLB}
		for _, a := range q.Groups {
			qi.Groups = append(qi.Groups, Attachment{MGID: a.MGID, MLID: a.LID})
		}
		out = append(out, qi)
	}
	return out
}

// Memberships returns the port's SA memberships. A group whose SA
// request is in flight at that moment is left out rather than waited for.
func (d *Device) Memberships() []Membership {
	sa := d.sa
	sa.mu.Lock()
	groups := make([]*saGroup, 0, len(sa.groups))
	for _, g := range sa.groups {
		groups = append(groups, g)
	}
	sa.mu.Unlock()
	out := make([]Membership, 0, len(groups))
	for _, g := range groups {
		if !g.mu.TryLock() {
			continue
		}
		if g.joinState != 0 {
			out = append(out, Membership{MGID: g.rec.MGID, MLID: g.rec.MLID, JoinState: g.joinState, Members: g.count})
		}
		g.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b Membership) int { return int(a.MLID) - int(b.MLID) })
	return out
}
