package rdmacm_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestREADMEQuickStart: README's librdmacm quick start is Example's body,
// word for word, so what README shows is what go test runs.
func TestREADMEQuickStart(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(readme)
	i := strings.Index(s, "## Quick start: librdmacm's API in Go")
	if i < 0 {
		t.Fatal("README has no librdmacm quick start section")
	}
	s = s[i:]
	a := strings.Index(s, "```go\n")
	if a < 0 {
		t.Fatal("no Go block in the quick start")
	}
	b := strings.Index(s[a+6:], "```")
	if b < 0 {
		t.Fatal("the quick start's Go block does not end")
	}
	block := s[a+6 : a+6+b]
	ex, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ex), "func Example() {\n"+block+"\t// Output:") {
		t.Errorf("README's quick start is not Example's body in example_test.go; README has:\n%s", block)
	}
}
