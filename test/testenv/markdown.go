package testenv

import (
	"fmt"
	"os"
	"strings"
)

// CodeBlock returns the first fenced code block of language lang (```go)
// after the line heading in the Markdown file path: the code a document
// shows, for a test that runs it or compares it with the code it copies.
func CodeBlock(path, heading, lang string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := string(b)
	i := strings.Index(s, "\n"+heading+"\n")
	if i < 0 {
		return "", fmt.Errorf("%s has no section %q", path, heading)
	}
	s = s[i:]
	fence := "```" + lang + "\n"
	a := strings.Index(s, fence)
	if a < 0 {
		return "", fmt.Errorf("%s: no ```%s block after %q", path, lang, heading)
	}
	s = s[a+len(fence):]
	end := strings.Index(s, "```")
	if end < 0 {
		return "", fmt.Errorf("%s: the ```%s block after %q does not end", path, lang, heading)
	}
	return s[:end], nil
}
