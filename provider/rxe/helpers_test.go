package rxe

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

func TestMain(m *testing.M) {
	if os.Getenv(otherUserEnv) != "" {
		os.Exit(otherUserChild(os.Args[1:]))
	}
	testenv.OwnNetns() // lo to this package alone
	testenv.ClearSoftRDMA()
	goleak.VerifyTestMain(m)
}

// delivery is one datagram received by a test QP.
type delivery struct {
	grh     [verbs.GRHLen]byte
	payload []byte
	srcQP   uint32
	imm     uint32
	hasImm  bool
}

// fakeRx is the receive side of a test QP: a goroutine keeps receive WRs
// posted on the QP and records every completion in ch. bufLen sets the
// size of the receive buffers (0: large enough for any datagram); with
// noWR nothing is posted, so datagrams find no receive WR.
type fakeRx struct {
	ch     chan delivery
	bufLen int
	noWR   bool
}

func newFakeRx() *fakeRx { return &fakeRx{ch: make(chan delivery, 4096)} }

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

// tqp is a UD QP of the device under test, made through the verbs core
// like any QP; drv is its transport side (what this package implements).
type tqp struct {
	t   *testing.T
	qp  *verbs.QP
	drv softverbs.DriverQP
	pd  *verbs.PD
	scq *verbs.CQ
}

func (q *tqp) QPN() uint32                                 { return q.qp.Num() }
func (q *tqp) AttachMcast(gid verbs.GID, lid uint16) error { return q.qp.AttachMcast(gid, lid) }
func (q *tqp) DetachMcast(gid verbs.GID, lid uint16) error { return q.qp.DetachMcast(gid, lid) }
func (q *tqp) Modify(a *verbs.QPAttr, m verbs.QPAttrMask) error {
	return q.qp.Modify(a, m)
}
func (q *tqp) Destroy() error { return q.qp.Destroy() }

// Send posts one signaled send through the verbs core and returns the
// error of its creation or completion (a failed completion's errno).
func (q *tqp) Send(s *softverbs.UDSend) error {
	q.t.Helper()
	if s.AH == nil {
		return syscall.EINVAL
	}
	ah, err := q.pd.CreateAH(s.AH)
	if err != nil {
		return err
	}
	defer ah.Destroy()
	wr := &verbs.SendWR{Opcode: verbs.WRSend, Flags: verbs.SendSignaled, ImmData: s.Imm,
		UD: verbs.UDWR{AH: ah, RemoteQPN: s.RemoteQPN, RemoteQKey: s.RemoteQKey}}
	if s.HasImm {
		wr.Opcode = verbs.WRSendWithImm
	}
	if s.Solicited {
		wr.Flags |= verbs.SendSolicited
	}
	if len(s.Payload) > 0 {
		mr, err := q.pd.RegMR(append([]byte(nil), s.Payload...), 0)
		if err != nil {
			return err
		}
		defer mr.Dereg()
		wr.SGList = []verbs.SGE{mr.SGE(0, mr.Len())}
	}
	if err := q.qp.PostSend(wr); err != nil {
		return err
	}
	var wc [1]verbs.WC
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		n, err := q.scq.Poll(wc[:])
		if err != nil {
			return err
		}
		if n == 1 {
			break
		}
		if err := q.scq.Wait(ctx); err != nil {
			q.t.Fatalf("send completion: %v", err)
		}
	}
	if wc[0].Status != verbs.WCSuccess {
		return fmt.Errorf("send completion %v: %w", wc[0].Status, syscall.Errno(wc[0].VendorErr))
	}
	return nil
}

// qpObjects are a test QP in RTS and the objects under it.
type qpObjects struct {
	ctx      *verbs.Context
	pd       *verbs.PD
	scq, rcq *verbs.CQ
	qp       *verbs.QP
}

// rtsQP creates a UD QP in RTS with the given Q_Key on d, with a receive
// CQ of rcqe entries; close releases everything.
func rtsQP(tb testing.TB, d *Device, flags verbs.CreateFlags, qkey uint32, rcqe int) *qpObjects {
	tb.Helper()
	o := &qpObjects{}
	var err error
	if o.ctx, err = d.Verbs().Open(); err != nil {
		tb.Fatal(err)
	}
	if o.pd, err = o.ctx.AllocPD(); err != nil {
		tb.Fatal(err)
	}
	if o.scq, err = o.ctx.CreateCQ(16); err != nil {
		tb.Fatal(err)
	}
	if o.rcq, err = o.ctx.CreateCQ(rcqe); err != nil {
		tb.Fatal(err)
	}
	o.qp, err = o.pd.CreateQP(&verbs.QPInitAttr{SendCQ: o.scq, RecvCQ: o.rcq, QPType: verbs.QPTypeUD, CreateFlags: flags,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 64}})
	if err != nil {
		tb.Fatal(err)
	}
	for _, st := range []verbs.QPState{verbs.QPSInit, verbs.QPSRTR, verbs.QPSRTS} {
		attr := verbs.QPAttr{State: st, QKey: qkey, PortNum: 1}
		mask := verbs.QPAttrState
		if st == verbs.QPSInit {
			mask |= verbs.QPAttrQKey | verbs.QPAttrPort | verbs.QPAttrPKeyIdx
		}
		if st == verbs.QPSRTS {
			mask |= verbs.QPAttrSQPSN
		}
		if err := o.qp.Modify(&attr, mask); err != nil {
			tb.Fatal(err)
		}
	}
	return o
}

// close destroys the QP and the objects under it.
func (o *qpObjects) close() {
	o.qp.Destroy()
	o.scq.Destroy()
	o.rcq.Destroy()
	o.pd.Dealloc()
	o.ctx.Close()
}

// newQP creates a UD QP in RTS with the given Q_Key on d, whose received
// datagrams go to rx.
func newQP(t *testing.T, d *Device, rx *fakeRx, flags verbs.CreateFlags, qkey uint32) *tqp {
	t.Helper()
	o := rtsQP(t, d, flags, qkey, 4096)
	qp, pd, rcq := o.qp, o.pd, o.rcq
	q := &tqp{t: t, qp: qp, pd: pd, scq: o.scq, drv: transportQP(t, d, qp.Num())}
	size := rx.bufLen
	if size == 0 {
		size = verbs.GRHLen + 9000
	}
	mr, err := pd.RegMR(make([]byte, 64*size), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	post := func(slot int) {
		qp.PostRecv(&verbs.RecvWR{WRID: uint64(slot), SGList: []verbs.SGE{mr.SGE(slot*size, size)}})
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	if !rx.noWR {
		for i := range 64 {
			post(i)
		}
	}
	go func() {
		defer close(done)
		c, cancel := context.WithCancel(context.Background())
		go func() { <-stop; cancel() }()
		var wc [16]verbs.WC
		for {
			n, err := rcq.Poll(wc[:])
			if err != nil {
				return
			}
			for _, w := range wc[:n] {
				if w.Status != verbs.WCSuccess {
					continue
				}
				b := mr.Buf()[int(w.WRID)*size : int(w.WRID)*size+int(w.ByteLen)]
				dl := delivery{srcQP: w.SrcQP, imm: w.ImmData, hasImm: w.Flags&verbs.WCWithImm != 0,
					payload: append([]byte(nil), b[verbs.GRHLen:]...)}
				copy(dl.grh[:], b)
				select {
				case rx.ch <- dl:
				default:
				}
				post(int(w.WRID))
			}
			if n == 0 && rcq.Wait(c) != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
		o.qp.Destroy()
		mr.Dereg()
		o.close()
	})
	return q
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

// mcastAH is the AH the RDMA CM builds for a RoCEv2 IPv4 group.
func mcastAH(group netip.Addr) *verbs.AHAttr {
	return &verbs.AHAttr{
		IsGlobal: true,
		PortNum:  1,
		GRH:      verbs.GlobalRoute{DGID: wire.RoCEv2MGID(group), SGIDIndex: 0, HopLimit: 64},
	}
}

func mgid(group netip.Addr) verbs.GID { return wire.RoCEv2MGID(group) }

// putOrigDst writes the IP_ORIGDSTADDR control message of a datagram to
// dst:4791 into b, as the kernel hands it to the device's IPv4 sockets, and
// returns its length.
func putOrigDst(b []byte, dst netip.Addr) int {
	var sa [unix.SizeofSockaddrInet4]byte
	binary.NativeEndian.PutUint16(sa[0:], unix.AF_INET)
	binary.BigEndian.PutUint16(sa[2:], wire.UDPPort)
	a := dst.As4()
	copy(sa[4:], a[:])
	return putCmsg(b, unix.IPPROTO_IP, unix.IP_ORIGDSTADDR, sa[:])
}

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
		testenv.Require(t, "no /proc/net/igmp: %v", err)
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

// igmpState reports whether the interface's IPv4 membership of group
// reaches the wanted state (present or not) within 2 s. One read of
// /proc/net/igmp is not a snapshot: while other processes join and leave
// groups, the kernel's record-by-record listing can skip an entry, so a
// check reads again until it sees what it waits for.
func igmpState(t *testing.T, ifname string, group netip.Addr, present bool) bool {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		if igmpHas(t, ifname, group) == present {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
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

// manualQP is a test QP without a receive goroutine, for the receive path
// driven by hand: recycle polls one completion and posts its WR again.
type manualQP struct {
	qp   *verbs.QP
	rcq  *verbs.CQ
	mr   *verbs.MR
	size int
	wrs  []verbs.RecvWR
	sges []verbs.SGE
	wc   [1]verbs.WC
	n    int // completions seen
}

// newManualQP creates a UD QP in RTS on d with 64 posted receive WRs.
func newManualQP(tb testing.TB, d *Device, flags verbs.CreateFlags, qkey uint32) *manualQP {
	tb.Helper()
	o := rtsQP(tb, d, flags, qkey, 256)
	qp, pd, rcq := o.qp, o.pd, o.rcq
	const size = verbs.GRHLen + 4096
	mr, err := pd.RegMR(make([]byte, 64*size), verbs.AccessLocalWrite)
	if err != nil {
		tb.Fatal(err)
	}
	m := &manualQP{qp: qp, rcq: rcq, mr: mr, size: size, wrs: make([]verbs.RecvWR, 64), sges: make([]verbs.SGE, 64)}
	for i := range m.wrs {
		m.sges[i] = mr.SGE(i*size, size)
		m.wrs[i] = verbs.RecvWR{WRID: uint64(i), SGList: m.sges[i : i+1]}
		if err := qp.PostRecv(&m.wrs[i]); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(func() {
		qp.Destroy()
		mr.Dereg()
		o.close()
	})
	return m
}

// recycle takes one completion, if any, and posts its WR again.
func (m *manualQP) recycle() {
	if n, _ := m.rcq.Poll(m.wc[:]); n == 1 {
		m.n++
		m.qp.PostRecv(&m.wrs[m.wc[0].WRID])
	}
}

// transportQP returns the transport side of the device's QP qpn.
func transportQP(tb testing.TB, d *Device, qpn uint32) softverbs.DriverQP {
	tb.Helper()
	for _, info := range d.core.QPs() {
		if info.QPN == qpn {
			return info.Transport
		}
	}
	tb.Fatalf("no QP %#x", qpn)
	return nil
}

// receiveOne handles datagram b as the one datagram of a batch read by r.
func (r *receiver) receiveOne(b, name, oob []byte) {
	r.countReceived(1, uint64(len(b)))
	if r.blk != nil {
		r.handleForwarded(b, false)
		return
	}
	r.handle(b, name, oob, false)
}

// recvFixture is a device's receive path fed by hand: a QP with 64 posted
// receive WRs attached to a group (Q_Key 9), the receiver of the group's
// socket, and one datagram to the group with the source address and
// control messages recvmmsg would give it.
type recvFixture struct {
	g                netip.Addr
	q                *manualQP
	r                *receiver
	frame, name, oob []byte
}

// newRecvFixture sets up a recvFixture on d with a payload of size bytes.
func newRecvFixture(tb testing.TB, d *Device, size int) *recvFixture {
	tb.Helper()
	f := &recvFixture{g: randGroup(), q: newManualQP(tb, d, 0, 9)}
	if err := f.q.qp.AttachMcast(mgid(f.g), 0); err != nil {
		tb.Fatal(err)
	}
	in := &injector{port: 40001}
	f.frame = in.craft(f.g, wire.UDHeader{PKey: 0xFFFF, DestQP: wire.MulticastQPN, QKey: 9, SrcQP: 77}, make([]byte, size), nil)
	d.mu.Lock()
	s := d.mships[f.g].sock
	d.mu.Unlock()
	f.r = newReceiver(d, s, nil)
	f.name = make([]byte, 16)
	f.name[0], f.name[2], f.name[3] = unix.AF_INET, 40001>>8, 40001&0xff
	copy(f.name[4:], []byte{127, 0, 0, 1})
	oob := make([]byte, 128)
	k := putOrigDst(oob, f.g)
	k += putCmsgInt(oob[k:], unix.IPPROTO_IP, unix.IP_TTL, 1)
	k += putCmsgInt(oob[k:], unix.IPPROTO_IP, unix.IP_TOS, 0)
	f.oob = oob[:k]
	return f
}
