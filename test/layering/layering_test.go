// Package layering holds the test that keeps the import graph the shape
// docs/layout.md draws: dependencies point down the stack, and the front
// (the RDMA CM and what is built on it) and the providers, side by side
// above verbs, never import each other.
package layering

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/test/testenv"
)

const module = "github.com/softrdma/softrdma/"

// A layer of the stack, bottom first.
const (
	ground   = iota // codecs and system calls: nothing of RDMA objects
	seam            // verbs/driver: the provider-facing API and the data types verbs aliases
	core            // verbs and rdmacm/kernelcm: what the front and the providers sit on
	shared          // what the front and the providers both use
	sideways        // the front and the providers (columns below)
	service         // the emulated subnet's service
	programs        // commands (softrdma bench too), the C ABI, the endpoint, provider/all
	harness         // tests and their programs
	unknown
)

var layerNames = [...]string{"ground", "driver", "core", "shared", "front/providers", "service", "programs", "harness", "unknown"}

// A column of the sideways layer.
const (
	noColumn = iota
	front
	providers
)

// rule places the packages under a path prefix (the longest prefix
// wins).
type rule struct {
	prefix string
	layer  int
	column int
}

var rules = []rule{
	{"wire", ground, noColumn},
	{"internal/sys/", ground, noColumn},
	{"internal/registry", ground, noColumn},
	{"internal/envvars", ground, noColumn},
	{"ib/mad", ground, noColumn},
	{"ib/fabric", ground, noColumn},
	{"ib/sa", ground, noColumn},
	{"ib/simproto", ground, noColumn},
	{"ib/sma", ground, noColumn},
	{"ib/umadrmpp", ground, noColumn},
	{"mcast/internal/proto", ground, noColumn},
	{"verbs", core, noColumn},
	{"verbs/driver", seam, noColumn},
	{"rdmacm/kernelcm", core, noColumn},
	{"logging", shared, noColumn},
	{"capture", shared, noColumn},
	{"rdmacm", sideways, front},
	{"mcast", sideways, front},
	{"provider/", sideways, providers},
	{"provider/all", programs, noColumn},
	{"ib/sm", service, noColumn},
	{"introspect", programs, noColumn},
	{"capi", programs, noColumn},
	{"capi/capibuild", programs, noColumn},
	{"cmd/", programs, noColumn},
	{"test/", harness, noColumn},
}

// place returns the layer and column of package p (module-relative).
func place(p string) (layer, column int) {
	best := -1
	layer, column = unknown, noColumn
	for _, r := range rules {
		if matches(p, r.prefix) && len(r.prefix) > best {
			best, layer, column = len(r.prefix), r.layer, r.column
		}
	}
	return layer, column
}

// matches reports whether package p is under prefix: a prefix ending in
// "/" takes the packages below it, any other the package and those below.
func matches(p, prefix string) bool {
	if strings.HasSuffix(prefix, "/") {
		return strings.HasPrefix(p, prefix)
	}
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}

// TestImportsPointDown lists every package of the module (with the cgo
// build tags too) and fails on an import that points up a layer, across
// the front and the providers, or into a package no rule places.
func TestImportsPointDown(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		testenv.Require(t, "no go command: %v", err)
	}
	cmd := exec.Command(gobin, "list", "-e", "-tags", "rdmacore,capi", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || !strings.HasPrefix(f[0], module) {
			continue
		}
		n++
		from := strings.TrimPrefix(f[0], module)
		var to []string
		for _, imp := range f[1:] {
			if strings.HasPrefix(imp, module) {
				to = append(to, strings.TrimPrefix(imp, module))
			}
		}
		for _, e := range check(from, to) {
			t.Error(e)
		}
	}
	if n < 20 {
		t.Fatalf("go list gave %d packages of the module:\n%s", n, out)
	}
}

// check returns what is wrong with package from importing the packages
// to (module-relative): a package no rule places, an import up the stack,
// across the front and the providers, or into a package no rule places.
func check(from string, to []string) []string {
	fl, fc := place(from)
	if fl == unknown {
		return []string{from + ": no layer (add it to the rules here and to docs/layout.md)"}
	}
	var errs []string
	for _, imp := range to {
		tl, tc := place(imp)
		switch {
		case tl == unknown:
			errs = append(errs, fmt.Sprintf("%s imports %s, which no rule places", from, imp))
		case tl > fl:
			errs = append(errs, fmt.Sprintf("%s (%s) imports %s (%s): an import up the stack", from, layerNames[fl], imp, layerNames[tl]))
		case fl == sideways && tl == sideways && fc != tc:
			errs = append(errs, fmt.Sprintf("%s imports %s: the front and the providers never import each other", from, imp))
		}
	}
	return errs
}

// TestCheck: the rules catch an import up the stack (verbs/driver
// importing verbs, verbs importing a provider), across the front and the
// providers, and of an unplaced package, and let the imports down pass.
func TestCheck(t *testing.T) {
	for _, c := range []struct {
		from string
		to   []string
		want string // a substring of the one error; "" for none
	}{
		{"verbs", []string{"verbs/driver", "internal/registry", "wire"}, ""},
		{"verbs/driver", []string{"internal/registry", "wire", "ib/mad"}, ""},
		{"provider/rxe", []string{"verbs", "verbs/driver", "provider/softverbs"}, ""},
		{"rdmacm", []string{"verbs", "verbs/driver", "rdmacm/saclient"}, ""},
		{"verbs/driver", []string{"verbs"}, "verbs/driver (driver) imports verbs (core): an import up the stack"},
		{"verbs/driver", []string{"provider/softverbs"}, "an import up the stack"},
		{"verbs", []string{"rdmacm"}, "an import up the stack"},
		{"internal/registry", []string{"verbs/driver"}, "an import up the stack"},
		{"rdmacm", []string{"provider/rxe"}, "never import each other"},
		{"verbs", []string{"nowhere"}, "which no rule places"},
		{"nowhere", nil, "no layer"},
	} {
		errs := check(c.from, c.to)
		switch {
		case c.want == "" && len(errs) != 0:
			t.Errorf("%s → %v: %v, want no error", c.from, c.to, errs)
		case c.want != "" && (len(errs) != 1 || !strings.Contains(errs[0], c.want)):
			t.Errorf("%s → %v: %q, want one error with %q", c.from, c.to, errs, c.want)
		}
	}
}
