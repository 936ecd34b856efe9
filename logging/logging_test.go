package logging_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/logging"
	_ "github.com/softrdma/softrdma/provider/all"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "" {
		testenv.OwnNetns() // lo to this package alone
		testenv.ClearSoftRDMA()
		goleak.VerifyTestMain(m)
		return
	}
	os.Exit(m.Run())
}

// childEnv marks the process TestLogsWithoutIntrospect starts.
const childEnv = "SOFTRDMA_TEST_LOGGING_CHILD"

// TestLogsWithoutIntrospect: a program that uses rdmacm and nothing of
// introspect gets the logs SOFTRDMA_LOG asks for. The child joins a group
// on lo; its stderr has the JSON record of the join.
func TestLogsWithoutIntrospect(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		ch, err := rdmacm.CreateEventChannel()
		if err != nil {
			t.Fatal(err)
		}
		id, err := rdmacm.CreateID(ch, nil, rdmacm.PS_UDP)
		if err != nil {
			t.Fatal(err)
		}
		if err := id.BindAddr(rdmacm.UDPAddr(netip.MustParseAddr("127.0.0.1"))); err != nil {
			t.Fatal(err)
		}
		if err := id.JoinMulticast(rdmacm.UDPAddr(netip.MustParseAddr("239.77.1.2")), nil); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ev, err := ch.GetEvent(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ev.Ack()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestLogsWithoutIntrospect$", "-test.count=1")
	cmd.Env = testenv.CleanEnv(childEnv+"=1", logging.EnvLog+"=info,json")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if out, err := cmd.Output(); err != nil {
		t.Fatalf("child: %v\n%s\n%s", err, out, stderr.Bytes())
	}
	for _, line := range strings.Split(stderr.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "multicast join" && rec["group"] == "239.77.1.2" && rec["device"] == "rxe_lo" {
			return
		}
	}
	t.Errorf("no JSON record of the join in the child's stderr:\n%s", stderr.Bytes())
}

// TestBadSpecFailsChannels: a SOFTRDMA_LOG value that does not parse fails
// the event channels of the program with EINVAL and names the variable.
func TestBadSpecFailsChannels(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		_, err := rdmacm.CreateEventChannel()
		if !errors.Is(err, syscall.EINVAL) || !strings.Contains(fmt.Sprint(err), "SOFTRDMA_LOG=loud: level \"loud\"") {
			t.Fatalf("CreateEventChannel: %v, want EINVAL naming SOFTRDMA_LOG", err)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBadSpecFailsChannels$", "-test.count=1", "-test.v")
	cmd.Env = testenv.CleanEnv(childEnv+"=1", logging.EnvLog+"=loud")
	if out, err := cmd.CombinedOutput(); err != nil || !bytes.Contains(out, []byte("--- PASS")) {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

// TestUnknownVariableNamed: a program whose environment has a misspelled
// SOFTRDMA_ variable is told once on stderr, with the name it meant, when
// it first opens an event channel or lists the devices (both here).
func TestUnknownVariableNamed(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		ch, err := rdmacm.CreateEventChannel()
		if err != nil {
			t.Fatal(err)
		}
		ch.Close()
		verbs.DeviceList()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestUnknownVariableNamed$", "-test.count=1")
	cmd.Env = testenv.CleanEnv(childEnv+"=1", "SOFTRDMA_LGO=info")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if out, err := cmd.Output(); err != nil {
		t.Fatalf("child: %v\n%s\n%s", err, out, stderr.Bytes())
	}
	const want = "softrdma: ignoring unknown environment variable SOFTRDMA_LGO (did you mean SOFTRDMA_LOG?)\n"
	if n := strings.Count(stderr.String(), want); n != 1 {
		t.Errorf("the child's stderr has the warning %d times, want once:\n%s", n, stderr.Bytes())
	}
}
