package capibuild

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ModulePath is the module path of softrdma's source, which the go.mod of
// a source Build accepts declares.
const ModulePath = "github.com/softrdma/softrdma"

// UntrustedError is the error of a path that another user could change:
// a source to build from or a directory of libraries to load.
type UntrustedError struct {
	Path   string // the offending file or directory
	Reason string // e.g. "is owned by uid 65534 (nobody), not by you or root (you are uid 1000 (ann))"
}

func (e *UntrustedError) Error() string {
	return e.Path + ": " + e.Reason
}

// userName returns "uid N (name)", or "uid N" for a uid without a name.
func userName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return fmt.Sprintf("uid %d (%s)", uid, u.Username)
	}
	return fmt.Sprintf("uid %d", uid)
}

// checkInfo tells whether fi (of path) is safe from other users: owned by
// the effective user or root, and not writable by its group or others.
// An ancestor (a directory above the path that matters) may be writable
// by others if its sticky bit is set, as /tmp is: others cannot rename or
// remove what is in it.
func checkInfo(path string, fi fs.FileInfo, ancestor bool) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return &UntrustedError{path, "has no owner to check"}
	}
	me := os.Geteuid()
	if int(st.Uid) != me && st.Uid != 0 {
		return &UntrustedError{path, fmt.Sprintf("is owned by %s, not by you or root (you are %s)", userName(int(st.Uid)), userName(me))}
	}
	if fi.Mode().Perm()&0o022 != 0 && !(ancestor && fi.IsDir() && fi.Mode()&fs.ModeSticky != 0) {
		return &UntrustedError{path, fmt.Sprintf("is writable by its group or others (mode %v; chmod go-w)", fi.Mode())}
	}
	return nil
}

// checkPath resolves the symbolic links of path and checks the result
// and every directory above it up to / (checkInfo). It returns the
// resolved path.
func checkPath(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", err
	}
	for p, ancestor := real, false; ; p, ancestor = filepath.Dir(p), true {
		fi, err := os.Lstat(p)
		if err != nil {
			return "", err
		}
		if err := checkInfo(p, fi, ancestor); err != nil {
			return "", err
		}
		if p == filepath.Dir(p) {
			return real, nil
		}
	}
}

// CheckSource checks that dir is softrdma's source (its go.mod declares
// ModulePath and it has capi/) and that no other user can change it: dir,
// every directory above it, and every file and directory in it (but
// .git, which Build does not read) must be owned by the effective user or
// root and not be writable by their group or others (a directory above
// dir may be, if sticky, as /tmp is). It returns dir absolute, without
// symbolic links; an error of the ownership or mode of a path is an
// *UntrustedError that names it.
func CheckSource(dir string) (string, error) {
	return checkSource(dir, nil)
}

// CheckSourceStamp is CheckSource and NewStamp (with the tools of o; its
// ModuleDir is dir) in one walk of the tree.
func CheckSourceStamp(dir string, o Options) (string, Stamp, error) {
	st := newStamper()
	real, err := checkSource(dir, st.file)
	if err != nil {
		return "", Stamp{}, err
	}
	o.ModuleDir = real
	s, err := st.finish(o)
	return real, s, err
}

// checkSource is CheckSource; it gives visit (if not nil) every path
// below dir that it checked, relative to dir, with what the build reads
// of it (a symbolic link's target).
func checkSource(dir string, visit func(rel string, fi fs.FileInfo)) (string, error) {
	real, err := checkPath(dir)
	if err != nil {
		return "", err
	}
	if !declaresModule(filepath.Join(real, "go.mod")) {
		return "", fmt.Errorf("%s is not softrdma's source: no go.mod declaring module %s", real, ModulePath)
	}
	if fi, err := os.Stat(filepath.Join(real, "capi")); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("%s is not softrdma's source: no capi/", real)
	}
	err = filepath.WalkDir(real, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".git" && p != real {
			return filepath.SkipDir
		}
		var fi fs.FileInfo
		if d.Type()&fs.ModeSymlink != 0 {
			fi, err = os.Stat(p) // what the build reads
		} else {
			fi, err = d.Info()
		}
		if err != nil {
			return err
		}
		if err := checkInfo(p, fi, false); err != nil {
			return err
		}
		if visit != nil {
			rel, _ := filepath.Rel(real, p)
			visit(rel, fi)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return real, nil
}

// CheckLibDir checks that no other user can change the libraries in dir,
// before it is put on LD_LIBRARY_PATH: dir, every directory above it (a
// sticky one may be writable by others) and the libraries in it must be
// owned by the effective user or root and not be writable by their group
// or others. It returns dir absolute, without symbolic links; an error of
// the ownership or mode of a path is an *UntrustedError that names it.
func CheckLibDir(dir string) (string, error) {
	real, err := checkPath(dir)
	if err != nil {
		return "", err
	}
	for _, f := range append([]string{CapiLib}, ThinLibs...) {
		p := filepath.Join(real, f)
		fi, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", err
		}
		if err := checkInfo(p, fi, false); err != nil {
			return "", err
		}
	}
	return real, nil
}

// declaresModule tells whether the go.mod file declares ModulePath.
func declaresModule(gomod string) bool {
	f, err := os.Open(gomod)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(m), `"`) == ModulePath
		}
	}
	return false
}
