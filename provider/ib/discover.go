package ib

import (
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// EnvPorts names the IPoIB addresses of the InfiniBand ports a process
// opens for its device list (ibv_get_device_list), comma-separated, on the
// subnet SOFTRDMA_SM names: "127.0.3.1" gives softib0 at that address. A
// program that only uses verbs (ibv_devinfo, perftest) finds its ports
// this way; the RDMA CM opens the port of the address an id binds without
// it.
const EnvPorts = "SOFTRDMA_IB_PORTS"

// discoverer opens the ports EnvPorts names for a host's device list.
type discoverer struct{}

// Discover opens, once per host, a port for each address of EnvPorts on
// the subnet of SOFTRDMA_SM (driver.Provider). A port that cannot be opened
// is reported on stderr once and left out; a bad address too.
func (discoverer) Discover(h driver.Host) {
	list := os.Getenv(EnvPorts)
	if list == "" || os.Getenv("SOFTRDMA_SM") == "" {
		return
	}
	r := On(h.(*verbs.Host))
	r.env.Lock()
	tried := r.tried
	r.tried = true
	r.env.Unlock()
	if tried {
		return
	}
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		a, err := netip.ParseAddr(s)
		if err == nil {
			_, err = r.OpenFromEnv(a)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "softrdma: %s=%s: port %q: %v\n", EnvPorts, list, s, err)
		}
	}
}

func init() { driver.Register("ib", discoverer{}) }
