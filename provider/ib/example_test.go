package ib_test

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/rdmacm/saclient"
)

// Example starts a subnet manager in the process, attaches a port to it
// and shows what the port learned at activation, and what the host's SA
// client (imported by rdmacm, here directly) learned from the SA.
func Example() {
	s, err := sm.New(sm.Config{Listen: "127.0.0.1:0", SendOnlySupport: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	port, err := ib.Open(ib.Config{SM: s.FabricAddr().String(), Local: netip.MustParseAddr("127.0.3.1")})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer port.Close()
	pa, _ := port.QueryPort(1)
	sa, _ := saclient.For(port.Verbs())
	bc, _ := sa.BroadcastGroup()
	fmt.Printf("LID %d, SM LID %d, %v, %v\n", port.LID(), pa.SMLID, pa.State, pa.LinkLayer)
	fmt.Printf("IPoIB broadcast group %v MLID %#x Q_Key %#x\n", bc.MGID, bc.MLID, bc.QKey)
	fmt.Println("send-only full member support:", sa.SendOnlyFullMemberSupported())
	// Output:
	// LID 2, SM LID 1, PORT_ACTIVE, InfiniBand
	// IPoIB broadcast group ff12:401b:ffff::ffff:ffff MLID 0xc000 Q_Key 0xb1b
	// send-only full member support: true
}
