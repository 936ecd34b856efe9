package nettest

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// GoTool returns the go command that runs the tests: $GOROOT/bin/go when
// it exists, else go on $PATH.
func GoTool() string {
	if root := os.Getenv("GOROOT"); root != "" {
		p := filepath.Join(root, "bin", "go")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "go"
}

// MDBEntry is one entry of `bridge -j mdb show`.
type MDBEntry struct {
	Dev   string `json:"dev"`
	Port  string `json:"port"`
	Group string `json:"grp"`
	State string `json:"state"`
}

// ParseMDB decodes the output of `bridge -j mdb show` (empty output: no
// entries).
func ParseMDB(out string) ([]MDBEntry, error) {
	if strings.TrimSpace(out) == "" {
		return nil, nil
	}
	var doc []struct {
		MDB []MDBEntry `json:"mdb"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		return nil, fmt.Errorf("bridge mdb json: %v: %q", err, out)
	}
	var all []MDBEntry
	for _, d := range doc {
		all = append(all, d.MDB...)
	}
	return all, nil
}

// MDBPorts returns the ports of the entries for group.
func MDBPorts(ents []MDBEntry, group netip.Addr) []string {
	var ports []string
	for _, e := range ents {
		if g, err := netip.ParseAddr(e.Group); err == nil && g == group {
			ports = append(ports, e.Port)
		}
	}
	return ports
}
