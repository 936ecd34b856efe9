package saclient

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
	if mask&mad.CompMTU != 0 && !mad.SelectorMet(mask&mad.CompMTUSelector != 0, r.MTUSelector, int(r.MTU), int(g.MTU)) {
		return false
	}
	if mask&mad.CompRate != 0 && !mad.SelectorMet(mask&mad.CompRateSelector != 0, r.RateSelector, int(r.Rate), int(g.Rate)) {
		return false
	}
	return true
}
