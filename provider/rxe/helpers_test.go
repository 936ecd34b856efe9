package rxe

import (
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// delivery is one datagram handed to a fakeRx.
type delivery struct {
	grh     [verbs.GRHLen]byte
	payload []byte
	srcQP   uint32
	imm     uint32
	hasImm  bool
}

// fakeRx is a softverbs.Receiver that records deliveries. With noWR set it
// answers NoRecvWR; with bufLen > 0 it answers TooLong when 40 + payload
// exceeds bufLen, like a posted receive of that size.
type fakeRx struct {
	ch     chan delivery
	noWR   atomic.Bool
	bufLen atomic.Int64
}

func newFakeRx() *fakeRx { return &fakeRx{ch: make(chan delivery, 4096)} }

func (f *fakeRx) Deliver(grh *[verbs.GRHLen]byte, payload []byte, srcQP uint32, imm uint32, hasImm bool) softverbs.DeliverResult {
	if f.noWR.Load() {
		return softverbs.NoRecvWR
	}
	if n := f.bufLen.Load(); n > 0 && int64(verbs.GRHLen+len(payload)) > n {
		return softverbs.TooLong
	}
	d := delivery{grh: *grh, payload: append([]byte(nil), payload...), srcQP: srcQP, imm: imm, hasImm: hasImm}
	select {
	case f.ch <- d:
	default:
	}
	return softverbs.Delivered
}

// wait returns the next delivery or fails after a timeout.
func (f *fakeRx) wait(t *testing.T) delivery {
	t.Helper()
	select {
	case d := <-f.ch:
		return d
	case <-time.After(5 * time.Second):
		t.Fatal("timeout waiting for a delivery")
		return delivery{}
	}
}

// none checks that nothing is delivered for a short while.
func (f *fakeRx) none(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case d := <-f.ch:
		t.Fatalf("unexpected delivery: srcQP %#x payload %q", d.srcQP, d.payload)
	case <-time.After(within):
	}
}

// loDev returns a fresh device on lo, closed at the end of the test.
func loDev(t *testing.T) *Device {
	t.Helper()
	return loDevOpts(t, Options{})
}

func loDevOpts(t *testing.T, o Options) *Device {
	t.Helper()
	if d := existing("lo"); d != nil {
		d.Close()
	}
	ifi, err := ForName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if o != (Options{}) {
		if err := ifi.SetLimits(o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { ifi.Close() })
	return ifi
}

func existing(name string) *Device {
	for _, d := range Devices() {
		if d.Name() == "rxe_"+name {
			return d
		}
	}
	return nil
}

// randGroup returns a random IPv4 group in 239.0.0.0/8 (administratively
// scoped), so concurrent tests of other packages do not collide.
func randGroup() netip.Addr {
	return netip.AddrFrom4([4]byte{239, byte(1 + rand.IntN(254)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))})
}

// newQP creates a UD QP in RTS with the given Q_Key.
func newQP(t *testing.T, d *Device, rx softverbs.Receiver, flags verbs.CreateFlags, qkey uint32) softverbs.DriverQP {
	t.Helper()
	q, err := d.CreateQP(rx, softverbs.DriverQPInit{Type: verbs.QPTypeUD, CreateFlags: flags})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Destroy() })
	for _, st := range []verbs.QPState{verbs.QPSInit, verbs.QPSRTR, verbs.QPSRTS} {
		attr := verbs.QPAttr{State: st, QKey: qkey, PortNum: 1}
		mask := verbs.QPAttrState
		if st == verbs.QPSInit {
			mask |= verbs.QPAttrQKey | verbs.QPAttrPort | verbs.QPAttrPKeyIdx
		}
		if err := q.Modify(&attr, mask); err != nil {
			t.Fatal(err)
		}
	}
	return q
}

// mcastAH is the AH the RDMA CM builds for a RoCEv2 IPv4 group.
func mcastAH(group netip.Addr) *verbs.AHAttr {
	return &verbs.AHAttr{
		IsGlobal: true,
		PortNum:  1,
		GRH:      verbs.GlobalRoute{DGID: wire.RoCEv2MGID(group), SGIDIndex: 0, HopLimit: 64},
	}
}

func mgid(group netip.Addr) verbs.GID { return wire.RoCEv2MGID(group) }

// eventually polls cond until it holds or fails after a timeout.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timeout: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// receiveGoroutines counts the package's receive goroutines.
func receiveGoroutines() int {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	return strings.Count(string(buf[:n]), "rxe.(*Device).receiveLoop(")
}

// igmpHas reports whether /proc/net/igmp lists group on interface ifname.
func igmpHas(t *testing.T, ifname string, group netip.Addr) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/net/igmp")
	if err != nil {
		t.Skipf("no /proc/net/igmp: %v", err)
	}
	a := group.As4()
	// The kernel prints the __be32 group with %08X: host byte order.
	want := strings.ToUpper(hex32(uint32(a[0]) | uint32(a[1])<<8 | uint32(a[2])<<16 | uint32(a[3])<<24))
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if line[0] != '\t' && line[0] != ' ' { // "Idx Device : Count ..." line
			in = len(f) >= 2 && f[1] == ifname
			continue
		}
		if in && f[0] == want {
			return true
		}
	}
	return false
}

func hex32(v uint32) string {
	const digits = "0123456789ABCDEF"
	var b [8]byte
	for i := 7; i >= 0; i-- {
		b[i] = digits[v&0xF]
		v >>= 4
	}
	return string(b[:])
}

func isErrno(err error, e syscall.Errno) bool { return errors.Is(err, e) }

// netInterfaces returns the names of the interfaces that are up.
func netInterfaces() ([]string, error) {
	ifs, err := net.Interfaces()
	var out []string
	for _, i := range ifs {
		if i.Flags&net.FlagUp != 0 {
			out = append(out, i.Name)
		}
	}
	return out, err
}
