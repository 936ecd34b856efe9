package sa

import (
	"testing"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// BenchmarkCreate16000Groups: one port creates 16,000 groups (one SubnAdmSet
// each), as many as the HCA's max_mcast_grp; ns/op is for all 16,000.
func BenchmarkCreate16000Groups(b *testing.B) {
	n := benchGroups
	reqs := make([]mad.MAD, n)
	for i := range reqs {
		mgid := wire.GID{0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 14: byte(i >> 8), 15: byte(i)}
		reqs[i] = req(mad.MethodSet, mad.CompCreateRequired, udpJoin(mgid, guidA, 1))
	}
	for b.Loop() {
		s := New(Config{})
		s.AddPort(Port{GUID: guidA})
		for _, r := range reqs {
			if resp := s.Handle(r, From{GUID: guidA}); len(resp) != 1 || resp[0].Status() != 0 {
				b.Fatalf("create: status %#x", resp[0].Status())
			}
		}
	}
}

var benchGroups = 16000
