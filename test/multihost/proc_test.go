package multihost

import (
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/nettest"
)

// procMaxRun is how long a process of a test may run at the most.
const procMaxRun = 90 * time.Second

// mckey starts mckey in host h with args. It runs in its own process group,
// is killed after 90 s at the latest, and is killed (and its output logged)
// when the test ends.
func (tp *topo) mckey(h *host, args ...string) *nettest.Proc {
	tp.t.Helper()
	return startProc(tp.t, h.ns, mckeyBin, args...)
}

// startProc starts bin with args in namespace ns (see nettest.StartProc).
func startProc(t *testing.T, ns, bin string, args ...string) *nettest.Proc {
	t.Helper()
	return nettest.StartProc(t, ns, bin, procMaxRun, args...)
}
