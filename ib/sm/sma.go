package sm

import (
	"slices"

	"github.com/softrdma/softrdma/ib/sma"
)

// CAPorts lists the attached ports for package sma's model of the
// subnet (sma.Ports): GUID, NodeDesc and the LID the SM gave each, by
// LID (so that they take the switch's ports in that order).
func (s *SM) CAPorts() []sma.Port {
	s.mu.Lock()
	defer s.mu.Unlock()
	ps := make([]sma.Port, 0, len(s.byAddr))
	for _, p := range s.byAddr {
		lid := p.lid
		if s.ext != nil {
			lid = 0 // OpenSM assigns every LID
		}
		ps = append(ps, sma.Port{GUID: p.guid, NodeDesc: p.desc, LID: lid})
	}
	slices.SortFunc(ps, func(a, b sma.Port) int { return int(a.LID) - int(b.LID) })
	return ps
}
