package pyverbs

import (
	"testing"

	"github.com/softrdma/softrdma/test/testenv"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	testenv.ClearSoftRDMA()
	goleak.VerifyTestMain(m)
}
