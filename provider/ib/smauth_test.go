package ib_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/logging"
	"github.com/softrdma/softrdma/provider/ib"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
)

// The attack these tests play: while softsm is down (stopped, restarting,
// killed), a process of another user binds the SM's address and answers
// the ports' attaches with port_info, to get their SA MADs and multicast
// payloads. A port must trust an SM it can authenticate, not an address.

// fakeSMEnv makes the test binary a fake SM (fakeSMChild) instead of
// running tests.
const fakeSMEnv = "SOFTRDMA_TEST_IB_FAKE_SM"

// nobody is the uid and gid of the other user.
const nobody = 65534

// reportMarker is the datagram that asks fakeSMChild for its report: it
// arrives after every datagram sent to the child before it.
const reportMarker = "fake SM: report"

// fakeSMChild is the impostor, as small as the one of the report: "ADDR"
// binds UDP ADDR, prints "bound ADDR", answers every attach with a
// port_info, and when reportMarker comes prints what it got: "attaches N
// data M" (data: IB packets, SA MADs and payloads alike). It exits when
// stdin closes.
func fakeSMChild(args []string) int {
	if len(args) != 1 {
		return 2
	}
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(args[0])))
	if err != nil {
		fmt.Printf("bind: %v\n", err)
		return 1
	}
	fmt.Printf("bound %v\n", c.LocalAddr())
	var attaches, data atomic.Int64
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			b := buf[:n]
			switch {
			case string(b) == reportMarker:
				fmt.Printf("attaches %d data %d\n", attaches.Load(), data.Load())
			case fabric.IsControl(b):
				a, err := fabric.DecodeControl(b)
				if err != nil || a.Type != fabric.TypeAttach {
					continue
				}
				attaches.Add(1)
				c.WriteToUDPAddrPort(fabric.EncodeControl(&fabric.Control{
					Type: fabric.TypePortInfo, GUID: a.GUID, LID: 2, SMLID: fabric.SMLID,
					SubnetPrefix: fabric.DefaultSubnetPrefix, PKeys: []uint16{fabric.DefaultPKey}, Epoch: 0x5eed,
					MTU: fabric.PortMTU, Rate: fabric.PortRate, State: fabric.StateActive,
				}), from)
			case fabric.IsFlow(b):
			default:
				data.Add(1)
			}
		}
	}()
	io.Copy(io.Discard, os.Stdin) // until the test is done with it
	return 0
}

// childSM is a running fakeSMChild.
type childSM struct {
	addr  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	once  sync.Once
	att   int
	data  int
}

// startChildSM starts fakeSMChild on addr as uid (-1: this user).
func startChildSM(t *testing.T, uid int, addr string) *childSM {
	t.Helper()
	bin := os.Args[0]
	if uid >= 0 {
		// A copy the other user may run (the test binary's directory is
		// this user's only).
		dir, err := os.MkdirTemp("", "softrdma-ib-fakesm-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		bin = filepath.Join(dir, "ib.test")
		b, err := os.ReadFile(os.Args[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, bin, addr)
	cmd.Env = testenv.CleanEnv(fakeSMEnv + "=1")
	cmd.Dir = os.TempDir()
	cmd.Stderr = os.Stderr
	if uid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f := &childSM{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	t.Cleanup(func() { f.stop(t) })
	line, err := f.out.ReadString('\n')
	a, ok := strings.CutPrefix(strings.TrimSpace(line), "bound ")
	if !ok {
		t.Fatalf("fake SM as uid %d: %q %v", uid, line, err)
	}
	f.addr = a
	return f
}

// stop ends the fake SM and returns the attaches and data packets it got
// until then: it asks for the report with a datagram, which the fake SM
// reads after every datagram sent to it before.
func (f *childSM) stop(t *testing.T) (attaches, data int) {
	f.once.Do(func() {
		defer f.cmd.Wait()
		defer f.stdin.Close()
		c, err := net.Dial("udp", f.addr)
		if err != nil {
			t.Errorf("fake SM's report: %v", err)
			return
		}
		defer c.Close()
		if _, err := c.Write([]byte(reportMarker)); err != nil {
			t.Errorf("fake SM's report: %v", err)
			return
		}
		line, _ := f.out.ReadString('\n')
		if _, err := fmt.Sscanf(line, "attaches %d data %d", &f.att, &f.data); err != nil {
			t.Errorf("fake SM's report %q: %v", line, err)
		}
	})
	return f.att, f.data
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Require(t, "needs root to run a fake SM as another user (uid %d)", nobody)
	}
}

// logRecorder keeps the messages logged through package logging.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
	ch   chan struct{}
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.msgs = append(r.msgs, rec.Level.String()+" "+rec.Message)
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
	return nil
}

// recordLogs sends package logging's records to a recorder until the test
// ends.
func recordLogs(t *testing.T) *logRecorder {
	r := &logRecorder{ch: make(chan struct{}, 1)}
	logging.SetLogger(slog.New(r))
	t.Cleanup(func() { logging.SetLogger(nil) })
	return r
}

// waitFor waits until a message contains every one of want.
func (r *logRecorder) waitFor(t *testing.T, want ...string) string {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		r.mu.Lock()
		for _, m := range r.msgs {
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(m, w)
			}
			if ok {
				r.mu.Unlock()
				return m
			}
		}
		msgs := strings.Join(r.msgs, "\n")
		r.mu.Unlock()
		select {
		case <-r.ch:
		case <-deadline:
			t.Fatalf("no log message with %q; logged:\n%s", want, msgs)
		}
	}
}

// stoppableSM starts an SM on 127.0.0.1:0 and returns it with a function
// that stops it (and frees its address).
func stoppableSM(t *testing.T, cfg sm.Config) (*sm.SM, func()) {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	s, err := sm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return s, stop
}

// watchKinds hands the port's events to a channel.
func watchKinds(d *ib.Device) <-chan ib.PortEventKind {
	ch := make(chan ib.PortEventKind, 64)
	d.Watch(func(ev ib.PortEvent) {
		select {
		case ch <- ev.Kind:
		default:
		}
	})
	return ch
}

// waitKind waits for an event of kind k (others are skipped).
func waitKind(t *testing.T, ch <-chan ib.PortEventKind, k ib.PortEventKind, what string) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		select {
		case got := <-ch:
			if got == k {
				return
			}
		case <-deadline:
			t.Fatalf("no event %d: %s", k, what)
		}
	}
}

// TestSMAddressHeldByOtherUser: a fake SM of another user holds the SM's
// address: opening a port on it fails at once with EACCES naming that
// uid, and the fake SM gets nothing from the port (not even an attach).
func TestSMAddressHeldByOtherUser(t *testing.T) {
	requireRoot(t)
	f := startChildSM(t, nobody, "127.0.0.1:0")
	d, err := ib.Open(ib.Config{SM: f.addr, Local: netip.MustParseAddr("127.0.7.1"), ActivateTimeout: 10 * time.Second})
	if err == nil {
		d.Close()
		t.Fatalf("a port opened on the SM address %s held by uid %d", f.addr, nobody)
	}
	if !errors.Is(err, syscall.EACCES) || !strings.Contains(err.Error(), fmt.Sprintf("held by uid %d", nobody)) {
		t.Fatalf("open on %s held by uid %d: %v; want EACCES naming the uid", f.addr, nobody, err)
	}
	t.Logf("open: %v", err)
	if att, data := f.stop(t); att != 0 || data != 0 {
		t.Errorf("the fake SM got %d attaches and %d data packets, want none", att, data)
	}
}

// TestSMTakenOverWhileDown: the attack of the report. A port is active on
// root's SM; the SM stops and another user's fake SM binds its address
// and answers the port's keepalives. The port refuses it: it goes down
// (PortError), logs an error naming the uid, counts the fake port_infos
// in untrusted_drops, sends no SA MAD, and the fake SM gets no data.
func TestSMTakenOverWhileDown(t *testing.T) {
	requireRoot(t)
	logs := recordLogs(t)
	s, stop := stoppableSM(t, sm.Config{SendOnlySupport: true})
	addr := s.FabricAddr().String()
	p := openPort(t, s, "127.0.7.2")
	d := p.dev
	mgid, _ := verbs.ParseGID("ff12:4001:ffff::7:2")
	_, rec := p.join(t, mgid, mad.JoinFullMember)
	ah, err := p.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, PortNum: 1, DLID: rec.MLID, GRH: verbs.GlobalRoute{DGID: mgid, HopLimit: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Destroy()
	evs := watchKinds(d)
	stop()
	f := startChildSM(t, nobody, addr)
	waitKind(t, evs, ib.PortError, "the port stayed up with another user's fake SM at its SM's address")
	logs.waitFor(t, "ERROR", fmt.Sprintf("held by uid %d", nobody))
	if pa, _ := d.QueryPort(1); pa.State == verbs.PortActive {
		t.Errorf("port %+v: active with the fake SM", pa)
	}
	if err := d.SendSA(make([]byte, 256)); !errors.Is(err, syscall.ENETDOWN) {
		t.Errorf("SA MAD to the fake SM: %v, want ENETDOWN", err)
	}
	// The port may have found the fake SM by its silence first: its
	// answers to the next keepalive are counted.
	for deadline := time.Now().Add(15 * time.Second); d.Counters().Get(softverbs.UntrustedDrops) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("untrusted_drops 0: the fake port_infos were not counted")
		}
	}
	// A multicast payload: refused or lost, never sent to the fake SM.
	wr := verbs.SendWR{Opcode: verbs.WRSend, SGList: []verbs.SGE{p.mr.SGE(0, 32)}, Flags: verbs.SendSignaled,
		UD: verbs.UDWR{AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: 0x01234567}}
	if err := p.qp.PostSend(&wr); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var wc [8]verbs.WC
		for n := 0; n == 0; n, _ = p.cq.Poll(wc[:]) {
			if err := p.cq.Wait(ctx); err != nil {
				t.Fatalf("no completion of the send: %v", err)
			}
		}
	}
	if _, data := f.stop(t); data != 0 {
		t.Errorf("the fake SM got %d data packets", data)
	}
}

// TestSMKeyWithoutKeyRefused: with a key configured (SOFTRDMA_SM_KEY_FILE),
// a fake SM of the port's own user (which the owner check trusts) that
// does not hold the key is refused: Open fails with EACCES, and the fake
// SM gets attaches only, no data.
func TestSMKeyWithoutKeyRefused(t *testing.T) {
	f := startChildSM(t, -1, "127.0.0.1:0")
	key := filepath.Join(t.TempDir(), "sm.key")
	if err := os.WriteFile(key, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SOFTRDMA_SM", f.addr)
	t.Setenv("SOFTRDMA_SM_KEY_FILE", key)
	d, err := ib.OpenFromEnv(netip.MustParseAddr("127.0.7.3"))
	if err == nil {
		d.Close()
		t.Fatal("a port with a key opened on an SM without it")
	}
	if !errors.Is(err, syscall.EACCES) || !strings.Contains(err.Error(), "key") {
		t.Fatalf("open: %v; want EACCES about the key", err)
	}
	t.Logf("open: %v", err)
	if _, data := f.stop(t); data != 0 {
		t.Errorf("the fake SM got %d data packets", data)
	}
}

// TestSMIdentityChangeWarned: a port trusts uid 65534 too
// (SOFTRDMA_SM_UID); its SM (root's) stops and uid 65534's SM answers at
// the address: the port takes it, and logs a warning that the SM at its
// address changed identity, naming both.
func TestSMIdentityChangeWarned(t *testing.T) {
	requireRoot(t)
	logs := recordLogs(t)
	s, stop := stoppableSM(t, sm.Config{})
	addr := s.FabricAddr().String()
	t.Setenv("SOFTRDMA_SM", addr)
	t.Setenv("SOFTRDMA_SM_UID", fmt.Sprint(nobody))
	d, err := ib.OpenFromEnv(netip.MustParseAddr("127.0.7.4"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	stop()
	startChildSM(t, nobody, addr)
	m := logs.waitFor(t, "WARN", "changed identity", "uid 0", fmt.Sprintf("uid %d", nobody))
	t.Logf("logged: %s", m)
}
