package main

import (
	"debug/buildinfo"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/softrdma/softrdma/capi/capibuild"
)

// goShadowWarning returns the line softrdma exec prints when name, looked
// up on PATH, is prog, a Go program of softrdma's module (go install
// ./cmd/... puts cmd/mckey in GOBIN as mckey, where it may come first on
// PATH): it does not load the C libraries, and the C program of that
// name that it shadows, if one comes later on PATH, is named. "" when
// name is a path, or prog is not a Go program of softrdma's.
func goShadowWarning(name, prog string) string {
	if strings.Contains(name, "/") {
		return "" // the program the user named, not one PATH found
	}
	pkg, ok := softrdmaGoProgram(prog)
	if !ok {
		return ""
	}
	c := ""
	seen := false
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, name)
		if !seen {
			// The PATH entries up to and with the one prog came from.
			seen = sameFile(p, prog)
			continue
		}
		if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			continue
		}
		if _, ours := softrdmaGoProgram(p); !ours {
			c = p
			break
		}
	}
	w := fmt.Sprintf("softrdma exec: warning: %s is %s, the Go program %s (pure Go: it does not use the C libraries)", name, prog, pkg)
	if c != "" {
		return w + fmt.Sprintf("; it shadows %s, run that path for the C program", c)
	}
	return w + fmt.Sprintf("; no other %s on PATH", name)
}

// softrdmaGoProgram tells whether the file prog is a Go program built from
// softrdma's module, and returns its package path.
func softrdmaGoProgram(prog string) (string, bool) {
	bi, err := buildinfo.ReadFile(prog)
	if err != nil {
		return "", false // not a Go program
	}
	if bi.Main.Path != capibuild.ModulePath && !strings.HasPrefix(bi.Path, capibuild.ModulePath+"/") {
		return "", false
	}
	return bi.Path, true
}

// sameFile tells whether a and b are the same file.
func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}
