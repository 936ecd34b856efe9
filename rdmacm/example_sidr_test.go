package rdmacm_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
)

// ExampleID_Connect connects two UD ids on loopback through the CM
// (SIDR): the listener gets CONNECT_REQUEST on a new id, which creates
// its QP and accepts; the active side gets ESTABLISHED with the remote QP
// number and Q_Key, and the answer's private data.
func ExampleID_Connect() {
	lo := netip.MustParseAddr("127.0.0.1")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	// The passive side: bind, listen.
	lch, _ := rdmacm.CreateEventChannel()
	defer lch.Close()
	listen, _ := rdmacm.CreateID(lch, nil, rdmacm.PS_UDP)
	defer listen.Destroy()
	listen.BindAddr(rdmacm.UDPAddr(lo))
	if err := listen.Listen(1); err != nil {
		fmt.Println(err)
		return
	}
	port := listen.SrcAddr().(*net.UDPAddr).Port

	// The active side: resolve address and route, create the QP, connect.
	ach, _ := rdmacm.CreateEventChannel()
	defer ach.Close()
	id, _ := rdmacm.CreateID(ach, nil, rdmacm.PS_UDP)
	defer id.Destroy()
	id.ResolveAddr(nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}, 2*time.Second)
	ev, _ := ach.GetEvent(ctx)
	ev.Ack()
	id.ResolveRoute(2 * time.Second)
	ev, _ = ach.GetEvent(ctx)
	ev.Ack()
	id.CreateQP(nil, &verbs.QPInitAttr{Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	defer id.DestroyQP()
	id.Connect(&rdmacm.ConnParam{PrivateData: []byte("hello")})

	// The request, on a new id.
	req, _ := lch.GetEvent(ctx)
	child := req.ID
	defer child.Destroy()
	fmt.Println(req.Event, string(req.Param.PrivateData.([]byte)[:5]))
	child.CreateQP(nil, &verbs.QPInitAttr{Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	defer child.DestroyQP()
	child.Accept(&rdmacm.ConnParam{PrivateData: []byte("welcome")})
	req.Ack()

	// The answer.
	est, _ := ach.GetEvent(ctx)
	fmt.Println(est.Event, est.Param.QPNum == child.QP().Num(), est.Param.QKey == rdmacm.UDPQKey,
		string(est.Param.PrivateData.([]byte)[:7]))
	est.Ack()
	// Output:
	// RDMA_CM_EVENT_CONNECT_REQUEST hello
	// RDMA_CM_EVENT_ESTABLISHED true true welcome
}
