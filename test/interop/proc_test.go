package interop

import (
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/nettest"
)

// procMaxRun is how long a process of a case may run at the most.
const procMaxRun = 150 * time.Second

// mckey starts softrdma's mckey in the softrdma namespace h0. It runs in
// its own process group, is killed after 150 s at the latest, and is killed
// (and its output logged) when the test ends.
func (l *lab) mckey(t *testing.T, args ...string) *nettest.Proc {
	t.Helper()
	return startProc(t, l.h0, mckeyBin, args...)
}

// grhpeer starts the grhpeer helper in h0.
func (l *lab) grhpeer(t *testing.T, args ...string) *nettest.Proc {
	t.Helper()
	return startProc(t, l.h0, grhpeerBin, args...)
}

// startProc starts bin with args in namespace ns (see nettest.StartProc).
func startProc(t *testing.T, ns, bin string, args ...string) *nettest.Proc {
	t.Helper()
	return nettest.StartProc(t, ns, bin, procMaxRun, args...)
}
