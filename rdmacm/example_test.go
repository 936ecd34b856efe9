package rdmacm_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	// The kinds of device the example runs on.
	_ "github.com/softrdma/softrdma/provider/all"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
)

// Example joins a multicast group on loopback as a full member, sends one
// datagram to it and receives it on the same QP (multicast loopback).
func Example() {
	group := rdmacm.UDPAddr(netip.MustParseAddr("239.254.7.7"))
	src := rdmacm.UDPAddr(netip.MustParseAddr("127.0.0.1"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	ch, _ := rdmacm.CreateEventChannel()
	defer ch.Close()
	id, _ := rdmacm.CreateID(ch, nil, rdmacm.PS_UDP)
	defer id.Destroy()

	id.ResolveAddr(src, group, 2*time.Second)
	ev, _ := ch.GetEvent(ctx)
	fmt.Println(ev.Event)
	ev.Ack()

	id.CreateQP(nil, &verbs.QPInitAttr{Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	defer id.DestroyQP()
	buf := make([]byte, verbs.GRHLen+5)
	mr, _ := id.RegMsgs(buf)
	defer mr.Dereg()
	id.PostRecv(1, mr, 0, len(buf))

	id.JoinMulticastEx(&rdmacm.JoinMCAttrEx{
		CompMask:  rdmacm.JoinMCAttrAddress | rdmacm.JoinMCAttrJoinFlags,
		JoinFlags: rdmacm.MCJoinFlagFullMember,
		Addr:      group,
	}, "my join")
	ev, _ = ch.GetEvent(ctx)
	p := ev.Param
	fmt.Println(ev.Event, p.PrivateData, p.AHAttr.GRH.DGID)
	fmt.Printf("qpn %#x qkey %#x\n", p.QPNum, p.QKey)
	ah, _ := id.PD().CreateAH(&p.AHAttr)
	defer ah.Destroy()
	ev.Ack()

	msg := make([]byte, 5)
	copy(msg, "hello")
	smr, _ := id.RegMsgs(msg)
	defer smr.Dereg()
	id.PostUDSend(2, smr, 0, len(msg), verbs.SendSignaled, ah, rdmacm.MulticastQPN)
	id.GetSendComp(ctx)
	wc, _ := id.GetRecvComp(ctx)
	fmt.Printf("received %q, byte_len %d\n", buf[verbs.GRHLen:wc.ByteLen], wc.ByteLen)

	fmt.Println(id.LeaveMulticast(group))
	// Output:
	// RDMA_CM_EVENT_ADDR_RESOLVED
	// RDMA_CM_EVENT_MULTICAST_JOIN my join ::ffff:239.254.7.7
	// qpn 0xffffff qkey 0x1234567
	// received "hello", byte_len 45
	// <nil>
}
