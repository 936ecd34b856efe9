// Package envvars knows every SOFTRDMA_ environment variable softrdma's
// programs and libraries read, so that a misspelled one is named once on
// stderr instead of being ignored in silence.
package envvars

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
)

// Prefix is what every variable of softrdma's begins with.
const Prefix = "SOFTRDMA_"

// Known lists the variables a user sets, each with what it does.
var Known = map[string]string{
	"SOFTRDMA_SM":          "the emulated InfiniBand subnet's SM address (softsm -listen)",
	"SOFTRDMA_SM_KEY_FILE": "a file with the key that authenticates the subnet's SM",
	"SOFTRDMA_SM_UID":      "a uid, besides root and the user's own, whose local SM a port trusts",
	"SOFTRDMA_IB_PORTS":    "IPoIB addresses of the IB ports a verbs-only program opens",
	"SOFTRDMA_BACKEND":     "auto, soft or kernel: which stack new ids use",
	"SOFTRDMA_LOG":         "log level (debug, info, warn, error), optionally ,json",
	"SOFTRDMA_DEBUG_ADDR":  "where the introspection endpoint listens (unix, unix:PATH, 127.0.0.1:PORT)",
	"SOFTRDMA_DEBUG_DIR":   "the only directory for endpoint sockets",
	"SOFTRDMA_DEBUG_TOKEN": "the TCP endpoint's token",
	"SOFTRDMA_LIBDIR":      "softrdma exec: the libraries' directory",
	"SOFTRDMA_SRC":         "softrdma exec: the source to build the libraries from",
	"SOFTRDMA_NO_SYSFS":    "softrdma exec: 1 runs the program without the sysfs view",
}

// internal are the prefixes of variables that softrdma's own tests,
// benchmarks and helper processes pass among themselves (and
// SOFTRDMA_ARTIFACTS, where they leave captures and logs).
var internal = []string{
	"SOFTRDMA_TEST_", "SOFTRDMA_BENCH_", "SOFTRDMA_LAT_", "SOFTRDMA_INTEROP_",
	"SOFTRDMA_CONFORMANCE_", "SOFTRDMA_RDMACORE_", "SOFTRDMA_INTROSPECT_",
	"SOFTRDMA_CAPI_", "SOFTRDMA_PYVERBS_", "SOFTRDMA_ARTIFACTS",
}

// Names returns the variables of Known, sorted.
func Names() []string {
	out := make([]string, 0, len(Known))
	for k := range Known {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// IsKnown reports whether name is a variable softrdma reads.
func IsKnown(name string) bool {
	if _, ok := Known[name]; ok {
		return true
	}
	for _, p := range internal {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// Unknown returns the SOFTRDMA_ variables of environ (KEY=VALUE strings)
// that softrdma does not read, sorted.
func Unknown(environ []string) []string {
	var out []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, Prefix) && !IsKnown(k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Suggest returns the known variable closest to name when it is a likely
// misspelling of it (at most two edits away), else "".
func Suggest(name string) string {
	best, bestD := "", 3
	for k := range Known {
		if d := distance(name, k); d < bestD || d == bestD && k < best {
			best, bestD = k, d
		}
	}
	return best
}

// Warning is the line that names the unknown variables of environ, or ""
// when there are none.
func Warning(environ []string) string {
	unk := Unknown(environ)
	if len(unk) == 0 {
		return ""
	}
	parts := make([]string, len(unk))
	for i, k := range unk {
		parts[i] = k
		if s := Suggest(k); s != "" {
			parts[i] += " (did you mean " + s + "?)"
		}
	}
	return fmt.Sprintf("softrdma: ignoring unknown environment variable %s", strings.Join(parts, ", "))
}

var once sync.Once

// WarnOnce writes Warning(os.Environ()) to stderr, once per process.
func WarnOnce() { once.Do(func() { warn(os.Stderr, os.Environ()) }) }

func warn(w io.Writer, environ []string) {
	if s := Warning(environ); s != "" {
		fmt.Fprintln(w, s)
	}
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
