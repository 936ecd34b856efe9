package mcast_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/softrdma/softrdma/mcast"
	// The kinds of device the example runs on.
	_ "github.com/softrdma/softrdma/provider/all"
)

// Example: two members of a group on loopback; one sends three messages,
// the other receives them, in order.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	group := netip.MustParseAddr("239.254.9.9")
	opts := &mcast.Options{Local: netip.MustParseAddr("127.0.0.1")}

	rcv, err := mcast.Join(ctx, group, opts)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rcv.Close()
	snd, err := mcast.Join(ctx, group, opts)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer snd.Close()

	snd.WaitReceivers(ctx, 1) // rcv receives the stream from its start
	for _, m := range []string{"one", "two", "three"} {
		snd.Send(ctx, []byte(m))
	}
	buf := make([]byte, 64<<10)
	for range 3 {
		n, from, err := rcv.Receive(ctx, buf)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(string(buf[:n]), from.QPN == snd.LocalAddr().(*mcast.Addr).QPN)
	}
	// Output:
	// one true
	// two true
	// three true
}
