package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
)

// mckeyPair is one run of Debian's mckey as receiver and sender through
// softrdma exec: their arguments, the environment (SOFTRDMA_SM) and the
// network namespaces ("" for the test's own) each runs in.
type mckeyPair struct {
	recv, send     []string
	env            []string
	recvNS, sendNS string
	// joins is how many "joined" lines the receiver prints before the
	// sender starts (one per connection, -c).
	joins int
	// joined, when set, must match a line of each output.
	joined *regexp.Regexp
}

// run starts the receiver, waits until it joined, runs the sender and
// checks that both got through their transfers.
func (p mckeyPair) run(t *testing.T, dir string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mckey := []string{"stdbuf", "-oL", "mckey"}
	recv, rout := startExecNS(t, ctx, dir, p.recvNS, p.env, append(mckey, p.recv...)...)
	if !rout.waitN("mckey: joined dgid:", max(p.joins, 1)) {
		recv.Wait()
		t.Fatalf("the receiver did not join:\n%s", rout)
	}
	send, sout := startExecNS(t, ctx, dir, p.sendNS, p.env, append(mckey, p.send...)...)
	serr := send.Wait()
	sout.wait("\x00") // the whole output
	rerr := recv.Wait()
	rout.wait("\x00")
	t.Logf("receiver %q:\n%s\nsender %q:\n%s", p.recv, rout, p.send, sout)
	if serr != nil || rerr != nil {
		t.Fatalf("sender: %v, receiver: %v", serr, rerr)
	}
	if p.joined != nil {
		for _, o := range []*lineWaiter{rout, sout} {
			if !p.joined.MatchString(o.String()) {
				t.Errorf("no line matching %q", p.joined)
			}
		}
	}
	checkMckeyRun(t, rout.String(), sout.String())
}

// TestExecMckeyOptions runs Debian's unmodified mckey through softrdma
// exec with every option of its usage besides those TestExecMckey and
// TestExecMckeyIB use (-m -b -s -C -S): on RoCEv2 over lo -c (three
// connections, three joins each side), -o (a send-only full member
// sender) and -l (both sides' QPs block their own multicast loopback);
// across a veth pair between two network namespaces (a host each); on
// the emulated IB subnet -p 0x2 (RDMA_PS_IPOIB: the group's Q_Key is the
// IPoIB broadcast group's) and -M (an unmapped AF_IB MGID).
func TestExecMckeyOptions(t *testing.T) {
	requireRDMACore(t, "mckey", "stdbuf")
	dir := execDir(t)
	if !testenv.InNetns(t) {
		return
	}
	if out, err := exec.Command("ip", "route", "add", "224.0.0.0/4", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("ip route add 224.0.0.0/4 dev lo: %v\n%s", err, out)
	}
	lo := []string{"-b", "127.0.0.1", "-C", "10", "-S", "64"}
	opts := func(group string, extra ...string) []string {
		return append(append([]string{"-m", group}, lo...), extra...)
	}
	t.Run("connections", func(t *testing.T) {
		mckeyPair{recv: opts("239.23.1.1", "-c", "3"), send: opts("239.23.1.1", "-c", "3", "-s"), joins: 3}.run(t, dir)
	})
	t.Run("send-only", func(t *testing.T) {
		mckeyPair{recv: opts("239.23.1.2"), send: opts("239.23.1.2", "-s", "-o")}.run(t, dir)
	})
	t.Run("no-loopback", func(t *testing.T) {
		mckeyPair{recv: opts("239.23.1.3", "-l"), send: opts("239.23.1.3", "-s", "-l")}.run(t, dir)
	})
	t.Run("veth", func(t *testing.T) { mckeyAcrossVeth(t, dir) })
	smEnv := []string{startSM(t)}
	t.Run("ipoib", func(t *testing.T) {
		ib := func(bind string, extra ...string) []string {
			return append([]string{"-m", "230.23.1.4", "-b", bind, "-C", "10", "-S", "64", "-p", "0x2"}, extra...)
		}
		// The IPoIB MGID of 230.23.1.4 (signature 0x401b, not RDMA_PS_UDP's
		// 0x4001), and the broadcast group's Q_Key 0xb1b.
		joined := regexp.MustCompile(`mckey: joined dgid: ff12:401b:ffff::617:104 mlid 0xc0[0-9a-f]{2} sl 0`)
		mckeyPair{recv: ib("127.0.3.11"), send: ib("127.0.3.12", "-s"), env: smEnv, joined: joined}.run(t, dir)
	})
	t.Run("unmapped", func(t *testing.T) {
		// An MGID of RDMA_PS_UDP's form (signature 0x4001): an IPoIB one
		// (0x401b) would need the broadcast group's Q_Key, which a
		// RDMA_PS_UDP id does not ask for (the SA refuses: -EINVAL).
		const mgid = "ff12:4001:ffff::601:204"
		un := func(bind string, extra ...string) []string {
			return append([]string{"-M", mgid, "-b", bind, "-C", "10", "-S", "64"}, extra...)
		}
		joined := regexp.MustCompile(`mckey: joined dgid: ` + regexp.QuoteMeta(mgid) + ` mlid 0xc0[0-9a-f]{2} sl 0`)
		mckeyPair{recv: un("127.0.3.13"), send: un("127.0.3.14", "-s"), env: smEnv, joined: joined}.run(t, dir)
	})
}

// The veth pair's ends: srmka (vethA) in the first namespace, srmkb
// (vethB) in the second.
const vethA, vethB = "10.23.7.1", "10.23.7.2"

// vethPair makes two network namespaces joined by a veth pair (srmka
// vethA/24, srmkb vethB/24, both up and running), deleted when the test
// ends, and returns their names; prefix tells them apart from other
// tests'.
func vethPair(t *testing.T, prefix string) (nsA, nsB string) {
	t.Helper()
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	suffix := fmt.Sprint(os.Getpid())
	nsA, nsB = prefix+"-a-"+suffix, prefix+"-b-"+suffix
	for _, ns := range []string{nsA, nsB} {
		ip("netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		ip("-n", ns, "link", "set", "lo", "up")
	}
	ip("link", "add", "srmka", "netns", nsA, "type", "veth", "peer", "name", "srmkb", "netns", nsB)
	for _, e := range []struct{ ns, dev, addr string }{{nsA, "srmka", vethA + "/24"}, {nsB, "srmkb", vethB + "/24"}} {
		ip("-n", e.ns, "addr", "add", e.addr, "dev", e.dev)
		ip("-n", e.ns, "link", "set", e.dev, "up")
	}
	// A veth end is PORT_ACTIVE once the kernel saw both ends up (its
	// operstate UP, after the link watch's delay); a join before fails.
	for _, e := range []struct{ ns, dev string }{{nsA, "srmka"}, {nsB, "srmkb"}} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			out, err := exec.Command("ip", "-n", e.ns, "-o", "link", "show", "dev", e.dev).CombinedOutput()
			if err == nil && strings.Contains(string(out), "state UP") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s in %s not up: %v %s", e.dev, e.ns, err, out)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nsA, nsB
}

// mckeyAcrossVeth runs mckey's receiver and sender in two network
// namespaces joined by a veth pair, each on the RoCEv2 device of its end.
func mckeyAcrossVeth(t *testing.T, dir string) {
	nsA, nsB := vethPair(t, "srmk")
	args := func(bind string, extra ...string) []string {
		return append([]string{"-m", "239.23.1.5", "-b", bind, "-C", "10", "-S", "64"}, extra...)
	}
	mckeyPair{recv: args(vethB), send: args(vethA, "-s"), recvNS: nsB, sendNS: nsA}.run(t, dir)
}

// waitN returns true once n lines containing s were read, false if the
// output ended before.
func (w *lineWaiter) waitN(s string, n int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		seen := 0
		for _, l := range w.lines {
			if strings.Contains(l, s) {
				seen++
			}
		}
		if seen >= n {
			return true
		}
		if w.done {
			return false
		}
		w.cond.Wait()
	}
}
