package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/test/testenv"
)

// nobody is the other user's uid and gid.
const nobody = 65534

// TestHeldByOtherUser: another user's process (a softsm run as nobody,
// which could as well be a fake SM) holds the fabric address; root's
// softsm on that address refuses to start: it exits 1 saying who holds
// it (uid, pid, command).
func TestHeldByOtherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Require(t, "needs root to run a process as another user (uid %d)", nobody)
	}
	dir, err := os.MkdirTemp("", "softsm-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "softsm")
	b, err := os.ReadFile(softsmBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	holder := exec.CommandContext(ctx, bin, "-listen", "127.0.0.1:0")
	holder.Env = testenv.CleanEnv()
	holder.Dir = dir
	holder.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		holder.Process.Signal(syscall.SIGTERM)
		holder.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	m := readyRE.FindStringSubmatch(strings.TrimSpace(line))
	if m == nil {
		t.Fatalf("softsm as uid %d: %q %v", nobody, line, err)
	}
	addr := m[1]

	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, softsmBin, "-listen", addr)
	cmd.Env = testenv.CleanEnv()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("softsm on %s held by uid %d: %v, want exit 1; stdout %q stderr %q", addr, nobody, err, stdout.String(), stderr.String())
	}
	want := fmt.Sprintf("softsm: %s is held by uid %d (pid %d softsm); refusing to start", addr, nobody, holder.Process.Pid)
	if !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr %q, want %q", stderr.String(), want)
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout %q: the refused softsm said it listens", stdout.String())
	}
}

// TestKeyFile: with -key-file softsm's port_info carries the key's MAC
// over the attach's nonce; a key file group or others may read is refused
// (exit 2, saying why).
func TestKeyFile(t *testing.T) {
	dir := t.TempDir()
	key := []byte("0123456789abcdef0123456789abcdef")
	file := filepath.Join(dir, "sm.key")
	if err := os.WriteFile(file, key, 0o640); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"-listen", "127.0.0.1:0", "-key-file", file}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "group or others may access it") {
		t.Errorf("key file of mode 0640: exit %d, stderr %q", code, errb.String())
	}
	os.Chmod(file, 0o600)
	p := start(t, "-key-file", file)
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nonce := []byte("0123456789012345")
	a := fabric.Control{Type: fabric.TypeAttach, GUID: 0x100007, Nonce: nonce}
	buf := make([]byte, 65536)
	var pi *fabric.Control
	for range 2 {
		c.WriteToUDPAddrPort(fabric.EncodeControl(&a), p.fabric)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatal(err)
		}
		if pi, err = fabric.DecodeControl(buf[:n]); err != nil {
			t.Fatal(err)
		}
		a.Cookie = pi.Cookie
	}
	if pi.Type != fabric.TypePortInfo || !fabric.CheckControlMAC(key, nonce, pi) || len(pi.Session) != fabric.SessionLen {
		t.Errorf("port_info %+v: want the key's MAC over the nonce and a session", pi)
	}
	if fabric.CheckControlMAC(key, []byte("another nonce!!!"), pi) {
		t.Error("the MAC holds for another nonce")
	}
	p.stop(t)
}
