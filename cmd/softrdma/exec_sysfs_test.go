package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/test/testenv"
)

// sysfsScript prints, one "name=value" line each, what the tests read of
// the view of rxe_lo (what pyverbs' tests, ibdev2netdev and the like read).
const sysfsScript = `d=/sys/class/infiniband/rxe_lo
p=$d/ports/1
echo "gid0=$(cat $p/gids/0)"
echo "ndev0=$(cat $p/gid_attrs/ndevs/0)"
echo "type0=$(cat $p/gid_attrs/types/0)"
echo "state=$(cat $p/state)"
echo "phys_state=$(cat $p/phys_state)"
echo "link_layer=$(cat $p/link_layer)"
echo "node_type=$(cat $d/node_type)"
echo "node_guid=$(cat $d/node_guid)"
echo "netdevs=$(ls $d/device/net/)"
echo "netdev_addr=$(cat $d/device/net/lo/address)"
echo "ibdev=$(cat /sys/class/infiniband_verbs/uverbs0/ibdev)"
echo "capeff=$(grep CapEff /proc/self/status | tr -d '\t')"
echo "pid=$$"
`

// sysfsValues parses sysfsScript's output.
func sysfsValues(out string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = v
		}
	}
	return m
}

// devinfoGUID runs ibv_devinfo through softrdma exec and returns the
// node_guid it prints for the first device.
func devinfoGUID(t *testing.T, ctx context.Context, dir string) string {
	t.Helper()
	cmd, out := startExec(t, ctx, dir, "ibv_devinfo", "-v")
	err := cmd.Wait()
	out.wait("\x00")
	if err != nil {
		t.Fatalf("ibv_devinfo -v: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`node_guid:\s+(\S+)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no node_guid in ibv_devinfo -v:\n%s", out)
	}
	return m[1]
}

// checkSysfsView checks sysfsScript's values against the device's
// (ibv_devinfo's GUID and GID 0 of rxe_lo).
func checkSysfsView(t *testing.T, out, guid string) {
	t.Helper()
	got := sysfsValues(out)
	want := map[string]string{
		"gid0":       "0000:0000:0000:0000:0000:ffff:7f00:0001",
		"ndev0":      "lo",
		"type0":      "RoCE v2",
		"state":      "4: ACTIVE",
		"phys_state": "5: LinkUp",
		"link_layer": "Ethernet",
		"node_type":  "1: CA",
		"node_guid":  guid,
		"netdevs":    "lo",
		"ibdev":      "rxe_lo",
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %q, want %q", k, got[k], w)
		}
	}
	if got["netdev_addr"] != "00:00:00:00:00:00" {
		t.Errorf("device/net/lo/address = %q: not lo's own sysfs directory", got["netdev_addr"])
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}

// noViewLeft fails if the view's tmpfs is mounted in the test's own
// mount namespace: it is the program's alone.
func noViewLeft(t *testing.T) {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), " - tmpfs softrdma ") {
		t.Errorf("the view is mounted in the caller's namespace:\n%s", mi)
	}
}

// TestExecSysfsView runs a shell script through softrdma exec as root that
// reads /sys/class/infiniband/rxe_lo and /sys/class/infiniband_verbs:
// the GID, its netdev and type, the port state, the netdev under
// device/net (lo's real sysfs directory) and the node GUID that
// ibv_devinfo prints through softrdma exec. The program takes softrdma
// exec's place (same PID) and keeps root's capabilities (no user namespace for root), infiniband-diags' ibstatus
// and ibstat show the device from it, and the view is not mounted in the
// caller's namespace.
func TestExecSysfsView(t *testing.T) {
	requireRDMACore(t, "ibv_devinfo")
	dir := execDir(t)
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	guid := devinfoGUID(t, ctx, dir)
	cmd, out := startExec(t, ctx, dir, "sh", "-c", sysfsScript)
	err := cmd.Wait()
	out.wait("\x00")
	if err != nil {
		t.Fatalf("sh: %v\n%s", err, out)
	}
	checkSysfsView(t, out.String(), guid)
	if got := sysfsValues(out.String())["pid"]; got != fmt.Sprint(cmd.Process.Pid) {
		t.Errorf("the program's PID is %s, softrdma exec's %d: not exec'd in its place", got, cmd.Process.Pid)
	}
	own, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	capEff := regexp.MustCompile(`CapEff:\s+(\S+)`).FindStringSubmatch(string(own))[1]
	if got := sysfsValues(out.String())["capeff"]; got != "CapEff:"+capEff {
		t.Errorf("the program's capabilities: %s, the test's: %s", got, capEff)
	}
	// infiniband-diags' ibstatus (a script over sysfs) and ibstat
	// (libibumad's umad_get_ca) read the view too, when installed.
	for _, c := range []struct {
		prog string
		want []string
	}{
		{"ibstatus", []string{"Infiniband device 'rxe_lo' port 1 status:", "state:\t\t 4: ACTIVE", "link_layer:\t Ethernet",
			"default gid:\t 0000:0000:0000:0000:0000:ffff:7f00:0001"}},
		{"ibstat", []string{"CA 'rxe_lo'", "Node GUID: 0x" + strings.ReplaceAll(guid, ":", ""), "State: Active", "Link layer: Ethernet"}},
	} {
		if _, err := exec.LookPath(c.prog); err != nil {
			t.Logf("no %s (infiniband-diags): not checked", c.prog)
			continue
		}
		cmd, out := startExec(t, ctx, dir, c.prog)
		err := cmd.Wait()
		out.wait("\x00")
		if err != nil {
			t.Errorf("%s: %v\n%s", c.prog, err, out)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%s lacks %q:\n%s", c.prog, w, out)
			}
		}
	}
	noViewLeft(t)
}

// execDirForNobody is execDir with the binary and libraries readable by
// uid 65534 (execDir's directory is the test process's alone).
func execDirForNobody(t *testing.T) string {
	t.Helper()
	dir := execDir(t)
	for _, d := range []string{dir, filepath.Join(dir, "lib")} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// startExecAs is startExec as uid and gid 65534, with extra as the
// program's descriptor 3 when not nil.
func startExecAs(t *testing.T, ctx context.Context, dir string, extra *os.File, args ...string) (*exec.Cmd, *lineWaiter) {
	t.Helper()
	argv := append([]string{filepath.Join(dir, "softrdma"), "exec", "-libdir", filepath.Join(dir, "lib"), "--"}, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = testenv.CleanEnv("HOME=/nonexistent")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if extra != nil {
		cmd.ExtraFiles = []*os.File{extra}
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	return cmd, newLineWaiter(pr)
}

// TestExecSysfsViewUnprivileged is TestExecSysfsView as uid 65534: the
// view is mounted in a user namespace that maps the user's own ids (the
// program runs as nobody, with no capability), and softrdma exec, which
// waits for it there, passes on its descriptors (3 too), the signals it
// gets (SIGUSR1 reaches the program's trap), the program's exit status
// and its death by a signal.
func TestExecSysfsViewUnprivileged(t *testing.T) {
	requireRDMACore(t, "ibv_devinfo")
	if os.Geteuid() != 0 {
		testenv.Require(t, "needs root to run a program as uid 65534")
	}
	dir := execDirForNobody(t)
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	guid := devinfoGUID(t, ctx, dir)

	t.Run("view", func(t *testing.T) {
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer pr.Close()
		cmd, out := startExecAs(t, ctx, dir, pw, "sh", "-c", sysfsScript+`echo "uid=$(id -u)"; echo via-fd3 >&3; exit 3`)
		pw.Close()
		fd3 := newLineWaiter(pr)
		err = cmd.Wait()
		out.wait("\x00")
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 {
			t.Fatalf("exit: %v, want status 3\n%s", err, out)
		}
		if !strings.Contains(out.String(), "\nuid=65534") {
			t.Errorf("the program does not run as 65534:\n%s", out)
		}
		if got := sysfsValues(out.String())["capeff"]; got != "CapEff:0000000000000000" {
			t.Errorf("the program has capabilities: %s", got)
		}
		checkSysfsView(t, out.String(), guid)
		if !fd3.wait("via-fd3") {
			t.Errorf("descriptor 3 did not reach the program: %q", fd3)
		}
		noViewLeft(t)
	})
	t.Run("signals", func(t *testing.T) {
		cmd, out := startExecAs(t, ctx, dir, nil, "sh", "-c", `trap 'echo got-usr1; exit 5' USR1; echo ready; while :; do sleep 1 & wait $!; done`)
		if !out.wait("ready") {
			cmd.Wait()
			t.Fatalf("the program did not start:\n%s", out)
		}
		if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		out.wait("\x00")
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 5 || !strings.Contains(out.String(), "got-usr1") {
			t.Fatalf("after SIGUSR1 to softrdma exec: %v, want the trap's status 5\n%s", err, out)
		}
		cmd, out = startExecAs(t, ctx, dir, nil, "sh", "-c", `kill -TERM $$`)
		err = cmd.Wait()
		out.wait("\x00")
		if !errors.As(err, &ee) {
			t.Fatalf("a program killed by SIGTERM: %v\n%s", err, out)
		}
		if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
			t.Fatalf("a program killed by SIGTERM: softrdma exec ended with %v\n%s", err, out)
		}
	})
}

// TestExecSysfsFallback: where the view cannot be mounted (root without
// CAP_SYS_ADMIN, as in a container; root gets no user namespace, which
// would cost it its capabilities on the host), the program runs with the
// host's /sys and one line on stderr says so; -no-sysfs and
// SOFTRDMA_NO_SYSFS=1 run it without the view and without the line.
func TestExecSysfsFallback(t *testing.T) {
	requireRDMACore(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		testenv.Require(t, "no setpriv (util-linux): %v", err)
	}
	if os.Geteuid() != 0 {
		testenv.Require(t, "needs root")
	}
	dir := execDir(t)
	if !testenv.InNetns(t) {
		return
	}
	if _, err := os.Stat("/sys/class/infiniband"); err == nil {
		t.Skip("the host has /sys/class/infiniband: the check below needs its absence")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	script := `test -e /sys/class/infiniband && echo view=yes || echo view=no`
	for _, c := range []struct {
		name string
		pre  []string // before softrdma
		flag []string // after exec
		env  []string
		line bool
	}{
		{"no-cap-sys-admin", []string{"setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin", "--"}, nil, nil, true},
		{"flag", nil, []string{"-no-sysfs"}, nil, false},
		{"env", nil, nil, []string{"SOFTRDMA_NO_SYSFS=1"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			argv := append(append([]string{}, c.pre...), filepath.Join(dir, "softrdma"), "exec", "-libdir", filepath.Join(dir, "lib"))
			argv = append(append(argv, c.flag...), "--", "sh", "-c", script)
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			cmd.Env = testenv.CleanEnv(c.env...)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %v\n%s", argv, err, out)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if lines[len(lines)-1] != "view=no" {
				t.Errorf("the program saw a view:\n%s", out)
			}
			const say = "softrdma exec: no sysfs view of the devices (unshare: operation not permitted): sh sees the host's /sys/class/infiniband"
			if c.line && (len(lines) != 2 || lines[0] != say) {
				t.Errorf("stderr does not say, on one line, that there is no view:\n%s", out)
			}
			if !c.line && len(lines) != 1 {
				t.Errorf("more than the program's output:\n%s", out)
			}
		})
	}
}

// openPty returns a new pseudo-terminal's master and slave.
func openPty(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		testenv.Require(t, "no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetUint32(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return m, s
}

// TestExecSysfsViewTerminal: softrdma exec waiting for a program of
// another user's (TestExecSysfsViewUnprivileged) in the foreground of a
// terminal does not pass on the ^C the program gets from the terminal
// itself: the program (testdata/sigcount.c) counts one SIGINT. SIGUSR1
// sent to softrdma exec afterwards is passed on after any SIGINT it
// passed on before, and ends the program with the count.
func TestExecSysfsViewTerminal(t *testing.T) {
	requireRDMACore(t)
	if os.Geteuid() != 0 {
		testenv.Require(t, "needs root to run a program as uid 65534")
	}
	dir := execDirForNobody(t)
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	master, slave := openPty(t)
	prog := buildCTest(t, dir, "sigcount")
	argv := []string{filepath.Join(dir, "softrdma"), "exec", "-libdir", filepath.Join(dir, "lib"), "--", prog}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = testenv.CleanEnv("HOME=/nonexistent")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0,
		Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	out := newLineWaiter(master)
	if !out.wait("ready") {
		cmd.Wait()
		t.Fatalf("the program did not start:\n%s", out)
	}
	if _, err := master.Write([]byte{3}); err != nil { // ^C
		t.Fatal(err)
	}
	if !out.wait("int") {
		cmd.Wait()
		t.Fatalf("^C did not reach the program:\n%s", out)
	}
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if !out.wait("total=") {
		t.Fatalf("SIGUSR1 did not reach the program:\n%s", out)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("softrdma exec: %v\n%s", err, out)
	}
	if !strings.Contains(out.String(), "total=1") {
		t.Errorf("the program got SIGINT more than once for the terminal's ^C:\n%s", out)
	}
}
