package rdmacm

// docs/infiniband.md's claims about the RDMA CM on InfiniBand: an SM restart resets every
// joined id, and the SA Delete of a leave carries only the join states no
// other local id still needs.

import (
	"syscall"
	"testing"

	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/test/testsm"
	"github.com/softrdma/softrdma/verbs"
)

// joinWith joins id to g with flags and context ctx and reads the JOIN
// event from id's channel.
func joinWith(t *testing.T, id *ID, g *IBAddr, flags uint32, ctx any) {
	t.Helper()
	if err := id.JoinMulticastEx(&JoinMCAttrEx{CompMask: JoinMCAttrAddress | JoinMCAttrJoinFlags, JoinFlags: flags, Addr: g}, ctx); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, id.Channel())
	ev.Ack()
	if ev.Event != EventMulticastJoin || ev.Param.PrivateData != ctx {
		t.Fatalf("join %v: %v %d", ctx, ev.Event, ev.Status)
	}
}

// ibGroup is an unmapped IB group address.
func ibGroup(t *testing.T, mgid string) *IBAddr {
	t.Helper()
	g, err := verbs.ParseGID(mgid)
	if err != nil {
		t.Fatal(err)
	}
	return &IBAddr{GID: g, PKey: 0xffff}
}

// TestIBSMRestartResetsEveryJoin: after an SM restart every joined id of
// the port gets MULTICAST_ERROR -ENETRESET, once per join: two groups of one
// id, and another id (on its own channel) in one of them.
func TestIBSMRestartResetsEveryJoin(t *testing.T) {
	first := startSM(t, sm.Config{SendOnlySupport: true})
	addr := first.sm.FabricAddr().String()
	openPort(t, first, "127.0.0.8", ib.Config{})
	_, a := ibID(t, "127.0.0.8", PS_UDP)
	_, b := ibID(t, "127.0.0.8", PS_UDP)
	g1, g2 := ibGroup(t, "ff12:4001:ffff::608:101"), ibGroup(t, "ff12:4001:ffff::608:102")
	joinWith(t, a, g1, MCJoinFlagFullMember, "a1")
	joinWith(t, a, g2, MCJoinFlagFullMember, "a2")
	joinWith(t, b, g1, MCJoinFlagSendOnlyFullMember, "b1")

	first.stop()
	startSM(t, sm.Config{Listen: addr, SendOnlySupport: true})
	got := map[any]int{}
	for _, id := range []*ID{a, a, b} {
		ev := nextEvent(t, id.Channel())
		ev.Ack()
		if ev.Event != EventMulticastError || ev.Status != -int(syscall.ENETRESET) {
			t.Fatalf("after the SM restart: %v %d (%v)", ev.Event, ev.Status, ev.Param.PrivateData)
		}
		got[ev.Param.PrivateData]++
	}
	if got["a1"] != 1 || got["a2"] != 1 || got["b1"] != 1 {
		t.Errorf("-ENETRESET per join: %v, want a1, a2 and b1 once each", got)
	}
	for _, l := range []struct {
		id *ID
		g  *IBAddr
	}{{a, g1}, {a, g2}, {b, g1}} {
		if err := l.id.LeaveMulticast(l.g); err != nil {
			t.Errorf("leave after the reset: %v", err)
		}
	}
}

// TestIBSADeleteMixedStates: a full member and a send-only full member of
// one group on one port make one SA membership with JoinState 0x9; when the
// full member leaves, the SA Delete removes only FullMember (0x8 stays);
// when the send-only member leaves too, the membership goes. And the other
// way round.
func TestIBSADeleteMixedStates(t *testing.T) {
	n := startSM(t, sm.Config{SendOnlySupport: true})
	port := openPort(t, n, "127.0.0.9", ib.Config{})
	_, full := ibID(t, "127.0.0.9", PS_UDP)
	_, so := ibID(t, "127.0.0.9", PS_UDP)
	const fullBit, sendOnlyBit = 0x1, 0x8
	for _, c := range []struct {
		mgid         string
		first, other *ID
		left         uint8 // the state that stays after the first leave
	}{
		{"ff12:4001:ffff::609:101", full, so, sendOnlyBit},
		{"ff12:4001:ffff::609:102", so, full, fullBit},
	} {
		t.Run(c.mgid, func(t *testing.T) {
			if c.left == sendOnlyBit {
				testsm.SkipOnOpenSM(t, "a FullMember Delete by a group's only full member port also ends its SendOnlyFullMember bit on OpenSM 3.3.23 (osm_mgrp_remove_port): the port's membership and the group go, and the send-only id's later leave is refused (EINVAL); softsm keeps the 0x8 bit")
			}
			g := ibGroup(t, c.mgid)
			joinWith(t, full, g, MCJoinFlagFullMember, "full")
			joinWith(t, so, g, MCJoinFlagSendOnlyFullMember, "so")
			eventually(t, "JoinState 0x9 at the SA", func() bool { s, ok := n.joinState(t, port, c.mgid); return ok && s == fullBit|sendOnlyBit })
			if err := c.first.LeaveMulticast(g); err != nil {
				t.Fatal(err)
			}
			eventually(t, "only the state no local id needs removed", func() bool { s, ok := n.joinState(t, port, c.mgid); return ok && s == c.left })
			if err := c.other.LeaveMulticast(g); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the port's membership removed after the last leave", func() bool { _, ok := n.joinState(t, port, c.mgid); return !ok })
		})
	}
}
