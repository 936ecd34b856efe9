package rxe

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/wire"
)

// otherUserEnv makes the test binary act as another local user's process
// (otherUserChild) instead of running tests.
const otherUserEnv = "SOFTRDMA_TEST_RXE_OTHER_USER"

// nobody is the uid and gid the other user's process runs as.
const nobody = 65534

// TestOtherUserCannotShare runs a process of another user (nobody) beside a
// device of this one that has a QP: it can bind UDP 4791 neither on the
// wildcard nor on 127.0.0.1 (the more specific address would win the
// kernel's unicast lookup), with SO_REUSEADDR or SO_REUSEPORT, and what
// it sends to the device's hand-over socket is dropped unread. Then, the other way round: while
// another user holds 4791, creating a QP fails with EADDRINUSE and a reason
// that names that user.
func TestOtherUserCannotShare(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Require(t, "needs root to start a process as another user")
	}
	d := loDev(t)
	newQP(t, d, newFakeRx(), 0, 1)
	d.mu.Lock()
	sock := handoverName(d.blocks[0].port4)
	d.mu.Unlock()
	out := asNobody(t, "attack", sock)
	for _, want := range []string{
		"bind 0.0.0.0:4791 SO_REUSEADDR: address already in use",
		"bind 0.0.0.0:4791 SO_REUSEPORT: address already in use",
		"bind 127.0.0.1:4791 SO_REUSEADDR: address already in use",
		"bind 127.0.0.1:4791 SO_REUSEPORT: address already in use",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("the other user's process: no %q in\n%s", want, out)
		}
	}
	// Anyone may connect to an abstract socket: the device closes the
	// other user's connection unread.
	if !strings.Contains(out, "connect "+sock+": ok\n") {
		t.Fatalf("the other user's process could not connect to the hand-over socket:\n%s", out)
	}
	eventually(t, "untrusted_drops 1", func() bool { return d.Counters().Get(softverbs.UntrustedDrops) == 1 })
	if n := d.Counters().Get(softverbs.RcvdForwarded); n != 0 {
		t.Errorf("rcvd_forwarded %d after the other user's hand-over", n)
	}
}

// TestPortHeldByOtherUser: while another user's socket holds UDP 4791, a
// device can neither join a group nor open the sockets of its first QP,
// and the error (EADDRINUSE) names that user.
func TestPortHeldByOtherUser(t *testing.T) {
	if !testenv.InNetns(t) {
		return // 4791 to itself: no other package's device beside it
	}
	if d := existing("lo"); d != nil {
		d.Close()
	}
	cmd, _ := nobodyCmd(t, "hold")
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
	defer cmd.Wait()
	defer stdin.Close() // the holder exits
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if line != "held: ok\n" {
		t.Fatalf("the other user's process: %q %v", line, err)
	}
	d := loDev(t)
	g := randGroup()
	err = d.IncGroup(g)
	if err == nil {
		d.DecGroup(g)
	}
	d.mu.Lock()
	b, berr := d.openBlockLocked()
	if berr == nil {
		d.blocks = append(d.blocks, b) // closed with the device
	}
	d.mu.Unlock()
	for _, c := range []struct {
		what string
		err  error
	}{{"join", err}, {"first QP's sockets", berr}} {
		if !errors.Is(c.err, syscall.EADDRINUSE) || !strings.Contains(fmt.Sprint(c.err), fmt.Sprintf("another user (uid %d)", nobody)) {
			t.Errorf("%s while uid %d holds 4791: %v", c.what, nobody, c.err)
		} else {
			t.Logf("%s: %v", c.what, c.err)
		}
	}
}

// asNobody runs the test binary as nobody in otherUserChild mode and
// returns its output.
func asNobody(t *testing.T, args ...string) string {
	t.Helper()
	cmd, _ := nobodyCmd(t, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("as nobody: %v\n%s", err, out)
	}
	return string(out)
}

// nobodyCmd returns the command running a copy of the test binary (in a
// directory nobody may enter) as nobody, in otherUserChild mode.
func nobodyCmd(t *testing.T, args ...string) (*exec.Cmd, context.CancelFunc) {
	t.Helper()
	return userCmd(t, nobody, otherUserEnv+"=1", args...)
}

// userCmd returns the command running a copy of the test binary (in a
// directory anyone may enter) as uid and gid uid, with env added to the
// environment.
func userCmd(t *testing.T, uid int, env string, args ...string) (*exec.Cmd, context.CancelFunc) {
	t.Helper()
	dir, err := os.MkdirTemp("", "softrdma-rxe-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "rxe.test")
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = testenv.CleanEnv(env)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	return cmd, cancel
}

// otherUserChild is the other user's process: "attack SOCK" tries to share
// UDP 4791 and to connect to hand-over socket SOCK, printing each outcome.
func otherUserChild(args []string) int {
	if len(args) < 1 {
		return 2
	}
	switch args[0] {
	case "attack":
		for _, a := range [][4]byte{{0, 0, 0, 0}, {127, 0, 0, 1}} {
			for _, o := range []struct {
				name string
				opt  int
			}{{"SO_REUSEADDR", unix.SO_REUSEADDR}, {"SO_REUSEPORT", unix.SO_REUSEPORT}} {
				fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
				if err != nil {
					fmt.Println(err)
					return 1
				}
				unix.SetsockoptInt(fd, unix.SOL_SOCKET, o.opt, 1)
				err = unix.Bind(fd, &unix.SockaddrInet4{Addr: a, Port: wire.UDPPort})
				fmt.Printf("bind %d.%d.%d.%d:%d %s: %v\n", a[0], a[1], a[2], a[3], wire.UDPPort, o.name, errText(err))
				unix.Close(fd)
			}
		}
		if len(args) > 1 {
			fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
			if err == nil {
				if err = unix.Connect(fd, &unix.SockaddrUnix{Name: args[1]}); err == nil {
					unix.Write(fd, make([]byte, 100)) // a would-be hand-over
				}
				unix.Close(fd)
			}
			fmt.Printf("connect %s: %v\n", args[1], errText(err))
		}
	case "squat":
		// "squat NAME" listens on abstract unix socket NAME, reads what
		// comes until stdin closes, and prints how many bytes it read.
		if len(args) < 2 {
			return 2
		}
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
		if err == nil {
			if err = unix.Bind(fd, &unix.SockaddrUnix{Name: args[1]}); err == nil {
				err = unix.Listen(fd, 16)
			}
		}
		fmt.Printf("squatted: %v\n", errText(err))
		if err != nil {
			return 1
		}
		var read atomic.Int64
		go func() {
			for {
				c, _, err := unix.Accept(fd)
				if err != nil {
					return
				}
				go func() {
					b := make([]byte, 65536)
					for {
						n, err := unix.Read(c, b)
						if n <= 0 || err != nil {
							unix.Close(c)
							return
						}
						read.Add(int64(n))
					}
				}()
			}
		}()
		os.Stdin.Read(make([]byte, 1)) // until the test ends
		time.Sleep(50 * time.Millisecond)
		fmt.Printf("read %d\n", read.Load())
	case "hold":
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err == nil {
			unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
			err = unix.Bind(fd, &unix.SockaddrInet4{Port: wire.UDPPort})
		}
		fmt.Printf("held: %v\n", errText(err))
		os.Stdin.Read(make([]byte, 1)) // until the test ends
	default:
		return 2
	}
	return 0
}

func errText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	if err == nil {
		return "ok"
	}
	return err.Error()
}
