package testenv

import (
	"os"
	"slices"
	"strings"
	"testing"
)

func TestClearAndCleanEnv(t *testing.T) {
	t.Setenv("SOFTRDMA_SM", "127.0.0.1:4792")
	t.Setenv("SOFTRDMA_DEBUG_ADDR", "unix")
	t.Setenv("NOT_SOFTRDMA_X", "kept")
	t.Setenv("SOFTRDMA_TEST_MARK", "kept")
	t.Setenv("SOFTRDMA_ARTIFACTS", "/tmp/a")
	env := CleanEnv("SOFTRDMA_LOG=info")
	for _, kv := range env[:len(env)-1] {
		if k, _, _ := strings.Cut(kv, "="); cleared(k) {
			t.Errorf("CleanEnv kept %s", kv)
		}
	}
	if env[len(env)-1] != "SOFTRDMA_LOG=info" || !slices.Contains(env, "NOT_SOFTRDMA_X=kept") ||
		!slices.Contains(env, "SOFTRDMA_TEST_MARK=kept") || !slices.Contains(env, "SOFTRDMA_ARTIFACTS=/tmp/a") {
		t.Errorf("CleanEnv lost a variable: %q", env)
	}
	ClearSoftRDMA()
	for _, k := range []string{"SOFTRDMA_SM", "SOFTRDMA_DEBUG_ADDR"} {
		if v, ok := os.LookupEnv(k); ok {
			t.Errorf("%s=%s after ClearSoftRDMA", k, v)
		}
	}
	if os.Getenv("NOT_SOFTRDMA_X") != "kept" || os.Getenv("SOFTRDMA_TEST_MARK") != "kept" {
		t.Error("ClearSoftRDMA removed another variable")
	}
}
