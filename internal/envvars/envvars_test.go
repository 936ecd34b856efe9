package envvars

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestWarning(t *testing.T) {
	env := []string{"PATH=/bin", "SOFTRDMA_SM=127.0.0.1:4792", "SOFTRDMA_SM_KEYFILE=x", "SOFTRDMA_LGO=info", "SOFTRDMA_TEST_BENCH=1", "SOFTRDMA_WHATEVER=1"}
	got := Warning(env)
	want := "softrdma: ignoring unknown environment variable SOFTRDMA_LGO (did you mean SOFTRDMA_LOG?), SOFTRDMA_SM_KEYFILE (did you mean SOFTRDMA_SM_KEY_FILE?), SOFTRDMA_WHATEVER"
	if got != want {
		t.Errorf("Warning:\n got %q\nwant %q", got, want)
	}
	if w := Warning([]string{"SOFTRDMA_LOG=info", "HOME=/root"}); w != "" {
		t.Errorf("known variables only: %q", w)
	}
	var buf bytes.Buffer
	warn(&buf, env)
	if buf.String() != want+"\n" {
		t.Errorf("warn wrote %q", buf.String())
	}
}

// TestKnownCoversSource: every SOFTRDMA_ variable named in the module's
// non-test Go and C source is one IsKnown accepts, so the warning never
// names a variable softrdma reads.
func TestKnownCoversSource(t *testing.T) {
	root := filepath.Join("..", "..")
	re := regexp.MustCompile(`SOFTRDMA_[A-Z0-9_]*[A-Z0-9]`)
	seen := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == ".git" || n == "testdata" || n == "envvars" || strings.HasPrefix(n, "_") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, "_test.go") || !(strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".c")) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllString(string(b), -1) {
			seen++
			if !IsKnown(m) && !strings.HasSuffix(m, "_H") {
				t.Errorf("%s names %s, which envvars does not know", path, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 10 {
		t.Fatalf("found %d SOFTRDMA_ names in the source: the walk missed it", seen)
	}
}

func TestSuggestFar(t *testing.T) {
	if s := Suggest("SOFTRDMA_COMPLETELY_ELSE"); s != "" {
		t.Errorf("Suggest of a far name: %q", s)
	}
	if s := Suggest("SOFTRDMA_DEBUG_ADR"); s != "SOFTRDMA_DEBUG_ADDR" {
		t.Errorf("Suggest(SOFTRDMA_DEBUG_ADR) = %q", s)
	}
}
