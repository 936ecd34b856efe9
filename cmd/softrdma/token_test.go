package main

import (
	"strings"
	"testing"

	"github.com/softrdma/softrdma/introspect"
)

// TestTCPToken: the subcommands send SOFTRDMA_DEBUG_TOKEN to a TCP
// endpoint; without it they fail saying what to set.
func TestTCPToken(t *testing.T) {
	t.Setenv(introspect.EnvToken, "")
	srv, err := introspect.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, cmd := range []string{"devices", "groups"} {
		if code, _, errOut := softrdma(cmd, "-addr", srv.Addr()); code != 1 || !strings.Contains(errOut, introspect.EnvToken) {
			t.Errorf("%s without the token: exit %d %q, want 1 naming %s", cmd, code, errOut, introspect.EnvToken)
		}
	}
	t.Setenv(introspect.EnvToken, srv.Token())
	for _, cmd := range []string{"devices", "groups"} {
		if code, _, errOut := softrdma(cmd, "-addr", srv.Addr(), "--json"); code != 0 {
			t.Errorf("%s with the token: exit %d %q", cmd, code, errOut)
		}
	}
}
