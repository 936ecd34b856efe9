package interop

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/nettest"
)

// The lab: one switch namespace with the snooping bridge br0, the host
// namespace h0 of softrdma (eth0 on bridge port p0) and two guests on tap1
// and tap2. The subnet exists only inside these namespaces.
const (
	subnet     = "10.78.0."
	guestCount = 2

	bootTimeout = 240 * time.Second // a TCG boot takes ~15 s alone; the machine may be busy
	lineTimeout = 60 * time.Second  // a process prints an expected line
	exitTimeout = 90 * time.Second  // a process exits by itself
	wireTimeout = 20 * time.Second  // frames show up in a capture
)

type lab struct {
	sw, h0    string     // namespace names
	hostAddr  netip.Addr // softrdma's address (h0 eth0)
	hostPort  string     // h0's bridge port: p0
	guests    []*guest
	dir       string // work directory
	accel     string
	querierAt time.Time
	bootNote  string
}

// guest is one QEMU guest with rdma_rxe.
type guest struct {
	name    string // g1, g2
	addr    netip.Addr
	port    string // its tap: the bridge port
	mac     string
	dir     string // its work directory
	share   string // the 9p folder of the command channel
	console string // the serial console log
	qemuLog string
	info    string // the guest's ready file

	cmd  *exec.Cmd
	done chan struct{} // closed when qemu exited
	seq  atomic.Int64
}

func (g *guest) String() string { return fmt.Sprintf("%s(%v)", g.name, g.addr) }

var (
	theLab  *lab
	labErr  error
	labOnce sync.Once
)

// needLab returns the lab, booting it on first use.
func needLab(t *testing.T) *lab {
	t.Helper()
	requireEnv(t)
	labOnce.Do(func() {
		theLab, labErr = newLab()
	})
	if labErr != nil {
		t.Fatalf("interop lab: %v", labErr)
	}
	return theLab
}

func runErr(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// newLab creates the namespaces and the bridge and boots the guests.
func newLab() (l *lab, err error) {
	start := time.Now()
	dir, err := os.MkdirTemp("", "softrdma-interop-")
	if err != nil {
		return nil, err
	}
	base := fmt.Sprintf("%s%04x-", nsPrefix, rand.Uint32()&0xffff)
	l = &lab{sw: base + "sw", h0: base + "h0", hostAddr: netip.MustParseAddr(subnet + "10"), hostPort: "p0", dir: dir}
	theLab = l // so that TestMain closes it even when the boot fails
	for i := 1; i <= guestCount; i++ {
		g := &guest{
			name: fmt.Sprintf("g%d", i),
			addr: netip.MustParseAddr(fmt.Sprintf("%s1%d", subnet, i)),
			port: fmt.Sprintf("tap%d", i),
			mac:  fmt.Sprintf("52:54:00:4e:00:%02x", 10+i),
			done: make(chan struct{}),
		}
		g.dir = filepath.Join(dir, g.name)
		g.share = filepath.Join(g.dir, "share")
		g.console = filepath.Join(g.dir, "console.log")
		g.qemuLog = filepath.Join(g.dir, "qemu.log")
		if err := os.MkdirAll(filepath.Join(g.share, "cmd"), 0o755); err != nil {
			return l, err
		}
		if err := os.MkdirAll(filepath.Join(g.share, "out"), 0o755); err != nil {
			return l, err
		}
		l.guests = append(l.guests, g)
	}

	cmds := [][]string{
		{"netns", "add", l.sw},
		{"netns", "add", l.h0},
		{"-n", l.sw, "link", "set", "lo", "up"},
		// Intervals in centiseconds, as in test/multihost: IGMPv3 queries,
		// short startup queries, quick last-member queries. The querier
		// is switched on last (below).
		{"-n", l.sw, "link", "add", "br0", "type", "bridge", "stp_state", "0",
			"mcast_snooping", "1", "mcast_igmp_version", "3",
			"mcast_startup_query_count", "2", "mcast_startup_query_interval", "100",
			"mcast_query_interval", "1000", "mcast_query_response_interval", "50",
			"mcast_last_member_count", "2", "mcast_last_member_interval", "50"},
		{"-n", l.sw, "link", "set", "br0", "up"},
		{"-n", l.h0, "link", "set", "lo", "up"},
		{"-n", l.sw, "link", "add", l.hostPort, "mtu", "1500", "type", "veth", "peer", "name", "eth0", "netns", l.h0},
		{"-n", l.sw, "link", "set", l.hostPort, "master", "br0"},
		{"-n", l.sw, "link", "set", l.hostPort, "up"},
		{"-n", l.h0, "addr", "add", l.hostAddr.String() + "/24", "dev", "eth0"},
		{"-n", l.h0, "link", "set", "eth0", "up"},
	}
	for _, g := range l.guests {
		cmds = append(cmds,
			[]string{"-n", l.sw, "tuntap", "add", "dev", g.port, "mode", "tap"},
			[]string{"-n", l.sw, "link", "set", g.port, "mtu", "1500", "master", "br0"},
			[]string{"-n", l.sw, "link", "set", g.port, "up"})
	}
	cmds = append(cmds, []string{"-n", l.sw, "link", "set", "br0", "type", "bridge", "mcast_querier", "1"})
	for _, c := range cmds {
		if _, err := runErr("ip", c...); err != nil {
			return l, err
		}
	}
	l.querierAt = time.Now().Add(500 * time.Millisecond)

	l.accel = chooseAccel(dir)
	errs := make(chan error, len(l.guests))
	for _, g := range l.guests {
		go func() { errs <- l.boot(g) }()
	}
	var all []error
	for range l.guests {
		if err := <-errs; err != nil {
			all = append(all, err)
		}
	}
	if err := errors.Join(all...); err != nil {
		return l, err
	}
	l.bootNote = fmt.Sprintf("%d guests booted with %s in %.1fs", len(l.guests), l.accel, time.Since(start).Seconds())
	fmt.Printf("interop: %s; image %s\n", l.bootNote, imageDir)
	for _, g := range l.guests {
		fmt.Printf("interop: %s ready:\n\t%s\n", g, strings.ReplaceAll(strings.TrimSpace(g.info), "\n", "\n\t"))
	}
	return l, nil
}

// chooseAccel picks KVM when it boots a stock kernel here, else TCG.
// SOFTRDMA_INTEROP_ACCEL=kvm|tcg forces one. The verdict of a probe is
// cached beside the image (per host kernel and qemu version).
func chooseAccel(dir string) string {
	switch a := os.Getenv("SOFTRDMA_INTEROP_ACCEL"); a {
	case "kvm", "tcg":
		return a
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg"
	}
	f.Close()
	var uts syscall.Utsname
	_ = syscall.Uname(&uts)
	rel := make([]byte, 0, len(uts.Release))
	for _, c := range uts.Release {
		if c == 0 {
			break
		}
		rel = append(rel, byte(c))
	}
	qv, _ := exec.Command("qemu-system-x86_64", "--version").Output()
	h := sha256.Sum256([]byte(string(rel) + "\n" + string(qv)))
	verdictFile := filepath.Join(filepath.Dir(filepath.Clean(imageDir)), "accel-"+hex.EncodeToString(h[:8]))
	if b, err := os.ReadFile(verdictFile); err == nil {
		if v := strings.TrimSpace(string(b)); v == "kvm" || v == "tcg" {
			return v
		}
	}
	v := probeKVM(dir)
	_ = os.WriteFile(verdictFile, []byte(v+"\n"), 0o644)
	return v
}

// probeKVM boots the kernel under KVM without an initramfs: a working KVM
// reaches the "no root" panic (and exits, -no-reboot) within seconds.
func probeKVM(dir string) string {
	log := filepath.Join(dir, "kvm-probe.log")
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", "-accel", "kvm", "-m", "256", "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none", "-no-reboot",
		"-serial", "file:"+log, "-kernel", filepath.Join(imageDir, "vmlinuz"),
		"-append", "console=ttyS0 earlyprintk=serial panic=-1 root=/dev/nonexistent")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	_ = cmd.Run()
	b, _ := os.ReadFile(log)
	if strings.Contains(string(b), "Kernel panic") {
		return "kvm"
	}
	return "tcg"
}

// boot starts the guest's qemu in the switch namespace and waits until its
// init reports rxe0 ready.
func (l *lab) boot(g *guest) error {
	start := time.Now()
	appendArgs := fmt.Sprintf("console=ttyS0 rdinit=/init panic=-1 loglevel=4 interop.name=%s interop.addr=%v/24", g.name, g.addr)
	args := []string{"netns", "exec", l.sw, "qemu-system-x86_64",
		"-name", g.name, "-accel", l.accel, "-m", "512", "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none", "-no-reboot",
		"-serial", "file:" + g.console,
		"-kernel", filepath.Join(imageDir, "vmlinuz"), "-initrd", filepath.Join(imageDir, "initrd.img"),
		"-append", appendArgs,
		// The only NIC: a tap on the namespace's bridge (never user-mode networking).
		"-netdev", "tap,id=n0,ifname=" + g.port + ",script=no,downscript=no",
		"-device", "virtio-net-pci,romfile=,netdev=n0,mac=" + g.mac,
		"-fsdev", "local,id=f0,path=" + g.share + ",security_model=none",
		"-device", "virtio-9p-pci,fsdev=f0,mount_tag=ctl",
	}
	logf, err := os.Create(g.qemuLog)
	if err != nil {
		return err
	}
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("%s: start qemu: %v", g.name, err)
	}
	g.cmd = cmd
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(g.done)
	}()
	deadline := time.After(bootTimeout)
	for {
		if b, err := os.ReadFile(filepath.Join(g.share, "ready")); err == nil {
			g.info = string(b)
			g.info += fmt.Sprintf("boot %.1fs (%s)\n", time.Since(start).Seconds(), l.accel)
			return nil
		}
		if b, err := os.ReadFile(filepath.Join(g.share, "failed")); err == nil {
			return fmt.Errorf("%s: guest init failed: %s; console:\n%s", g.name, strings.TrimSpace(string(b)), tail(g.console, 30))
		}
		select {
		case <-g.done:
			q, _ := os.ReadFile(g.qemuLog)
			return fmt.Errorf("%s: qemu exited during boot (%v): %s; console:\n%s", g.name, cmd.ProcessState, strings.TrimSpace(string(q)), tail(g.console, 30))
		case <-deadline:
			return fmt.Errorf("%s: not ready within %v (%s); console:\n%s", g.name, bootTimeout, l.accel, tail(g.console, 30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "\t" + strings.Join(lines, "\n\t")
}

// close stops the guests and removes the namespaces; with failed, it keeps
// the guests' consoles and command channels as artifacts first.
func (l *lab) close(failed bool) {
	for _, g := range l.guests {
		if g.cmd != nil && g.cmd.Process != nil {
			_ = syscall.Kill(-g.cmd.Process.Pid, syscall.SIGKILL)
			select {
			case <-g.done:
			case <-time.After(10 * time.Second):
				fmt.Fprintf(os.Stderr, "interop: %s: qemu not gone 10s after SIGKILL\n", g.name)
			}
		}
	}
	if failed {
		dst := filepath.Join(artifacts.Dir(), "guests")
		for _, g := range l.guests {
			d := filepath.Join(dst, g.name)
			if err := copyTree(d, g.dir); err != nil {
				fmt.Fprintf(os.Stderr, "interop: keeping %s: %v\n", g.dir, err)
				continue
			}
			fmt.Printf("interop: guest %s console and command outputs kept: %s\n", g.name, d)
		}
	}
	for _, ns := range []string{l.sw, l.h0} {
		if err := nettest.Delete(ns); err != nil && !strings.Contains(err.Error(), "No such file") {
			fmt.Fprintf(os.Stderr, "interop: cleanup: %v\n", err)
		}
	}
	os.RemoveAll(l.dir)
}

// copyTree copies the regular files under src to dst.
func copyTree(dst, src string) error {
	return filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if fi.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		return nettest.CopyFile(filepath.Join(dst, rel), p)
	})
}

// keepGuestLogs keeps the consoles of the guests for a failed test.
func (l *lab) keepGuestLogs(t *testing.T) {
	for _, g := range l.guests {
		tmp := filepath.Join(t.TempDir(), g.name+"-console.log")
		if err := nettest.CopyFile(tmp, g.console); err == nil {
			artifacts.Keep(t, tmp)
		}
	}
}

// Captures.

// captureAll starts a capture on every bridge port (p0, tap1, tap2) and
// keeps the guest consoles when the test fails.
func (l *lab) captureAll(t *testing.T) map[string]*nettest.Capture {
	t.Helper()
	caps := map[string]*nettest.Capture{}
	for _, p := range l.ports() {
		caps[p] = nettest.StartCapture(t, l.sw, p, artifacts)
	}
	t.Cleanup(func() {
		if t.Failed() {
			l.keepGuestLogs(t)
		}
	})
	return caps
}

func (l *lab) ports() []string {
	ps := []string{l.hostPort}
	for _, g := range l.guests {
		ps = append(ps, g.port)
	}
	return ps
}

// waitQuerier waits until the bridge's querier is in effect (until then a
// snooping bridge floods).
func (l *lab) waitQuerier() {
	time.Sleep(time.Until(l.querierAt.Add(700 * time.Millisecond)))
}

// mdb returns the bridge's multicast database.
func (l *lab) mdb() ([]nettest.MDBEntry, error) {
	out, err := runErr("bridge", "-n", l.sw, "-j", "mdb", "show", "dev", "br0")
	if err != nil {
		return nil, err
	}
	return nettest.ParseMDB(out)
}

// mdbPorts returns the bridge ports with an mdb entry for group.
func (l *lab) mdbPorts(t *testing.T, group netip.Addr) []string {
	t.Helper()
	ents, err := l.mdb()
	if err != nil {
		t.Fatal(err)
	}
	return nettest.MDBPorts(ents, group)
}

// waitMDB waits until the bridge has (present) or no longer has an mdb
// entry for group on port.
func (l *lab) waitMDB(t *testing.T, group netip.Addr, port string, present bool, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		has := false
		for _, p := range l.mdbPorts(t, group) {
			has = has || p == port
		}
		if has == present {
			return
		}
		if time.Now().After(deadline) {
			ents, _ := l.mdb()
			t.Fatalf("bridge mdb: entry for %v on %s present=%v after %v, want present=%v; mdb: %+v", group, port, has, timeout, present, ents)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// randGroups returns n distinct random groups in 239.0.0.0/8 that also
// differ in the 23 bits of the Ethernet multicast address.
func randGroups(n int) []netip.Addr {
	var out []netip.Addr
	seen := map[uint32]bool{}
	for len(out) < n {
		v := rand.Uint32() & 0x00ffffff
		if v&0xffff00 == 0 || v&0xff == 0 || v&0xff == 255 || v>>16 == 255 || seen[v&0x7fffff] {
			continue
		}
		seen[v&0x7fffff] = true
		out = append(out, netip.AddrFrom4([4]byte{239, byte(v >> 16), byte(v >> 8), byte(v)}))
	}
	return out
}

// The guest command channel.

// gcmd is a command running in a guest.
type gcmd struct {
	t    *testing.T
	g    *guest
	n    int64
	name string
}

func (c *gcmd) path(ext string) string {
	return filepath.Join(c.g.share, "out", strconv.FormatInt(c.n, 10)+ext)
}

// start runs a shell script in the guest (in its own process group). The
// command is killed and its output logged when the test ends.
func (g *guest) start(t *testing.T, name, script string) *gcmd {
	t.Helper()
	select {
	case <-g.done:
		t.Fatalf("%s: qemu is gone; console:\n%s", g.name, tail(g.console, 30))
	default:
	}
	c := &gcmd{t: t, g: g, n: g.seq.Add(1), name: g.name + "$ " + name}
	tmp := filepath.Join(g.share, "cmd", fmt.Sprintf(".%d.tmp", c.n))
	if err := os.WriteFile(tmp, []byte(script+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(g.share, "cmd", fmt.Sprintf("%d.sh", c.n))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, ok := c.rc(); !ok {
			c.kill()
		}
		t.Logf("%s\n%s", c.name, nettest.Indent(c.output()))
	})
	return c
}

// mckey starts rdma-core's mckey in the guest with line-buffered output,
// killed after 150 s at the latest.
func (g *guest) mckey(t *testing.T, args ...string) *gcmd {
	t.Helper()
	return g.start(t, "mckey "+strings.Join(args, " "),
		"exec timeout -s KILL 150 stdbuf -oL -eL mckey "+strings.Join(args, " "))
}

// run runs a short command in the guest and returns its stdout; it fails
// the test unless the command exits 0.
func (g *guest) run(t *testing.T, script string) string {
	t.Helper()
	c := g.start(t, script, script)
	if rc := c.wait(exitTimeout); rc != 0 {
		t.Fatalf("%s: exit status %d:\n%s", c.name, rc, nettest.Indent(c.output()))
	}
	b, _ := os.ReadFile(c.path(".out"))
	return string(b)
}

// counter reads one of rxe0's hw_counters.
func (g *guest) counter(t *testing.T, name string) uint64 {
	t.Helper()
	out := g.run(t, "cat /sys/class/infiniband/rxe0/ports/1/hw_counters/"+name)
	v, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64)
	if err != nil {
		t.Fatalf("%s: counter %s: %q", g.name, name, out)
	}
	return v
}

// output returns stdout and, when not empty, stderr.
func (c *gcmd) output() string {
	out, _ := os.ReadFile(c.path(".out"))
	errb, _ := os.ReadFile(c.path(".err"))
	s := string(out)
	if len(errb) > 0 {
		s += "[stderr]\n" + string(errb)
	}
	if rc, ok := c.rc(); ok {
		s += fmt.Sprintf("[exit status %d]\n", rc)
	}
	return s
}

// rc returns the exit status once the command finished.
func (c *gcmd) rc() (int, bool) {
	b, err := os.ReadFile(c.path(".rc"))
	if err != nil {
		return 0, false
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1, true
	}
	return v, true
}

func (c *gcmd) exited() bool { _, ok := c.rc(); return ok }

// poll waits until cond holds, the guest dies or the timeout passes.
func (c *gcmd) poll(timeout time.Duration, cond func() bool) error {
	deadline := time.After(timeout)
	for {
		if cond() {
			return nil
		}
		select {
		case <-c.g.done:
			return fmt.Errorf("qemu of %s exited; console:\n%s", c.g.name, tail(c.g.console, 30))
		case <-deadline:
			return fmt.Errorf("timeout after %v", timeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitLine waits until the command printed line (a whole line).
func (c *gcmd) waitLine(line string, timeout time.Duration) {
	c.t.Helper()
	var exited bool
	err := c.poll(timeout, func() bool {
		b, _ := os.ReadFile(c.path(".out"))
		if nettest.HasLine(string(b), line) {
			return true
		}
		exited = c.exited()
		return exited
	})
	if err == nil && !exited {
		return
	}
	if exited {
		b, _ := os.ReadFile(c.path(".out"))
		if nettest.HasLine(string(b), line) {
			return
		}
		c.t.Fatalf("%s exited without printing %q:\n%s", c.name, line, nettest.Indent(c.output()))
	}
	c.t.Fatalf("%s: no %q: %v:\n%s", c.name, line, err, nettest.Indent(c.output()))
}

// wait waits for the command's exit status; on timeout it kills it and
// fails the test.
func (c *gcmd) wait(timeout time.Duration) int {
	c.t.Helper()
	if err := c.poll(timeout, c.exited); err != nil {
		c.kill()
		c.t.Fatalf("%s: %v; killed:\n%s", c.name, err, nettest.Indent(c.output()))
	}
	rc, _ := c.rc()
	return rc
}

// expectExit fails the test unless the command exits with status want.
func (c *gcmd) expectExit(want int, timeout time.Duration) {
	c.t.Helper()
	if got := c.wait(timeout); got != want {
		c.t.Fatalf("%s: exit status %d, want %d:\n%s", c.name, got, want, nettest.Indent(c.output()))
	}
}

// kill asks the guest to kill the command's process group and waits a
// little for its exit status.
func (c *gcmd) kill() {
	if c.exited() {
		return
	}
	_ = os.WriteFile(filepath.Join(c.g.share, "cmd", fmt.Sprintf("%d.kill", c.n)), nil, 0o644)
	_ = c.poll(10*time.Second, c.exited)
}
