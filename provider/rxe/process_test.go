package rxe

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
)

const childGroupEnv = "SOFTRDMA_TEST_RXE_CHILD_GROUP"

// TestTwoProcesses exchanges datagrams with a second process on lo: both
// bind UDP 4791 (SO_REUSEPORT), both receive the group, and their QPNs
// differ (derived from host-unique send ports).
func TestTwoProcesses(t *testing.T) {
	const qkey = 0x5EED
	if gs := os.Getenv(childGroupEnv); gs != "" {
		childProcess(t, netip.MustParseAddr(gs), qkey)
		return
	}
	d := loDev(t)
	g := randGroup()
	rx := newFakeRx()
	q := newQP(t, d, rx, 0, qkey)
	if err := q.AttachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestTwoProcesses$", "-test.count=1")
	cmd.Env = testenv.CleanEnv(childGroupEnv + "=" + g.String())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	expect := func(prefix string) string {
		t.Helper()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("child exited before %q", prefix)
				}
				if strings.HasPrefix(l, prefix) {
					return strings.TrimPrefix(l, prefix)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("timeout waiting for child %q", prefix)
			}
		}
	}
	var childQPN uint32
	fmt.Sscanf(expect("READY "), "%x", &childQPN)
	if childQPN == 0 || childQPN == q.QPN() || childQPN>>8 == q.QPN()>>8 {
		t.Errorf("child QPN %#x, ours %#x", childQPN, q.QPN())
	}
	if err := q.Send(&softverbs.UDSend{AH: mcastAH(g), RemoteQPN: verbs.MulticastQPN, RemoteQKey: qkey, Payload: []byte("ping")}); err != nil {
		t.Fatal(err)
	}
	if got := expect("GOT "); got != fmt.Sprintf("%x ping", q.QPN()) {
		t.Errorf("child got %q", got)
	}
	for {
		got := rx.wait(t)
		if string(got.payload) == "ping" { // our own, looped back
			continue
		}
		if string(got.payload) != "pong" || got.srcQP != childQPN {
			t.Errorf("from child: %+v", got)
		}
		break
	}
	for range lines {
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("child: %v", err)
	}
}

func childProcess(t *testing.T, g netip.Addr, qkey uint32) {
	d, err := ForName("lo")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	rx := newFakeRx()
	q := newQP(t, d, rx, 0, qkey)
	if err := q.AttachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("READY %x\n", q.QPN())
	got := rx.wait(t)
	fmt.Printf("GOT %x %s\n", got.srcQP, got.payload)
	if err := q.Send(&softverbs.UDSend{AH: mcastAH(g), RemoteQPN: verbs.MulticastQPN, RemoteQKey: qkey, Payload: []byte("pong")}); err != nil {
		t.Fatal(err)
	}
}
