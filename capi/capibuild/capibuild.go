// Package capibuild builds softrdma's drop-in librdmacm.so.1 and
// libibverbs.so.1 (the capi command, see its package doc): the Go side as
// libsoftrdma-capi.so (go build -buildmode=c-shared -tags capi), and the
// two thin libraries that forward every rdma-core symbol, with its symbol
// version, to it.
package capibuild

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

//go:embed symbols.txt
var symbolsTxt string

// CapiLib is the file name of the library that holds the Go runtime.
const CapiLib = "libsoftrdma-capi.so"

// ThinLibs are the file names (and sonames) of the libraries a program
// loads in place of rdma-core's.
var ThinLibs = []string{"librdmacm.so.1", "libibverbs.so.1"}

// versions are the version nodes of each library, oldest first; each
// inherits the one before it, as in rdma-core, except those in roots.
var versions = map[string][]string{
	"librdmacm.so.1": {"RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"},
	"libibverbs.so.1": {"IBVERBS_1.0", "IBVERBS_1.1", "IBVERBS_1.5", "IBVERBS_1.6", "IBVERBS_1.7",
		"IBVERBS_1.8", "IBVERBS_1.9", "IBVERBS_1.10", "IBVERBS_1.11", "IBVERBS_1.12", "IBVERBS_1.13",
		"IBVERBS_1.14", "IBVERBS_PRIVATE_34"},
}

var roots = map[string]bool{"RDMACM_1.0": true, "IBVERBS_1.0": true, "IBVERBS_PRIVATE_34": true}

// Symbol is one exported symbol of rdma-core's libraries.
type Symbol struct {
	Lib     string // librdmacm.so.1 or libibverbs.so.1
	Version string // e.g. RDMACM_1.1
	Name    string
	Default bool   // name@@version (else a compat name@version)
	Kind    string // what a stub returns: ptr, neg, errno, zero, void; object for data
}

// Symbols returns the symbols of rdma-core 44.0's libraries (symbols.txt).
func Symbols() []Symbol {
	var syms []Symbol
	sc := bufio.NewScanner(strings.NewReader(symbolsTxt))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 5 || strings.HasPrefix(f[0], "#") {
			continue
		}
		syms = append(syms, Symbol{Lib: f[0], Version: f[1], Name: f[2], Default: f[3] == "@@", Kind: f[4]})
	}
	return syms
}

// Target returns the function of libsoftrdma-capi.so a symbol jumps to.
func (s Symbol) Target() string {
	if s.Default {
		return "softrdma_" + s.Name
	}
	return "softrdma_compat_" + s.Name
}

// Complete tells whether dir holds the three libraries.
func Complete(dir string) bool {
	for _, f := range append([]string{CapiLib}, ThinLibs...) {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return false
		}
	}
	return true
}

// Options are the tools Build runs.
type Options struct {
	ModuleDir string    // the softrdma module's source (go.mod's directory), which must pass CheckSource
	Go        string    // the go command ("go" if empty)
	CC        string    // the C compiler ($CC, else "cc")
	Log       io.Writer // the tools' output (os.Stderr if nil)
}

// withDefaults fills in the tools Options leaves empty.
func (o Options) withDefaults() Options {
	if o.Go == "" {
		o.Go = "go"
	}
	if o.CC == "" {
		o.CC = os.Getenv("CC")
	}
	if o.CC == "" {
		o.CC = "cc"
	}
	if o.Log == nil {
		o.Log = os.Stderr
	}
	return o
}

// Build builds the three libraries into dir, with a StampFile that
// records what they were built from (NewStamp, taken before the build:
// a file changed during the build makes them out of date). It refuses a
// ModuleDir that fails CheckSource, and builds it alone: without a
// go.work of the directories above it, and without running the version
// control tool.
func Build(ctx context.Context, dir string, o Options) error {
	src, err := CheckSource(o.ModuleDir)
	if err != nil {
		return fmt.Errorf("refusing to build from %s: %w", o.ModuleDir, err)
	}
	o.ModuleDir = src
	o = o.withDefaults()
	dir, err = filepath.Abs(dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	stamp, err := NewStamp(o)
	if err != nil {
		return err
	}
	// No stamp while the libraries are being replaced: a build that
	// fails half-way leaves them out of date.
	if err := os.Remove(filepath.Join(dir, StampFile)); err != nil && !os.IsNotExist(err) {
		return err
	}
	run := func(wd, name string, args ...string) error {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = wd
		cmd.Stdout, cmd.Stderr = o.Log, o.Log
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "GOWORK=off")
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
		}
		return nil
	}
	capi := filepath.Join(dir, CapiLib)
	if err := run(o.ModuleDir, o.Go, "build", "-tags", "capi", "-buildmode=c-shared", "-trimpath", "-buildvcs=false",
		"-ldflags=-extldflags=-Wl,-soname,"+CapiLib, "-o", capi+".tmp", "./capi"); err != nil {
		return err
	}
	os.Remove(filepath.Join(dir, strings.TrimSuffix(CapiLib, ".so")+".so.tmp.h"))
	os.Remove(capi + ".h")
	if err := os.Rename(capi+".tmp", capi); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "softrdma-capi")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for _, lib := range ThinLibs {
		asm, script, err := Trampolines(lib, runtime.GOARCH)
		if err != nil {
			return err
		}
		s, m := filepath.Join(tmp, lib+".S"), filepath.Join(tmp, lib+".map")
		if err := os.WriteFile(s, asm, 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(m, script, 0o644); err != nil {
			return err
		}
		out := filepath.Join(dir, lib)
		if err := run(tmp, o.CC, "-shared", "-fPIC", "-nostdlib", "-o", out+".tmp", s,
			"-Wl,-soname,"+lib, "-Wl,--version-script="+m, "-L"+dir, "-l:"+CapiLib,
			"-Wl,-rpath,$ORIGIN", "-Wl,-z,noexecstack"); err != nil {
			return err
		}
		if err := os.Rename(out+".tmp", out); err != nil {
			return err
		}
	}
	return writeStamp(dir, stamp)
}

// forkSafe are the calls that never reach Go (capi/fork.c): they work in
// the child of a fork(), where every other call fails.
var forkSafe = map[string]bool{
	"ibv_get_device_name": true, "ibv_free_device_list": true, "ibv_fork_init": true,
	"ibv_is_fork_initialized": true, "ibv_node_type_str": true, "ibv_port_state_str": true,
	"ibv_event_type_str": true, "ibv_wc_status_str": true, "ibv_rate_to_mult": true,
	"ibv_rate_to_mbps": true, "mult_to_ibv_rate": true, "mbps_to_ibv_rate": true,
	"ibv_read_sysfs_file": true, "verbs_register_driver_34": true, "rdma_event_str": true,
	"rdma_freeaddrinfo": true, "rdma_free_devices": true,
}

// forkENOSYS are the calls that make objects from nothing: in the child of
// a fork() they fail with ENOSYS (softrdma does not run there), the others
// with EINVAL (their objects are the parent's).
var forkENOSYS = map[string]bool{
	"ibv_get_device_list": true, "rdma_create_event_channel": true, "rdma_getaddrinfo": true,
}

// forkServed are the calls a child of fork() makes through its parent
// (capi/forkchild.c): in the child their trampoline jumps to
// softrdma_child_<name>, with the program's arguments as they are.
var forkServed = map[string]bool{
	"ibv_ack_cq_events": true, "ibv_alloc_pd": true, "ibv_attach_mcast": true, "ibv_close_device": true,
	"ibv_create_ah": true, "ibv_detach_mcast": true, "ibv_query_qp": true, "rdma_set_option": true, "ibv_query_pkey": true, "_ibv_query_gid_ex": true, "_ibv_query_gid_table": true, "rdma_get_src_port": true, "rdma_get_dst_port": true, "ibv_get_device_guid": true, "ibv_get_device_index": true, "rdma_get_devices": true,
	"ibv_create_comp_channel": true, "ibv_create_cq": true, "ibv_create_qp": true, "ibv_dealloc_pd": true,
	"ibv_dereg_mr": true, "ibv_destroy_ah": true, "ibv_destroy_comp_channel": true, "ibv_destroy_cq": true,
	"ibv_destroy_qp": true, "ibv_get_cq_event": true, "ibv_get_device_list": true, "ibv_modify_qp": true,
	"ibv_open_device": true, "ibv_query_device": true, "ibv_query_gid": true, "ibv_query_port": true,
	"ibv_reg_mr": true, "ibv_reg_mr_iova": true, "ibv_reg_mr_iova2": true,
	"rdma_ack_cm_event": true, "rdma_bind_addr": true, "rdma_create_event_channel": true,
	"rdma_create_ep": true, "rdma_destroy_ep": true,
	"rdma_create_id": true, "rdma_create_qp": true, "rdma_destroy_event_channel": true,
	"rdma_destroy_id": true, "rdma_destroy_qp": true, "rdma_get_cm_event": true, "rdma_getaddrinfo": true,
	"rdma_join_multicast": true, "rdma_join_multicast_ex": true, "rdma_leave_multicast": true, "rdma_resolve_addr": true,
	"rdma_resolve_route": true, "rdma_listen": true, "rdma_connect": true, "rdma_accept": true, "rdma_reject": true,
	"ibv_create_ah_from_wc": true, "ibv_init_ah_from_wc": true,
}

// Trampolines returns the assembly and the version script of a thin
// library: every symbol of lib is a jump to its Target. On amd64 a symbol
// that reaches Go first tests softrdma_forked (capi/fork.c): in the child
// of a fork() it fails instead (see forkSafe and forkENOSYS); on arm64 it
// jumps at once.
func Trampolines(lib, goarch string) (asm, script []byte, err error) {
	var jmp, ptr string
	switch goarch {
	case "amd64":
		jmp, ptr = "jmp %s@PLT", ".quad"
	case "arm64":
		jmp, ptr = "b %s", ".xword"
	default:
		return nil, nil, fmt.Errorf("capibuild: no trampolines for %s", goarch)
	}
	var a, v bytes.Buffer
	fmt.Fprintf(&a, "/* %s: every symbol jumps to libsoftrdma-capi.so (generated by capi/capibuild). */\n", lib)
	// The constructor gives the loading thread the signal mask that
	// libsoftrdma-capi.so's constructor saved before the Go runtime
	// started (capi/signals.c); it runs after that library's.
	fmt.Fprintf(&a, "\t.text\nsoftrdma_tramp_init:\n\t"+jmp+"\n", "softrdma_sig_restore")
	fmt.Fprintf(&a, "\t.section .init_array,\"aw\"\n\t.balign 8\n\t%s softrdma_tramp_init\n", ptr)
	byVer := map[string][]string{}
	for _, s := range Symbols() {
		if s.Lib != lib {
			continue
		}
		// As rdma-core does: every version of a name is a .symver alias
		// of a label of its own, and the version script lists the name in
		// every node it has a version in.
		label := "softrdma_tramp_" + s.Name + "_" + strings.NewReplacer(".", "_").Replace(s.Version)
		if s.Kind == "object" {
			fmt.Fprintf(&a, "\t.data\n\t.globl %s\n\t.type %s, %%object\n\t.size %s, 1\n%s:\n\t.byte 0\n", label, label, label, label)
		} else if goarch == "amd64" && !forkSafe[s.Name] {
			// In the child of a fork() (capi/fork.c sets softrdma_forked)
			// the call goes to softrdma_forked_<kind>(name, errno)
			// instead: the Go runtime's threads are not in the child.
			e := 22 // EINVAL: an object of the parent
			if forkENOSYS[s.Name] {
				e = 38 // ENOSYS
			}
			fmt.Fprintf(&a, "\t.section .rodata\n%s_name:\n\t.asciz \"%s\"\n", label, s.Name)
			fmt.Fprintf(&a, "\t.text\n\t.globl %s\n\t.type %s, %%function\n%s:\n", label, label, label)
			fmt.Fprintf(&a, "\tmovq softrdma_forked@GOTPCREL(%%rip), %%r11\n\tcmpl $0, (%%r11)\n\tjne 1f\n\t"+jmp+"\n", s.Target())
			if s.Default && forkServed[s.Name] {
				fmt.Fprintf(&a, "1:\tjmp softrdma_child_%s@PLT\n", s.Name)
			} else {
				fmt.Fprintf(&a, "1:\tleaq %s_name(%%rip), %%rdi\n\tmovl $%d, %%esi\n\tjmp softrdma_forked_%s@PLT\n", label, e, s.Kind)
			}
		} else {
			fmt.Fprintf(&a, "\t.text\n\t.globl %s\n\t.type %s, %%function\n%s:\n\t"+jmp+"\n", label, label, label, s.Target())
		}
		at := "@"
		if s.Default {
			at = "@@"
		}
		fmt.Fprintf(&a, "\t.symver %s, %s%s%s\n", label, s.Name, at, s.Version)
		byVer[s.Version] = append(byVer[s.Version], s.Name)
	}
	fmt.Fprintf(&a, "\t.section .note.GNU-stack,\"\",%%progbits\n")
	prev := ""
	for i, ver := range versions[lib] {
		fmt.Fprintf(&v, "%s {\n", ver)
		if names := byVer[ver]; len(names) > 0 {
			fmt.Fprintf(&v, "  global:\n")
			for _, n := range names {
				fmt.Fprintf(&v, "    %s;\n", n)
			}
		}
		if i == 0 {
			fmt.Fprintf(&v, "  local: *;\n")
		}
		if roots[ver] || prev == "" {
			fmt.Fprintf(&v, "};\n")
		} else {
			fmt.Fprintf(&v, "} %s;\n", prev)
		}
		prev = ver
	}
	return a.Bytes(), v.Bytes(), nil
}
