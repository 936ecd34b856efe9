package main

// The sysfs view of softrdma exec: PROGRAM sees softrdma's devices under
// /sys/class/infiniband and /sys/class/infiniband_verbs, as tools and test
// suites that look for a device's netdev, GIDs and port state there
// (ibdev2netdev, pyverbs' tests, NCCL, UCX) expect of the kernel's rxe.
//
// How: a mount namespace of the program's own whose /sys/class is a
// tmpfs holding the generated infiniband and infiniband_verbs directories
// and a bind mount of every other class of the real /sys/class. Where
// the process may mount (root: CAP_SYS_ADMIN), softrdma exec unshares the
// mount namespace of its own thread, mounts and execs PROGRAM from that
// thread: PROGRAM takes over the process as without the view. Otherwise
// (an unprivileged user) it starts itself again in a new user namespace
// that maps the user's own uid and gid (PROGRAM still runs as the user,
// with no capability) and a new mount namespace; that child mounts and
// execs PROGRAM, and softrdma exec waits for it, forwards the signals it
// gets (not those its terminal sent PROGRAM too) and ends as PROGRAM
// ended (its status, or its signal). When
// neither works, PROGRAM runs without the view and one line on stderr
// says so. docs/c-programs.md, "The sysfs view", argues the design.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/provider/rxe"
	"github.com/softrdma/softrdma/verbs"
)

// envNoSysfs turns the sysfs view off when set to anything but "" or "0"
// (as -no-sysfs does).
const envNoSysfs = "SOFTRDMA_NO_SYSFS"

// viewChildArg0 is argv[0] of softrdma started again in a new user
// namespace to mount the view and exec PROGRAM (see init below).
const viewChildArg0 = "softrdma-sysfs-view"

// sysfsClass is where the view is mounted.
const sysfsClass = "/sys/class"

// noSysfsFlag defines -no-sysfs on the exec command's flags.
func noSysfsFlag(fs *flag.FlagSet) *bool {
	v := os.Getenv(envNoSysfs)
	return fs.Bool("no-sysfs", v != "" && v != "0", "run PROGRAM with the host's /sys, without the sysfs view of softrdma's devices (also "+envNoSysfs+"=1)")
}

// execProgram execs prog with argv and env, in a mount namespace with the
// sysfs view unless noView. It returns only on failure, with the exit
// status for softrdma exec, or, when PROGRAM ran in a child, with
// PROGRAM's exit status (unless PROGRAM died of a signal: then this
// process dies of it too).
func execProgram(prog string, argv, env []string, noView bool, stderr io.Writer) int {
	if noView {
		return execPlain(prog, argv, env, stderr)
	}
	v, err := buildView()
	if err != nil {
		return execWithoutView(prog, argv, env, err, stderr)
	}
	// The namespace is the calling thread's: exec from it.
	runtime.LockOSThread()
	err = enterView(v)
	if err == nil {
		return execPlain(prog, argv, env, stderr)
	}
	if os.Geteuid() != 0 && errors.Is(err, syscall.EPERM) {
		// Not for root: root in a user namespace of its own loses the
		// capabilities it has on the host (raw sockets, CAP_NET_ADMIN).
		return runInUserNS(prog, argv, env, stderr)
	}
	return execWithoutView(prog, argv, env, err, stderr)
}

// execPlain execs prog; it returns only when execve fails.
func execPlain(prog string, argv, env []string, stderr io.Writer) int {
	// exec: PROGRAM takes over this process, so its exit status and the
	// signals sent to it (or that kill it) are seen by the caller as is.
	err := syscall.Exec(prog, argv, env)
	fmt.Fprintf(stderr, "softrdma exec: %s: %v\n", prog, err)
	return 126
}

// execWithoutView says why there is no view, on one line, and execs prog.
func execWithoutView(prog string, argv, env []string, why error, stderr io.Writer) int {
	fmt.Fprintf(stderr, "softrdma exec: no sysfs view of the devices (%v): %s sees the host's /sys/class/infiniband\n", why, filepath.Base(prog))
	return execPlain(prog, argv, env, stderr)
}

// enterView unshares the calling thread's mount namespace and mounts the
// view in it. On failure the thread's namespace is as it was (or a copy
// of it): nothing of the view stays mounted.
func enterView(v *view) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	return mountView(v)
}

// mountView mounts v over sysfsClass in the current mount namespace, which
// must be the process's own: nothing it mounts propagates to the host.
func mountView(v *view) error {
	// Mounts under / are shared with the host's by default (systemd):
	// receive the host's, send none.
	if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("making / a slave mount: %w", err)
	}
	orig, err := unix.Open(sysfsClass, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(orig)
	classes, err := os.ReadDir(sysfsClass)
	if err != nil {
		return err
	}
	if err := unix.Mount("softrdma", sysfsClass, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755"); err != nil {
		return fmt.Errorf("mounting a tmpfs on %s: %w", sysfsClass, err)
	}
	if err := populate(v, orig, classes); err != nil {
		unix.Unmount(sysfsClass, unix.MNT_DETACH)
		return err
	}
	return nil
}

// populate writes v into the tmpfs on sysfsClass and binds the real
// classes (read through orig, the directory under it) next to it.
func populate(v *view, orig int, classes []os.DirEntry) error {
	for _, c := range classes {
		if c.Name() == "infiniband" || c.Name() == "infiniband_verbs" {
			continue
		}
		dst := filepath.Join(sysfsClass, c.Name())
		if err := os.Mkdir(dst, 0o755); err != nil {
			return err
		}
		src := fmt.Sprintf("/proc/self/fd/%d/%s", orig, c.Name())
		if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("binding %s/%s: %w", sysfsClass, c.Name(), err)
		}
	}
	if err := populateFiles(v); err != nil {
		return err
	}
	return remountRO()
}

// populateFiles writes v's files and links under sysfsClass. A file whose
// content an earlier one has is a hard link to it: the GID tables are
// mostly empty entries (1024 per port), and a start with tens of
// interfaces stays fast.
func populateFiles(v *view) error {
	dirs := map[string]bool{}
	first := map[string]string{} // content -> the file that has it
	for _, f := range v.files {
		p := filepath.Join(sysfsClass, f.path)
		if d := filepath.Dir(p); !dirs[d] {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
			dirs[d] = true
		}
		var err error
		switch same, ok := first[f.data]; {
		case f.link != "":
			err = os.Symlink(f.link, p)
		case ok:
			err = os.Link(same, p)
		default:
			err = os.WriteFile(p, []byte(f.data), 0o444)
			first[f.data] = p
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// remountRO makes the tmpfs on sysfsClass read-only, as sysfs is to a
// user (the tmpfs only: the binds keep their own flags).
func remountRO() error {
	if err := unix.Mount("none", sysfsClass, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("remounting %s read-only: %w", sysfsClass, err)
	}
	return nil
}

// runInUserNS runs softrdma again as the view child in a new user and
// mount namespace, waits for it and ends as it ended.
func runInUserNS(prog string, argv, env []string, stderr io.Writer) int {
	uid, gid := os.Getuid(), os.Getgid()
	attr := &syscall.ProcAttr{
		Env:   env,
		Files: inheritedFds(),
		Sys: &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}},
			// The child mounts with CAP_SYS_ADMIN of the new user
			// namespace and drops it before it execs PROGRAM.
			AmbientCaps: []uintptr{unix.CAP_SYS_ADMIN},
		},
	}
	// Signals are forwarded from before the child exists to after it is
	// reaped: none is lost, and none goes to a recycled PID.
	sigs := make(chan os.Signal, 16)
	forwarded := []os.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGWINCH, syscall.SIGCONT}
	signal.Notify(sigs, forwarded...)
	// /proc/self/exe: this very binary, whatever its path names now.
	pid, err := syscall.ForkExec("/proc/self/exe", append([]string{viewChildArg0, prog}, argv...), attr)
	if err != nil {
		signal.Stop(sigs)
		return execWithoutView(prog, argv, env, fmt.Errorf("a user namespace: %w", err), stderr)
	}
	done := make(chan syscall.WaitStatus)
	go func() {
		var ws syscall.WaitStatus
		for {
			_, err := syscall.Wait4(pid, &ws, 0, nil)
			if err != syscall.EINTR {
				break
			}
		}
		done <- ws
	}()
	for {
		select {
		case s := <-sigs:
			if fromTerminal(s) {
				continue // the program, in the same group, has it too
			}
			syscall.Kill(pid, s.(syscall.Signal))
		case ws := <-done:
			signal.Stop(sigs)
			return mirrorExit(ws)
		}
	}
}

// fromTerminal reports whether s is a signal the terminal sends its
// foreground process group (^C, ^\, a resize) and this process is in that
// group: the program, in the same group, got it from the terminal too,
// and is not sent it twice. (A kill of softrdma exec alone with one of
// these, while it is in the foreground, is then not passed on.)
func fromTerminal(s os.Signal) bool {
	if s != syscall.SIGINT && s != syscall.SIGQUIT && s != syscall.SIGWINCH {
		return false
	}
	tty, err := unix.Open("/dev/tty", unix.O_RDONLY|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false // no controlling terminal
	}
	defer unix.Close(tty)
	fg, err := unix.IoctlGetInt(tty, unix.TIOCGPGRP)
	return err == nil && fg == unix.Getpgrp()
}

// inheritedFds returns the descriptors this process was given (those
// without close-on-exec), each at its own number, for the child.
func inheritedFds() []uintptr {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return []uintptr{0, 1, 2}
	}
	var fds []uintptr
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fl, err := unix.FcntlInt(uintptr(n), unix.F_GETFD, 0)
		if err != nil || fl&unix.FD_CLOEXEC != 0 {
			continue
		}
		for len(fds) <= n {
			fds = append(fds, ^uintptr(0)) // closed in the child
		}
		fds[n] = uintptr(n)
	}
	return fds
}

// mirrorExit returns the child's exit status, or, when a signal killed
// it, kills this process with the same signal (its default action, with
// no core dump of softrdma's own).
func mirrorExit(ws syscall.WaitStatus) int {
	if !ws.Signaled() {
		return ws.ExitStatus()
	}
	sig := ws.Signal()
	unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{})
	// Past the Go runtime's handler: the signal's default action (an
	// all-zero struct sigaction is SIG_DFL with no flags, on every
	// architecture's layout).
	var dfl [32]uint64
	unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0)
	var set unix.Sigset_t
	set.Val[0] = 1 << (uint(sig) - 1)
	unix.PthreadSigmask(unix.SIG_UNBLOCK, &set, nil)
	unix.Tgkill(unix.Getpid(), unix.Gettid(), unix.Signal(sig))
	return 128 + int(sig)
}

func init() {
	if len(os.Args) >= 3 && os.Args[0] == viewChildArg0 {
		os.Exit(viewChild(os.Args[1], os.Args[2:]))
	}
}

// viewChild is softrdma started by runInUserNS: it mounts the view, drops
// its capabilities and execs PROGRAM. It returns only on failure.
func viewChild(prog string, argv []string) int {
	// init runs on the main thread; keep it for the exec, which must be
	// from a thread without ambient capabilities.
	runtime.LockOSThread()
	v, err := buildView()
	if err == nil {
		err = mountView(v)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "softrdma exec: no sysfs view of the devices (%v): %s sees the host's /sys/class/infiniband\n", err, filepath.Base(prog))
	}
	dropCaps()
	return execPlain(prog, argv, os.Environ(), os.Stderr)
}

// dropCaps clears the calling thread's inheritable and ambient
// capabilities: PROGRAM, exec'd by a user other than root, then has none.
func dropCaps() {
	unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if unix.Capget(&hdr, &data[0]) == nil {
		data[0].Inheritable, data[1].Inheritable = 0, 0
		unix.Capset(&hdr, &data[0])
	}
}

// view is the generated content: files and symbolic links by their path
// under /sys/class.
type view struct {
	files []viewFile
}

type viewFile struct {
	path string
	data string // the content (with its newline), when not a link
	link string // the target, for a symbolic link
}

func (v *view) file(path, format string, args ...any) {
	v.files = append(v.files, viewFile{path: path, data: fmt.Sprintf(format, args...) + "\n"})
}

func (v *view) symlink(path, target string) {
	v.files = append(v.files, viewFile{path: path, link: target})
}

// buildView generates the view of the devices a program sees: the RoCEv2
// device rxe_<ifname> of every network interface, in the order of its
// device list, from the devices' own attributes (what ibv_query_device,
// ibv_query_port and ibv_query_gid give the program), on a host of its
// own so that nothing of this process's default host is created.
func buildView() (*view, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	h := verbs.NewHost()
	defer h.Close()
	names := map[int]string{}
	reg := rxe.On(h)
	var devs []*rxe.Device
	for _, ifi := range ifs {
		names[ifi.Index] = ifi.Name
		if d, err := reg.ForInterface(ifi.Index); err == nil {
			devs = append(devs, d)
		}
	}
	v := &view{}
	v.file("infiniband_verbs/abi_version", "6") // IB_USER_VERBS_ABI_VERSION
	for i, d := range devs {
		if err := v.addRoCE(i, d, names); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// addRoCE adds rxe device d, the n-th of the list, as the kernel's
// drivers/infiniband/core/sysfs.c and rxe show it.
func (v *view) addRoCE(n int, d *rxe.Device, names map[int]string) error {
	ctx, err := d.Verbs().Open()
	if err != nil {
		return err
	}
	defer ctx.Close()
	attr := ctx.QueryDevice()
	port, err := ctx.QueryPort(1)
	if err != nil {
		return err
	}
	gids, err := ctx.QueryGIDTable(1)
	if err != nil {
		return err
	}
	name, ifname := d.Name(), names[d.Ifindex()]
	dev := "infiniband/" + name + "/"
	v.file(dev+"node_type", "1: CA")
	v.file(dev+"node_guid", "%s", guidString(attr.NodeGUID))
	v.file(dev+"sys_image_guid", "%s", guidString(attr.SysImageGUID))
	v.file(dev+"node_desc", "rxe")
	v.file(dev+"fw_ver", "%s", attr.FWVer)
	v.file(dev+"parent", "%s", ifname) // rxe's own attribute
	// The netdev where ibdev2netdev and pyverbs look (a hardware RoCE
	// device's PCI function has it; the kernel's rxe has no device link).
	v.symlink(dev+"device/net/"+ifname, "/sys/class/net/"+ifname)
	p := dev + "ports/1/"
	v.addPort(p, port)
	byIndex := map[int]verbs.GIDEntry{}
	for _, g := range gids {
		byIndex[g.Index] = g
	}
	for i := 0; i < port.GIDTblLen; i++ {
		g, ok := byIndex[i]
		v.file(fmt.Sprintf("%sgids/%d", p, i), "%s", gidString(g.GID))
		if !ok {
			// The kernel's file exists and fails with EINVAL.
			continue
		}
		nd := names[g.NetdevIdx]
		if nd == "" {
			nd = ifname
		}
		v.file(fmt.Sprintf("%sgid_attrs/ndevs/%d", p, i), "%s", nd)
		v.file(fmt.Sprintf("%sgid_attrs/types/%d", p, i), "%s", gidTypeString(g.Type))
	}
	for i := 0; i < max(port.PKeyTblLen, 1); i++ {
		v.file(fmt.Sprintf("%spkeys/%d", p, i), "0xffff")
	}
	uv := fmt.Sprintf("infiniband_verbs/uverbs%d/", n)
	v.file(uv+"ibdev", "%s", name)
	v.file(uv+"abi_version", "2") // RXE_UVERBS_ABI_VERSION
	v.symlink(uv+"device", "../../infiniband/"+name+"/device")
	return nil
}

// addPort adds a port's attribute files under p (ports/N/), in the
// formats of the kernel's sysfs.c with the values ibv_query_port gives.
func (v *view) addPort(p string, a verbs.PortAttr) {
	states := []string{"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"}
	st := "UNKNOWN"
	if int(a.State) < len(states) {
		st = states[a.State]
	}
	v.file(p+"state", "%d: %s", a.State, st)
	v.file(p+"lid", "0x%x", a.LID)
	v.file(p+"lid_mask_count", "%d", a.LMC)
	v.file(p+"sm_lid", "0x%x", a.SMLID)
	v.file(p+"sm_sl", "%d", a.SMSL)
	capMask := uint32(1 << 16) // IB_PORT_CM_SUP
	if a.LinkLayer == verbs.LinkLayerEthernet {
		capMask |= 1 << 26 // IB_PORT_IP_BASED_GIDS
	}
	v.file(p+"cap_mask", "0x%08x", capMask)
	v.file(p+"rate", "2.5 Gb/sec (1X)") // 1X SDR, as ibv_query_port says
	if a.State == verbs.PortActive {
		v.file(p+"phys_state", "5: LinkUp")
	} else {
		v.file(p+"phys_state", "3: Disabled")
	}
	v.file(p+"link_layer", "%s", a.LinkLayer)
}

// guidString formats a GUID as sysfs (and ibv_devinfo) do: 0002:c903:….
func guidString(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff)
}

// gidString formats a GID as the kernel's %pI6: eight groups of four hex
// digits.
func gidString(g verbs.GID) string {
	var b strings.Builder
	for i := 0; i < 16; i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		fmt.Fprintf(&b, "%02x%02x", g[i], g[i+1])
	}
	return b.String()
}

// gidTypeString is the kernel's ib_cache_gid_type_str.
func gidTypeString(t verbs.GIDType) string {
	if t == verbs.GIDTypeRoCEv2 {
		return "RoCE v2"
	}
	return "IB/RoCE v1"
}
