package interop

import (
	"fmt"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/test/nettest"
)

// TestKernelConformance runs the conformance suite (test/conformance) in
// guest g1 on the kernel's rxe through the rdmacore build: every case must
// pass with the behaviour documented for the kernel backend. Its lines
// (CONFORMANCE kernel …) are printed next to the soft backend's, which
// `go test -v ./test/conformance` prints on the host.
func TestKernelConformance(t *testing.T) {
	l := needLab(t)
	note := report(t)
	g := l.guests[0]
	env := []string{
		"SOFTRDMA_CONFORMANCE_BACKEND=kernel",
		"SOFTRDMA_CONFORMANCE_ADDR=" + g.addr.String(),
		// The guest routes only its /24 and loopback.
		"SOFTRDMA_CONFORMANCE_UNREACH=192.0.2.1",
	}
	out, rc := g.goTestEnv(t, "./test/conformance", env, "-test.v", "-test.count=1", "-test.run", "^TestConformance$")
	var lines []string
	pass, fail, skip := 0, 0, 0
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "CONFORMANCE ") {
			continue
		}
		lines = append(lines, line)
		switch f := strings.Fields(line); {
		case len(f) < 4:
		case f[3] == "PASS":
			pass++
		case f[3] == "FAIL":
			fail++
		case f[3] == "SKIP":
			skip++
		}
	}
	fmt.Println(strings.Join(lines, "\n"))
	if rc != 0 || fail > 0 || skip > 0 || pass == 0 {
		t.Fatalf("%s: conformance.test (kernel): exit status %d, %d passed, %d failed, %d skipped:\n%s", g, rc, pass, fail, skip, nettest.Indent(out))
	}
	note.set("conformance suite on %s's rxe0 (kernel backend): %d cases passed", g.name, pass)
}
