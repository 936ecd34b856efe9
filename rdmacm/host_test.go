package rdmacm

import (
	"net"
	"slices"
	"testing"

	"github.com/softrdma/softrdma/provider/rxe"
	"github.com/softrdma/softrdma/verbs"
)

// TestIsolatedHost runs the CM on a host of its own: its device list has
// the device of every interface, its ids, devices and multicast counts are
// its own (not DefaultHost's), and closing it releases them.
func TestIsolatedHost(t *testing.T) {
	h := verbs.NewHost()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var want, got []string
	for _, ifi := range ifs {
		want = append(want, "rxe_"+ifi.Name)
	}
	for _, d := range h.DeviceList() {
		got = append(got, d.Name())
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("device list %v, want %v", got, want)
	}

	ch, err := CreateEventChannelOn(h)
	if err != nil {
		t.Fatal(err)
	}
	id, err := CreateID(ch, nil, PS_UDP)
	if err != nil {
		t.Fatal(err)
	}
	if err := id.BindAddr(lo); err != nil {
		t.Fatal(err)
	}
	g := randGroup()
	before := Stats()
	join(t, id, g, MCJoinFlagFullMember, nil).Ack()
	if id.Verbs().Device().Host() != h || id.Verbs().Device() == verbs.DeviceByName("rxe_lo") {
		t.Errorf("id bound to a device of another host")
	}
	if n := len(InspectHost(h).IDs); n != 1 {
		t.Errorf("host lists %d ids, want 1", n)
	}
	for _, info := range Inspect().IDs {
		if info.Src != nil && info.Src.String() == id.SrcAddr().String() {
			t.Errorf("default host lists the isolated host's id %v", info.Src)
		}
	}
	if err := id.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
	// The counts are the host's: the default host's did not move.
	if st := StatsHost(h); st.Joins != 1 || st.Leaves != 1 {
		t.Errorf("host counts %+v, want 1 join and 1 leave", st)
	}
	if st := InspectHost(h).Stats; st.Joins != 1 {
		t.Errorf("InspectHost counts %+v", st)
	}
	if st := Stats(); st.Joins != before.Joins || st.Leaves != before.Leaves {
		t.Errorf("default host counts moved: %+v → %+v", before, st)
	}
	if err := id.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	h.Close()
	if n := len(rxe.On(h).Devices()); n != 0 {
		t.Errorf("%d devices after Close", n)
	}
	if n := len(h.Devices()); n != 0 {
		t.Errorf("%d verbs devices after Close", n)
	}
}
