package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/verbs"
)

// TestEveryErrorHasErrno drives every error path of the rdmacm and verbs
// API that a caller can reach from a bound id on lo, and checks that each
// error is a *verbs.Error naming the C call, with the errno librdmacm or
// libibverbs gives, reachable with errors.Is.
func TestEveryErrorHasErrno(t *testing.T) {
	ch, id := newID(t, PS_UDP)
	_, tcp := newID(t, PS_TCP)
	mr := withQP(t, id, 1, 256, 0)
	unbound, err := CreateID(ch, nil, PS_UDP)
	if err != nil {
		t.Fatal(err)
	}
	defer unbound.Destroy()
	busyCh, err := CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	busyID, err := CreateID(busyCh, nil, PS_UDP)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { busyID.Destroy(); busyCh.Close() }()
	closedCh, _ := CreateEventChannel()
	closedCh.Close()
	emptyCh, _ := CreateEventChannel()
	defer emptyCh.Close()
	emptyCh.SetNonblocking(true)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	g := randGroup()
	attr := func(mask, flags uint32, a net.Addr) *JoinMCAttrEx {
		return &JoinMCAttrEx{CompMask: mask, JoinFlags: flags, Addr: a}
	}
	full := JoinMCAttrAddress | JoinMCAttrJoinFlags
	pd := id.PD()
	ctx := pd.Context()
	qp := id.QP()
	cq := id.SendCQ()
	ah, err := pd.CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: 1, GRH: verbs.GlobalRoute{DGID: verbs.GID(netip.MustParseAddr("::ffff:239.9.9.9").As16())}})
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Destroy()
	deadCQ, _ := ctx.CreateCQ(1)
	deadCQ.Destroy()
	plainCQ, _ := ctx.CreateCQ(1)
	defer plainCQ.Destroy()
	recvCh := id.RecvCQChannel()

	cases := []struct {
		name  string
		op    string
		errno syscall.Errno
		call  func() error
	}{
		{"create id: bad port space", "rdma_create_id", syscall.EINVAL, func() error { _, err := CreateID(ch, nil, PortSpace(0x7777)); return err }},
		{"bind: nil address", "rdma_bind_addr", syscall.EINVAL, func() error { return unbound.BindAddr(nil) }},
		{"bind: not local", "rdma_bind_addr", syscall.EADDRNOTAVAIL, func() error { return unbound.BindAddr(UDPAddr(netip.MustParseAddr("192.0.2.1"))) }},
		{"bind: twice", "rdma_bind_addr", syscall.EINVAL, func() error { return id.BindAddr(lo) }},
		{"resolve: nil destination", "rdma_resolve_addr", syscall.EINVAL, func() error { return unbound.ResolveAddr(nil, nil, 0) }},
		{"resolve: families differ", "rdma_resolve_addr", syscall.EINVAL, func() error {
			return unbound.ResolveAddr(lo, UDPAddr(netip.MustParseAddr("ff0e::1")), 0)
		}},
		{"join_ex: nil attributes", "rdma_join_multicast_ex", syscall.EINVAL, func() error { return id.JoinMulticastEx(nil, nil) }},
		{"join_ex: reserved comp_mask bit", "rdma_join_multicast_ex", syscall.EOPNOTSUPP, func() error { return id.JoinMulticastEx(attr(JoinMCAttrReserved|full, 0, g), nil) }},
		{"join_ex: no address bit", "rdma_join_multicast_ex", syscall.EINVAL, func() error { return id.JoinMulticastEx(attr(JoinMCAttrJoinFlags, 0, g), nil) }},
		{"join_ex: no flags bit", "rdma_join_multicast_ex", syscall.EINVAL, func() error { return id.JoinMulticastEx(attr(JoinMCAttrAddress, 0, g), nil) }},
		{"join_ex: flags ≥ 2", "rdma_join_multicast_ex", syscall.EINVAL, func() error { return id.JoinMulticastEx(attr(full, 2, g), nil) }},
		{"join_ex: nil address", "rdma_join_multicast_ex", syscall.EINVAL, func() error { return id.JoinMulticastEx(attr(full, 0, nil), nil) }},
		{"join_ex: unsupported address", "rdma_join_multicast_ex", syscall.EINVAL, func() error {
			return id.JoinMulticastEx(attr(full, 0, &net.UnixAddr{Name: "/x", Net: "unixgram"}), nil)
		}},
		{"join: unbound id", "rdma_join_multicast", syscall.EINVAL, func() error { return unbound.JoinMulticast(g, nil) }},
		{"join: PS_TCP id", "rdma_join_multicast", syscall.EINVAL, func() error { return tcp.JoinMulticast(g, nil) }},
		{"join: wildcard group", "rdma_join_multicast", syscall.EINVAL, func() error { return id.JoinMulticast(UDPAddr(netip.IPv4Unspecified()), nil) }},
		{"join: loopback group", "rdma_join_multicast", syscall.EINVAL, func() error { return id.JoinMulticast(UDPAddr(netip.MustParseAddr("127.0.0.9")), nil) }},
		{"leave: not joined", "rdma_leave_multicast", syscall.EADDRNOTAVAIL, func() error { return id.LeaveMulticast(g) }},
		{"leave: nil address", "rdma_leave_multicast", syscall.EINVAL, func() error { return id.LeaveMulticast(nil) }},
		{"get event: empty non-blocking channel", "rdma_get_cm_event", syscall.EAGAIN, func() error { _, err := emptyCh.GetEvent(context.TODO()); return err }},
		{"try get event: empty", "rdma_get_cm_event", syscall.EAGAIN, func() error { _, err := emptyCh.TryGetEvent(); return err }},
		{"get event: closed channel", "rdma_get_cm_event", syscall.EBADF, func() error { _, err := closedCh.GetEvent(context.TODO()); return err }},
		{"get event: cancelled", "rdma_get_cm_event", syscall.EINTR, func() error { _, err := busyCh.GetEvent(cancelled); return err }},
		{"ack: nil event", "rdma_ack_cm_event", syscall.EINVAL, func() error { var ev *Event; return ev.Ack() }},
		{"ack: event never retrieved", "rdma_ack_cm_event", syscall.EINVAL, func() error { return (&Event{}).Ack() }},
		{"close channel: ids left", "rdma_destroy_event_channel", syscall.EBUSY, func() error { return busyCh.Close() }},
		{"close channel: twice", "rdma_destroy_event_channel", syscall.EINVAL, func() error { return closedCh.Close() }},
		{"create qp: unbound id", "rdma_create_qp", syscall.EINVAL, func() error { return unbound.CreateQP(nil, &verbs.QPInitAttr{}) }},
		{"create qp: id has one", "rdma_create_qp", syscall.EINVAL, func() error { return id.CreateQP(nil, &verbs.QPInitAttr{QPType: verbs.QPTypeUD}) }},
		{"destroy qp: none", "rdma_destroy_qp", syscall.EINVAL, func() error { return unbound.DestroyQP() }},
		{"reg msgs: unbound id", "rdma_reg_msgs", syscall.EINVAL, func() error { _, err := unbound.RegMsgs(make([]byte, 8)); return err }},
		{"post recv: no QP", "rdma_post_recv", syscall.EINVAL, func() error { return unbound.PostRecv(1, mr, 0, 64) }},
		{"post recv: outside the MR", "rdma_post_recv", syscall.EINVAL, func() error { return id.PostRecv(1, mr, 200, 64) }},
		{"post ud send: nil AH", "rdma_post_ud_send", syscall.EINVAL, func() error { return id.PostUDSend(1, mr, 0, 8, 0, nil, MulticastQPN) }},
		{"get recv comp: no CQ", "rdma_get_recv_comp", syscall.EINVAL, func() error { _, err := unbound.GetRecvComp(context.TODO()); return err }},
		{"get send comp: cancelled", "rdma_get_send_comp", syscall.EINTR, func() error { _, err := id.GetSendComp(cancelled); return err }},

		{"ibv_query_port: port 2", "ibv_query_port", syscall.EINVAL, func() error { _, err := ctx.QueryPort(2); return err }},
		{"ibv_query_gid: no such index", "ibv_query_gid", syscall.ENODATA, func() error { _, err := ctx.QueryGID(1, 999); return err }},
		{"ibv_query_gid_table: port 0", "ibv_query_gid_table", syscall.EINVAL, func() error { _, err := ctx.QueryGIDTable(0); return err }},
		{"ibv_create_cq: 0 entries", "ibv_create_cq", syscall.EINVAL, func() error { _, err := ctx.CreateCQ(0); return err }},
		{"ibv_close_device: PD left", "ibv_close_device", syscall.EBUSY, func() error { return ctx.Close() }},
		{"ibv_dealloc_pd: objects left", "ibv_dealloc_pd", syscall.EBUSY, func() error { return pd.Dealloc() }},
		{"ibv_reg_mr: empty buffer", "ibv_reg_mr", syscall.EINVAL, func() error { _, err := pd.RegMR(nil, 0); return err }},
		{"ibv_create_ah: nil attributes", "ibv_create_ah", syscall.EINVAL, func() error { _, err := pd.CreateAH(nil); return err }},
		{"ibv_create_ah: RoCE without GRH", "ibv_create_ah", syscall.EINVAL, func() error { _, err := pd.CreateAH(&verbs.AHAttr{PortNum: 1}); return err }},
		{"ibv_create_qp: nil attributes", "ibv_create_qp", syscall.EINVAL, func() error { _, err := pd.CreateQP(nil); return err }},
		{"ibv_create_qp: RC", "ibv_create_qp", syscall.EOPNOTSUPP, func() error {
			_, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTypeRC})
			return err
		}},
		{"ibv_modify_qp: RTS to INIT", "ibv_modify_qp", syscall.EINVAL, func() error {
			return qp.Modify(&verbs.QPAttr{State: verbs.QPSInit}, verbs.QPAttrState)
		}},
		{"ibv_post_send: opcode", "ibv_post_send", syscall.EINVAL, func() error {
			return qp.PostSend(&verbs.SendWR{Opcode: verbs.WROpcode(9), UD: verbs.UDWR{AH: ah}})
		}},
		{"ibv_post_recv: unknown lkey", "ibv_post_recv", syscall.EINVAL, func() error {
			return qp.PostRecv(&verbs.RecvWR{SGList: []verbs.SGE{{Addr: 1, Length: 1, LKey: 0xdead}}})
		}},
		{"ibv_attach_mcast: unicast GID", "ibv_attach_mcast", syscall.EINVAL, func() error {
			return qp.AttachMcast(verbs.GID(netip.MustParseAddr("::ffff:10.0.0.1").As16()), 0)
		}},
		{"ibv_detach_mcast: not attached", "ibv_detach_mcast", syscall.EINVAL, func() error {
			return qp.DetachMcast(verbs.GID(netip.MustParseAddr("::ffff:239.9.9.9").As16()), 0)
		}},
		{"ibv_poll_cq: destroyed CQ", "ibv_poll_cq", syscall.EINVAL, func() error { _, err := deadCQ.Poll(make([]verbs.WC, 1)); return err }},
		{"ibv_get_cq_event: cancelled", "ibv_get_cq_event", syscall.EINTR, func() error { return plainCQ.Wait(cancelled) }},
		{"ibv_get_cq_event: channel, cancelled", "ibv_get_cq_event", syscall.EINTR, func() error { _, _, err := recvCh.GetCQEvent(cancelled); return err }},
		{"ibv_get_cq_event: non-blocking, none", "ibv_get_cq_event", syscall.EAGAIN, func() error {
			recvCh.SetNonblocking(true)
			defer recvCh.SetNonblocking(false)
			_, _, err := recvCh.GetCQEvent(context.Background())
			return err
		}},
		{"ibv_create_cq: no such vector", "ibv_create_cq", syscall.EINVAL, func() error {
			_, err := ctx.CreateCQEx(1, verbs.CQInit{Vector: ctx.NumCompVectors()})
			return err
		}},
		{"ibv_destroy_comp_channel: used by a CQ", "ibv_destroy_comp_channel", syscall.EBUSY, func() error { return recvCh.Destroy() }},
		{"ibv_destroy_cq: used by a QP", "ibv_destroy_cq", syscall.EBUSY, func() error { return cq.Destroy() }},
		{"ibv_destroy_cq: twice", "ibv_destroy_cq", syscall.EINVAL, func() error { return deadCQ.Destroy() }},
		{"ibv_init_ah_from_wc: nil WC", "ibv_init_ah_from_wc", syscall.EINVAL, func() error { _, err := verbs.InitAHFromWC(ctx, 1, nil, nil); return err }},
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
	// A failed post names the work request (C's bad_wr) under the errno.
	err = qp.PostSend(&verbs.SendWR{Opcode: verbs.WROpcode(9), UD: verbs.UDWR{AH: ah}})
	var bad *verbs.BadWRError
	if !errors.As(err, &bad) || bad.Index != 0 {
		t.Errorf("post send: %v, want a BadWRError at 0", err)
	}
	// An ended wait still says why, for the caller that checks the context.
	if _, err := busyCh.GetEvent(cancelled); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled GetEvent: %v", err)
	}
}

// TestEINVALSaysWhy: an EINVAL that can have several causes names the one
// it has, next to librdmacm's errno.
func TestEINVALSaysWhy(t *testing.T) {
	ch, id := newID(t, PS_UDP)
	_, tcp := newID(t, PS_TCP)
	withQP(t, id, 1, 256, 0)
	unbound, err := CreateID(ch, nil, PS_UDP)
	if err != nil {
		t.Fatal(err)
	}
	defer unbound.Destroy()
	ah, err := id.PD().CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: 1, GRH: verbs.GlobalRoute{DGID: verbs.GID(netip.MustParseAddr("::ffff:239.9.9.9").As16())}})
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Destroy()
	g := randGroup()
	routed, err := CreateID(nil, nil, PS_UDP) // synchronous: each call waits for its event
	if err != nil {
		t.Fatal(err)
	}
	defer routed.Destroy()
	if err := routed.ResolveAddr(lo, g, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := routed.ResolveRoute(time.Second); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, reason string
		err          error
	}{
		{"unbound id", "not bound to a device", unbound.JoinMulticast(g, nil)},
		{"PS_TCP id", "port space RDMA_PS_TCP has IBV_QPT_RC QPs, a join wants IBV_QPT_UD", tcp.JoinMulticast(g, nil)},
		{"group 0.0.0.0", "group address 0.0.0.0 is unspecified", id.JoinMulticast(UDPAddr(netip.IPv4Unspecified()), nil)},
		{"route resolved", "id is ROUTE_RESOLVED, a join wants ADDR_BOUND or ADDR_RESOLVED", routed.JoinMulticast(g, nil)},
		{"opcode left zero", "opcode IBV_WR_RDMA_WRITE (0) on a UD QP", id.QP().PostSend(&verbs.SendWR{UD: verbs.UDWR{AH: ah}})},
	} {
		if !errors.Is(c.err, syscall.EINVAL) || !strings.Contains(fmt.Sprint(c.err), c.reason) {
			t.Errorf("%s: %v, want EINVAL saying %q", c.name, c.err, c.reason)
		}
	}
}

// TestJoinPortDownSaysWhy: a join on a RoCE device whose interface has no
// carrier (its veth peer is down) fails with ENODEV and says the port is
// not active. It runs in a child process inside a network namespace of
// its own.
func TestJoinPortDownSaysWhy(t *testing.T) {
	if os.Getenv("SOFTRDMA_TEST_NETNS_CHILD") == "port-down" {
		_, id := newID(t, PS_UDP)
		// A second bind: EINVAL, with the id's state.
		if err := id.BindAddr(UDPAddr(netip.MustParseAddr("10.68.0.1"))); !errors.Is(err, syscall.EINVAL) || !strings.Contains(fmt.Sprint(err), "id is ADDR_BOUND, a bind wants IDLE") {
			t.Errorf("second bind: %v, want EINVAL saying the id is bound", err)
		}
		id, err := CreateID(nil, nil, PS_UDP)
		if err != nil {
			t.Fatal(err)
		}
		defer id.Destroy()
		if err := id.BindAddr(UDPAddr(netip.MustParseAddr("10.68.0.1"))); err != nil {
			t.Fatal(err)
		}
		err = id.JoinMulticast(UDPAddr(netip.MustParseAddr("239.68.0.1")), nil)
		if !errors.Is(err, syscall.ENODEV) || !strings.Contains(fmt.Sprint(err), "port 1 of rxe_pd0 is PORT_DOWN, not active") {
			t.Fatalf("join: %v, want ENODEV saying port 1 of rxe_pd0 is not active", err)
		}
		return
	}
	runInNetns(t, "port-down", "^TestJoinPortDownSaysWhy$", [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "pd0", "type", "veth", "peer", "name", "pd1"},
		{"addr", "add", "10.68.0.1/24", "dev", "pd0"},
		{"link", "set", "pd0", "up"},
	})
}
