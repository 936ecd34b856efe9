package capibuild

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestForkServed checks the calls a child of fork() makes through its
// parent: each is a symbol of the libraries with a default version, has a
// softrdma_child_<name> in capi/forkchild.c (else the thin library would
// not load), and its amd64 trampoline jumps there in a child.
func TestForkServed(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "forkchild.c"))
	if err != nil {
		t.Fatal(err)
	}
	defs := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^[A-Za-z_].*\bsoftrdma_child_(\w+)\(`).FindAllSubmatch(src, -1) {
		defs[string(m[1])] = true
	}
	libOf := map[string]string{}
	for _, s := range Symbols() {
		if s.Default && s.Kind != "object" {
			libOf[s.Name] = s.Lib
		}
	}
	for name := range forkServed {
		lib, ok := libOf[name]
		if !ok {
			t.Errorf("%s: no default version of the symbol", name)
			continue
		}
		if !defs[name] {
			t.Errorf("%s: no softrdma_child_%s in capi/forkchild.c", name, name)
		}
		if forkSafe[name] {
			t.Errorf("%s: both fork-safe and served", name)
		}
		asm, _, err := Trampolines(lib, "amd64")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(asm), "jmp softrdma_child_"+name+"@PLT\n") {
			t.Errorf("%s: the trampoline does not jump to softrdma_child_%s", name, name)
		}
	}
}
