package testenv

import (
	"os"
	"slices"
	"testing"
)

func TestClearAndCleanEnv(t *testing.T) {
	t.Setenv("SOFTRDMA_SM", "127.0.0.1:4792")
	t.Setenv("SOFTRDMA_DEBUG_ADDR", "unix")
	t.Setenv("SOFTRDMA_LOG", "info")
	t.Setenv("SOFTRDMA_SOME_CHILD_MARKER", "kept")
	t.Setenv("NOT_SOFTRDMA_X", "kept")
	env := CleanEnv("SOFTRDMA_SM=10.0.0.1:4792")
	for _, kv := range env[:len(env)-2] {
		for _, v := range Vars {
			if len(kv) > len(v) && kv[:len(v)+1] == v+"=" {
				t.Errorf("CleanEnv kept %s", kv)
			}
		}
	}
	if env[len(env)-2] != ChildEnv || env[len(env)-1] != "SOFTRDMA_SM=10.0.0.1:4792" ||
		!slices.Contains(env, "NOT_SOFTRDMA_X=kept") || !slices.Contains(env, "SOFTRDMA_SOME_CHILD_MARKER=kept") {
		t.Errorf("CleanEnv: %q", env)
	}
	ClearSoftRDMA()
	for _, k := range Vars {
		if v, ok := os.LookupEnv(k); ok {
			t.Errorf("%s=%s after ClearSoftRDMA", k, v)
		}
	}
	if os.Getenv("NOT_SOFTRDMA_X") != "kept" || os.Getenv("SOFTRDMA_SOME_CHILD_MARKER") != "kept" {
		t.Error("ClearSoftRDMA removed another variable")
	}
}

// TestChildKeepsWhatItsParentSet: in a process whose environment a test
// prepared (ChildEnv), ClearSoftRDMA keeps SOFTRDMA_SM.
func TestChildKeepsWhatItsParentSet(t *testing.T) {
	t.Setenv("SOFTRDMA_TEST_CHILD", "1")
	t.Setenv("SOFTRDMA_SM", "127.0.0.1:4792")
	ClearSoftRDMA()
	if os.Getenv("SOFTRDMA_SM") != "127.0.0.1:4792" {
		t.Error("a child lost the SOFTRDMA_SM its parent set")
	}
}
