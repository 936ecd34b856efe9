package sm

import (
	"net/netip"
	"testing"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// TestGroupQuotaPerSourceOverFabric: four ports attached from one
// source address, each within its MaxGroupsPerPort, cannot take every
// MLID together: by default the ports of one address may create a
// quarter of the MLIDs (rounded up), further creates get 0x0100
// (GroupQuotaRefusals), and a port of another address still creates a
// group (before, the four took every MLID and it got 0x0100).
func TestGroupQuotaPerSourceOverFabric(t *testing.T) {
	const maxMLID = wire.MulticastLIDBase + 16 // 16 MLIDs beside the broadcast group's
	s := startSM(t, Config{MaxMLID: maxMLID, MaxGroupsPerPort: 4})
	lo := netip.MustParseAddr("127.0.0.1")
	g := func(i int) wire.GID { return wire.GID{0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 14: 0x62, 15: byte(i)} }
	created, refused, i := 0, 0, 0
	for k := range 4 {
		p := newFakePortAt(t, s.FabricAddr(), lo, 0x620001+uint64(k))
		for range 4 {
			rs := p.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, g(i), p.guid, mad.JoinFullMember), false)
			if len(rs) != 1 {
				t.Fatalf("create %d from port %d: %d answers", i, k, len(rs))
			}
			switch st := rs[0].Status(); st {
			case 0:
				created++
			case mad.StatusNoResources:
				refused++
			default:
				t.Fatalf("create %d from port %d: status %#04x", i, k, st)
			}
			i++
		}
	}
	const perSource = (maxMLID - wire.MulticastLIDBase + 1 + 3) / 4
	if created != perSource || refused != 16-perSource {
		t.Errorf("ports of %v: %d creates, %d refused; want %d, %d", lo, created, refused, perSource, 16-perSource)
	}
	other := newFakePortAt(t, s.FabricAddr(), netip.MustParseAddr("127.0.0.2"), 0x620010)
	mustStatus(t, other.sa(mcReq(mad.MethodSet, mad.CompCreateRequired, g(i), other.guid, mad.JoinFullMember), false), 0)
	if st := s.Stats(); st.GroupQuotaRefusals != uint64(refused) {
		t.Errorf("GroupQuotaRefusals %d, want %d", st.GroupQuotaRefusals, refused)
	}
}
