package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestBadInvocations: refused with a message and a non-zero status, never
// a panic, before anything is served.
func TestBadInvocations(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"-port-timeout", "-1s"}, 2, "-port-timeout"},
		{[]string{"-port-timeout", "0"}, 2, "-port-timeout"},
		{[]string{"-sa-listen", "0.0.0.0:0"}, 1, "not a loopback address"},
		{[]string{"-sa-listen", "192.0.2.1:4793"}, 1, "not a loopback address"},
		{[]string{"-sa-listen", "nonsense"}, 1, "not a loopback address"},
		{[]string{"-port", "0"}, 2, "bad GUID"},
		{[]string{"extra"}, 2, "unexpected argument"},
	} {
		var out, errb bytes.Buffer
		code := run(append([]string{"-listen", "127.0.0.1:0"}, c.args...), &out, &errb)
		if code != c.code || !strings.Contains(errb.String(), c.msg) {
			t.Errorf("softsm %v: status %d, stderr %q; want %d and %q", c.args, code, errb.String(), c.code, c.msg)
		}
	}
}
