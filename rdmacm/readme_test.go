package rdmacm_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/test/testenv"
)

// TestREADMEQuickStart: README's librdmacm quick start is Example's body,
// word for word, so what README shows is what go test runs.
func TestREADMEQuickStart(t *testing.T) {
	block, err := testenv.CodeBlock(filepath.Join("..", "README.md"), "## Quick start: librdmacm's API in Go (`rdmacm`, `verbs`)", "go")
	if err != nil {
		t.Fatal(err)
	}
	ex, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ex), "func Example() {\n"+block+"\t// Output:") {
		t.Errorf("README's quick start is not Example's body in example_test.go; README has:\n%s", block)
	}
}
