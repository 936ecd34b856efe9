package rdmacm

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"
	"github.com/softrdma/softrdma/capture"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
	"golang.org/x/net/bpf"
)

// TestCMAPIErrnos drives every error path of SetOption, MigrateID,
// ResolveRoute, GetAddrInfo, CreateEP and GetDevices: each error is a
// *verbs.Error naming the C call, with the errno librdmacm or the kernel
// gives.
func TestCMAPIErrnos(t *testing.T) {
	ch, id := newID(t, PS_UDP)
	_, tcp := newID(t, PS_TCP)
	idle, err := CreateID(ch, nil, PS_UDP)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Destroy()
	syncID, err := CreateID(nil, nil, PS_UDP)
	if err != nil {
		t.Fatal(err)
	}
	defer syncID.Destroy()
	closedCh, _ := CreateEventChannel()
	closedCh.Close()
	otherHost := verbs.NewHost()
	defer otherHost.Close()
	otherCh, err := CreateEventChannelOn(otherHost)
	if err != nil {
		t.Fatal(err)
	}
	defer otherCh.Close()
	path := make([]byte, sizeofPathRecData)
	path[0] = ibPathGMPPrimaryBidi
	badPath := make([]byte, sizeofPathRecData) // flags 0: not a primary GMP path
	udHints := &AddrInfo{QPType: verbs.QPTypeUD, PortSpace: PS_UDP}

	cases := []struct {
		name  string
		op    string
		errno syscall.Errno
		call  func() error
	}{
		{"set option: unknown level", "rdma_set_option", syscall.ENOSYS, func() error { return id.SetOption(7, OptionIDTOS, uint8(0)) }},
		{"set option: unknown ID option", "rdma_set_option", syscall.ENOSYS, func() error { return id.SetOption(OptionID, 9, 1) }},
		{"set option: unknown IB option", "rdma_set_option", syscall.ENOSYS, func() error { return id.SetOption(OptionIB, 0, nil) }},
		{"set option: TOS as a C int", "rdma_set_option", syscall.EINVAL, func() error { return id.SetOption(OptionID, OptionIDTOS, 0x28) }},
		{"set option: TOS without a value", "rdma_set_option", syscall.EINVAL, func() error { return id.SetOption(OptionID, OptionIDTOS, nil) }},
		{"set option: REUSEADDR as a byte", "rdma_set_option", syscall.EINVAL, func() error { return idle.SetOption(OptionID, OptionIDReuseAddr, uint8(1)) }},
		{"set option: REUSEADDR off after bind", "rdma_set_option", syscall.EINVAL, func() error { return id.SetOption(OptionID, OptionIDReuseAddr, 0) }},
		{"set option: AFONLY as int64", "rdma_set_option", syscall.EINVAL, func() error { return idle.SetOption(OptionID, OptionIDAFOnly, int64(1)) }},
		{"set option: AFONLY after resolve", "rdma_set_option", syscall.EINVAL, func() error { return syncID.SetOption(OptionID, OptionIDAFOnly, 1) }},
		{"set option: ACK_TIMEOUT on a UD id", "rdma_set_option", syscall.EINVAL, func() error { return id.SetOption(OptionID, OptionIDAckTimeout, uint8(14)) }},
		{"set option: ACK_TIMEOUT as int", "rdma_set_option", syscall.EINVAL, func() error { return tcp.SetOption(OptionID, OptionIDAckTimeout, 14) }},
		{"set option: value of a Go type C has not", "rdma_set_option", syscall.EINVAL, func() error { return id.SetOption(OptionID, OptionIDReuseAddr, true) }},
		{"set option: int beyond a C int", "rdma_set_option", syscall.EINVAL, func() error { return idle.SetOption(OptionID, OptionIDReuseAddr, 1<<40) }},
		{"set option: IB_PATH not whole records", "rdma_set_option", syscall.EINVAL, func() error { return id.SetOption(OptionIB, OptionIBPath, make([]byte, 10)) }},
		{"set option: IB_PATH without a primary path", "rdma_set_option", syscall.EINVAL, func() error { return syncID.SetOption(OptionIB, OptionIBPath, badPath) }},
		{"set option: IB_PATH on a bound id", "rdma_set_option", syscall.EINVAL, func() error { return id.SetOption(OptionIB, OptionIBPath, path) }},
		{"migrate: sync id to no channel", "rdma_migrate_id", syscall.EINVAL, func() error { return syncID.MigrateID(nil) }},
		{"migrate: closed channel", "rdma_migrate_id", syscall.EBADF, func() error { return idle.MigrateID(closedCh) }},
		{"migrate: channel of another host", "rdma_migrate_id", syscall.EINVAL, func() error { return idle.MigrateID(otherCh) }},
		{"resolve route: bound, not resolved", "rdma_resolve_route", syscall.EINVAL, func() error { return id.ResolveRoute(time.Second) }},
		{"resolve route: idle", "rdma_resolve_route", syscall.EINVAL, func() error { return idle.ResolveRoute(time.Second) }},
		{"getaddrinfo: nothing", "rdma_getaddrinfo", syscall.EINVAL, func() error { _, err := GetAddrInfo("", "", nil); return err }},
		{"getaddrinfo: RAI_SA with a node", "rdma_getaddrinfo", syscall.EOPNOTSUPP, func() error {
			_, err := GetAddrInfo("127.0.0.1", "", &AddrInfo{Flags: RAI_SA})
			return err
		}},
		{"getaddrinfo: RAI_SA with RAI_DNS", "rdma_getaddrinfo", syscall.EOPNOTSUPP, func() error {
			_, err := GetAddrInfo("", "7471", &AddrInfo{Flags: RAI_SA | RAI_DNS})
			return err
		}},
		{"getaddrinfo: RAI_SA without service", "rdma_getaddrinfo", syscall.EINVAL, func() error { _, err := GetAddrInfo("", "", &AddrInfo{Flags: RAI_SA}); return err }},
		{"getaddrinfo: RAI_SA lookup", "rdma_getaddrinfo", syscall.ENOENT, func() error { _, err := GetAddrInfo("", "7471", &AddrInfo{Flags: RAI_SA}); return err }},
		{"getaddrinfo: EAI_NONAME (numeric host)", "rdma_getaddrinfo", syscall.ENOENT, func() error {
			_, err := GetAddrInfo("localhost", "", &AddrInfo{Flags: RAI_NUMERICHOST})
			return err
		}},
		{"getaddrinfo: EAI_ADDRFAMILY", "rdma_getaddrinfo", syscall.EAFNOSUPPORT, func() error {
			_, err := GetAddrInfo("127.0.0.1", "", &AddrInfo{Family: syscall.AF_INET6})
			return err
		}},
		{"getaddrinfo: EAI_FAMILY", "rdma_getaddrinfo", syscall.EAFNOSUPPORT, func() error {
			_, err := GetAddrInfo("127.0.0.1", "", &AddrInfo{Family: syscall.AF_UNIX})
			return err
		}},
		{"getaddrinfo: EAI_SERVICE", "rdma_getaddrinfo", syscall.ENOENT, func() error { _, err := GetAddrInfo("127.0.0.1", "no-such-service", udHints); return err }},
		{"getaddrinfo: EAI_SOCKTYPE", "rdma_getaddrinfo", syscall.ESOCKTNOSUPPORT, func() error {
			_, err := GetAddrInfo("127.0.0.1", "1", &AddrInfo{QPType: verbs.QPTypeUD, PortSpace: PS_TCP})
			return err
		}},
		{"getaddrinfo: AF_IB from IPv4", "rdma_getaddrinfo", syscall.EAFNOSUPPORT, func() error {
			_, err := GetAddrInfo("127.0.0.1", "", &AddrInfo{Flags: RAI_FAMILY | RAI_NUMERICHOST, Family: AF_IB})
			return err
		}},
		{"create ep: nil addrinfo", "rdma_create_ep", syscall.EINVAL, func() error { _, err := CreateEP(nil, nil, nil); return err }},
		{"create ep: bad port space", "rdma_create_ep", syscall.EINVAL, func() error { _, err := CreateEP(&AddrInfo{PortSpace: 0x7777}, nil, nil); return err }},
		{"create ep: passive, address not local", "rdma_create_ep", syscall.EADDRNOTAVAIL, func() error {
			_, err := CreateEP(&AddrInfo{Flags: RAI_PASSIVE, PortSpace: PS_UDP, QPType: verbs.QPTypeUD, SrcAddr: UDPAddr(netip.MustParseAddr("192.0.2.1"))}, nil, nil)
			return err
		}},
		{"create ep: passive without an address", "rdma_create_ep", syscall.EINVAL, func() error {
			_, err := CreateEP(&AddrInfo{Flags: RAI_PASSIVE, PortSpace: PS_UDP, QPType: verbs.QPTypeUD}, nil, nil)
			return err
		}},
		{"create ep: active without a destination", "rdma_create_ep", syscall.EINVAL, func() error {
			_, err := CreateEP(&AddrInfo{PortSpace: PS_UDP, QPType: verbs.QPTypeUD}, nil, nil)
			return err
		}},
	}
	// syncID: address resolved (AFONLY refused, IB_PATH takes records).
	if err := syncID.ResolveAddr(lo, lo, time.Second); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			var e *verbs.Error
			switch {
			case err == nil:
				t.Fatalf("no error, want %v", c.errno)
			case !errors.As(err, &e):
				t.Fatalf("%T %v: not a *verbs.Error", err, err)
			case e.Errno == 0 || e.Errno != c.errno || !errors.Is(err, c.errno):
				t.Fatalf("%v: errno %d, want %d (%v)", err, int(e.Errno), int(c.errno), c.errno)
			case e.Op != c.op:
				t.Fatalf("%v: op %q, want %q", err, e.Op, c.op)
			}
		})
	}
	// A failed lookup also gives getaddrinfo's code, as C's return value.
	_, err = GetAddrInfo("localhost", "", &AddrInfo{Flags: RAI_NUMERICHOST})
	var eaiErr AddrInfoError
	if !errors.As(err, &eaiErr) || eaiErr != EAI_NONAME {
		t.Errorf("numeric lookup of a name: %v, want EAI_NONAME", err)
	}
}

// TestSetOptionTOSOnTheWire: RDMA_OPTION_ID_TOS is recorded, and, as the
// kernel's cma_iboe_join_multicast, leaves the JOIN event's traffic class
// 0; a traffic class put into the AH attributes is the IP TOS byte of
// every datagram sent through the AH, as the frames received on lo show
// (the capture package's received frames carry the TOS the kernel
// delivered; as root an AF_PACKET capture on lo sees the frame itself).
func TestSetOptionTOSOnTheWire(t *testing.T) {
	const tos = 0xb8 // DSCP EF
	g := randGroup()
	// As root, an AF_PACKET capture on lo sees the frames themselves.
	rawTOS := make(chan uint8, 16)
	if os.Geteuid() == 0 {
		h, err := pcapgo.NewEthernetHandle("lo")
		if err != nil {
			t.Logf("no AF_PACKET capture on lo: %v", err)
		} else {
			// lo is busy with other tests: take only IPv4 frames to g.
			g4 := g.IP.To4()
			prog, err := bpf.Assemble([]bpf.Instruction{
				bpf.LoadAbsolute{Off: 12, Size: 2},
				bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 0x0800, SkipTrue: 3},
				bpf.LoadAbsolute{Off: 30, Size: 4},
				bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(g4[0])<<24 | uint32(g4[1])<<16 | uint32(g4[2])<<8 | uint32(g4[3]), SkipTrue: 1},
				bpf.RetConstant{Val: 65535},
				bpf.RetConstant{Val: 0},
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := h.SetBPF(prog); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					data, _, err := h.ReadPacketData()
					if err != nil {
						return
					}
					if ip, ok := ipv4To(data, g.IP); ok {
						select {
						case rawTOS <- ip.TOS():
						default:
						}
					}
				}
			}()
			defer func() { h.Close(); <-done }()
		}
	} else {
		close(rawTOS)
	}
	_, id := newID(t, PS_UDP) // rxe_lo exists from here on
	var pcap bytes.Buffer
	c, err := capture.Start(&pcap, capture.Options{Device: "rxe_lo", Direction: capture.Received})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()

	if err := id.SetOption(OptionID, OptionIDTOS, uint8(tos)); err != nil {
		t.Fatal(err)
	}
	if got, set := id.TOS(); got != tos || !set {
		t.Fatalf("TOS %#x set %v", got, set)
	}
	mr := withQP(t, id, 1, 256, 0)
	ev := join(t, id, g, MCJoinFlagFullMember, nil)
	if tc := ev.Param.AHAttr.GRH.TrafficClass; tc != 0 {
		t.Errorf("JOIN AH traffic class %#x, want 0 (the kernel's)", tc)
	}
	if ev.Param.PrivateDataLen != 0 {
		t.Errorf("JOIN private_data_len %d, want 0", ev.Param.PrivateDataLen)
	}
	attr := ev.Param.AHAttr
	attr.GRH.TrafficClass = tos
	ah, err := id.PD().CreateAH(&attr)
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Destroy()
	ev.Ack()
	msg := []byte("tos!")
	smr, err := id.RegMsgs(msg)
	if err != nil {
		t.Fatal(err)
	}
	defer smr.Dereg()
	if err := id.PostUDSend(9, smr, 0, len(msg), verbs.SendSignaled, ah, MulticastQPN); err != nil {
		t.Fatal(err)
	}
	if _, err := id.GetSendComp(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	wc, err := id.GetRecvComp(ctxT(t))
	if err != nil || wc.Status != verbs.WCSuccess {
		t.Fatalf("recv: %v %v", wc.Status, err)
	}
	// The receive buffer's GRH area holds the IPv4 header as received.
	buf := mr.Buf()
	if got := wire.IPv4(buf[20:40]).TOS(); got != tos {
		t.Errorf("received IPv4 TOS %#x, want %#x", got, tos)
	}
	c.Stop()
	<-c.Done()
	r, err := pcapgo.NewReader(&pcap)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for {
		data, _, err := r.ReadPacketData()
		if err != nil {
			break
		}
		if ip, ok := ipv4To(data, g.IP); ok {
			found = true
			if ip.TOS() != tos {
				t.Errorf("captured frame to %v: TOS %#x, want %#x", g.IP, ip.TOS(), tos)
			}
		}
	}
	if !found {
		t.Errorf("no captured frame to %v", g.IP)
	}
	select {
	case got, ok := <-rawTOS:
		if ok && got != tos {
			t.Errorf("AF_PACKET frame to %v on lo: TOS %#x, want %#x", g.IP, got, tos)
		}
	case <-time.After(2 * time.Second):
		t.Errorf("AF_PACKET on lo: no frame to %v", g.IP)
	}
	if err := id.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
}

// ipv4To returns the IPv4 header of an Ethernet frame sent to dst.
func ipv4To(frame []byte, dst net.IP) (wire.IPv4, bool) {
	if len(frame) < 14+20 || frame[12] != 0x08 || frame[13] != 0x00 {
		return nil, false
	}
	ip := wire.IPv4(frame[14:])
	return ip, net.IP(ip.Dst().AsSlice()).Equal(dst)
}

// TestReuseAddrAFOnly: the port rules of the kernel's cma_check_port.
func TestReuseAddrAFOnly(t *testing.T) {
	ch, err := CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	mk := func(opts ...int) *ID {
		t.Helper()
		id, err := CreateID(ch, nil, PS_UDP)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { id.Destroy() })
		for i := 0; i < len(opts); i += 2 {
			if err := id.SetOption(OptionID, opts[i], opts[i+1]); err != nil {
				t.Fatal(err)
			}
		}
		return id
	}
	first := mk()
	if err := first.BindAddr(lo); err != nil {
		t.Fatal(err)
	}
	port := first.SrcPort()
	at := func(a string) *net.UDPAddr {
		return net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(a), port))
	}
	wantErrno(t, mk().BindAddr(at("127.0.0.1")), syscall.EADDRINUSE)
	wantErrno(t, mk().BindAddr(at("0.0.0.0")), syscall.EADDRNOTAVAIL)
	wantErrno(t, mk(OptionIDReuseAddr, 1).BindAddr(at("127.0.0.1")), syscall.EADDRINUSE) // only one of the two reuses
	// Both reuse: the same address binds twice.
	a, b := mk(OptionIDReuseAddr, 1), mk(OptionIDReuseAddr, 1)
	pa := net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port+1))
	if err := a.BindAddr(pa); err != nil {
		t.Fatal(err)
	}
	if err := b.BindAddr(pa); err != nil {
		t.Errorf("both REUSEADDR: %v", err)
	}
	// REUSEADDR may be turned on after bind, and then counts.
	if err := first.SetOption(OptionID, OptionIDReuseAddr, 1); err != nil {
		t.Fatal(err)
	}
	if err := mk(OptionIDReuseAddr, 1).BindAddr(at("127.0.0.1")); err != nil {
		t.Errorf("after first's REUSEADDR: %v", err)
	}
	// AFONLY: an IPv6 wildcard id shares an IPv4 id's port only if it is
	// AFONLY (IPv4 ids are).
	v6port := port + 2
	v4 := mk()
	if err := v4.BindAddr(net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), v6port))); err != nil {
		t.Fatal(err)
	}
	any6 := net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.IPv6Unspecified(), v6port))
	if b, _ := os.ReadFile("/proc/sys/net/ipv6/bindv6only"); string(bytes.TrimSpace(b)) != "1" {
		wantErrno(t, mk().BindAddr(any6), syscall.EADDRNOTAVAIL)
	}
	if err := mk(OptionIDAFOnly, 1).BindAddr(any6); err != nil {
		t.Errorf("AFONLY IPv6 wildcard next to IPv4: %v", err)
	}
}

// TestMigrateID: unread events move with the id; the migration waits for
// the acks of events already read; nil makes the id synchronous.
func TestMigrateID(t *testing.T) {
	ch1, id := newID(t, PS_UDP)
	ch2, err := CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	g1, g2 := randGroup(), randGroup()
	join(t, id, g1, MCJoinFlagSendOnlyFullMember, "one").Ack()
	if err := id.JoinMulticast(g2, "two"); err != nil {
		t.Fatal(err)
	}
	// An unacked event of the id holds the migration.
	if err := id.ResolveAddr(lo, lo, time.Second); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for ch1.Len() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	ev, err := ch1.GetEvent(ctxT(t))
	if err != nil || ev.Event != EventMulticastJoin || ev.Param.PrivateData != "two" {
		t.Fatalf("%v %v", ev, err)
	}
	done := make(chan error, 1)
	go func() { done <- id.MigrateID(ch2) }()
	select {
	case err := <-done:
		t.Fatalf("migrated before the ack: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	ev.Ack()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if id.Channel() != ch2 || ch1.Len() != 0 || ch2.Len() != 1 {
		t.Fatalf("channel %p (ch2 %p), queued %d/%d", id.Channel(), ch2, ch1.Len(), ch2.Len())
	}
	ev, err = ch2.GetEvent(ctxT(t))
	if err != nil || ev.Event != EventAddrResolved || ev.ID != id {
		t.Fatalf("moved event: %v %v", ev, err)
	}
	ev.Ack()
	// ch1 may close now: the id is ch2's.
	if err := ch1.Close(); err != nil {
		t.Fatalf("close the old channel: %v", err)
	}
	// New events come on ch2.
	if err := id.LeaveMulticast(g1); err != nil {
		t.Fatal(err)
	}
	join(t, id, g1, MCJoinFlagSendOnlyFullMember, "three").Ack()

	// nil: synchronous. A join now waits for its event.
	if err := id.MigrateID(nil); err != nil {
		t.Fatal(err)
	}
	if id.Channel() == ch2 || ch2.Len() != 0 {
		t.Fatal("still on ch2")
	}
	g3 := randGroup()
	if err := id.JoinMulticast(g3, "four"); err != nil {
		t.Fatal(err)
	}
	if ev := id.Event(); ev == nil || ev.Event != EventMulticastJoin || ev.Param.PrivateData != "four" {
		t.Fatalf("parked event %v", ev)
	}
	wantErrno(t, id.MigrateID(nil), syscall.EINVAL)
	// And back to ch2: the parked event is acked, the private channel closed.
	priv := id.Channel()
	if err := id.MigrateID(ch2); err != nil {
		t.Fatal(err)
	}
	if id.Event() != nil || priv.Close() == nil {
		t.Error("the private channel is still open or an event still parked")
	}
	for _, g := range []net.Addr{g1, g2, g3} {
		if err := id.LeaveMulticast(g); err != nil {
			t.Errorf("leave %v: %v", g, err)
		}
	}
	if err := id.Destroy(); err != nil {
		t.Fatal(err)
	}
	// Destroy took the id off ch2.
	if err := ch2.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestGetAddrInfo checks the lookups librdmacm's addrinfo.c makes.
func TestGetAddrInfo(t *testing.T) {
	udp := func(a string, p uint16) net.Addr {
		return net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(a), p))
	}
	cases := []struct {
		name          string
		node, service string
		hints         *AddrInfo
		want          AddrInfo
	}{
		{"passive numeric UD", "127.0.0.1", "7471", &AddrInfo{Flags: RAI_PASSIVE | RAI_NUMERICHOST, QPType: verbs.QPTypeUD, PortSpace: PS_UDP},
			AddrInfo{Flags: RAI_PASSIVE, Family: syscall.AF_INET, QPType: verbs.QPTypeUD, PortSpace: PS_UDP, SrcAddr: udp("127.0.0.1", 7471)}},
		{"passive, no node: wildcard", "", "7471", &AddrInfo{Flags: RAI_PASSIVE, PortSpace: PS_UDP},
			AddrInfo{Flags: RAI_PASSIVE, Family: syscall.AF_INET, QPType: verbs.QPTypeUD, PortSpace: PS_UDP, SrcAddr: udp("0.0.0.0", 7471)}},
		{"passive IPv6 wildcard", "", "1", &AddrInfo{Flags: RAI_PASSIVE, Family: syscall.AF_INET6, QPType: verbs.QPTypeUD},
			AddrInfo{Flags: RAI_PASSIVE, Family: syscall.AF_INET6, QPType: verbs.QPTypeUD, PortSpace: PS_UDP, SrcAddr: udp("::", 1)}},
		{"active group, no hints: stream first", "239.1.2.3", "", nil,
			AddrInfo{Family: syscall.AF_INET, QPType: verbs.QPTypeRC, PortSpace: PS_TCP, DstAddr: udp("239.1.2.3", 0)}},
		{"active, no node: loopback", "", "9", &AddrInfo{Family: syscall.AF_INET, QPType: verbs.QPTypeUD},
			AddrInfo{Family: syscall.AF_INET, QPType: verbs.QPTypeUD, PortSpace: PS_UDP, DstAddr: udp("127.0.0.1", 9)}},
		{"port modulo 2^16, as glibc", "127.0.0.1", "99999", &AddrInfo{PortSpace: PS_UDP},
			AddrInfo{Family: syscall.AF_INET, QPType: verbs.QPTypeUD, PortSpace: PS_UDP, DstAddr: udp("127.0.0.1", 34463)}},
		{"localhost by name", "localhost", "", &AddrInfo{Family: syscall.AF_INET, QPType: verbs.QPTypeUD},
			AddrInfo{Family: syscall.AF_INET, QPType: verbs.QPTypeUD, PortSpace: PS_UDP, DstAddr: udp("127.0.0.1", 0)}},
		{"hint source copied", "239.1.2.3", "", &AddrInfo{QPType: verbs.QPTypeUD, SrcAddr: lo},
			AddrInfo{Family: syscall.AF_INET, QPType: verbs.QPTypeUD, PortSpace: PS_UDP, SrcAddr: lo, DstAddr: udp("239.1.2.3", 0)}},
		{"no node nor service: the hints", "", "", &AddrInfo{Flags: RAI_NUMERICHOST, Family: syscall.AF_INET, QPType: verbs.QPTypeUD, PortSpace: PS_UDP, DstAddr: lo},
			AddrInfo{Flags: RAI_NUMERICHOST, Family: syscall.AF_INET, QPType: verbs.QPTypeUD, PortSpace: PS_UDP, DstAddr: lo}},
		{"AF_IB from a numeric IPv6 GID", "fe80::2", "7174", &AddrInfo{Flags: RAI_FAMILY | RAI_NUMERICHOST | RAI_PASSIVE, Family: AF_IB, QPType: verbs.QPTypeUD, PortSpace: PS_IB},
			AddrInfo{Flags: RAI_PASSIVE, Family: AF_IB, QPType: verbs.QPTypeUD, PortSpace: PS_IB, SrcAddr: &IBAddr{
				PKey: 0xFFFF, GID: verbs.GID(netip.MustParseAddr("fe80::2").As16()),
				SID: uint64(PS_IB)<<16 + 7174, SIDMask: ibIPPSMask | ibIPPortMask}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := GetAddrInfo(c.node, c.service, c.hints)
			if err != nil {
				t.Fatal(err)
			}
			defer FreeAddrInfo(got)
			if got.Flags != c.want.Flags || got.Family != c.want.Family || got.QPType != c.want.QPType || got.PortSpace != c.want.PortSpace ||
				!sameAddr(got.SrcAddr, c.want.SrcAddr) || !sameAddr(got.DstAddr, c.want.DstAddr) || got.Next != nil {
				t.Errorf("got %+v (src %v dst %v), want %+v (src %v dst %v)", *got, got.SrcAddr, got.DstAddr, c.want, c.want.SrcAddr, c.want.DstAddr)
			}
		})
	}
}

func sameAddr(a, b net.Addr) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	sa, err1 := toSockaddr(a)
	sb, err2 := toSockaddr(b)
	return err1 == nil && err2 == nil && sa == sb
}

// TestCreateEP: a passive endpoint is bound (and joins), an active one is
// route-resolved with its QP (and, as in the kernel, cannot join).
func TestCreateEP(t *testing.T) {
	res, err := GetAddrInfo("127.0.0.1", "", &AddrInfo{Flags: RAI_PASSIVE | RAI_NUMERICHOST, QPType: verbs.QPTypeUD, PortSpace: PS_UDP})
	if err != nil {
		t.Fatal(err)
	}
	ctxs, err := GetDevices()
	if err != nil {
		t.Fatal(err)
	}
	var rxeLo *verbs.Context
	for _, c := range ctxs {
		if c.Device().Name() == "rxe_lo" {
			rxeLo = c
		}
	}
	if rxeLo == nil {
		t.Fatalf("GetDevices: no rxe_lo in %d contexts", len(ctxs))
	}
	pd, err := rxeLo.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Dealloc()
	attr := &verbs.QPInitAttr{Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}}
	ep, err := CreateEP(res, pd, attr)
	if err != nil {
		t.Fatal(err)
	}
	if ep.Verbs() != rxeLo || ep.PD() != pd || ep.QP() != nil || ep.SrcPort() == 0 || ep.DstPort() != 0 || !ep.isSync() {
		t.Errorf("passive EP: verbs %v pd ok %v qp %v ports %d/%d", ep.Verbs() == rxeLo, ep.PD() == pd, ep.QP(), ep.SrcPort(), ep.DstPort())
	}
	if err := ep.CreateQP(nil, attr); err != nil { // the EP's PD
		t.Fatal(err)
	}
	g := randGroup()
	if err := ep.JoinMulticast(g, "ep"); err != nil {
		t.Fatalf("passive EP join: %v", err)
	}
	if err := ep.LeaveMulticast(g); err != nil {
		t.Fatal(err)
	}
	if err := DestroyEP(ep); err != nil {
		t.Fatal(err)
	}

	// Active: resolved towards the group from lo, route resolved, QP made.
	res, err = GetAddrInfo(g.IP.String(), "4791", &AddrInfo{QPType: verbs.QPTypeUD, PortSpace: PS_UDP, SrcAddr: lo})
	if err != nil {
		t.Fatal(err)
	}
	attr = &verbs.QPInitAttr{Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}}
	ep, err = CreateEP(res, nil, attr)
	if err != nil {
		t.Fatal(err)
	}
	if ep.QP() == nil || attr.QPType != verbs.QPTypeUD || ep.DstPort() != 4791 {
		t.Errorf("active EP: qp %v type %v dst port %d", ep.QP(), attr.QPType, ep.DstPort())
	}
	if ev := ep.Event(); ev == nil || ev.Event != EventRouteResolved {
		t.Errorf("active EP: last event %v, want ROUTE_RESOLVED", ev)
	}
	wantErrno(t, ep.JoinMulticast(g, nil), syscall.EINVAL)
	if err := DestroyEP(ep); err != nil {
		t.Fatal(err)
	}
	// With a route given as a path record: SetOption(IB_PATH) instead.
	route := make([]byte, sizeofPathRecData)
	route[0] = ibPathGMPPrimaryBidi
	res.Route = route
	ep, err = CreateEP(res, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ev := ep.Event(); ev == nil || ev.Event != EventRouteResolved || ep.QP() != nil {
		t.Errorf("EP with a route: last event %v, qp %v", ev, ep.QP())
	}
	DestroyEP(ep)
}

// TestGetDevicesShared: the contexts GetDevices returns are the ones ids
// bound to the devices use.
func TestGetDevicesShared(t *testing.T) {
	_, id := newID(t, PS_UDP)
	ctxs, err := GetDevices()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range ctxs {
		found = found || c == id.Verbs()
	}
	if !found {
		t.Errorf("the id's context is not among the %d of GetDevices", len(ctxs))
	}
	FreeDevices(ctxs)
}
