// Package noprovider tests what a program that imports no kind of device
// is told: it is the one test binary of the module that links no
// provider.
package noprovider

import (
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/softrdma/softrdma/rdmacm"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestNoProviderNamed: binding an address without a provider imported
// fails as an address no device owns (EADDRNOTAVAIL) and says why, with
// the import line that fixes it.
func TestNoProviderNamed(t *testing.T) {
	id, err := rdmacm.CreateID(nil, nil, rdmacm.PS_UDP)
	if err != nil {
		t.Fatal(err)
	}
	defer id.Destroy()
	err = id.BindAddr(rdmacm.UDPAddr(netip.MustParseAddr("127.0.0.1")))
	if !errors.Is(err, syscall.EADDRNOTAVAIL) || !strings.Contains(err.Error(), `imports no kind of device (import _ "github.com/softrdma/softrdma/provider/all")`) {
		t.Fatalf("BindAddr without a provider: %v; want EADDRNOTAVAIL naming the missing import", err)
	}
}
