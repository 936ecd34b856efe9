package rdmacm_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	// The kinds of device the example runs on.
	_ "github.com/softrdma/softrdma/provider/all"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// ExampleID_SetOption sets an id's type of service. As in the kernel, the
// JOIN event's AH keeps traffic class 0; the program puts the TOS into the
// AH attributes, and every datagram sent through the AH carries it (here
// read back from the IPv4 header of the datagram received over lo).
func ExampleID_SetOption() {
	group := rdmacm.UDPAddr(netip.MustParseAddr("239.254.7.8"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ch, _ := rdmacm.CreateEventChannel()
	defer ch.Close()
	id, _ := rdmacm.CreateID(ch, nil, rdmacm.PS_UDP)
	defer id.Destroy()

	const tos = 0xb8 // DSCP EF
	fmt.Println(id.SetOption(rdmacm.OptionID, rdmacm.OptionIDTOS, uint8(tos)))
	fmt.Println(id.SetOption(rdmacm.OptionID, rdmacm.OptionIDTOS, tos)) // an int: C's sizeof(int)
	fmt.Println(id.SetOption(rdmacm.OptionID, rdmacm.OptionIDReuseAddr, 1))

	id.BindAddr(rdmacm.UDPAddr(netip.MustParseAddr("127.0.0.1")))
	id.CreateQP(nil, &verbs.QPInitAttr{Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	defer id.DestroyQP()
	buf := make([]byte, verbs.GRHLen+3)
	mr, _ := id.RegMsgs(buf)
	defer mr.Dereg()
	id.PostRecv(1, mr, 0, len(buf))

	id.JoinMulticast(group, nil)
	ev, _ := ch.GetEvent(ctx)
	attr := ev.Param.AHAttr
	fmt.Printf("JOIN traffic class %#x\n", attr.GRH.TrafficClass)
	ev.Ack()
	attr.GRH.TrafficClass = tos
	ah, _ := id.PD().CreateAH(&attr)
	defer ah.Destroy()

	msg := []byte("EF!")
	smr, _ := id.RegMsgs(msg)
	defer smr.Dereg()
	id.PostUDSend(2, smr, 0, len(msg), verbs.SendSignaled, ah, rdmacm.MulticastQPN)
	id.GetSendComp(ctx)
	id.GetRecvComp(ctx)
	fmt.Printf("received TOS %#x\n", wire.IPv4(buf[20:40]).TOS())
	id.LeaveMulticast(group)
	// Output:
	// <nil>
	// rdma_set_option: TOS is a uint8, not 4 bytes: invalid argument
	// <nil>
	// JOIN traffic class 0x0
	// received TOS 0xb8
}

// ExampleID_MigrateID moves an id, with its unread event, to another
// channel, then makes it synchronous.
func ExampleID_MigrateID() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ch1, _ := rdmacm.CreateEventChannel()
	ch2, _ := rdmacm.CreateEventChannel()
	defer ch2.Close()
	id, _ := rdmacm.CreateID(ch1, nil, rdmacm.PS_UDP)
	defer id.Destroy()
	lo := rdmacm.UDPAddr(netip.MustParseAddr("127.0.0.1"))
	id.ResolveAddr(lo, lo, time.Second) // ADDR_RESOLVED, on ch1

	fmt.Println(id.MigrateID(ch2), ch1.Len(), ch2.Len())
	fmt.Println(ch1.Close()) // no id left on it
	ev, _ := ch2.GetEvent(ctx)
	fmt.Println(ev.Event)
	ev.Ack()

	fmt.Println(id.MigrateID(nil), id.Channel() == ch2)
	fmt.Println(id.MigrateID(nil))
	// Output:
	// <nil> 0 1
	// <nil>
	// RDMA_CM_EVENT_ADDR_RESOLVED
	// <nil> false
	// rdma_migrate_id: synchronous id: invalid argument
}

// ExampleGetAddrInfo resolves a local address to bind a UD id to, and a
// group to resolve.
func ExampleGetAddrInfo() {
	res, _ := rdmacm.GetAddrInfo("127.0.0.1", "7471", &rdmacm.AddrInfo{
		Flags: rdmacm.RAI_PASSIVE | rdmacm.RAI_NUMERICHOST, QPType: verbs.QPTypeUD, PortSpace: rdmacm.PS_UDP,
	})
	fmt.Println(res.Flags == rdmacm.RAI_PASSIVE, res.Family == syscall.AF_INET, res.QPType, res.PortSpace, res.SrcAddr)
	rdmacm.FreeAddrInfo(res)

	res, _ = rdmacm.GetAddrInfo("239.1.1.1", "", &rdmacm.AddrInfo{PortSpace: rdmacm.PS_UDP})
	fmt.Println(res.QPType, res.DstAddr, res.SrcAddr)

	_, err := rdmacm.GetAddrInfo("localhost", "", &rdmacm.AddrInfo{Flags: rdmacm.RAI_NUMERICHOST})
	var eai rdmacm.AddrInfoError
	fmt.Println(errors.As(err, &eai), int(eai), errors.Is(err, syscall.ENOENT))
	// Output:
	// true true IBV_QPT_UD RDMA_PS_UDP 127.0.0.1:7471
	// IBV_QPT_UD 239.1.1.1:0 <nil>
	// true -2 true
}

// ExampleGetDevices lists the device contexts: the ones ids bound to the
// devices use.
func ExampleGetDevices() {
	ctxs, err := rdmacm.GetDevices()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rdmacm.FreeDevices(ctxs)
	ch, _ := rdmacm.CreateEventChannel()
	defer ch.Close()
	id, _ := rdmacm.CreateID(ch, nil, rdmacm.PS_UDP)
	defer id.Destroy()
	id.BindAddr(rdmacm.UDPAddr(netip.MustParseAddr("127.0.0.1")))
	for _, c := range ctxs {
		if c.Device().Name() == "rxe_lo" {
			fmt.Println("rxe_lo, shared with the id:", c == id.Verbs())
		}
	}
	// Output:
	// rxe_lo, shared with the id: true
}

// ExampleCreateEP makes a synchronous UD endpoint bound to 127.0.0.1 (a
// passive one: an id whose route is resolved cannot join) and joins a
// group with it.
func ExampleCreateEP() {
	res, _ := rdmacm.GetAddrInfo("127.0.0.1", "", &rdmacm.AddrInfo{
		Flags: rdmacm.RAI_PASSIVE | rdmacm.RAI_NUMERICHOST, QPType: verbs.QPTypeUD, PortSpace: rdmacm.PS_UDP,
	})
	ep, err := rdmacm.CreateEP(res, nil, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rdmacm.DestroyEP(ep)
	ep.CreateQP(nil, &verbs.QPInitAttr{Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	group := rdmacm.UDPAddr(netip.MustParseAddr("239.254.7.9"))
	fmt.Println(ep.JoinMulticast(group, "ctx")) // synchronous: waits for the event
	ev := ep.Event()
	fmt.Println(ev.Event, ev.Param.PrivateData, ev.Param.PrivateDataLen)
	fmt.Println(ep.LeaveMulticast(group))
	// Output:
	// <nil>
	// RDMA_CM_EVENT_MULTICAST_JOIN ctx 0
	// <nil>
}

// ExampleID_SrcPort reads the ports of a resolved id, in host order.
func ExampleID_SrcPort() {
	id, _ := rdmacm.CreateID(nil, nil, rdmacm.PS_UDP)
	defer id.Destroy()
	src := net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:17471"))
	dst := net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:4791"))
	id.ResolveAddr(src, dst, time.Second)
	fmt.Println(id.SrcPort(), id.DstPort())
	// Output:
	// 17471 4791
}

// ExampleID_ResolveRoute resolves an id's route; afterwards the id can no
// longer join a group, as in the kernel.
func ExampleID_ResolveRoute() {
	id, _ := rdmacm.CreateID(nil, nil, rdmacm.PS_UDP)
	defer id.Destroy()
	lo := rdmacm.UDPAddr(netip.MustParseAddr("127.0.0.1"))
	group := rdmacm.UDPAddr(netip.MustParseAddr("239.254.7.10"))
	id.ResolveAddr(lo, group, time.Second)
	fmt.Println(id.ResolveRoute(time.Second), id.Event().Event)
	fmt.Println(errors.Is(id.JoinMulticast(group, nil), syscall.EINVAL))
	// Output:
	// <nil> RDMA_CM_EVENT_ROUTE_RESOLVED
	// true
}
