package verbs_test

import (
	"fmt"
	"net/netip"

	"github.com/softrdma/softrdma/provider/rxe"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// Example opens the software RoCEv2 device of the loopback interface,
// brings a UD QP to RTS and attaches it to a multicast group, as a C
// program does with ibv_open_device … ibv_attach_mcast.
func Example() {
	dev, err := rxe.ForName("lo")
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, _ := dev.Verbs().Open()
	defer ctx.Close()
	port, _ := ctx.QueryPort(1)
	gid, _ := ctx.QueryGID(1, 0)
	fmt.Println(dev.Name(), port.State, port.LinkLayer, port.ActiveMTU.Bytes(), gid)

	pd, _ := ctx.AllocPD()
	defer pd.Dealloc()
	cq, _ := ctx.CreateCQ(16)
	defer cq.Destroy()
	qp, _ := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTypeUD,
		Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	defer qp.Destroy()
	qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, PortNum: 1, QKey: 0x01234567},
		verbs.QPAttrState|verbs.QPAttrPKeyIdx|verbs.QPAttrPort|verbs.QPAttrQKey)
	qp.Modify(&verbs.QPAttr{State: verbs.QPSRTR}, verbs.QPAttrState)
	qp.Modify(&verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState|verbs.QPAttrSQPSN)
	fmt.Println(qp.Type(), qp.State())

	mgid := wire.RoCEv2MGID(netip.MustParseAddr("239.254.8.8"))
	fmt.Println(qp.AttachMcast(mgid, 0), mgid)
	fmt.Println(qp.DetachMcast(mgid, 0))
	// Output:
	// rxe_lo PORT_ACTIVE Ethernet 4096 ::ffff:127.0.0.1
	// IBV_QPT_UD RTS
	// <nil> ::ffff:239.254.8.8
	// <nil>
}
