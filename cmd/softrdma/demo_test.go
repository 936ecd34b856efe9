package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/test/testenv"
)

func TestDemo(t *testing.T) {
	var out bytes.Buffer
	if code := demo([]string{"-count", "3", "-size", "100"}, &out); code != 0 {
		t.Fatalf("demo exit %d:\n%s", code, out.String())
	}
	s := out.String()
	for _, want := range []string{
		"receiver     full           3   3 / 3 / 3",
		"send-only    send-only      3   0 / 0 / 0",
		"no-loopback  full           3   3 / 3 / 0",
		"RDMA_CM_EVENT_MULTICAST_JOIN status 0",
		"demo: all expectations held",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("demo output lacks %q:\n%s", want, s)
		}
	}
}

func TestDemoBadFlags(t *testing.T) {
	var out bytes.Buffer
	if code := demo([]string{"-group", "10.1.1.1"}, &out); code != 2 {
		t.Errorf("unicast group: exit %d", code)
	}
	if code := demo([]string{"-size", "0"}, &out); code != 2 {
		t.Errorf("size 0: exit %d", code)
	}
}

// TestDemoUnprivileged runs the demo binary as nobody; then again while a
// root-owned socket holds UDP 4791, where it must fail and say why.
func TestDemoUnprivileged(t *testing.T) {
	if !testenv.InNetns(t) {
		return // 4791 to itself: another package's devices (root's) would hold it
	}
	dir, err := os.MkdirTemp("", "softrdma-demo-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "softrdma")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	demo := func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "-count", "2")
		cmd.Env = testenv.CleanEnv()
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := demo()
	if err != nil {
		t.Fatalf("demo as nobody: %v\n%s", err, out)
	}
	if !strings.Contains(out, "demo: all expectations held") {
		t.Fatalf("demo output:\n%s", out)
	}
	// Another user (root here) holding UDP 4791: the devices of one
	// network namespace run as one user (SO_REUSEPORT), and the demo says
	// whose the port is instead of losing its datagrams to that socket.
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: 4791}); err != nil {
		t.Fatalf("root bind 4791: %v", err)
	}
	out, err = demo()
	if err == nil || !strings.Contains(out, "UDP port 4791 is held by a socket of another user (uid 0)") {
		t.Fatalf("demo as nobody while root holds 4791: %v\n%s", err, out)
	}
	t.Logf("demo as nobody while root holds 4791:\n%s", out)
}
