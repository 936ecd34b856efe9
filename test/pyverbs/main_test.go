package pyverbs

import (
	"testing"

	"github.com/softrdma/softrdma/test/testenv"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	testenv.OwnNetns() // lo to this package alone
	testenv.ClearSoftRDMA()
	goleak.VerifyTestMain(m)
}
