package mcast

import (
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/verbs"
)

// GroupRecord is a decoded MCMemberRecord: a multicast group as the SA
// describes it, or a join request.
type GroupRecord = mad.MCMemberFields

// IPoIBBroadcastMGID is the default partition's IPoIB IPv4 broadcast group.
var IPoIBBroadcastMGID = verbs.GID{0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}

// recordMatches reports whether a join request r agrees with the group
// record g on every component it names (the kernel's cmp_rec).
func recordMatches(r, g *GroupRecord, mask uint64) bool {
	switch {
	case mask&mad.CompPortGID != 0 && r.PortGID != g.PortGID,
		mask&mad.CompQKey != 0 && r.QKey != g.QKey,
		mask&mad.CompMLID != 0 && r.MLID != g.MLID,
		mask&mad.CompTClass != 0 && r.TClass != g.TClass,
		mask&mad.CompPKey != 0 && r.PKey != g.PKey,
		mask&mad.CompSL != 0 && r.SL != g.SL,
		mask&mad.CompFlowLabel != 0 && r.FlowLabel != g.FlowLabel,
		mask&mad.CompHopLimit != 0 && r.HopLimit != g.HopLimit,
		mask&mad.CompScope != 0 && r.Scope != g.Scope:
		return false
	}
	if mask&mad.CompMTU != 0 && !selectorOK(r.MTUSelector, r.MTU, g.MTU, mask&mad.CompMTUSelector != 0) {
		return false
	}
	if mask&mad.CompRate != 0 && !selectorOK(r.RateSelector, r.Rate, g.Rate, mask&mad.CompRateSelector != 0) {
		return false
	}
	return true
}

// selectorOK applies an MTU/rate selector: greater than, less than,
// exactly, largest available.
func selectorOK(sel, want, have uint8, withSel bool) bool {
	if !withSel {
		return want == have
	}
	switch sel {
	case mad.SelGreaterThan:
		return have > want
	case mad.SelLessThan:
		return have < want
	case mad.SelExactly:
		return have == want
	}
	return true
}
