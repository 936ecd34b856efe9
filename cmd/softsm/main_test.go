package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/wire"
	"go.uber.org/goleak"
)

var softsmBin string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	testenv.OwnNetns() // lo to this package alone
	testenv.ClearSoftRDMA()
	dir, err := os.MkdirTemp("", "softsm-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	args := []string{"build", "-o", dir}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, ".")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go %s: %v\n%s", strings.Join(args, " "), err, out)
		return 1
	}
	softsmBin = filepath.Join(dir, "softsm")
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

var readyRE = regexp.MustCompile(`^softsm: listening fabric (\S+) sa (\S+)$`)

type proc struct {
	cmd        *exec.Cmd
	fabric, sa netip.AddrPort
	stderr     bytes.Buffer
	done       chan struct{} // closed once the process was waited for
	err        error         // its exit, once done is closed
}

// start runs softsm on free loopback ports and waits for its ready line.
func start(t *testing.T, args ...string) *proc {
	t.Helper()
	args = append([]string{"-listen", "127.0.0.1:0", "-sa-listen", "127.0.0.1:0"}, args...)
	p := &proc{cmd: exec.Command(softsmBin, args...), done: make(chan struct{})}
	p.cmd.Stderr = &p.stderr
	p.cmd.Env = testenv.CleanEnv()
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		io.Copy(io.Discard, out)
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	select {
	case l := <-lines:
		m := readyRE.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("ready line %q", l)
		}
		p.fabric, p.sa = netip.MustParseAddrPort(m[1]), netip.MustParseAddrPort(m[2])
	case <-time.After(20 * time.Second):
		t.Fatalf("no ready line; stderr: %s", p.stderr.String())
	}
	return p
}

// stop sends SIGTERM and expects exit status 0.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.err != nil {
			t.Fatalf("softsm exit: %v; stderr: %s", p.err, p.stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("softsm did not exit on SIGTERM")
	}
}

func query(t *testing.T, addr netip.AddrPort, m mad.MAD) mad.MAD {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.WriteToUDPAddrPort(m, addr); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 1024)
	n, _, err := conn.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatal(err)
	}
	return mad.MAD(buf[:n])
}

func TestSoftsmProcess(t *testing.T) {
	p := start(t, "-port", "0x100001", "-port", "0x100003,0x100005", "-v")
	m := mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 0x0123456789ABCDEF, 0)
	r := query(t, p.sa, m)
	if len(r) != mad.Len || r.TID() != 0x0123456789ABCDEF || r.Status() != 0 || !r.ClassPortInfo().SendOnlyFullMemberSupported() {
		t.Fatalf("answer % x", []byte(r[:64]))
	}
	// A pre-registered port can join with no client attached.
	j := mad.NewSARequest(mad.MethodSet, mad.AttrMCMemberRecord, 2, mad.CompCreateRequired)
	f := mad.MCMemberFields{MGID: mustGID("ff12:4001:ffff::601:203"), PortGID: mustGID("fe80::10:5"),
		QKey: 0x01234567, PKey: 0xFFFF, JoinState: mad.JoinFullMember}
	j.MCMemberRecord().Encode(&f)
	if r := query(t, p.sa, j); r.Status() != 0 || r.MCMemberRecord().MLID() != 0xC001 {
		t.Fatalf("join status %#x", r.Status())
	}
	// A port attaching with the third GUID gets LID 4.
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pi, err := attachFrom(c, p.fabric, 0x100005)
	if err != nil || pi.LID != 4 || pi.Epoch == 0 {
		t.Fatalf("port_info %+v %v", pi, err)
	}
	p.stop(t)
	if !strings.Contains(p.stderr.String(), "attached") {
		t.Fatalf("-v log: %s", p.stderr.String())
	}
}

func TestSoftsmNoSendOnly(t *testing.T) {
	p := start(t, "-no-sendonly-support")
	r := query(t, p.sa, mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 1, 0))
	if r.ClassPortInfo().SendOnlyFullMemberSupported() {
		t.Fatal("bit 12 set")
	}
	p.stop(t)
}

func TestSoftsmFlags(t *testing.T) {
	var out, errb bytes.Buffer
	for _, args := range [][]string{{"-port", "zz"}, {"-subnet-prefix", "x"}, {"extra"}, {"-nosuchflag"}} {
		out.Reset()
		errb.Reset()
		if code := run(args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d", args, code)
		}
	}
	if code := run([]string{"-listen", "256.0.0.1:1"}, &out, &errb); code != 1 {
		t.Errorf("bad listen address: exit %d", code)
	}
}

// attachFrom attaches guid from c to the softsm at sm as a port does: an
// attach, and when the SM answers with a retry (c's address is not proven
// yet) the attach again with its cookie. It returns the SM's last answer
// (port_info or refused).
func attachFrom(c *net.UDPConn, sm netip.AddrPort, guid uint64) (*fabric.Control, error) {
	a := fabric.Control{Type: fabric.TypeAttach, GUID: guid}
	buf := make([]byte, 65536)
	for range 2 {
		if _, err := c.WriteToUDPAddrPort(fabric.EncodeControl(&a), sm); err != nil {
			return nil, err
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return nil, err
		}
		m, err := fabric.DecodeControl(buf[:n])
		if err != nil || m.Type != fabric.TypeRetry {
			return m, err
		}
		a.Cookie = m.Cookie
	}
	return nil, fmt.Errorf("attach of %#x: a retry for the cookie of a retry", guid)
}

func mustGID(s string) wire.GID {
	g, err := wire.ParseGID(s)
	if err != nil {
		panic(err)
	}
	return g
}
