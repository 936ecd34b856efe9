package conformance

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// setOption: rdma_set_option's checks (the kernel's ucma_set_option).
func (s *suite) setOption(t *testing.T) string {
	ch := s.channel(t)
	id := s.bound(t, ch)
	cases := []struct {
		name       string
		level, opt int
		val        any
		want       want
	}{
		{"unknown-level", 7, 0, uint8(0), same("ENOSYS")},
		{"unknown-id-option", rdmacm.OptionID, 9, 1, same("ENOSYS")},
		{"unknown-ib-option", rdmacm.OptionIB, 0, nil, same("ENOSYS")},
		{"tos-uint8", rdmacm.OptionID, rdmacm.OptionIDTOS, uint8(0xb8), same("OK")},
		{"tos-int", rdmacm.OptionID, rdmacm.OptionIDTOS, 0xb8, same("EINVAL")},
		{"reuseaddr-on-bound", rdmacm.OptionID, rdmacm.OptionIDReuseAddr, 1, same("OK")},
		{"reuseaddr-off-bound", rdmacm.OptionID, rdmacm.OptionIDReuseAddr, 0, same("EINVAL")},
		{"reuseaddr-byte", rdmacm.OptionID, rdmacm.OptionIDReuseAddr, uint8(1), same("EINVAL")},
		{"afonly-bound", rdmacm.OptionID, rdmacm.OptionIDAFOnly, 1, same("OK")},
		{"ack-timeout-ud", rdmacm.OptionID, rdmacm.OptionIDAckTimeout, uint8(14), same("EINVAL")},
		{"ib-path-10-bytes", rdmacm.OptionIB, rdmacm.OptionIBPath, make([]byte, 10), same("EINVAL")},
	}
	var seen []string
	for _, c := range cases {
		got := outcome(id.SetOption(c.level, c.opt, c.val))
		seen = append(seen, s.expect(t, c.name, got, c.want))
	}
	return strings.Join(seen, " ")
}

// tosJoin: an id's TOS leaves the JOIN AH's traffic class 0; a traffic
// class put into the AH is the received datagram's IP TOS.
func (s *suite) tosJoin(t *testing.T) string {
	const tos = 0xb8
	ch := s.channel(t)
	g := s.group(t)
	rx := endpoint(t, s.bound(t, ch), 1, 0)
	joined(t, ch, rx.ID(), g, rdmacm.MCJoinFlagFullMember)
	tx := endpoint(t, s.bound(t, ch), 1, 0)
	if err := tx.ID().SetOption(rdmacm.OptionID, rdmacm.OptionIDTOS, uint8(tos)); err != nil {
		t.Fatal(err)
	}
	p := joined(t, ch, tx.ID(), g, rdmacm.MCJoinFlagSendOnlyFullMember)
	seen := s.expect(t, "join-traffic-class", fmt.Sprint(p.AHAttr.GRH.TrafficClass), same("0"))
	p.AHAttr.GRH.TrafficClass = tos
	tx.Send(t, p, "tos", 1)
	rx.Recv(t, 1)
	// The GRH area of a RoCEv2 IPv4 datagram ends with its IPv4 header;
	// on IB it is the GRH, whose traffic class follows the IP version.
	got := wire.IPv4(rx.Slot(0)[20:verbs.GRHLen]).TOS()
	if s.target == targetSoftIB {
		got = rx.Slot(0)[0]<<4 | rx.Slot(0)[1]>>4
	}
	return seen + " " + s.expect(t, "received-tos", fmt.Sprintf("%#x", got), same("0xb8"))
}

// portRules: rdma_bind_addr's port checks with REUSEADDR (cma_check_port).
func (s *suite) portRules(t *testing.T) string {
	ch := s.channel(t)
	first := s.bound(t, ch)
	port := first.SrcPort()
	at := func(a netip.Addr) net.Addr { return net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, port)) }
	bind := func(a netip.Addr, reuse bool) string {
		id := s.id(t, ch, rdmacm.PS_UDP)
		if reuse {
			if err := id.SetOption(rdmacm.OptionID, rdmacm.OptionIDReuseAddr, 1); err != nil {
				t.Fatal(err)
			}
		}
		return outcome(id.BindAddr(at(a)))
	}
	any4 := netip.IPv4Unspecified()
	var seen []string
	seen = append(seen, s.expect(t, "same-address", bind(s.addr, false), same("EADDRINUSE")))
	seen = append(seen, s.expect(t, "wildcard", bind(any4, false), same("EADDRNOTAVAIL")))
	seen = append(seen, s.expect(t, "one-reuses", bind(s.addr, true), same("EADDRINUSE")))
	if err := first.SetOption(rdmacm.OptionID, rdmacm.OptionIDReuseAddr, 1); err != nil {
		t.Fatal(err)
	}
	seen = append(seen, s.expect(t, "both-reuse", bind(s.addr, true), same("OK")))
	seen = append(seen, s.expect(t, "src-port", fmt.Sprint(first.SrcPort() == port && port != 0), same("true")))
	return strings.Join(seen, " ")
}

// portSpaces: the kernel's port rules across port spaces (cma_get_port):
// each port space has ports of its own; an RDMA_PS_IPOIB id binds only an
// InfiniBand device's address (cma_acquire_dev_by_src_ip: EINVAL on
// RoCE); a port below 1024 needs CAP_NET_BIND_SERVICE in the binding
// thread (EACCES without); an id of a port space whose QP type is not UD
// (RDMA_PS_TCP, RDMA_PS_IB through rdma_create_id) cannot join.
func (s *suite) portSpaces(t *testing.T) string {
	ch := s.channel(t)
	first := s.bound(t, ch)
	port := first.SrcPort()
	at := func(p uint16) net.Addr { return net.UDPAddrFromAddrPort(netip.AddrPortFrom(s.addr, p)) }
	bind := func(ps rdmacm.PortSpace, p uint16) string { return outcome(s.id(t, ch, ps).BindAddr(at(p))) }
	var seen []string
	seen = append(seen, s.expect(t, "udp-same-port", bind(rdmacm.PS_UDP, port), same("EADDRINUSE")))
	seen = append(seen, s.expect(t, "tcp-same-port", bind(rdmacm.PS_TCP, port), same("OK")))
	seen = append(seen, s.expect(t, "ib-same-port", bind(rdmacm.PS_IB, port), same("OK")))
	seen = append(seen, s.expect(t, "ipoib-same-port", bind(rdmacm.PS_IPOIB, port), want{soft: "EINVAL", ib: "OK"}))
	// A privileged port, from a thread without CAP_NET_BIND_SERVICE in
	// its effective set, then (when the run has it) with it.
	low := uint16(900 + rand.IntN(124))
	seen = append(seen, s.expect(t, "privileged-without-cap", s.bindWithoutCap(t, capNetBindService, at(low)), same("EACCES")))
	if hasCap(capNetBindService) {
		seen = append(seen, s.expect(t, "privileged-with-cap", bind(rdmacm.PS_UDP, low), same("OK")))
	}
	for _, ps := range []rdmacm.PortSpace{rdmacm.PS_TCP, rdmacm.PS_IB} {
		id := s.id(t, ch, ps)
		if err := id.BindAddr(at(0)); err != nil {
			t.Fatalf("bind %v id: %v", ps, err)
		}
		seen = append(seen, s.expect(t, ps.String()+"-join", outcome(joinEx(id, s.group(t), rdmacm.MCJoinFlagFullMember, nil)), same("EINVAL")))
	}
	if n := ch.Len(); n != 0 {
		t.Errorf("%d events queued after refused binds and joins", n)
	}
	return strings.Join(seen, " ")
}

// bindWithoutCap binds a new RDMA_PS_UDP id to a on an OS thread of its
// own whose effective set lacks capability bit, and returns the bind's
// outcome. Capabilities are per thread, and the kernel's capable() asks
// the calling one; the kernel also refuses a command on the RDMA CM's file
// from a thread whose credentials differ from the opener's (EACCES), so
// the channel and the id are made, and destroyed, on that thread too. The
// thread is never handed back to the runtime: it ends with its goroutine.
func (s *suite) bindWithoutCap(t *testing.T, bit uint, a net.Addr) string {
	t.Helper()
	var out string
	var errs []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // no Unlock: the thread dies with the goroutine
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errs = append(errs, "capget: "+err.Error())
			return
		}
		data[0].Effective &^= 1 << bit
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errs = append(errs, "capset: "+err.Error())
			return
		}
		ch, err := rdmacm.CreateEventChannel()
		if err != nil {
			errs = append(errs, "channel: "+err.Error())
			return
		}
		defer func() {
			if err := ch.Close(); err != nil {
				errs = append(errs, "close channel: "+err.Error())
			}
		}()
		if err := ch.SetBackend(s.backend); err != nil {
			errs = append(errs, "backend: "+err.Error())
			return
		}
		id, err := rdmacm.CreateID(ch, nil, rdmacm.PS_UDP)
		if err != nil {
			errs = append(errs, "create id: "+err.Error())
			return
		}
		out = outcome(id.BindAddr(a))
		if err := id.Destroy(); err != nil {
			errs = append(errs, "destroy id: "+err.Error())
		}
	}()
	<-done
	if len(errs) > 0 {
		t.Errorf("without capability %d: %s", bit, strings.Join(errs, "; "))
	}
	return out
}

// ipoibJoin: an RDMA_PS_IPOIB id joins a group without a QP. On IB the id
// takes the IPoIB broadcast group's Q_Key (cma_set_default_qkey); on RoCE
// it cannot bind the device's address (portSpaces), and bound to the
// wildcard it has no device to join on (EINVAL, as every id).
func (s *suite) ipoibJoin(t *testing.T) string {
	ch := s.channel(t)
	var seen []string
	wild := s.id(t, ch, rdmacm.PS_IPOIB)
	if err := wild.BindAddr(rdmacm.UDPAddr(netip.IPv4Unspecified())); err != nil {
		t.Fatalf("bind 0.0.0.0: %v", err)
	}
	seen = append(seen, s.expect(t, "wildcard-bound-join", outcome(joinEx(wild, s.group(t), rdmacm.MCJoinFlagFullMember, nil)), same("EINVAL")))
	id := s.id(t, ch, rdmacm.PS_IPOIB)
	err := id.BindAddr(rdmacm.UDPAddr(s.addr))
	seen = append(seen, s.expect(t, "bind", outcome(err), want{soft: "EINVAL", ib: "OK"}))
	if err != nil {
		return strings.Join(seen, " ")
	}
	err = joinEx(id, s.group(t), rdmacm.MCJoinFlagFullMember, nil)
	seen = append(seen, s.expect(t, "join", outcome(err), want{ib: "OK"}))
	if err != nil {
		return strings.Join(seen, " ")
	}
	ev := event(t, ch)
	got := fmt.Sprintf("%v/%d", ev.Event, ev.Status)
	if ev.Event == rdmacm.EventMulticastJoin {
		got += fmt.Sprintf("/qkey=%#x", ev.Param.QKey)
	}
	ev.Ack()
	seen = append(seen, s.expect(t, "event", got, want{ib: fmt.Sprintf("RDMA_CM_EVENT_MULTICAST_JOIN/0/qkey=%#x", rdmacm.IPoIBQKey)}))
	return strings.Join(seen, " ")
}

// capNetBindService is CAP_NET_BIND_SERVICE's bit (linux/capability.h).
const capNetBindService = 10

// hasCap reports whether the calling thread has capability bit in its
// effective set.
func hasCap(bit uint) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	return unix.Capget(&hdr, &data[0]) == nil && data[0].Effective&(1<<bit) != 0
}

// routeThenJoin: rdma_resolve_route, after which the id cannot join.
func (s *suite) routeThenJoin(t *testing.T) string {
	ch := s.channel(t)
	id := s.id(t, ch, rdmacm.PS_UDP)
	g := s.group(t)
	if err := id.ResolveAddr(rdmacm.UDPAddr(s.addr), rdmacm.UDPAddr(g), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	ev := event(t, ch)
	ev.Ack()
	var seen []string
	seen = append(seen, s.expect(t, "route-before-resolved", outcome(s.id(t, ch, rdmacm.PS_UDP).ResolveRoute(time.Second)), same("EINVAL")))
	seen = append(seen, s.expect(t, "resolve-route", outcome(id.ResolveRoute(2*time.Second)), same("OK")))
	ev = event(t, ch)
	// On IB the route is an SA PathRecord query for the group's IPoIB
	// MGID, which no port has joined: ROUTE_ERROR, and the id is back in
	// ADDR_RESOLVED, where it may join.
	seen = append(seen, s.expect(t, "event", fmt.Sprintf("%v/%d", ev.Event, ev.Status), want{soft: "RDMA_CM_EVENT_ROUTE_RESOLVED/0", ib: "RDMA_CM_EVENT_ROUTE_ERROR/-22"}))
	ev.Ack()
	// The route's path (id->route.path_rec): on RoCE built from the
	// addresses (cma_resolve_iboe_route), its MTU the port's active one.
	// The LIDs are left out: on the kernel's RoCE path librdmacm's copy
	// holds bytes of the destination MAC there (01:00:5e… of a group).
	route := id.Route()
	desc := fmt.Sprintf("paths=%d", len(route))
	if len(route) > 0 {
		p := route[0]
		mtuActive := false
		if pa, err := id.Verbs().QueryPort(id.PortNum()); err == nil {
			mtuActive = p.MTU == uint8(pa.ActiveMTU)
		}
		desc += fmt.Sprintf(" sgid-is-src=%v dgid-is-group=%v hop=%d tclass=%d rev=%v pkey=%#x sl=%d mtu-sel=%d mtu-active=%v rate-sel=%d plt=%d/%d",
			p.SGID == verbs.GID(wire.GIDFromAddr(s.addr)), p.DGID == verbs.GID(wire.GIDFromAddr(g)),
			p.HopLimit, p.TrafficClass, p.Reversible, p.PKey, p.SL, p.MTUSelector, mtuActive, p.RateSelector,
			p.PacketLifeTimeSelector, p.PacketLifeTime)
	}
	seen = append(seen, s.expect(t, "route", desc, want{
		soft: "paths=1 sgid-is-src=true dgid-is-group=true hop=64 tclass=0 rev=true pkey=0xffff sl=0 mtu-sel=2 mtu-active=true rate-sel=2 plt=2/18",
		ib:   "paths=0",
	}))
	seen = append(seen, s.expect(t, "join", outcome(id.JoinMulticast(rdmacm.UDPAddr(g), nil)), want{soft: "EINVAL", ib: "OK"}))
	return strings.Join(seen, " ")
}

// migrateID: rdma_migrate_id moves the id's unread events and its later
// ones to the new channel.
func (s *suite) migrateID(t *testing.T) string {
	ch1, ch2 := s.channel(t), s.channel(t)
	id := s.bound(t, ch1)
	g := s.group(t)
	if err := joinEx(id, g, rdmacm.MCJoinFlagSendOnlyFullMember, "moved"); err != nil {
		t.Fatal(err)
	}
	// Wait until the JOIN event is queued on ch1, then move the id.
	deadline := time.Now().Add(20 * time.Second)
	for ch1.Len() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	var seen []string
	seen = append(seen, s.expect(t, "migrate", outcome(id.MigrateID(ch2)), same("OK")))
	seen = append(seen, s.expect(t, "queued-old-new", fmt.Sprintf("%d/%d", ch1.Len(), ch2.Len()), same("0/1")))
	ev := event(t, ch2)
	seen = append(seen, s.expect(t, "event", fmt.Sprintf("%v/%v", ev.Event, ev.Param.PrivateData), same("RDMA_CM_EVENT_MULTICAST_JOIN/moved")))
	ev.Ack()
	g2 := s.group(t)
	joined(t, ch2, id, g2, rdmacm.MCJoinFlagSendOnlyFullMember)
	seen = append(seen, s.expect(t, "to-sync", outcome(id.MigrateID(nil)), same("OK")))
	seen = append(seen, s.expect(t, "sync-again", outcome(id.MigrateID(nil)), same("EINVAL")))
	seen = append(seen, s.expect(t, "back", outcome(id.MigrateID(ch1)), same("OK")))
	for _, a := range []netip.Addr{g, g2} {
		if err := id.LeaveMulticast(rdmacm.UDPAddr(a)); err != nil {
			t.Errorf("leave %v: %v", a, err)
		}
	}
	return strings.Join(seen, " ")
}

// passiveEP: rdma_getaddrinfo(RAI_PASSIVE) and rdma_create_ep give a
// bound synchronous id that joins.
func (s *suite) passiveEP(t *testing.T) string {
	res, err := rdmacm.GetAddrInfo(s.addr.String(), "", &rdmacm.AddrInfo{
		Flags: rdmacm.RAI_PASSIVE | rdmacm.RAI_NUMERICHOST, QPType: verbs.QPTypeUD, PortSpace: rdmacm.PS_UDP,
	})
	if err != nil {
		t.Fatal(err)
	}
	ep, err := rdmacm.CreateEP(res, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rdmacm.DestroyEP(ep)
	var seen []string
	seen = append(seen, s.expect(t, "qp", fmt.Sprint(ep.QP() != nil), same("false")))
	if err := ep.CreateQP(nil, &verbs.QPInitAttr{Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}}); err != nil {
		t.Fatal(err)
	}
	g := rdmacm.UDPAddr(s.group(t))
	seen = append(seen, s.expect(t, "join", outcome(ep.JoinMulticast(g, "ep")), same("OK")))
	ev := ep.Event()
	seen = append(seen, s.expect(t, "event", fmt.Sprintf("%v/%v/%d", ev.Event, ev.Param.PrivateData, ev.Param.PrivateDataLen), same("RDMA_CM_EVENT_MULTICAST_JOIN/ep/0")))
	seen = append(seen, s.expect(t, "leave", outcome(ep.LeaveMulticast(g)), same("OK")))
	return strings.Join(seen, " ")
}
