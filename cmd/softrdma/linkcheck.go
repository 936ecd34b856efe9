package main

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// The libraries softrdma exec puts in front of rdma-core's: a program
// uses softrdma only through them.
var rdmaSonames = []string{"librdmacm.so.1", "libibverbs.so.1"}

// linkNote returns the line softrdma exec prints before running prog
// when prog cannot be using softrdma, or may not be: a statically linked
// program (a warning: the loader never sees LD_LIBRARY_PATH), or a
// dynamically linked one that links neither library, directly or through
// the libraries it links (a note: it may still load them at run time, as
// Python's pyverbs does). "" when prog links one of them, is not an ELF
// file (a script: its interpreter decides) or is a shell, interpreter or
// wrapper (runners: what it runs decides). env is the program's environment
// (its LD_LIBRARY_PATH is searched).
func linkNote(prog string, env []string) string {
	f, err := elf.Open(prog)
	if err != nil {
		return ""
	}
	defer f.Close()
	name := filepath.Base(prog)
	if !isDynamic(f) {
		return fmt.Sprintf("softrdma exec: warning: %s is statically linked: it cannot load softrdma's %s or %s, so it does not use softrdma", name, rdmaSonames[0], rdmaSonames[1])
	}
	if runsOthers(name) {
		return "" // the program it runs decides
	}
	found, err := linksRDMA(prog, f, libraryPath(env))
	if found || err != nil {
		return "" // linked, or unknown: say nothing rather than something wrong
	}
	return fmt.Sprintf("softrdma exec: note: %s links neither %s nor %s (nor do its libraries): it uses softrdma only if it loads them at run time (dlopen)", name, rdmaSonames[0], rdmaSonames[1])
}

// runners are programs whose work is to run another program or code
// (shells, interpreters, wrappers): whether they link the libraries says
// nothing, so linkNote says nothing of them.
var runners = map[string]bool{
	"sh": true, "bash": true, "dash": true, "zsh": true, "ksh": true, "busybox": true,
	"env": true, "stdbuf": true, "timeout": true, "nice": true, "ionice": true, "taskset": true,
	"numactl": true, "chrt": true, "setpriv": true, "setsid": true, "nohup": true, "time": true,
	"xargs": true, "unshare": true, "nsenter": true, "ip": true, "sudo": true, "su": true, "runuser": true,
	"strace": true, "ltrace": true, "gdb": true, "valgrind": true, "perf": true,
	"python": true, "perl": true, "ruby": true, "node": true, "lua": true, "tclsh": true,
	"mpirun": true, "mpiexec": true, "srun": true,
}

// runsOthers reports whether name (a program's base name, a version
// suffix such as python3.11's dropped) is one of runners.
func runsOthers(name string) bool {
	return runners[strings.TrimRight(name, "0123456789.")]
}

// isDynamic reports whether f asks for the dynamic loader.
func isDynamic(f *elf.File) bool {
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

// maxObjects bounds the libraries linksRDMA reads.
const maxObjects = 512

// linksRDMA reports whether the object f (at path) or a library it links,
// at any depth, names one of rdmaSonames; an error if a library is not
// found (the program may fail to start, or the loader knows a directory
// not searched here). Libraries are found as the
// loader finds them: RPATH (when there is no RUNPATH), LD_LIBRARY_PATH,
// RUNPATH, the directories of /etc/ld.so.conf, the default directories.
func linksRDMA(path string, f *elf.File, ldPath []string) (bool, error) {
	sys := systemDirs()
	seen := map[string]bool{}
	queue := []string{path}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		o := f
		if p != path {
			var err error
			if o, err = elf.Open(p); err != nil {
				continue
			}
		}
		needed, dirs, err := searchList(o, filepath.Dir(p), ldPath, sys)
		if o != f {
			o.Close()
		}
		if err != nil {
			return false, err
		}
		for _, n := range needed {
			for _, want := range rdmaSonames {
				if n == want {
					return true, nil
				}
			}
			if seen[n] {
				continue
			}
			seen[n] = true
			if len(seen) > maxObjects {
				return false, errors.New("too many libraries")
			}
			lib := findLib(n, dirs, f)
			if lib == "" {
				return false, fmt.Errorf("%s: not found", n) // the loader may know better
			}
			queue = append(queue, lib)
		}
	}
	return false, nil
}

// searchList returns the libraries o needs and the directories the
// loader searches for them.
func searchList(o *elf.File, origin string, ldPath, sys []string) (needed, dirs []string, err error) {
	if needed, err = o.DynString(elf.DT_NEEDED); err != nil {
		return nil, nil, err
	}
	runpath, _ := o.DynString(elf.DT_RUNPATH)
	var rpath []string
	if len(runpath) == 0 {
		rpath, _ = o.DynString(elf.DT_RPATH)
	}
	dirs = append(dirs, expandOrigin(rpath, origin)...)
	dirs = append(dirs, ldPath...)
	dirs = append(dirs, expandOrigin(runpath, origin)...)
	return needed, append(dirs, sys...), nil
}

// findLib returns the first file named n in dirs that is an ELF object
// of main's class and machine; "" if none is.
func findLib(n string, dirs []string, main *elf.File) string {
	for _, d := range dirs {
		p := filepath.Join(d, n)
		lf, err := elf.Open(p)
		if err != nil {
			continue
		}
		ok := lf.Class == main.Class && lf.Machine == main.Machine
		lf.Close()
		if ok {
			return p
		}
	}
	return ""
}

// expandOrigin splits colon-separated search paths and replaces $ORIGIN.
func expandOrigin(paths []string, origin string) []string {
	var out []string
	for _, p := range paths {
		for _, d := range strings.Split(p, ":") {
			d = strings.ReplaceAll(strings.ReplaceAll(d, "${ORIGIN}", origin), "$ORIGIN", origin)
			if d != "" {
				out = append(out, d)
			}
		}
	}
	return out
}

// libraryPath returns the directories of LD_LIBRARY_PATH in env.
func libraryPath(env []string) []string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "LD_LIBRARY_PATH="); ok {
			return expandOrigin([]string{v}, "")
		}
	}
	return nil
}

// systemDirs returns the directories of /etc/ld.so.conf (and the files it
// includes), then the loader's defaults.
func systemDirs() []string {
	var dirs []string
	readLdConf("/etc/ld.so.conf", &dirs, 0)
	dirs = append(dirs, "/lib/"+multiarch(), "/usr/lib/"+multiarch(), "/lib64", "/usr/lib64", "/lib", "/usr/lib")
	return dirs
}

// readLdConf adds the directories a ld.so.conf file names, following its
// include lines (glob patterns) a few levels deep.
func readLdConf(path string, dirs *[]string, depth int) {
	if depth > 4 {
		return
	}
	fh, err := os.Open(path)
	if err != nil {
		return
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		switch {
		case line == "":
		case strings.HasPrefix(line, "include "):
			pat := strings.TrimSpace(strings.TrimPrefix(line, "include "))
			if !filepath.IsAbs(pat) {
				pat = filepath.Join(filepath.Dir(path), pat)
			}
			files, _ := filepath.Glob(pat)
			for _, f := range files {
				readLdConf(f, dirs, depth+1)
			}
		default:
			*dirs = append(*dirs, line)
		}
	}
}

// multiarch returns Debian's multiarch triplet of this machine.
func multiarch() string {
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64-linux-gnu"
	case "arm64":
		return "aarch64-linux-gnu"
	}
	return runtime.GOARCH + "-linux-gnu"
}
