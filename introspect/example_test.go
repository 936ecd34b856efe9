package introspect_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/softrdma/softrdma/introspect"
	"github.com/softrdma/softrdma/provider/rxe"
)

// Example turns the endpoint on (on a Unix socket; it is off unless a
// program asks), reads it as `softrdma devices` does, and scrapes its
// Prometheus metrics.
func Example() {
	dir, _ := os.MkdirTemp("", "introspect-example-")
	defer os.RemoveAll(dir)
	srv, err := introspect.Start("unix:" + filepath.Join(dir, "softrdma.sock"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()

	// A device appears when an id binds an address of its interface;
	// here we open the loopback device directly.
	if _, err := rxe.ForName("lo"); err != nil {
		fmt.Println(err)
		return
	}

	c, err := introspect.Dial(srv.Addr())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	s, err := c.Snapshot(context.Background())
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range s.Devices {
		if d.Name == "rxe_lo" {
			p := d.Ports[0]
			fmt.Println(d.Name, p.State, p.ActiveMTU, p.GIDs[0].GID, p.GIDs[0].Type)
		}
	}
	m, _ := c.Metrics(context.Background())
	for _, line := range strings.Split(string(m), "\n") {
		if strings.HasPrefix(line, `softrdma_port_state{device="rxe_lo"}`) {
			fmt.Println(line)
		}
	}
	// Output:
	// rxe_lo PORT_ACTIVE 4096 ::ffff:127.0.0.1 RoCE v2
	// softrdma_port_state{device="rxe_lo"} 4
}
